//! policy-controller: Kubernetes objects (or manifest files) → the Calico v3 resources kube-controllers
//! would store in etcd mode → etcd.
//!
//! ```text
//!  k8s watchers ─┐                       ┌─> convert (pure) ─┐
//!                ├─> Index (sync, by obj)┤                   ├─> Desired ─> Writer (etcd txns, CAS)
//!  manifests ────┘                       └─ skip reports ────┘                 ^ fenced by Election
//! ```
//!
//! * [`convert`]: pure functions, one per source kind; no I/O.
//! * [`manifests`]: multi-document YAML/JSON files → converted resources + per-document skip reports.
//! * [`index`]: the synchronous source index (apply/delete/reset) the watchers feed.
//! * [`k8s_source`]: kube-rs watchers → index.
//! * [`writer`]: reconciles desired state into etcd under the keys the controller owns.
//! * [`election`]: one active replica, elected with etcd's election API.
//! * [`validate`]: every resource is decoded, validated and canonicalised by `calc_graph::model`.
//! * [`v3_passthrough`]: `projectcalico.org/v3` documents from manifests.
//! * [`metrics`], [`cli`].
//!
//! For `felixrs render`: [`load_manifests`] is pure apart from reading the files.
#![forbid(unsafe_code)]

pub mod cli;
pub mod convert;
pub mod default_pools;
pub mod election;
pub mod etcd_tls;
pub mod index;
pub mod k8s_source;
pub mod manifests;
pub mod metrics;
pub mod strict_k8s;
pub mod v3_passthrough;
pub mod validate;
pub mod writer;

pub use convert::{CalicoResource, ConvertOptions, ObjectRef, SkipReport};
pub use manifests::{ManifestError, ManifestSet, ManifestSkip, load_manifests};
