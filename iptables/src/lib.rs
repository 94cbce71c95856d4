//! iptables: the dataplane model of felixrs.
//!
//! * [`model`]: typed tables, chains and rules, and their iptables-restore text form.
//! * [`parse`]: every reader of kernel text: a nom parser of `iptables-save` / `ip6tables-save`
//!   output that round-trips the kernel's text, the kernel view of our chains (with its line-scan
//!   fallback) and the counter scan.
//! * [`render`]: calc-graph output -> the desired Calico-style chains and IP sets (pure).
//! * [`desired`]: the desired state, its checks, change log, per-table plans, IP set plans,
//!   cleanup plans and preview (pure).
//! * [`stats`]: per-policy counters: the kernel's rule counters attributed to policy, tier,
//!   direction and action (pure).
//! * [`apply`]: the transactional applier (`iptables-restore --noflush`, `ipset restore`), the only I/O,
//!   behind a small runner trait.
// Denied everywhere but `apply::xt_info` (its `getsockopt`s, no safe wrapper exists).
#![deny(unsafe_code)]

pub mod apply;
pub mod desired;
pub mod model;
pub mod parse;
pub mod render;
pub mod stats;
