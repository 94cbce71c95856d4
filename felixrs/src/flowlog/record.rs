//! The flow record: the connections of one 5-tuple (and reporter) during one aggregation
//! interval, with the endpoints at both ends, the enforced verdict and the policy rule that
//! decided it, and what the staged policies would have decided.
//!
//! One JSON object per line (`serde_json::to_string`); every string is JSON-escaped, so no
//! name, label or kernel prefix can forge a field or a line. Readers ignore unknown fields
//! (records may gain fields; none is ever renamed or removed).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Which side of the flow this node saw: the egress of a local source, or the ingress of a
/// local destination (Calico's `reporter`). A flow between two local pods is reported twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reporter {
    Src,
    Dst,
}

/// A verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowAction {
    Allow,
    Deny,
    /// Only in a [`PolicyHit`]: the policy passed the packet to the next tier.
    Pass,
}

/// One end of a flow.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FlowEnd {
    pub ip: Option<IpAddr>,
    pub port: Option<u16>,
    /// `wep` (a workload endpoint), `hep` (a host endpoint), `ns` (a network set) or `net`
    /// (anything else).
    #[serde(rename = "type")]
    pub kind: String,
    /// The endpoint's or network set's namespace; `None` for global ones and for `net`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The pod (workload), host endpoint or network set name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A policy (or profile, or tier end) that acted on the flow, in evaluation order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyHit {
    /// The kind as the datastore names it: `NetworkPolicy`, `GlobalNetworkPolicy`,
    /// `StagedNetworkPolicy`, `StagedGlobalNetworkPolicy`, `StagedKubernetesNetworkPolicy`,
    /// `Profile`, or `EndOfTier` (no policy of the tier decided; `name` is the tier) and
    /// `NoProfile` (no profile decided).
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    pub action: FlowAction,
    /// The rule's index in the policy's rules of that direction, when a rule decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_index: Option<u32>,
}

/// The policies that decided the flow: as enforced, and as it would be with every staged
/// policy enforced in its tier and order (Calico's "pending" policies).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FlowPolicies {
    pub enforced: Vec<PolicyHit>,
    /// Empty when no staged policy would change how this flow is evaluated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PolicyHit>,
}

/// One flow log record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRecord {
    /// Start and end of the aggregation interval, Unix seconds.
    pub start_time: u64,
    pub end_time: u64,
    /// The node that reported it.
    pub host: String,
    pub reporter: Reporter,
    /// `tcp`, `udp`, `icmp`, `icmp6`, `sctp`, or the protocol number.
    pub proto: String,
    pub source: FlowEnd,
    pub dest: FlowEnd,
    /// The enforced verdict.
    pub action: FlowAction,
    /// The verdict with the staged policies enforced; `None` when no staged policy applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_action: Option<FlowAction>,
    pub policies: FlowPolicies,
    pub num_connections_started: u64,
    pub num_connections_completed: u64,
    pub num_connections_live: u64,
    /// Counted from the reporter's endpoint: `out` is what it sent, `in` what it received.
    pub packets_in: u64,
    pub packets_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl FlowRecord {
    /// Whether the staged policies would have decided this flow differently.
    pub fn staged_differs(&self) -> bool {
        self.pending_action.is_some_and(|p| p != self.action)
    }

    /// One JSON line (no trailing newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a flow record always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> FlowRecord {
        FlowRecord {
            start_time: 1_800_000_000,
            end_time: 1_800_000_015,
            host: "node-a".into(),
            reporter: Reporter::Dst,
            proto: "tcp".into(),
            source: FlowEnd {
                ip: Some("10.65.0.2".parse().unwrap()),
                port: Some(40312),
                kind: "wep".into(),
                namespace: Some("prod".into()),
                name: Some("client\"\n{".into()),
                labels: BTreeMap::from([("app".into(), "client".into())]),
            },
            dest: FlowEnd {
                ip: Some("10.65.0.3".parse().unwrap()),
                port: Some(80),
                kind: "wep".into(),
                namespace: Some("prod".into()),
                name: Some("web".into()),
                labels: BTreeMap::new(),
            },
            action: FlowAction::Allow,
            pending_action: Some(FlowAction::Deny),
            policies: FlowPolicies {
                enforced: vec![PolicyHit {
                    kind: "Profile".into(),
                    tier: None,
                    namespace: None,
                    name: "kns.prod".into(),
                    action: FlowAction::Allow,
                    rule_index: Some(0),
                }],
                pending: vec![PolicyHit {
                    kind: "StagedNetworkPolicy".into(),
                    tier: Some("default".into()),
                    namespace: Some("prod".into()),
                    name: "deny-all".into(),
                    action: FlowAction::Deny,
                    rule_index: None,
                }],
            },
            num_connections_started: 1,
            num_connections_completed: 0,
            num_connections_live: 1,
            packets_in: 3,
            packets_out: 2,
            bytes_in: 180,
            bytes_out: 120,
        }
    }

    #[test]
    fn a_record_is_one_json_line_that_reads_back() {
        let r = record();
        let line = r.to_json_line();
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.contains(r#""name":"client\"\n{""#.replace("\n", "\\n").as_str()),
            "{line}"
        );
        assert!(line.contains(r#""type":"wep""#), "{line}");
        assert!(line.contains(r#""pending_action":"deny""#), "{line}");
        assert!(r.staged_differs());
        let back: FlowRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn readers_ignore_fields_they_do_not_know() {
        let mut v = serde_json::to_value(record()).unwrap();
        v["a_future_field"] = serde_json::json!(1);
        let back: FlowRecord = serde_json::from_value(v).unwrap();
        assert_eq!(back, record());
    }
}
