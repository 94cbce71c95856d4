//! The seam between the renderer and the agent's DNS learner (FQDN egress policy, issue 16).
//!
//! A rule's `destination.domains` becomes a domain IP set (`hash:ip` with per-member timeouts,
//! one per address family). The calculation graph knows which patterns a set stands for, never
//! its addresses: those are learned from DNS answers by the agent. Two things cross the seam:
//! * renderer ← learner, [`DomainMembers`]: when a domain set is first created, it is created
//!   full, with every unexpired address already learned for its patterns (so a restart, or a new
//!   policy naming an already-resolved domain, never starts from an empty set);
//! * renderer → learner, [`ActiveDomainSet`]: after each apply, the sets that exist in the kernel,
//!   so that the learner adds each newly learned address to every set whose patterns match.

use std::net::IpAddr;

use calc_graph::model::DomainPattern;

/// An address learned from a DNS answer, with the seconds it has left (from the record's TTL,
/// raised to the agent's minimum TTL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LearnedAddr {
    pub addr: IpAddr,
    pub remaining_secs: u32,
}

/// What the agent has learned from DNS.
pub trait DomainMembers: Send + Sync + std::fmt::Debug {
    /// Every unexpired address learned for a name that matches any of `patterns`.
    fn learned(&self, patterns: &[DomainPattern]) -> Vec<LearnedAddr>;
}

/// No DNS learning (no trusted DNS servers configured, or a tool rendering from manifests).
#[derive(Debug, Default, Clone, Copy)]
pub struct NothingLearned;

impl DomainMembers for NothingLearned {
    fn learned(&self, _patterns: &[DomainPattern]) -> Vec<LearnedAddr> {
        Vec::new()
    }
}

/// A domain set that exists in the kernel, as the learner needs it: the patterns it stands for
/// and its kernel set names per family (`None` where the family has no rule referencing it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActiveDomainSet {
    pub patterns: Vec<DomainPattern>,
    pub v4_set: Option<String>,
    pub v6_set: Option<String>,
}
