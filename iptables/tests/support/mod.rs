//! Shared helpers of the applier's root tests (hand-built desired states, kernel checks, TCP probes).
//! Namespaces come from `felixrs-test-support`; this module adds what only the applier's tests need: the
//! iptables/ipset tools they drive and an `ExecRunner` inside a namespace.

#![allow(dead_code)]

pub mod check;
pub mod desired;
pub mod host_world;
pub mod tcp;

use felixrs_test_support::netns::Netns;
use iptables::apply::ExecRunner;

/// Tools the kernel tests need; a missing one fails the test loudly (never a silent skip).
pub const REQUIRED_TOOLS: &[&str] = &[
    "ip",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-legacy-save",
    "ip6tables-nft-save",
    "ipset",
    "conntrack",
];

/// Panics unless we are root and every tool in [`REQUIRED_TOOLS`] is installed.
pub fn require_kernel_tools() {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(REQUIRED_TOOLS);
}

/// A fresh namespace for a kernel test (its own iptables tables and IP sets), deleted on drop.
pub fn kernel_netns() -> Netns {
    require_kernel_tools();
    Netns::new()
}

/// The applier's real runner, running every command inside `ns`.
pub fn runner(ns: &Netns) -> ExecRunner {
    ExecRunner::in_netns(ns.name()).expect("valid netns name")
}
