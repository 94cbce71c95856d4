//! Applier: desired state to the kernel, transactionally.
//!
//! This is the only part of the crate that does I/O, and all of it goes through [`Runner`]
//! ([`ExecRunner`]: std::process, optionally inside `ip netns exec <ns>`), but for the drift
//! check's change signals ([`signal`], asked in the caller's own namespace only): the nft
//! generation id over a netfilter netlink socket, and the legacy tables' summaries and contents
//! over a raw socket ([`xt_info`], the crate's only unsafe code).
//!
//! # Use
//! ```no_run
//! use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner};
//! use iptables::desired::{DesiredState, IpVersion};
//! # fn desired() -> DesiredState { DesiredState::new(IpVersion::V4) }
//! let mut v4 = Applier::new(ExecRunner::new(), ApplierConfig {
//!     family: IpVersion::V4,
//!     backend: Backend::Auto,
//!     ..ApplierConfig::default()
//! });
//! let report = v4.apply(&desired())?;   // on every change: writes only the differences
//! assert!(v4.apply(&desired())?.is_empty()); // nothing changed: nothing written, nothing read
//! v4.refresh(&desired())?;              // on a timer (e.g. 90 s): re-read, repair drift
//! # Ok::<(), iptables::apply::ApplyError>(())
//! ```
//!
//! # What we own, and the guarantees
//! * Ours: chains named `cali-*`, rules in other chains whose **first** comment is `cali:<hash>`,
//!   IP sets named `cali4*` / `cali6*`. Nothing else is ever written, deleted or flushed; no
//!   table is ever flushed (`iptables-restore --noflush` only).
//! * One `iptables-restore` transaction per changed table (atomic per `COMMIT`): a failed write
//!   leaves the table as it was. Rules are compared by hash, position by position (felix-reference §6.4):
//!   an unchanged rule is never rewritten and keeps its counters.
//! * Phase order: IP sets created/filled → tables written → unwanted sets destroyed, so no rule
//!   ever references a missing set and no referenced set is destroyed.
//! * Everything that goes into a payload is validated first (names, hashes, rule bodies, set
//!   members); every table is planned before anything is written, so bad input writes nothing.
//! * Hook rules sit at the top (or, for appends, the bottom) of their kernel chains; if anything
//!   lands above them they are deleted by spec and re-inserted.
//! * Failed writes are retried with exponential backoff after re-reading the kernel (5 tries
//!   from 10 ms by default); a persistent failure is an [`ApplyError`] naming the table and the
//!   payload line the tool blamed.
//!
//! # Modules
//! The input ([`DesiredState`](crate::desired::DesiredState)) and all pure planning (per-table
//! diff, IP set phases, cleanup plans, preview) are in [`crate::desired`]; the kernel view is
//! read by [`crate::parse::read_tables`]. This module runs the tools and keeps the state between
//! applies:
//! * [`drift`]: the fast check of everything of ours between two full refreshes; [`signal`]: its
//!   cheap "did anything change" per backend; [`xt_info`]: `IPT_SO_GET_INFO` and
//!   `IPT_SO_GET_ENTRIES`, legacy's.
//! * [`backend`]: legacy vs nft detection, binaries and lock options.
//! * [`runner`]: the process runner trait and its std::process implementation.
//! * [`cleanup`]: removing everything of ours from a node (`felixrs cleanup`).
//! * [`counters`]: reading the filter table with counters (for [`crate::stats`]).
//! * [`conntrack`]: deleting the conntrack flows of an address that left a local endpoint.
//! * `engine`: [`Applier`], tying it together.

pub mod backend;
pub mod cleanup;
pub mod conntrack;
pub mod counters;
pub mod drift;
mod engine;
pub mod error;
pub mod runner;
pub mod signal;
pub mod xt_info;

pub use backend::{
    Backend, Detection, Mode, Reason, detect_masquerade_fully_random, masquerade_fully_random,
};
pub use engine::{Applier, ApplierConfig, ApplyReport};
pub use error::ApplyError;
pub use runner::{ExecRunner, RunError, Runner};
