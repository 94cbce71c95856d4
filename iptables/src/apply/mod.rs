//! Applier: desired state to the kernel, transactionally.
//!
//! This is the only part of the crate that does I/O, and all of it goes through [`Runner`].
//!
//! * [`desired`]: the input type ([`DesiredState`]), produced by the renderer.
//! * [`runner`]: the process runner trait and its std::process implementation.

pub mod backend;
pub mod desired;
pub mod diff;
mod engine;
pub mod error;
pub mod ipset;
pub mod kernel;
mod read;
pub mod runner;

pub use backend::{Backend, Mode};
pub use desired::{
    DesiredRule, DesiredState, DesiredTable, HookPosition, HookRule, IpSetKind, IpSetMember,
    IpSetSpec, IpVersion, TableName,
};
pub use engine::{Applier, ApplierConfig, ApplyReport};
pub use error::ApplyError;
pub use runner::{ExecRunner, RunError, Runner};
