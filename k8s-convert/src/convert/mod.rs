//! Pure conversion of Kubernetes objects into the Calico v3 resources kube-controllers would store in
//! etcd mode (felix-reference §9). No I/O happens here.
//!
//! Invariants:
//! * every produced resource has a valid name, namespace and labels, so its etcd key has exactly the
//!   layout of felix-reference §9.6 and nothing in a name can add a path segment;
//! * an object that cannot be converted yields a [`SkipReport`] naming the object and the field, and a
//!   `retain_key`: the key it would have had, which the writer keeps (fail closed: a previously stored
//!   version stays in force instead of being deleted);
//! * a NetworkPolicy rule that cannot be converted is dropped with a report and the rest of the policy
//!   is kept, as Calico does. k8s rules only ever allow, so dropping one never opens traffic.

pub mod admin;
mod host_endpoint;
mod labels;
mod namespace;
mod networkpolicy;
mod node;
mod pod;

use std::fmt;

use calc_graph::model::{Metadata, Resource, Validated};

pub use admin::{
    admin_network_policy_to_calico, baseline_admin_network_policy_to_calico,
    cluster_network_policy_to_calico,
};
pub use host_endpoint::{
    ADDRESS_ANNOTATIONS, AUTO_HEP_SUFFIX, CREATED_BY_LABEL, CREATED_BY_VALUE,
    auto_host_endpoint_name, is_auto_host_endpoint, node_to_auto_host_endpoint,
};
pub use labels::{
    NameError, selector_from_label_selector, validate_dns_label, validate_dns_subdomain,
    validate_metadata_labels,
};
pub use namespace::{namespace_to_profile, service_account_to_profile};
pub use networkpolicy::network_policy_to_calico;
pub use node::{KNODE_PREFIX, NODE_MARKER_LABEL, node_to_network_set};
pub use pod::{interface_name, pod_to_workload_endpoint, workload_endpoint_name};

/// The etcd prefix under which Calico v3 resources live.
pub const RESOURCE_PREFIX: &str = calc_graph::model::CALICO_PREFIX;

/// Options that change how objects convert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertOptions {
    /// Host-side veth prefix (Felix `InterfacePrefix`), `cali` by default.
    pub interface_prefix: String,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            interface_prefix: "cali".to_string(),
        }
    }
}

/// An interface prefix that would not leave room for the 11 hex characters of a veth name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid interface prefix {0:?}: want 1-4 ASCII letters or digits")]
pub struct InvalidInterfacePrefix(pub String);

impl ConvertOptions {
    /// Checks the options: the prefix plus 11 hex characters must fit in IFNAMSIZ-1 (15).
    pub fn validate(&self) -> Result<(), InvalidInterfacePrefix> {
        let p = &self.interface_prefix;
        if p.is_empty() || p.len() > 4 || !p.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(InvalidInterfacePrefix(p.clone()));
        }
        Ok(())
    }
}

/// Which source object a report or resource came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRef {
    pub fn new(kind: &str, namespace: Option<&str>, name: &str) -> Self {
        ObjectRef {
            kind: kind.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// Why (part of) an object was not converted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SkipReport {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// JSON path of the offending field, e.g. `spec.ingress[0].ports[1].endPort`.
    pub field: String,
    pub message: String,
}

impl SkipReport {
    /// A report on `obj`'s `field`; `message` is a text or a typed error, shown as it displays.
    pub fn new(obj: &ObjectRef, field: impl Into<String>, message: impl fmt::Display) -> Self {
        SkipReport {
            kind: obj.kind.clone(),
            namespace: obj.namespace.clone(),
            name: obj.name.clone(),
            field: field.into(),
            message: message.to_string(),
        }
    }
}

impl fmt::Display for SkipReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let obj = ObjectRef {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        };
        write!(f, "{obj}: {}: {}", self.field, self.message)
    }
}

/// A Calico v3 resource ready to store: its identity and its body, typed.
#[derive(Debug, Clone, PartialEq)]
pub struct CalicoResource {
    /// v3 kind, e.g. `NetworkPolicy`.
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub body: Body,
}

/// What a [`CalicoResource`] stores.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// A resource of the shared model, validated once (where it was converted), stored in the
    /// model's canonical JSON ([`Resource::to_json`], encoded once, when it is written).
    Model(Validated),
    /// A `projectcalico.org/v3` document whose rules carry fields the model cannot hold: stored as
    /// written, so the agent sees those fields and fails the rules safe. `decoded` is what the
    /// agent decodes from `json`.
    AsWritten { json: String, decoded: Validated },
    /// A RemoteClusterConfiguration (read by the agents' federation, not a graph resource), as
    /// built by [`crate::v3_passthrough`].
    RemoteCluster(String),
}

