//! felixrs end-to-end test harness: a two-node cluster in network namespaces, the upstream Kubernetes
//! NetworkPolicy e2e cases as data, an independent evaluator of NetworkPolicy semantics, and drivers for
//! the real binaries (etcd, `policy-controller`, `felixrs agent`).

pub mod cases;
pub mod cluster;
pub mod driver;
pub mod evaluator;
pub mod netns;
pub mod traffic;
pub mod world;
