//! felixrs: the node agent (library part, so integration tests can drive its pieces in-process).
//!
//! # Layout
//! * [`agent`]: the `felixrs agent` daemon: etcd syncer, datastore state and snapshot, apply loop,
//!   status/health/metrics server, and its CLI arguments.
//! * [`cmd`]: the operator commands (`render`, `trace`, `stats`, `flows`, `cleanup`, `iptables`),
//!   one module each, and what they share (`cmd::shared`).
//! * [`dns`]: the DNS learner of FQDN egress policy (NFQUEUE, DNS parsing, learned map).
//! * [`flowlog`]: flow logs: the record every producer and reader shares.
//! * [`web`]: the web view the agent serves with `--web-view` (flows, policies, pods).
#![forbid(unsafe_code)]

pub mod agent;
pub mod cmd;
pub mod dns;
pub mod flowlog;
pub mod staged;
pub mod web;
