//! Applier: desired state to the kernel, transactionally.
//!
//! This is the only part of the crate that does I/O, and all of it goes through [`Runner`].
//!
//! * [`desired`]: the input type ([`DesiredState`]), produced by the renderer.
//! * [`runner`]: the process runner trait and its std::process implementation.

pub mod desired;
pub mod diff;
pub mod error;
pub mod kernel;
pub mod runner;

pub use desired::{
    DesiredRule, DesiredState, DesiredTable, HookPosition, HookRule, IpSetKind, IpSetMember,
    IpSetSpec, IpVersion, TableName,
};
pub use error::ApplyError;
pub use runner::{ExecRunner, RunError, Runner};