impl CalicoResource {
    /// A validated resource, named by its key: stored as `as_written` when given, else in the
    /// model's canonical JSON.
    pub fn new(valid: Validated, as_written: Option<String>) -> Self {
        let key = valid.key();
        CalicoResource {
            kind: key.kind.kind_name().to_string(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            body: match as_written {
                Some(json) => Body::AsWritten {
                    json,
                    decoded: valid,
                },
                None => Body::Model(valid),
            },
        }
    }

    /// The typed resource the agent reads (`None` for a RemoteClusterConfiguration).
    pub fn resource(&self) -> Option<&Resource> {
        match &self.body {
            Body::Model(v) | Body::AsWritten { decoded: v, .. } => Some(v.resource()),
            Body::RemoteCluster(_) => None,
        }
    }

    /// The validated resource, owned, for the graph to take as it is.
    pub fn into_valid(self) -> Option<Validated> {
        match self.body {
            Body::Model(v) | Body::AsWritten { decoded: v, .. } => Some(v),
            Body::RemoteCluster(_) => None,
        }
    }

    /// The JSON document stored in etcd.
    pub fn to_json(&self) -> String {
        match &self.body {
            Body::Model(v) => v.resource().to_json(),
            Body::AsWritten { json, .. } | Body::RemoteCluster(json) => json.clone(),
        }
    }

    /// The etcd key (felix-reference §9.6).
    pub fn etcd_key(&self) -> Result<String, KeyError> {
        etcd_key(&self.kind, self.namespace.as_deref(), &self.name)
    }
}

/// RemoteClusterConfiguration: stored for the agents (federation), not a graph resource.
pub const REMOTE_CLUSTER_KIND: &str = "RemoteClusterConfiguration";

/// Why a resource has no etcd key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("invalid name: {0}")]
    Name(calc_graph::model::NameError),
    #[error("invalid namespace: {0}")]
    Namespace(calc_graph::model::NameError),
    #[error("unsupported kind {0:?}")]
    UnsupportedKind(String),
    #[error("{0} is namespaced but has no namespace")]
    MissingNamespace(String),
    #[error("{0} is cluster-scoped but has a namespace")]
    UnexpectedNamespace(String),
}

/// The etcd key of a v3 resource: `/calico/resources/v3/projectcalico.org/<plural>/[<ns>/]<name>`.
/// Names and namespaces are checked first so that nothing in them can add a path segment.
pub fn etcd_key(kind: &str, namespace: Option<&str>, name: &str) -> Result<String, KeyError> {
    use calc_graph::model::{Kind, ResourceKey, validate_name, validate_namespace};
    if kind == REMOTE_CLUSTER_KIND {
        validate_name(name).map_err(KeyError::Name)?;
        return match namespace {
            None => Ok(calc_graph::model::remote_cluster_key(name)),
            Some(_) => Err(KeyError::UnexpectedNamespace(kind.to_string())),
        };
    }
    let k =
        Kind::from_kind_name(kind).ok_or_else(|| KeyError::UnsupportedKind(kind.to_string()))?;
    validate_name(name).map_err(KeyError::Name)?;
    match (k.is_namespaced(), namespace) {
        (true, Some(ns)) => {
            validate_namespace(ns).map_err(KeyError::Namespace)?;
            Ok(ResourceKey::namespaced(k, ns, name).etcd_key())
        }
        (true, None) => Err(KeyError::MissingNamespace(kind.to_string())),
        (false, None) => Ok(ResourceKey::global(k, name).etcd_key()),
        (false, Some(_)) => Err(KeyError::UnexpectedNamespace(kind.to_string())),
    }
}

/// The outcome of converting one source object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Converted {
    /// What to store; `None` when the object yields nothing (e.g. a host-networked pod) or was skipped.
    pub resource: Option<CalicoResource>,
    /// Problems found. With `resource: None` they mean the object was skipped; with a resource they
    /// name dropped rules.
    pub skips: Vec<SkipReport>,
    /// When the object was skipped: the key it would have had, kept in the store (fail closed).
    pub retain_key: Option<String>,
}

impl Converted {
    /// A converted resource, validated here, once (see [`crate::validate::checked`]).
    pub(crate) fn ok(resource: impl Into<Resource>, skips: Vec<SkipReport>) -> Self {
        crate::validate::checked(resource.into(), None, skips)
    }

    pub(crate) fn none() -> Self {
        Converted::default()
    }

    pub(crate) fn skipped(report: SkipReport, retain_key: Option<String>) -> Self {
        Converted {
            resource: None,
            skips: vec![report],
            retain_key,
        }
    }
}

/// The metadata of a converted resource: its name, the source object's uid and creation time.
pub(crate) fn metadata(
    name: String,
    namespace: Option<&str>,
    source: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Metadata {
    Metadata {
        name,
        namespace: namespace.map(str::to_string),
        uid: source.uid.clone().filter(|u| !u.is_empty()),
        creation_timestamp: timestamp(&source.creation_timestamp),
        ..Metadata::default()
    }
}

/// The k8s creation timestamp as Kubernetes writes it (RFC 3339, UTC, whole seconds), when set.
pub(crate) fn timestamp(
    t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) -> Option<String> {
    let v = serde_json::to_value(t.as_ref()?).ok()?;
    v.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// `Some(s)` unless `s` is empty (the model's reading of Go's `omitempty` strings).
pub(crate) fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}
