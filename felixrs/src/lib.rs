//! felixrs: the node agent (library part, so integration tests can drive its pieces in-process).
//!
//! # Layout
//! * [`agent`]: the `felixrs agent` daemon: etcd syncer, datastore state and snapshot, apply loop,
//!   status/health/metrics server, and its CLI arguments.
//! * [`render_cmd`]: `felixrs render`, manifests -> the payloads for an empty kernel.
//! * [`stats_cmd`]: `felixrs stats`, the kernel's counters of our rules per policy, tier,
//!   direction and action.
//! * [`trace_cmd`]: `felixrs trace`, which of a node's rules decide a packet between two pods.
//! * [`cleanup_cmd`]: `felixrs cleanup`, removes every chain, hook rule and set of ours.
//! * [`trace_kernel`]: `felixrs trace --kernel`, the packet through the kernel's own rules.
//! * [`flows_cmd`]: `felixrs flows`, the packets our NFLOG rules log, with the deciding policy.
//! * [`pods`]: which pod is this address, for `trace` and `flows`.
//! * [`dataplane_args`]: the dataplane flags both share (mark mask, interface prefixes, ...).
//! * [`dns`]: the DNS learner of FQDN egress policy (NFQUEUE, DNS parsing, learned map).
#![forbid(unsafe_code)]

pub mod agent;
pub mod cleanup_cmd;
pub mod dataplane_args;
pub mod dns;
pub mod flows_cmd;
pub mod pods;
pub mod render_cmd;
pub mod stats_cmd;
pub mod trace_cmd;
pub mod trace_kernel;
