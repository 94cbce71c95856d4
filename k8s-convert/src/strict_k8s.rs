//! Strict decoding of `networking.k8s.io/v1` NetworkPolicy, from manifests and from the API.
//!
//! k8s-openapi's types drop unknown fields silently, so a typo (`podSelectr`) or a field newer
//! than the schema we claim would silently widen the policy. The raw JSON is checked against the
//! known schema (`calc_graph::model::schema::K8S_NETWORK_POLICY`) first; an object with an unknown
//! field is reported (object + every field path) and skipped with its key retained, so the last
//! good version stays in etcd (as for any invalid object).
//!
//! [`StrictNetworkPolicy`] is what the watcher decodes: the typed object plus the unknown fields
//! its JSON had. It is a k8s-openapi resource (same group, kind and URL as NetworkPolicy), so
//! kube-rs lists and watches it as it would NetworkPolicy.

use calc_graph::model::schema::{K8S_NETWORK_POLICY, unknown_fields_in_value};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::convert::{self, ConvertOptions, Converted, ObjectRef, SkipReport};

/// A NetworkPolicy with the paths of the fields its JSON had that the schema does not know.
#[derive(Debug, Clone, Default)]
pub struct StrictNetworkPolicy {
    pub policy: NetworkPolicy,
    pub unknown_fields: Vec<String>,
}

impl StrictNetworkPolicy {
    /// Checks and decodes one JSON object.
    pub fn from_value(v: Value) -> Result<Self, serde_json::Error> {
        let unknown_fields = unknown_fields_in_value(&K8S_NETWORK_POLICY, &v);
        let policy = serde_json::from_value(v)?;
        Ok(StrictNetworkPolicy {
            policy,
            unknown_fields,
        })
    }

    /// [`Self::from_value`] of a borrowed object (no copy of it first).
    pub fn from_value_ref(v: &Value) -> Result<Self, serde_json::Error> {
        let unknown_fields = unknown_fields_in_value(&K8S_NETWORK_POLICY, v);
        let policy = NetworkPolicy::deserialize(v)?;
        Ok(StrictNetworkPolicy {
            policy,
            unknown_fields,
        })
    }

    /// Converts the policy, or, if it has unknown fields, reports them and retains its key.
    pub fn convert(&self, opts: &ConvertOptions) -> Converted {
        let converted = convert::network_policy_to_calico(&self.policy, opts);
        if self.unknown_fields.is_empty() {
            return converted;
        }
        let meta = &self.policy.metadata;
        let obj = ObjectRef::new(
            "NetworkPolicy",
            Some(meta.namespace.as_deref().unwrap_or("default")),
            meta.name.as_deref().unwrap_or(""),
        );
        let retain_key = converted
            .resource
            .as_ref()
            .and_then(|r| r.etcd_key().ok())
            .or(converted.retain_key);
        let message = format!(
            "unknown field{} {}; the previous version is kept",
            if self.unknown_fields.len() > 1 {
                "s"
            } else {
                ""
            },
            self.unknown_fields.join(", ")
        );
        Converted::skipped(
            SkipReport::new(&obj, self.unknown_fields[0].clone(), message),
            retain_key,
        )
    }
}

impl<'de> Deserialize<'de> for StrictNetworkPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        StrictNetworkPolicy::from_value(v).map_err(serde::de::Error::custom)
    }
}

impl k8s_openapi::Resource for StrictNetworkPolicy {
    const API_VERSION: &'static str = <NetworkPolicy as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <NetworkPolicy as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <NetworkPolicy as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <NetworkPolicy as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str =
        <NetworkPolicy as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <NetworkPolicy as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for StrictNetworkPolicy {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.policy.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.policy.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_unknown_field_skips_the_policy_and_retains_its_key() {
        let good = json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "web", "namespace": "prod", "managedFields": [{"x": 1}]},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "db"}}}],
                                  "ports": [{"port": 80, "endPort": 90}]}]}
        });
        let opts = ConvertOptions::default();
        let p: StrictNetworkPolicy = serde_json::from_value(good.clone()).unwrap();
        assert!(p.unknown_fields.is_empty());
        let c = p.convert(&opts);
        assert!(c.resource.is_some() && c.skips.is_empty(), "{c:?}");

        let mut bad = good;
        bad["spec"]["ingress"][0]["from"][0]["podSelectr"] = json!({});
        bad["spec"]["ingress"][0]["from"][0]
            .as_object_mut()
            .unwrap()
            .remove("podSelector");
        let p: StrictNetworkPolicy = serde_json::from_value(bad).unwrap();
        let c = p.convert(&opts);
        assert!(c.resource.is_none());
        assert_eq!(
            c.retain_key.as_deref(),
            Some("/calico/resources/v3/projectcalico.org/networkpolicies/prod/knp.default.web")
        );
        assert_eq!(c.skips.len(), 1);
        assert_eq!(c.skips[0].field, "spec.ingress[0].from[0].podSelectr");
        assert!(
            c.skips[0].message.contains("unknown field"),
            "{:?}",
            c.skips[0]
        );
    }
}
