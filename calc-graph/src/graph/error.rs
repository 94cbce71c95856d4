//! Why the graph refused (part of) an update: what [`CalcGraph::take_errors`](super::CalcGraph::take_errors)
//! reports with the resource's key. The resource is treated as deleted.

use crate::model::{Kind, NameError, ResourceKey, ValidationError};

pub use super::rules::SelectorFieldError;

/// One refused update (the key it concerns goes with it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// The body's kind, namespace or name is not the update key's.
    #[error("resource body is {body} but the update key is {key}; treated as deleted")]
    KeyMismatch { key: ResourceKey, body: ResourceKey },
    /// The resource failed validation (each error names the field).
    #[error("invalid, treated as deleted: {}", join(.0))]
    Invalid(Vec<ValidationError>),
    /// A selector of a policy or profile does not parse.
    #[error(transparent)]
    Selector(#[from] SelectorFieldError),
    /// A policy update carried another kind.
    #[error("expected a policy, got a {0}")]
    NotAPolicy(Kind),
    /// A staged policy could not be taken into the staged view (e.g. a
    /// StagedKubernetesNetworkPolicy whose spec does not convert).
    #[error("staged policy: {0}")]
    Staged(#[from] super::StagedK8sError),
    /// A remote cluster's name is not a valid name.
    #[error("remote cluster name {cluster:?}: {reason}")]
    RemoteClusterName { cluster: String, reason: NameError },
    /// A remote cluster's resource was refused.
    #[error("remote cluster {cluster}: {error}")]
    Remote {
        cluster: String,
        error: Box<GraphError>,
    },
}

fn join(errors: &[ValidationError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
