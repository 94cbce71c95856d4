//! A packet traced through a node's rendered rules: the types `trace`'s report, its kernel check
//! ([`super::check`]) and its kernel trace ([`super::kernel`]) all read, so none of them imports
//! another.

use std::net::IpAddr;

use iptables::render::static_chains;
use iptables::render::trace::{self, Packet};

/// How a node's rules end a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
    /// Our chain returned without a verdict: the kernel chain's other rules decide.
    NotOurs,
}

/// Which kernel chain the packet takes on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Routed through the node (pod to pod, pod to elsewhere): FORWARD.
    Forward,
    /// To the node itself: INPUT.
    Input,
    /// From the node itself: OUTPUT.
    Output,
}

impl Path {
    /// The kernel chain whose first rule is our hook.
    pub fn kernel_chain(self) -> &'static str {
        match self {
            Path::Forward => "FORWARD",
            Path::Input => "INPUT",
            Path::Output => "OUTPUT",
        }
    }

    pub fn our_chain(self) -> &'static str {
        match self {
            Path::Forward => static_chains::FORWARD,
            Path::Input => static_chains::INPUT,
            Path::Output => static_chains::OUTPUT,
        }
    }
}

/// A traced packet.
pub struct Traced {
    pub path: Path,
    /// The packet as it entered the node (the filter table may see another mark and conntrack
    /// state: see `pre`).
    pub packet: Packet,
    /// The raw and mangle tables the packet met before the filter table (only while the node has
    /// a host endpoint); the last one dropped it when [`Traced::trace`] is empty of steps and
    /// the verdict is DROP.
    pub pre: Vec<super::hosts::PreTable>,
    pub trace: trace::Trace,
    pub verdict: Verdict,
    pub(super) from: End,
    pub(super) to: End,
}

/// One end of the packet.
pub(super) struct End {
    /// This node itself.
    pub(super) host: bool,
    pub(super) addr: IpAddr,
    /// The pod, if the end is one.
    pub(super) pod: Option<String>,
    /// Its interface, if the pod is on the traced node.
    pub(super) local_iface: Option<String>,
    /// The host endpoint whose `expectedIPs` hold the address (a host end), and its interface.
    pub(super) host_endpoint: Option<(String, String)>,
}
