//! `StagedKubernetesNetworkPolicy` (Calico's staged form of a Kubernetes NetworkPolicy): its
//! spec is a Kubernetes NetworkPolicy spec plus `stagedAction`. Checked like a NetworkPolicy
//! (strict schema, the same conversion), and converted to the Calico policy spec it would be
//! promoted to: the graph's [`calc_graph::graph::StagedK8sConverter`].

use calc_graph::model::{PolicySpec, Resource, StagedKubernetesNetworkPolicy};
use serde_json::{Map, Value};

use crate::convert::ConvertOptions;
use crate::strict_k8s::StrictNetworkPolicy;

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
) -> Result<PolicySpec, String> {
    let v = as_network_policy(p);
    let strict = StrictNetworkPolicy::from_value(v).map_err(|e| format!("spec: {e}"))?;
    let converted = strict.convert(&ConvertOptions::default());
    if let Some(s) = converted.skips.first() {
        return Err(s.to_string());
    }
    match converted.resource.as_ref().and_then(|r| r.resource()) {
        Some(Resource::NetworkPolicy(np)) => Ok(np.spec.clone()),
        _ => Err("spec: does not convert to a NetworkPolicy".into()),
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
        assert!(e.contains("ingres"), "{e}");
    }
}
