//! What the operator commands share; each piece imports only the ones below it, never a command.
//!
//! * [`node_view`]: `--manifests`/`--state-dir` ([`node_view::SourceArgs`]) and the node's objects
//!   rendered as the agent would ([`node_view::NodeView`]): `render`, `trace`, `stats`, `flows`.
//! * [`pods`]: which pod is this address, for `trace` and `flows`.
//! * [`dataplane_args`]: the dataplane flags (mark mask, interface prefixes, ...) the agent and
//!   the commands share, so a command shows what the agent with the same flags programs.

pub mod dataplane_args;
pub mod node_view;
pub mod pods;
