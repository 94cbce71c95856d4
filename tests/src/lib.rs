//! felixrs end-to-end test harness: a two-node cluster in network namespaces, the upstream Kubernetes
//! NetworkPolicy e2e cases as data, an independent evaluator of NetworkPolicy semantics, and drivers for
//! the real binaries (etcd, `policy-controller`, `felixrs agent`). Namespaces, etcd and HTTP come from
//! `felixrs-test-support`.

pub mod admin_cases;
pub mod admin_evaluator;
pub mod calico_eval;
pub mod cases;
pub mod cases_icmp;
pub mod cases_v6;
pub mod cluster;
pub mod container;
pub mod dns;
pub mod driver;
pub mod env;
pub mod evaluator;
pub mod fqdn;
pub mod fuzz;
pub mod nat;
pub mod report;
pub mod ship;
pub mod spoof;
pub mod strict;
pub mod trace_cells;
pub mod traffic;
pub mod world;
