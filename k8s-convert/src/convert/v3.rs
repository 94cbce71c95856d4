//! The Calico `projectcalico.org/v3` JSON this crate writes, as typed serde structs.
//!
//! Field names and field order follow libcalico-go's Go structs (`api/pkg/apis/projectcalico/v3`), so a
//! value written here reads the same as one written by kube-controllers or the CNI plugin. Empty optional
//! fields are omitted exactly where Go's `omitempty` omits them; `source`/`destination` are always present
//! because Go's `omitempty` never omits a struct.

use std::collections::BTreeMap;

use serde::Serialize;

/// The API group/version every resource carries.
pub const API_VERSION: &str = "projectcalico.org/v3";

/// A complete v3 object: `kind`, `apiVersion`, `metadata`, `spec`.
#[derive(Debug, Clone, Serialize)]
pub struct Object<S> {
    pub kind: &'static str,
    #[serde(rename = "apiVersion")]
    pub api_version: &'static str,
    pub metadata: Meta,
    pub spec: S,
}

/// The subset of Kubernetes `ObjectMeta` Calico keeps in the store.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// `NetworkPolicySpec` (Go field order: tier, order, ingress, egress, selector, types).
#[derive(Debug, Clone, Serialize)]
pub struct NetworkPolicySpec {
    pub tier: &'static str,
    pub order: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<Rule>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Rule>,
    pub selector: String,
    pub types: Vec<&'static str>,
}

/// `ProfileSpec`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileSpec {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<Rule>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Rule>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels_to_apply: BTreeMap<String, String>,
}

/// `WorkloadEndpointSpec` (only the fields a pod conversion fills).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadEndpointSpec {
    pub orchestrator: &'static str,
    pub node: String,
    #[serde(rename = "containerID", skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    pub pod: String,
    pub endpoint: &'static str,
    pub service_account_name: String,
    pub ip_networks: Vec<String>,
    pub profiles: Vec<String>,
    pub interface_name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<EndpointPort>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_spoofed_source_prefixes: Vec<String>,
}

/// A named port on a workload endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPort {
    pub name: String,
    pub protocol: String,
    pub port: u16,
    #[serde(skip_serializing_if = "is_zero")]
    pub host_port: u16,
    #[serde(rename = "hostIP", skip_serializing_if = "String::is_empty")]
    pub host_ip: String,
}

fn is_zero(n: &u16) -> bool {
    *n == 0
}

/// A policy or profile rule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rule {
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    pub source: EntityRule,
    pub destination: EntityRule,
    /// `metadata.annotations` (rendered as rule comments); omitted when empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RuleMetadata>,
}

impl Rule {
    /// `{action: Allow}` with no match criteria.
    pub fn allow_all() -> Self {
        Rule::matching_all("Allow")
    }

    /// `{action: <action>}` with no match criteria.
    pub fn matching_all(action: &'static str) -> Self {
        Rule {
            action,
            protocol: None,
            source: EntityRule::default(),
            destination: EntityRule::default(),
            metadata: None,
        }
    }
}

/// A rule's `metadata`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleMetadata {
    pub annotations: BTreeMap<String, String>,
}

/// `GlobalNetworkPolicySpec` (Go field order: tier, order, ingress, egress, selector, types, ...,
/// namespaceSelector).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GlobalNetworkPolicySpec {
    pub tier: &'static str,
    pub order: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<Rule>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Rule>,
    pub selector: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<&'static str>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace_selector: String,
}

/// `TierSpec`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TierSpec {
    pub order: f64,
    pub default_action: &'static str,
}

/// One side of a rule (Go field order: nets, selector, namespaceSelector, ports, notNets).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntityRule {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub selector: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace_selector: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortSpec>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_nets: Vec<String>,
    /// Calico's `domains` (destination only): egress by DNS name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<String>,
}

/// A rule port as Calico's `numorstring.Port` writes it: a number, `"min:max"` or a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSpec {
    Number(u16),
    Range(u16, u16),
    Named(String),
}

impl Serialize for PortSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PortSpec::Number(n) => s.serialize_u16(*n),
            PortSpec::Range(a, b) => s.serialize_str(&format!("{a}:{b}")),
            PortSpec::Named(n) => s.serialize_str(n),
        }
    }
}
