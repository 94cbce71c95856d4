//! calc-graph: the pure core of felixrs.
//!
//! * [`model`]: Calico `projectcalico.org/v3` resources, their etcd keys and validation.
//! * [`selector`]: Calico's selector language (parse, evaluate, canonical form).
//! * [`graph`]: the calculation graph, from datastore updates to ordered dataplane updates.
//! * [`proto`]: the graph's output, consumed by the dataplane renderer.
//!
//! No I/O happens here: no tokio, etcd or kube. See ARCHITECTURE.md.
#![forbid(unsafe_code)]

pub mod graph;
pub mod model;
pub mod proto;
pub mod selector;
