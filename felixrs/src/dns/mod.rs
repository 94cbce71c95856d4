//! The DNS learner of FQDN egress policy (issue 16): DNS responses from the trusted servers to
//! local pods are held on an NFQUEUE until the domain IP sets that active rules use hold their
//! A/AAAA addresses, then released, so a pod never sees an answer whose addresses are not yet
//! allowed.
//!
//! # Layout
//! * [`packet`]: the queued L3 packet → addresses, ports and whole DNS messages (UDP, TCP).
//! * [`answer`]: a DNS message → (name, address, TTL) facts, CNAME chains followed (hickory-proto).
//! * [`learned`]: the learned map (TTLs, expiry, LRU cap).
//! * [`setwriter`]: kernel set writes (`add … timeout … -exist`) over ipset netlink.
//! * [`learner`]: the lock that ties them together, verdicts, active sets, the `DomainMembers`
//!   the renderer fills new sets from.
//! * [`queue`]: the NFQUEUE thread (nfq crate).
//! * [`persist`]: the map in `<state-dir>/dns-learned.json`.
//! * [`metrics`]: the `felixrs_dns_*` metrics.
//! * [`agent`]: the learner inside `felixrs agent` (queue thread, persister).
//! * [`trace`]: what `felixrs trace` says about domain rules (the learned map from its file).
//! * [`config`]: the flags' values (`--dns-trusted-servers` and friends).

pub mod agent;
pub mod answer;
pub mod config;
pub mod learned;
pub mod learner;
pub mod metrics;
pub mod packet;
pub mod persist;
pub mod queue;
pub mod setwriter;
pub mod trace;

pub use learner::{Learner, LearnerConfig, Verdict};
