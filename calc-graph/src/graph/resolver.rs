//! Policy resolution for one local endpoint: which tiers and policies apply, in order
//! (Felix's `PolicyResolver` and `PolicySorter`).
//!
//! * Tiers sort by `order` ascending, an absent order last, ties by name. The built-in tiers
//!   (`kube-admin` 1 000 Pass, `default` 1 000 000 Deny, `kube-baseline` 10 000 000 Pass) exist
//!   even without a Tier resource; a tier that is named by a policy but does not exist sorts last
//!   with default action Deny (fail closed).
//! * Within a tier, policies sort by `order` ascending (absent = +∞), ties by name, then
//!   namespace, then kind.
//! * A tier appears only if it has at least one policy for the endpoint; a policy joins the
//!   ingress list if its types include Ingress and the egress list if they include Egress.
//! * `doNotTrack` and `preDNAT` policies apply to host endpoints only and never join a workload
//!   endpoint's (normal) tiers.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::model::{Action, Tier, TierSpec};
use crate::proto::{PolicyId, TierInfo};

/// Known tiers: Tier resources plus the built-in defaults.
pub(crate) struct Tiers {
    resources: HashMap<String, TierSpec>,
    builtin: HashMap<String, TierSpec>,
}

impl Default for Tiers {
    fn default() -> Self {
        Tiers {
            resources: HashMap::new(),
            builtin: Tier::builtin()
                .into_iter()
                .map(|t| (t.metadata.name, t.spec))
                .collect(),
        }
    }
}

impl Tiers {
    pub(crate) fn set(&mut self, name: &str, spec: Option<TierSpec>) {
        match spec {
            Some(s) => self.resources.insert(name.to_string(), s),
            None => self.resources.remove(name),
        };
    }

    /// Order and default action of a tier.
    pub(crate) fn lookup(&self, name: &str) -> (Option<f64>, Action) {
        match self.resources.get(name).or_else(|| self.builtin.get(name)) {
            Some(spec) => (spec.order, spec.default_action()),
            None => (None, Action::Deny),
        }
    }
}

/// What the resolver needs to know about one policy matching the endpoint.
#[derive(Debug, Clone)]
pub(crate) struct PolicyRef<'a> {
    pub id: &'a PolicyId,
    pub order: Option<f64>,
    pub ingress: bool,
    pub egress: bool,
}

/// `None` sorts after every number.
fn cmp_order(a: Option<f64>, b: Option<f64>) -> Ordering {
    match (a, b) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

fn cmp_policy(a: &PolicyRef<'_>, b: &PolicyRef<'_>) -> Ordering {
    cmp_order(a.order, b.order)
        .then_with(|| a.id.name.cmp(&b.id.name))
        .then_with(|| a.id.namespace.cmp(&b.id.namespace))
        .then_with(|| a.id.kind.cmp(&b.id.kind))
}

/// The ordered tiers of an endpoint from the (normal) policies that match it.
pub(crate) fn resolve_tiers(mut policies: Vec<PolicyRef<'_>>, tiers: &Tiers) -> Vec<TierInfo> {
    policies.sort_by(cmp_policy);
    let mut by_tier: HashMap<&str, TierInfo> = HashMap::new();
    for p in &policies {
        if !p.ingress && !p.egress {
            continue;
        }
        let t = by_tier.entry(&p.id.tier).or_insert_with(|| TierInfo {
            name: p.id.tier.clone(),
            default_action: tiers.lookup(&p.id.tier).1,
            ingress_policies: Vec::new(),
            egress_policies: Vec::new(),
        });
        if p.ingress {
            t.ingress_policies.push(p.id.clone());
        }
        if p.egress {
            t.egress_policies.push(p.id.clone());
        }
    }
    let mut out: Vec<TierInfo> = by_tier.into_values().collect();
    out.sort_by(|a, b| {
        cmp_order(tiers.lookup(&a.name).0, tiers.lookup(&b.name).0)
            .then_with(|| a.name.cmp(&b.name))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::PolicyKind;

    fn pid(tier: &str, name: &str) -> PolicyId {
        PolicyId {
            kind: PolicyKind::GlobalNetworkPolicy,
            tier: tier.into(),
            namespace: None,
            name: name.into(),
        }
    }

    #[test]
    fn tiers_and_policies_sort_with_absent_order_last() {
        let mut tiers = Tiers::default();
        tiers.set(
            "security",
            Some(TierSpec {
                order: Some(100.0),
                default_action: Some(Action::Pass),
            }),
        );
        tiers.set("zeta", Some(TierSpec::default()));
        let ids = [
            pid("default", "b"),
            pid("default", "a"),
            pid("default", "c"),
            pid("security", "security.x"),
            pid("zeta", "zeta.y"),
            pid("missing", "missing.z"),
        ];
        let refs = vec![
            PolicyRef {
                id: &ids[0],
                order: Some(10.0),
                ingress: true,
                egress: false,
            },
            PolicyRef {
                id: &ids[1],
                order: Some(10.0),
                ingress: true,
                egress: true,
            },
            PolicyRef {
                id: &ids[2],
                order: None,
                ingress: true,
                egress: false,
            },
            PolicyRef {
                id: &ids[3],
                order: None,
                ingress: false,
                egress: true,
            },
            PolicyRef {
                id: &ids[4],
                order: Some(1.0),
                ingress: true,
                egress: false,
            },
            PolicyRef {
                id: &ids[5],
                order: Some(1.0),
                ingress: true,
                egress: false,
            },
        ];
        let out = resolve_tiers(refs, &tiers);
        let names: Vec<&str> = out.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["security", "default", "missing", "zeta"]);
        assert_eq!(out[0].default_action, Action::Pass);
        assert!(out[0].ingress_policies.is_empty());
        assert_eq!(out[1].default_action, Action::Deny);
        let ing: Vec<&str> = out[1]
            .ingress_policies
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(ing, ["a", "b", "c"]);
        assert_eq!(out[1].egress_policies.len(), 1);
        assert_eq!(
            out[2].default_action,
            Action::Deny,
            "missing tier fails closed"
        );
    }
}
