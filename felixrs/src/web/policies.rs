//! `GET /api/policies`: each policy's (and profile's, and tier end's) hits, from the kernel
//! counters the agent already reads for `/metrics` (every `--counters-interval`, both families
//! summed), with the flows it decided and its staged differences, counted from the flow
//! records the hub keeps.
//!
//! The document:
//! ```json
//! {"node": "node-1", "flows_kept": 120,
//!  "policies": [{"kind": "NetworkPolicy", "tier": "default", "namespace": "prod", "name": "allow-web",
//!                "counters": [{"direction": "ingress", "action": "allow", "packets": 12, "bytes": 840}],
//!                "packets": 12, "bytes": 840,
//!                "flows": {"allow": 3, "deny": 0},
//!                "staged": {"would_allow": 0, "would_deny": 2}}]}
//! ```
//! `kind` is the flow records' kind (`NetworkPolicy`, `GlobalNetworkPolicy`, `Profile`,
//! `EndOfTier` with `name` = `tier`, `NoProfile` with an empty name, and the staged kinds);
//! `tier` and `namespace` are `null` where the kind has none. `flows` counts the kept records
//! whose enforced verdict this policy decided, by verdict; `staged` the kept records whose
//! staged verdict differs from the enforced one and that this policy decided in the staged
//! evaluation (`pending`), by the staged verdict. Most packets first, then most staged
//! differences, then most flows.

use std::collections::BTreeMap;
use std::sync::Arc;

use calc_graph::proto::IpVersion;
use iptables::stats::{CounterKey, Tally};
use serde::Serialize;

use crate::flowlog::{FlowAction, FlowRecord, PolicyHit};

/// The `/api/policies` document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoliciesDoc {
    pub node: String,
    /// Flow records the hub keeps (what `flows` and `staged` count over).
    pub flows_kept: usize,
    pub policies: Vec<PolicyDoc>,
}

/// One policy, profile or tier end.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct PolicyDoc {
    pub kind: String,
    pub tier: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub counters: Vec<CounterDoc>,
    pub packets: u64,
    pub bytes: u64,
    pub flows: FlowCounts,
    pub staged: StagedCounts,
}

/// Kernel counters of one direction and action.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CounterDoc {
    pub direction: &'static str,
    pub action: &'static str,
    pub packets: u64,
    pub bytes: u64,
}

/// Flow records a policy decided, by enforced verdict.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct FlowCounts {
    pub allow: u64,
    pub deny: u64,
}

/// Flow records a policy would decide differently, by staged verdict.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct StagedCounts {
    pub would_allow: u64,
    pub would_deny: u64,
}

/// (kind, tier, namespace, name): one row.
type Key = (String, Option<String>, Option<String>, String);
/// A row's kernel counters: (direction, action) → (packets, bytes).
type ByAction = BTreeMap<(&'static str, &'static str), (u64, u64)>;

/// A counter key as a flow record names the same thing.
fn counter_identity(k: &CounterKey) -> Key {
    let kind = match k.source.as_str() {
        "networkpolicy" => "NetworkPolicy",
        "globalnetworkpolicy" => "GlobalNetworkPolicy",
        "profile" => "Profile",
        "tier-end" => "EndOfTier",
        "profile-end" => "NoProfile",
        other => other,
    };
    let tier = (!k.tier.is_empty()).then(|| k.tier.clone());
    match kind {
        "EndOfTier" => (kind.into(), tier, None, k.tier.clone()),
        "NoProfile" => (kind.into(), None, None, String::new()),
        _ => match k.name.split_once('/') {
            Some((ns, name)) => (kind.into(), tier, Some(ns.into()), name.into()),
            None => (kind.into(), tier, None, k.name.clone()),
        },
    }
}

fn hit_identity(h: &PolicyHit) -> Key {
    match h.kind.as_str() {
        "EndOfTier" => (
            h.kind.clone(),
            Some(h.tier.clone().unwrap_or_else(|| h.name.clone())),
            None,
            h.name.clone(),
        ),
        "NoProfile" => (h.kind.clone(), None, None, String::new()),
        _ => (
            h.kind.clone(),
            h.tier.clone(),
            h.namespace.clone(),
            h.name.clone(),
        ),
    }
}

/// The hit that decided: the last one that did not pass the packet on.
fn deciding(hits: &[PolicyHit]) -> Option<&PolicyHit> {
    (hits.iter().rev().find(|h| h.action != FlowAction::Pass)).or(hits.last())
}

/// The document for `node` from the last counter tallies and the kept flow records.
pub fn policies_of(
    node: &str,
    tallies: &[(IpVersion, Tally)],
    records: &[Arc<FlowRecord>],
) -> PoliciesDoc {
    let mut rows: BTreeMap<Key, PolicyDoc> = BTreeMap::new();
    let mut counters: BTreeMap<Key, ByAction> = BTreeMap::new();
    for (_, tally) in tallies {
        for (k, c) in &tally.counters {
            let e = counters
                .entry(counter_identity(k))
                .or_default()
                .entry((k.direction.as_str(), k.action.as_str()))
                .or_default();
            e.0 += c.packets;
            e.1 += c.bytes;
        }
    }
    for (key, by) in counters {
        let doc = entry(&mut rows, key);
        for ((direction, action), (packets, bytes)) in by {
            doc.packets += packets;
            doc.bytes += bytes;
            doc.counters.push(CounterDoc {
                direction,
                action,
                packets,
                bytes,
            });
        }
    }
    for r in records {
        if let Some(h) = deciding(&r.policies.enforced) {
            let doc = entry(&mut rows, hit_identity(h));
            match r.action {
                FlowAction::Deny => doc.flows.deny += 1,
                _ => doc.flows.allow += 1,
            }
        }
        if r.staged_differs()
            && let Some(h) = deciding(&r.policies.pending)
        {
            let doc = entry(&mut rows, hit_identity(h));
            match r.pending_action {
                Some(FlowAction::Deny) => doc.staged.would_deny += 1,
                _ => doc.staged.would_allow += 1,
            }
        }
    }
    let mut policies: Vec<PolicyDoc> = rows.into_values().collect();
    policies.sort_by(|a, b| {
        let rank = |p: &PolicyDoc| {
            (
                p.packets,
                p.staged.would_allow + p.staged.would_deny,
                p.flows.allow + p.flows.deny,
            )
        };
        rank(b).cmp(&rank(a))
    });
    PoliciesDoc {
        node: node.to_string(),
        flows_kept: records.len(),
        policies,
    }
}

