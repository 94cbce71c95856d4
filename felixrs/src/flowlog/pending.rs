//! The seam between the flow collector and the staged-policy evaluator: for a connection the
//! kernel decided, what the staged policies would have decided (Calico's pending policies),
//! evaluated with the same evaluator `felixrs trace` uses.

use std::net::IpAddr;

use super::{FlowAction, PolicyHit, Reporter};

/// A connection's first packet, as the collector saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Connection {
    /// IP protocol number.
    pub proto: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    /// ICMP type and code, for ICMP and ICMPv6.
    pub icmp: Option<(u8, u8)>,
}

/// What the staged policies would decide.
pub trait PendingPolicies: Send + Sync {
    /// The verdict and the hits (in evaluation order) with every staged policy enforced in its
    /// tier and order, for the local endpoint on the `reporter` side; `None` when no staged
    /// policy changes how that endpoint's traffic in that direction is evaluated.
    fn pending(
        &self,
        conn: &Connection,
        reporter: Reporter,
    ) -> Option<(FlowAction, Vec<PolicyHit>)>;
}

/// No staged policies: nothing pending.
pub struct NoPending;

impl PendingPolicies for NoPending {
    fn pending(&self, _: &Connection, _: Reporter) -> Option<(FlowAction, Vec<PolicyHit>)> {
        None
    }
}
