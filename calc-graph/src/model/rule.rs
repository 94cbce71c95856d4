//! Policy and profile rules (`Rule`, `EntityRule`) in Calico's v3 JSON form.
//!
//! A rule's `action` is required (Calico rejects a rule without one). `source` and
//! `destination` are omitted on output when empty (Go writes `{}`; both forms decode the same).
//! Selector strings are kept verbatim; the calculation graph parses and rewrites them.

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::domain::DomainPattern;
use super::metadata::{empty_as_none, nets, null_as_default};
use super::primitives::{Action, IcmpFields, IpVersion, Port, Protocol};

/// One ingress or egress rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub action: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_version: Option<IpVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_protocol: Option<Protocol>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp: Option<IcmpFields>,
    #[serde(rename = "notICMP", default, skip_serializing_if = "Option::is_none")]
    pub not_icmp: Option<IcmpFields>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "EntityRule::is_empty"
    )]
    pub source: EntityRule,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "EntityRule::is_empty"
    )]
    pub destination: EntityRule,
    /// L7 match; ignored by the iptables dataplane (felix-reference §10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpMatch>,
    /// `metadata.annotations`, rendered as rule comments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RuleMetadata>,
    /// Paths (relative to the rule, `source.selectr`) of fields the document had and the schema
    /// does not know; filled by [`crate::model::Resource`]'s decoding, never serialised. A rule
    /// with one fails safe, as a rule with an unenforced field does.
    #[serde(skip)]
    pub unknown_fields: Vec<String>,
}

/// Whether a rule sets a field.
pub type IsSet = fn(&Rule) -> bool;

/// The fields of a rule that are part of the upstream schema but that this dataplane does not
/// enforce, each with how to tell it is set. THE one list: a rule that sets one of these (or has
/// an unknown field) fails safe. An Allow rule is not rendered; a Deny or Log rule is rendered
/// with its other matches, so it denies (logs) at least what was written; a Pass rule becomes a
/// Deny of its other matches (dropping it would let a later Allow of its tier take what it passed). When a field
/// becomes enforced, remove it here (as `destination.domains` was with FQDN policy).
pub const UNENFORCED_RULE_FIELDS: &[(&str, IsSet)] = &[
    // L7: enforced by Calico's Envoy/Dikastes, never by iptables.
    ("http", |r| r.http.is_some()),
    // Kubernetes Service matches: no Service data reaches the agent.
    ("source.services", |r| r.source.services.is_some()),
    ("destination.services", |r| r.destination.services.is_some()),
    // DNS (FQDN) policy, Calico Enterprise's `domains`: a source has no domain name. (A
    // `destination.domains` is enforced in egress Allow rules; the graph's rule scanner fails
    // every other use of it safe, with the reason.)
    ("source.domains", |r| !r.source.domains.is_empty()),
];

impl Rule {
    /// A rule with only an action (`{action: Allow}` is "allow everything").
    pub fn new(action: Action) -> Rule {
        Rule {
            action,
            ip_version: None,
            protocol: None,
            not_protocol: None,
            icmp: None,
            not_icmp: None,
            source: EntityRule::default(),
            destination: EntityRule::default(),
            http: None,
            metadata: None,
            unknown_fields: Vec::new(),
        }
    }

    /// The fields of this rule that are set but not enforced ([`UNENFORCED_RULE_FIELDS`]), as
    /// paths relative to the rule.
    pub fn unenforced_fields(&self) -> Vec<&'static str> {
        UNENFORCED_RULE_FIELDS
            .iter()
            .filter(|(_, is_set)| is_set(self))
            .map(|(name, _)| *name)
            .collect()
    }

    /// Why the rule's `destination.domains` cannot be enforced as written, as (field, reason)
    /// pairs relative to the rule; empty when it has none or they are enforced. `egress`: the rule
    /// is an egress rule.
    ///
    /// Domains (FQDN policy) are enforced only in egress Allow rules (a destination match in the
    /// learned addresses of the names, AND-ed with the rule's other matches), never together
    /// with another destination address match (Calico Enterprise forbids the combination), and
    /// only when every name is valid ([`DomainPattern::parse`]); every other use makes the rule
    /// fail safe with these reasons. A bad name is never dropped from the list alone (that would
    /// change what the rule allows).
    pub fn rejected_domain_fields(&self, egress: bool) -> Vec<(String, String)> {
        let d = &self.destination;
        if d.domains.is_empty() {
            return Vec::new();
        }
        let whole = |reason: String| vec![("destination.domains".to_string(), reason)];
        if !egress {
            return whole("domains are enforced only in egress rules".into());
        }
        if self.action != Action::Allow {
            return whole(format!(
                "domains are enforced only in Allow rules, not {:?}",
                self.action
            ));
        }
        let mut problems: Vec<(String, String)> = (d.domains.iter().enumerate())
            .filter_map(|(i, raw)| {
                let e = DomainPattern::parse(raw).err()?;
                Some((format!("destination.domains[{i}]"), e.to_string()))
            })
            .collect();
        let others: Vec<&str> = [
            ("nets", !d.nets.is_empty()),
            ("notNets", !d.not_nets.is_empty()),
            ("selector", d.selector.is_some()),
            ("notSelector", d.not_selector.is_some()),
            ("namespaceSelector", d.namespace_selector.is_some()),
            ("serviceAccounts", d.service_accounts.is_some()),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| name)
        .collect();
        if !others.is_empty() {
            problems.push((
                "destination.domains".to_string(),
                format!(
                    "domains cannot be combined with destination.{}",
                    others.join(", destination.")
                ),
            ));
        }
        problems
    }

    /// Whether the rule must fail safe: it has an unknown or an unenforced field.
    pub fn fails_safe(&self) -> bool {
        !self.unknown_fields.is_empty() || UNENFORCED_RULE_FIELDS.iter().any(|(_, s)| s(self))
    }

    /// The rule's annotations (empty when it has no metadata).
    pub fn annotations(&self) -> impl Iterator<Item = (&String, &String)> {
        self.metadata.iter().flat_map(|m| m.annotations.iter())
    }
}

