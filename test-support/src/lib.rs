//! Test helpers shared by every felixrs crate's tests: real network namespaces ([`netns`]), a real
//! etcd process ([`etcd`]), a minimal HTTP/1.1 client ([`http`]), free ports ([`free_port`]), a node
//! with two pods wired as Calico wires them ([`node`]), a continuous TCP prober ([`prober`]), a TCP
//! relay that can cut a path between namespaces ([`relay`]), another package's built binaries
//! ([`binaries`]) and the in-repository iptables-save corpus ([`iptables_corpus_dir`]).
//!
//! Invariants: every resource (namespace, process, temp dir) is released on drop, also when the test
//! panics; a missing tool or missing root fails loudly with a message naming what is missing, never a
//! silent skip. Blocking std code only (no tokio/kube/etcd-client), so pure crates may dev-depend on it.

pub mod binaries;
mod corpus;
pub mod etcd;
pub mod http;
pub mod netns;
pub mod node;
mod ports;
pub mod prober;
pub mod relay;
mod tools;

pub use corpus::{iptables_corpus_dir, iptables_corpus_file};
pub use ports::free_port;
pub use tools::{require_root, require_tools, run_checked};
