//! Namespace → Profile `kns.<ns>` and ServiceAccount → Profile `ksa.<ns>.<sa>` (felix-reference §9.4).
//!
//! `kns.` profiles allow everything in both directions (the default allow for pods with no policy) and
//! apply `pcns.`-prefixed namespace labels; `ksa.` profiles have no rules and apply `pcsa.` labels.
//! Pods inherit these labels (felix-reference §8.2), which is how namespace and service-account selectors match.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};

use calc_graph::model::{Action, Profile, ProfileSpec, Rule};

use super::labels::validate_metadata_labels;
use super::{ConvertOptions, Converted, ObjectRef, SkipReport, etcd_key, metadata};

/// Name prefix of namespace profiles.
pub const KNS_PREFIX: &str = "kns.";
/// Name prefix of service-account profiles.
pub const KSA_PREFIX: &str = "ksa.";
/// The namespace label the API server maintains (`kubernetes.io/metadata.name: <name>`).
pub const METADATA_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn prefixed_labels(
    labels: &BTreeMap<String, String>,
    prefix: &str,
    name: &str,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v.clone()))
        .collect();
    out.insert(format!("{prefix}projectcalico.org/name"), name.to_string());
    out
}

/// Converts a Namespace into its `kns.<ns>` profile.
pub fn namespace_to_profile(ns: &Namespace, _opts: &ConvertOptions) -> Converted {
    let name = ns.metadata.name.as_deref().unwrap_or("");
    let obj = ObjectRef::new("Namespace", None, name);
    if let Err(e) = super::validate_dns_label(name) {
        return Converted::skipped(SkipReport::new(&obj, "metadata.name", e), None);
    }
    let profile = format!("{KNS_PREFIX}{name}");
    let key = etcd_key("Profile", None, &profile).ok();
    let mut labels = ns.metadata.labels.clone().unwrap_or_default();
    // The API server sets this label on every namespace (immutable, equal to the name; GA in
    // Kubernetes 1.22), and policies commonly select namespaces by it. Objects read from
    // manifest files have not been through the API server: set it as it would.
    labels.insert(METADATA_NAME_LABEL.to_string(), name.to_string());
    if let Err(e) = validate_metadata_labels(&labels) {
        return Converted::skipped(e.report(&obj), key);
    }
    let o = Profile {
        metadata: metadata(profile, None, &ns.metadata),
        spec: ProfileSpec {
            ingress: vec![Rule::new(Action::Allow)],
            egress: vec![Rule::new(Action::Allow)],
            labels_to_apply: prefixed_labels(&labels, "pcns.", name),
        },
    };
    Converted::ok(o, Vec::new())
}

/// Converts a ServiceAccount into its `ksa.<ns>.<sa>` profile.
pub fn service_account_to_profile(sa: &ServiceAccount, _opts: &ConvertOptions) -> Converted {
    let ns = sa.metadata.namespace.as_deref().unwrap_or("default");
    let name = sa.metadata.name.as_deref().unwrap_or("");
    let obj = ObjectRef::new("ServiceAccount", Some(ns), name);
    if let Err(e) = super::validate_dns_label(ns) {
        return Converted::skipped(SkipReport::new(&obj, "metadata.namespace", e), None);
    }
    if let Err(e) = super::validate_dns_subdomain(name) {
        return Converted::skipped(SkipReport::new(&obj, "metadata.name", e), None);
    }
    let profile = format!("{KSA_PREFIX}{ns}.{name}");
    let key = etcd_key("Profile", None, &profile);
    let key = match key {
        Ok(k) => k,
        Err(e) => return Converted::skipped(SkipReport::new(&obj, "metadata.name", e), None),
    };
    let labels = sa.metadata.labels.clone().unwrap_or_default();
    if let Err(e) = validate_metadata_labels(&labels) {
        return Converted::skipped(e.report(&obj), Some(key));
    }
    let o = Profile {
        metadata: metadata(profile, None, &sa.metadata),
        spec: ProfileSpec {
            ingress: Vec::new(),
            egress: Vec::new(),
            labels_to_apply: prefixed_labels(&labels, "pcsa.", name),
        },
    };
    Converted::ok(o, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels_to_apply(ns: serde_json::Value) -> serde_json::Value {
        let ns: Namespace = serde_json::from_value(ns).unwrap();
        let c = namespace_to_profile(&ns, &ConvertOptions::default());
        let json: serde_json::Value = serde_json::from_str(&c.resource.unwrap().to_json()).unwrap();
        json["spec"]["labelsToApply"].clone()
    }

    #[test]
    fn metadata_name_label_is_set_as_the_api_server_does() {
        // A manifest that never went through the API server lacks the label...
        let l = labels_to_apply(serde_json::json!({"metadata": {"name": "prod"}}));
        assert_eq!(l["pcns.kubernetes.io/metadata.name"], "prod");
        // ...and a hand-written one cannot make it lie about the name.
        let l = labels_to_apply(serde_json::json!({"metadata": {
            "name": "prod",
            "labels": {"kubernetes.io/metadata.name": "kube-system", "team": "a"},
        }}));
        assert_eq!(l["pcns.kubernetes.io/metadata.name"], "prod");
        assert_eq!(l["pcns.team"], "a");
    }
}
