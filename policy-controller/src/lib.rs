//! policy-controller: Kubernetes objects (or manifest files) → the Calico v3 resources kube-controllers
//! would store in etcd mode → etcd.
//!
//! ```text
//!  k8s watchers ─┐                       ┌─> convert (pure) ─┐
//!                ├─> Index (sync, by obj)┤                   ├─> Desired ─> Writer (etcd txns, CAS)
//!  manifests ────┘                       └─ skip reports ────┘                 ^ fenced by Election
//! ```
//!
//! * [`convert`], [`manifests`], [`validate`]: the pure conversion, from the `k8s-convert` crate
//!   (shared with `felixrs render`/`trace`).
//! * [`index`]: the synchronous source index (apply/delete/reset) the watchers feed.
//! * [`k8s_source`]: kube-rs watchers → index.
//! * [`writer`]: reconciles desired state into etcd under the keys the controller owns.
//! * [`election`]: one active replica, elected with etcd's election API.
//! * [`auto_hep`]: whether the Nodes' automatic host endpoints are asked for (flag over the
//!   `default` KubeControllersConfiguration).
//! * [`metrics`], [`cli`].
#![forbid(unsafe_code)]

pub mod auto_hep;
pub mod cli;
pub mod default_pools;
pub mod election;
pub mod index;
pub mod k8s_source;
pub mod metrics;
pub mod writer;

// The pure conversion lives in `k8s-convert` (shared with the agent's operator tools); what the
// tests, benches and fuzz targets reach through this crate is re-exported under its old paths.
pub use k8s_convert::{ConvertOptions, ObjectRef, load_manifests};
pub use k8s_convert::{convert, manifests, validate};