/// The source or destination half of a rule. All present fields must match (AND); within a list,
/// any entry matches (OR); `not*` fields match when none of their entries do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EntityRule {
    #[serde(with = "nets", skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<IpNet>,
    #[serde(with = "nets", skip_serializing_if = "Vec::is_empty")]
    pub not_nets: Vec<IpNet>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub selector: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub not_selector: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace_selector: Option<String>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ports: Vec<Port>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub not_ports: Vec<Port>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_accounts: Option<ServiceAccountMatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub services: Option<ServiceMatch>,
    /// DNS names (Calico Enterprise); known so that a rule using it fails safe.
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub domains: Vec<String>,
}

impl EntityRule {
    pub fn is_empty(&self) -> bool {
        *self == EntityRule::default()
    }

    /// Whether any selector-like field is set (selector, notSelector, namespaceSelector,
    /// serviceAccounts): the condition under which Calico ANDs in the policy's namespace.
    pub fn has_selector_fields(&self) -> bool {
        self.selector.is_some()
            || self.not_selector.is_some()
            || self.namespace_selector.is_some()
            || self.service_accounts.is_some()
    }
}

/// `serviceAccounts`: match endpoints by service account name and/or labels.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceAccountMatch {
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub names: Vec<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub selector: Option<String>,
}

/// `services`: match the endpoints of a Kubernetes Service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceMatch {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace: Option<String>,
}

/// `http`: L7 match on methods and paths.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpMatch {
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub methods: Vec<String>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub paths: Vec<HttpPath>,
}

/// One entry of `http.paths`: exactly one of `exact` or `prefix`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpPath {
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub exact: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub prefix: Option<String>,
}

/// A rule's own `metadata`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RuleMetadata {
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn full_rule_round_trips() {
        let v = json!({
            "action": "Allow",
            "ipVersion": 4,
            "protocol": "TCP",
            "notProtocol": 17,
            "source": {
                "nets": ["10.0.0.0/8"],
                "notNets": ["10.1.0.0/16"],
                "selector": "app == 'web'",
                "notSelector": "bad == 'true'",
                "namespaceSelector": "team == 'a'",
                "ports": [1024, "2000:3000"],
                "notPorts": ["metrics"],
                "serviceAccounts": {"names": ["api"], "selector": "x == 'y'"}
            },
            "destination": {"ports": [80, "http"], "services": {"name": "db", "namespace": "prod"}},
            "http": {"methods": ["GET"], "paths": [{"exact": "/a"}, {"prefix": "/b"}]},
            "metadata": {"annotations": {"owner": "ops"}}
        });
        let rule: Rule = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(rule.protocol, Some(Protocol::Tcp));
        assert_eq!(rule.not_protocol, Some(Protocol::Number(17)));
        assert_eq!(rule.source.ports[1], Port::Range(2000, 3000));
        assert_eq!(
            rule.annotations().collect::<Vec<_>>(),
            vec![(&"owner".to_string(), &"ops".to_string())]
        );
        assert_eq!(serde_json::to_value(&rule).unwrap(), v);
    }

    #[test]
    fn empty_parts_are_omitted_and_nulls_tolerated() {
        let rule: Rule = serde_json::from_value(json!({
            "action": "Deny", "source": {}, "destination": null,
            "icmp": {"type": 8}, "notICMP": {"type": 3, "code": 1},
            "unknownFutureField": true
        }))
        .unwrap();
        assert_eq!(
            serde_json::to_value(&rule).unwrap(),
            json!({"action": "Deny", "icmp": {"type": 8}, "notICMP": {"type": 3, "code": 1}})
        );
        assert_eq!(
            serde_json::to_value(Rule::new(Action::Pass)).unwrap(),
            json!({"action": "Pass"})
        );
    }

    #[test]
    fn action_is_required() {
        let err = serde_json::from_value::<Rule>(json!({"protocol": "TCP"})).unwrap_err();
        assert!(err.to_string().contains("missing field `action`"), "{err}");
    }

    #[test]
    fn bare_ip_nets_become_host_routes() {
        let e: EntityRule =
            serde_json::from_value(json!({"nets": ["10.0.0.1", "fd00::/64"]})).unwrap();
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({"nets": ["10.0.0.1/32", "fd00::/64"]})
        );
    }
}
