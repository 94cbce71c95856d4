//! NetworkPolicy, GlobalNetworkPolicy and the staged policy kinds.
//!
//! Staged kinds decode so the graph can recognise and ignore them; they are never enforced.
//! `StagedKubernetesNetworkPolicy` keeps its (Kubernetes-shaped) spec as raw JSON apart from
//! `stagedAction`.

use serde::{Deserialize, Serialize};

use super::metadata::{Metadata, empty_as_none, is_false, null_as_default, order_as_go};
use super::rule::Rule;
use super::tier::DEFAULT_TIER;

/// A direction a policy applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PolicyType {
    Ingress,
    Egress,
}

/// `projectcalico.org/v3` NetworkPolicy (namespaced).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: PolicySpec,
}

/// `projectcalico.org/v3` GlobalNetworkPolicy (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GlobalNetworkPolicy {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: PolicySpec,
}

/// The spec of both policy kinds: a NetworkPolicy's is a GlobalNetworkPolicy's without
/// `doNotTrack`, `preDNAT`, `applyOnForward` and `namespaceSelector` (the schema refuses them in a
/// NetworkPolicy document, validation in a NetworkPolicy built in code).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PolicySpec {
    /// Absent means `default`; see [`PolicySpec::tier_name`].
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub tier: Option<String>,
    /// Absent sorts after every present order.
    #[serde(
        serialize_with = "order_as_go",
        skip_serializing_if = "Option::is_none"
    )]
    pub order: Option<f64>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub selector: Option<String>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub types: Vec<PolicyType>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ingress: Vec<Rule>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub egress: Vec<Rule>,
    #[serde(skip_serializing_if = "is_false")]
    pub do_not_track: bool,
    #[serde(rename = "preDNAT", skip_serializing_if = "is_false")]
    pub pre_dnat: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub apply_on_forward: bool,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace_selector: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub service_account_selector: Option<String>,
    /// e.g. `AssumeNeededOnEveryNode`.
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub performance_hints: Vec<String>,
}

impl PolicySpec {
    /// The tier, with an absent tier meaning `default`.
    pub fn tier_name(&self) -> &str {
        self.tier.as_deref().unwrap_or(DEFAULT_TIER)
    }

    /// The directions the policy applies to, as Felix reads stored data
    /// (`extractPolicyMetadata` in `felix/calc`): the listed types, and an empty `types` means
    /// both Ingress and Egress ("back compatibility: no Types means Ingress and Egress").
    /// Differs from [`PolicySpec::effective_types`] only for stored policies without
    /// `types`, which Calico's own writers never produce.
    pub fn felix_types(&self) -> Vec<PolicyType> {
        if self.types.is_empty() {
            return vec![PolicyType::Ingress, PolicyType::Egress];
        }
        let mut t = self.types.clone();
        t.sort();
        t.dedup();
        t
    }

    /// The listed types (sorted, deduplicated), or, when there are none, the types Calico's
    /// client would have filled in at create time (see [`PolicySpec::create_time_types`]).
    /// Kept with this meaning because the graph already relies on it; see `felix_types` for how
    /// Felix itself reads a stored policy without types.
    pub fn effective_types(&self) -> Vec<PolicyType> {
        self.create_time_types()
    }

    /// The `types` Calico's client fills in when a policy is created without any
    /// (`defaultPolicyTypesField` in clientv3): Ingress, plus Egress when there are egress rules,
    /// and only Egress when there are only egress rules. Writers (the controller, manifest
    /// loaders) apply this before storing, so the stored policy means what its author expected.
    pub fn create_time_types(&self) -> Vec<PolicyType> {
        if !self.types.is_empty() {
            return self.felix_types();
        }
        match (self.ingress.is_empty(), self.egress.is_empty()) {
            (_, true) => vec![PolicyType::Ingress],
            (true, false) => vec![PolicyType::Egress],
            (false, false) => vec![PolicyType::Ingress, PolicyType::Egress],
        }
    }

    /// Sets `types` to [`PolicySpec::create_time_types`] if it is empty, as Calico's client does
    /// on create.
    pub fn fill_default_types(&mut self) {
        if self.types.is_empty() {
            self.types = self.create_time_types();
        }
    }
}

/// What applying a staged policy would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StagedAction {
    Set,
    Delete,
    Learn,
    Ignore,
}

