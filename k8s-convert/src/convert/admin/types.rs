//! The `policy.networking.k8s.io` cluster-scoped policy kinds (kubernetes-sigs/network-policy-api
//! v0.2.0): AdminNetworkPolicy and BaselineAdminNetworkPolicy (v1alpha1), ClusterNetworkPolicy
//! (v1alpha2).
//!
//! Two layers:
//! * the watched objects ([`AdminNetworkPolicy`], ...) keep `spec` as raw JSON, so one object with a
//!   field this build does not know never fails a whole list or watch;
//! * the spec types below are decoded strictly (`deny_unknown_fields`) by the conversion, so such a
//!   field is reported by name, and the object is skipped (fail closed), like every invalid object.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector as K8sLabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use serde::{Deserialize, Serialize};

/// The API group of the three kinds.
pub const GROUP: &str = "policy.networking.k8s.io";

macro_rules! watched_kind {
    ($(#[$doc:meta])* $ty:ident, $kind:literal, $version:literal, $plural:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        pub struct $ty {
            #[serde(default)]
            pub metadata: ObjectMeta,
            /// Raw; decoded strictly by the conversion.
            #[serde(default)]
            pub spec: serde_json::Value,
        }

        // kube-rs watches these through its blanket impl over the k8s-openapi traits.
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = concat!("policy.networking.k8s.io/", $version);
            const GROUP: &'static str = GROUP;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = k8s_openapi::ClusterResourceScope;
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
    };
}

watched_kind!(
    /// `policy.networking.k8s.io/v1alpha1` AdminNetworkPolicy (cluster-scoped).
    AdminNetworkPolicy,
    "AdminNetworkPolicy",
    "v1alpha1",
    "adminnetworkpolicies"
);
watched_kind!(
    /// `policy.networking.k8s.io/v1alpha1` BaselineAdminNetworkPolicy (cluster-scoped singleton
    /// `default`).
    BaselineAdminNetworkPolicy,
    "BaselineAdminNetworkPolicy",
    "v1alpha1",
    "baselineadminnetworkpolicies"
);
watched_kind!(
    /// `policy.networking.k8s.io/v1alpha2` ClusterNetworkPolicy (cluster-scoped).
    ClusterNetworkPolicy,
    "ClusterNetworkPolicy",
    "v1alpha2",
    "clusternetworkpolicies"
);

/// `metav1.LabelSelector`, strict.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    pub match_labels: Option<BTreeMap<String, String>>,
    pub match_expressions: Option<Vec<Requirement>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    pub values: Option<Vec<String>>,
}

impl LabelSelector {
    pub fn to_k8s(&self) -> K8sLabelSelector {
        K8sLabelSelector {
            match_labels: self.match_labels.clone(),
            match_expressions: self.match_expressions.as_ref().map(|es| {
                es.iter()
                    .map(|e| LabelSelectorRequirement {
                        key: e.key.clone(),
                        operator: e.operator.clone(),
                        values: e.values.clone(),
                    })
                    .collect()
            }),
        }
    }
}

/// `NamespacedPod`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespacedPod {
    pub namespace_selector: LabelSelector,
    pub pod_selector: LabelSelector,
}

/// The subject of every kind (exactly one of the two).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    pub namespaces: Option<LabelSelector>,
    pub pods: Option<NamespacedPod>,
}

/// A peer of every kind and direction (ingress peers have only `namespaces` and `pods`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Peer {
    pub namespaces: Option<LabelSelector>,
    pub pods: Option<NamespacedPod>,
    pub nodes: Option<LabelSelector>,
    pub networks: Option<Vec<String>>,
    pub domain_names: Option<Vec<String>>,
}

/// v1alpha1 `AdminNetworkPolicyPort` (exactly one of the three).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnpPort {
    pub port_number: Option<AnpPortNumber>,
    pub named_port: Option<String>,
    pub port_range: Option<AnpPortRange>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnpPortNumber {
    /// Defaults to TCP.
    pub protocol: Option<String>,
    pub port: i64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnpPortRange {
    /// Defaults to TCP.
    pub protocol: Option<String>,
    pub start: i64,
    pub end: i64,
}

/// One v1alpha1 rule (ANP and BANP, ingress and egress: `from` or `to`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnpRule {
    pub name: Option<String>,
    pub action: String,
    pub from: Option<Vec<Peer>>,
    pub to: Option<Vec<Peer>>,
    pub ports: Option<Vec<AnpPort>>,
}

/// `AdminNetworkPolicySpec` / `BaselineAdminNetworkPolicySpec` (BANP has no priority).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnpSpec {
    pub priority: Option<i64>,
    pub subject: Subject,
    pub ingress: Option<Vec<AnpRule>>,
    pub egress: Option<Vec<AnpRule>>,
}

/// v1alpha2 `Port`: a number or a range.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CnpPort {
    pub number: Option<i64>,
    pub range: Option<CnpPortRange>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CnpPortRange {
    pub start: i64,
    pub end: i64,
}

/// `ClusterNetworkPolicyProtocolTCP` (and UDP, SCTP).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CnpL4 {
    pub destination_port: Option<CnpPort>,
}

/// `ClusterNetworkPolicyProtocol` (exactly one field).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CnpProtocol {
    pub tcp: Option<CnpL4>,
    pub udp: Option<CnpL4>,
    pub sctp: Option<CnpL4>,
    pub destination_named_port: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CnpRule {
    pub name: Option<String>,
    pub action: String,
    pub from: Option<Vec<Peer>>,
    pub to: Option<Vec<Peer>>,
    pub protocols: Option<Vec<CnpProtocol>>,
}

/// `ClusterNetworkPolicySpec`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CnpSpec {
    pub tier: String,
    pub priority: i64,
    pub subject: Subject,
    pub ingress: Option<Vec<CnpRule>>,
    pub egress: Option<Vec<CnpRule>>,
}
