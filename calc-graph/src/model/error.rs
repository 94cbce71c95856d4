//! Errors of the resource model: decoding (`ModelError`) and validation (`ValidationError`).
//!
//! Every message names the resource (as `networkpolicies/prod/web`, or the etcd key when the key
//! itself is bad) and, where there is one, the JSON field path (`spec.ingress[2].destination.ports[0]`).

use std::fmt;

use thiserror::Error;

/// Why a key or a JSON document could not be turned into a resource.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ModelError {
    /// The etcd key is not a Calico v3 resource key.
    #[error("invalid etcd key {key:?}: {reason}")]
    InvalidKey { key: String, reason: String },
    /// The JSON has no `kind`, or one this model does not know.
    #[error("{resource}: unknown kind {kind:?}")]
    UnknownKind { resource: String, kind: String },
    /// The JSON's `apiVersion` is not `projectcalico.org/v3`.
    #[error("{resource}: unsupported apiVersion {api_version:?} (expected projectcalico.org/v3)")]
    ApiVersion {
        resource: String,
        api_version: String,
    },
    /// The JSON is malformed or a field has the wrong shape; `path` is empty for syntax errors.
    #[error("{resource}: {}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
    Decode {
        resource: String,
        path: String,
        message: String,
    },
    /// The document has fields the upstream schema does not know, outside any rule (inside a
    /// rule, an unknown field makes that rule fail safe instead).
    #[error("{resource}: {}", .paths.iter().map(|p| format!("{p}: unknown field")).collect::<Vec<_>>().join("; "))]
    UnknownFields {
        resource: String,
        paths: Vec<String>,
    },
    /// The etcd key and the resource body disagree on kind, namespace or name.
    #[error("{resource}: {field} in the body is {body:?} but the etcd key says {key:?}")]
    KeyMismatch {
        resource: String,
        field: &'static str,
        key: String,
        body: String,
    },
    /// The resource decoded but failed validation.
    #[error("{}", join_errors(.0))]
    Invalid(Vec<ValidationError>),
}

fn join_errors(errors: &[ValidationError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One validation failure: which resource, which field, what is wrong.
///
/// Displays as `networkpolicies/prod/web: spec.ingress[2].destination.ports[0]: port range 90:80 is reversed`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub struct ValidationError {
    /// The resource, as `ResourceKey`'s Display.
    pub resource: String,
    /// The JSON field path, e.g. `spec.ingress[2].destination.ports[0]`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.resource, self.path, self.message)
    }
}