/// `StagedNetworkPolicy`: a NetworkPolicy spec plus `stagedAction`; never enforced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StagedNetworkPolicy {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: StagedPolicySpec,
}

/// `StagedGlobalNetworkPolicy`: a GlobalNetworkPolicy spec plus `stagedAction`; never enforced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StagedGlobalNetworkPolicy {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: StagedPolicySpec,
}

/// The spec of both staged Calico policy kinds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StagedPolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_action: Option<StagedAction>,
    #[serde(flatten)]
    pub policy: PolicySpec,
}

/// `StagedKubernetesNetworkPolicy`: a Kubernetes NetworkPolicy spec plus `stagedAction`, kept
/// as raw JSON since nothing in felixrs interprets it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StagedKubernetesNetworkPolicy {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: StagedKubernetesNetworkPolicySpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StagedKubernetesNetworkPolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_action: Option<StagedAction>,
    /// The rest of the spec (`podSelector`, `ingress`, `egress`, `policyTypes`), verbatim.
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn global_policy_flags_use_calico_names() {
        let v = json!({
            "metadata": {"name": "host-fw"},
            "spec": {"order": 10, "selector": "has(host)", "types": ["Ingress"],
                     "doNotTrack": true, "preDNAT": false, "applyOnForward": true,
                     "ingress": [{"action": "Allow"}], "namespaceSelector": "all()"}
        });
        let p: GlobalNetworkPolicy = serde_json::from_value(v).unwrap();
        assert!(p.spec.do_not_track && p.spec.apply_on_forward && !p.spec.pre_dnat);
        assert_eq!(p.spec.tier_name(), "default");
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({
                "metadata": {"name": "host-fw"},
                "spec": {"order": 10, "selector": "has(host)", "types": ["Ingress"],
                         "ingress": [{"action": "Allow"}], "doNotTrack": true,
                         "applyOnForward": true, "namespaceSelector": "all()"}
            })
        );
    }

    #[test]
    fn orders_encode_like_go_floats() {
        for (input, output) in [
            ("5", "5"),
            ("5.0", "5"),
            ("2.5", "2.5"),
            ("-1", "-1"),
            ("1e3", "1000"),
        ] {
            let doc = format!(r#"{{"order": {input}}}"#);
            let s: PolicySpec = serde_json::from_str(&doc).unwrap();
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!(r#"{{"order":{output}}}"#)
            );
        }
    }

    #[test]
    fn felix_types_and_create_time_types() {
        use super::super::primitives::Action;
        let mut s = PolicySpec::default();
        let both = vec![PolicyType::Ingress, PolicyType::Egress];
        assert_eq!(s.felix_types(), both);
        assert_eq!(s.create_time_types(), vec![PolicyType::Ingress]);
        assert_eq!(s.effective_types(), vec![PolicyType::Ingress]);
        s.egress.push(Rule::new(Action::Allow));
        assert_eq!(s.felix_types(), both);
        assert_eq!(s.create_time_types(), vec![PolicyType::Egress]);
        s.ingress.push(Rule::new(Action::Deny));
        assert_eq!(s.create_time_types(), both);
        s.types = vec![PolicyType::Egress, PolicyType::Egress];
        assert_eq!(s.felix_types(), vec![PolicyType::Egress]);
        assert_eq!(s.create_time_types(), vec![PolicyType::Egress]);
        assert_eq!(s.effective_types(), vec![PolicyType::Egress]);

        let mut g = PolicySpec {
            ingress: vec![Rule::new(Action::Allow)],
            ..PolicySpec::default()
        };
        g.fill_default_types();
        assert_eq!(g.types, vec![PolicyType::Ingress]);
        assert_eq!(g.felix_types(), vec![PolicyType::Ingress]);
    }

    #[test]
    fn staged_specs_flatten() {
        let v = json!({"metadata": {"name": "s", "namespace": "n"},
                       "spec": {"stagedAction": "Set", "selector": "all()", "order": 5}});
        let p: StagedNetworkPolicy = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(p.spec.staged_action, Some(StagedAction::Set));
        assert_eq!(p.spec.policy.selector.as_deref(), Some("all()"));
        assert_eq!(serde_json::to_value(&p).unwrap(), v);
        let v = json!({"metadata": {"name": "k", "namespace": "n"},
                       "spec": {"stagedAction": "Delete", "podSelector": {}, "policyTypes": ["Ingress"]}});
        let p: StagedKubernetesNetworkPolicy = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&p).unwrap(), v);
    }
}
