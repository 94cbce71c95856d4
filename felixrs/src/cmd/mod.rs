//! The operator commands, one module per `felixrs` subcommand (the agent daemon is [`crate::agent`]).
//!
//! * [`render`]: `felixrs render`, manifests -> the payloads for an empty kernel.
//! * [`trace`]: `felixrs trace`, which of a node's rules decide a packet between two pods;
//!   [`trace::kernel`] is `--kernel` (the packet through the kernel's own rules).
//! * [`stats`]: `felixrs stats`, the kernel's counters of our rules per policy, tier, direction and
//!   action.
//! * [`flows`]: `felixrs flows`, the packets our NFLOG rules log, with the deciding policy.
//! * [`preview`]: `felixrs preview`, what a proposed policy change would do: recorded flows
//!   replayed, or the reachability matrix, before and after.
//! * [`cleanup`]: `felixrs cleanup`, removes every chain, hook rule and set of ours.
//! * [`iptables`](self::iptables): `felixrs iptables`, tools over iptables-save text.
//! * [`shared`]: what the commands share: the node view and its source flags, the dataplane flags
//!   (the agent's too), the "which pod is this address" lookup.

pub mod cleanup;
pub mod flows;
pub mod iptables;
pub mod preview;
pub mod render;
pub mod shared;
pub mod stats;
pub mod trace;
