//! Staged policies (Calico's pending policies) as the controller watches and converts them:
//! `StagedNetworkPolicy`, `StagedGlobalNetworkPolicy` and `StagedKubernetesNetworkPolicy` of
//! `projectcalico.org/v3` (the Calico API server's group; optional: a cluster without it answers
//! 404, an empty listing). Each is stored as written under its own key, validated by the model; a
//! `StagedKubernetesNetworkPolicy` is also checked like a Kubernetes NetworkPolicy (strict
//! schema, the same conversion) and converted to the Calico policy spec it would be promoted to:
//! the graph's [`calc_graph::graph::StagedK8sConverter`].

use calc_graph::graph::StagedK8sError;
use calc_graph::model::{PolicySpec, Resource, StagedAction, StagedKubernetesNetworkPolicy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::convert::{ConvertOptions, Converted};
use crate::strict_k8s::StrictNetworkPolicy;

/// The API group and version the staged kinds are watched under.
pub const GROUP: &str = "projectcalico.org";

macro_rules! watched_staged_kind {
    ($(#[$doc:meta])* $ty:ident, $kind:literal, $plural:literal, $scope:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        pub struct $ty {
            #[serde(default)]
            pub metadata: ObjectMeta,
            /// Raw; decoded strictly by the conversion.
            #[serde(default)]
            pub spec: Value,
        }

        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = "projectcalico.org/v3";
            const GROUP: &'static str = GROUP;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = "v3";
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl $ty {
            /// Converts the watched object: stored as written, validated by the model.
            pub fn convert(&self, _opts: &ConvertOptions) -> Converted {
                convert_watched($kind, &self.metadata, &self.spec)
            }
        }
    };
}

watched_staged_kind!(
    /// `projectcalico.org/v3` StagedNetworkPolicy (namespaced).
    WatchedStagedNetworkPolicy,
    "StagedNetworkPolicy",
    "stagednetworkpolicies",
    k8s_openapi::NamespaceResourceScope
);
watched_staged_kind!(
    /// `projectcalico.org/v3` StagedGlobalNetworkPolicy (cluster-scoped).
    WatchedStagedGlobalNetworkPolicy,
    "StagedGlobalNetworkPolicy",
    "stagedglobalnetworkpolicies",
    k8s_openapi::ClusterResourceScope
);
watched_staged_kind!(
    /// `projectcalico.org/v3` StagedKubernetesNetworkPolicy (namespaced).
    WatchedStagedKubernetesNetworkPolicy,
    "StagedKubernetesNetworkPolicy",
    "stagedkubernetesnetworkpolicies",
    k8s_openapi::NamespaceResourceScope
);

/// A watched staged object as the v3 document a manifest would hold, through the same
/// conversion ([`crate::v3_passthrough::convert_v3`]).
fn convert_watched(kind: &str, meta: &ObjectMeta, spec: &Value) -> Converted {
    let mut m = Map::new();
    m.insert(
        "name".into(),
        Value::from(meta.name.clone().unwrap_or_default()),
    );
    if let Some(ns) = &meta.namespace {
        m.insert("namespace".into(), Value::from(ns.clone()));
    }
    if let Some(l) = &meta.labels {
        m.insert("labels".into(), serde_json::to_value(l).unwrap_or_default());
    }
    if let Some(a) = &meta.annotations {
        m.insert(
            "annotations".into(),
            serde_json::to_value(a).unwrap_or_default(),
        );
    }
    let doc = serde_json::json!({
        "apiVersion": calc_graph::model::API_VERSION,
        "kind": kind,
        "metadata": Value::Object(m),
        "spec": spec,
    });
    crate::v3_passthrough::convert_v3(&doc)
}

/// Whether a `StagedKubernetesNetworkPolicy` converts as a Kubernetes NetworkPolicy would (a
/// `Delete` has nothing to convert); `Err` names the field.
pub fn check_staged_kubernetes(p: &StagedKubernetesNetworkPolicy) -> Result<(), StagedK8sError> {
    if p.spec.staged_action == Some(StagedAction::Delete) {
        return Ok(());
    }
    staged_kubernetes_policy_spec(p).map(|_| ())
}

/// The Kubernetes NetworkPolicy a staged one stands for (its spec without `stagedAction`).
fn as_network_policy(p: &StagedKubernetesNetworkPolicy) -> Value {
    let mut meta = Map::new();
    meta.insert("name".into(), Value::String(p.metadata.name.clone()));
    if let Some(ns) = &p.metadata.namespace {
        meta.insert("namespace".into(), Value::String(ns.clone()));
    }
    let mut doc = Map::new();
    doc.insert(
        "apiVersion".into(),
        Value::String("networking.k8s.io/v1".into()),
    );
    doc.insert("kind".into(), Value::String("NetworkPolicy".into()));
    doc.insert("metadata".into(), Value::Object(meta));
    doc.insert("spec".into(), Value::Object(p.spec.rest.clone()));
    Value::Object(doc)
}

/// The Calico policy spec of a `StagedKubernetesNetworkPolicy` with `stagedAction` Set, as its
/// promotion to a Kubernetes NetworkPolicy would be converted; `Err` names the field (an unknown
/// field, or a rule that does not convert: a staged policy is all or nothing).
pub fn staged_kubernetes_policy_spec(
    p: &StagedKubernetesNetworkPolicy,
) -> Result<PolicySpec, StagedK8sError> {
    let v = as_network_policy(p);
    let strict =
        StrictNetworkPolicy::from_value(v).map_err(|e| StagedK8sError::Spec(e.to_string()))?;
    let converted = strict.convert(&ConvertOptions::default());
    if let Some(s) = converted.skips.first() {
        return Err(StagedK8sError::Unconvertible(s.to_string()));
    }
    match converted.resource.as_ref().and_then(|r| r.resource()) {
        Some(Resource::NetworkPolicy(np)) => Ok(np.spec.clone()),
        _ => Err(StagedK8sError::NotANetworkPolicy),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn staged(spec: Value) -> StagedKubernetesNetworkPolicy {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "x"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn converts_like_a_network_policy() {
        let p = staged(
            json!({"stagedAction": "Set", "podSelector": {"matchLabels": {"app": "a"}},
                              "ingress": [{"ports": [{"port": 8080}]}]}),
        );
        let spec = staged_kubernetes_policy_spec(&p).unwrap();
        assert_eq!(
            spec.selector.as_deref(),
            Some("projectcalico.org/orchestrator == 'k8s' && app == 'a'")
        );
        assert_eq!(spec.ingress.len(), 1);
    }

    #[test]
    fn an_unknown_field_is_refused_with_its_name() {
        let p = staged(json!({"podSelector": {}, "ingres": []}));
        let e = staged_kubernetes_policy_spec(&p).unwrap_err();
        assert!(matches!(e, StagedK8sError::Unconvertible(_)), "{e:?}");
        assert!(e.to_string().contains("ingres"), "{e}");
    }
}
