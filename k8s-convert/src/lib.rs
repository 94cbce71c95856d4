//! k8s-convert: Kubernetes objects (or manifest files) → the typed Calico v3 resources
//! kube-controllers would store in etcd mode. Pure apart from reading manifest files: no kube,
//! tokio or etcd, so the controller (which writes the result to etcd) and the agent's operator
//! tools (`felixrs render`/`trace`, which render it) share one conversion.
//!
//! * [`convert`]: pure functions, one per source kind; no I/O.
//! * [`manifests`]: multi-document YAML/JSON files → converted resources + per-document skip reports.
//! * [`strict_k8s`]: NetworkPolicy checked against the known schema.
//! * [`validate`]: every resource is validated by `calc_graph::model` before it is stored.
//! * [`v3_passthrough`]: `projectcalico.org/v3` documents from manifests.
#![forbid(unsafe_code)]

pub mod convert;
pub mod manifests;
pub mod staged;
pub mod strict_k8s;
pub mod v3_passthrough;
pub mod validate;

pub use convert::{CalicoResource, ConvertOptions, ObjectRef, SkipReport};
pub use manifests::{ManifestError, ManifestSet, ManifestSkip, load_manifests};