fn entry(rows: &mut BTreeMap<Key, PolicyDoc>, key: Key) -> &mut PolicyDoc {
    rows.entry(key.clone()).or_insert_with(|| PolicyDoc {
        kind: key.0,
        tier: key.1,
        namespace: key.2,
        name: key.3,
        ..PolicyDoc::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flowlog::{FlowEnd, FlowPolicies, Reporter};
    use iptables::model::Counters;
    use iptables::stats::{Action, Direction, Source};

    fn hit(kind: &str, ns: Option<&str>, name: &str, action: FlowAction) -> PolicyHit {
        PolicyHit {
            kind: kind.into(),
            tier: (kind != "Profile").then(|| "default".into()),
            namespace: ns.map(Into::into),
            name: name.into(),
            action,
            rule_index: None,
        }
    }

    fn record(
        action: FlowAction,
        enforced: Vec<PolicyHit>,
        pending_action: Option<FlowAction>,
        pending: Vec<PolicyHit>,
    ) -> Arc<FlowRecord> {
        Arc::new(FlowRecord {
            start_time: 1,
            end_time: 2,
            host: "n".into(),
            reporter: Reporter::Dst,
            proto: "tcp".into(),
            source: FlowEnd::default(),
            dest: FlowEnd::default(),
            action,
            pending_action,
            policies: FlowPolicies { enforced, pending },
            num_connections_started: 1,
            num_connections_completed: 0,
            num_connections_live: 0,
            packets_in: 1,
            packets_out: 0,
            bytes_in: 60,
            bytes_out: 0,
        })
    }

    /// Counters of both families are summed under the flow records' names; a record counts for
    /// the policy that decided it (not one that passed), and a staged difference for the policy
    /// that decided the staged evaluation.
    #[test]
    fn counters_and_flows_meet_under_one_name() {
        let mut tally = Tally::default();
        for (source, tier, name, action, packets) in [
            (
                Source::NetworkPolicy,
                "default",
                "prod/allow-web",
                Action::Allow,
                5,
            ),
            (Source::TierEnd, "default", "", Action::Deny, 2),
            (Source::Profile, "", "kns.prod", Action::Allow, 1),
        ] {
            tally.counters.insert(
                CounterKey {
                    source,
                    tier: tier.into(),
                    name: name.into(),
                    direction: Direction::Ingress,
                    action,
                },
                Counters {
                    packets,
                    bytes: packets * 100,
                },
            );
        }
        let tallies = vec![(IpVersion::V4, tally.clone()), (IpVersion::V6, tally)];
        let records = vec![
            record(
                FlowAction::Allow,
                vec![
                    hit("GlobalNetworkPolicy", None, "pass-all", FlowAction::Pass),
                    hit(
                        "NetworkPolicy",
                        Some("prod"),
                        "allow-web",
                        FlowAction::Allow,
                    ),
                ],
                Some(FlowAction::Deny),
                vec![hit(
                    "StagedNetworkPolicy",
                    Some("prod"),
                    "deny-all",
                    FlowAction::Deny,
                )],
            ),
            record(
                FlowAction::Deny,
                vec![PolicyHit {
                    kind: "EndOfTier".into(),
                    tier: Some("default".into()),
                    namespace: None,
                    name: "default".into(),
                    action: FlowAction::Deny,
                    rule_index: None,
                }],
                Some(FlowAction::Deny),
                vec![],
            ),
        ];
        let doc = policies_of("n", &tallies, &records);
        assert_eq!(doc.flows_kept, 2);
        let by = |kind: &str, name: &str| {
            doc.policies
                .iter()
                .find(|p| p.kind == kind && p.name == name)
                .unwrap_or_else(|| panic!("{kind} {name} in {:?}", doc.policies))
        };
        let web = by("NetworkPolicy", "allow-web");
        assert_eq!(
            (web.namespace.as_deref(), web.tier.as_deref()),
            (Some("prod"), Some("default"))
        );
        assert_eq!((web.packets, web.bytes), (10, 1000));
        assert_eq!(web.flows, FlowCounts { allow: 1, deny: 0 });
        assert_eq!(web.staged, StagedCounts::default());
        let end = by("EndOfTier", "default");
        assert_eq!((end.packets, end.flows.deny), (4, 1));
        assert_eq!(by("Profile", "kns.prod").tier, None);
        let staged = by("StagedNetworkPolicy", "deny-all");
        assert_eq!(
            staged.staged,
            StagedCounts {
                would_allow: 0,
                would_deny: 1
            }
        );
        assert!(
            !doc.policies.iter().any(|p| p.name == "pass-all"),
            "a policy that passed decided nothing"
        );
        // Most packets first.
        assert_eq!(doc.policies[0].name, "allow-web");
    }
}
