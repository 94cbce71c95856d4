//! What the collector names: the endpoints at a flow's ends (local and remote workload
//! endpoints with pod, namespace and labels, host endpoints, network sets) and the policies an
//! NFLOG prefix names (its chain id -> kind, tier, namespace, name as the datastore has them),
//! built from the agent's view (the same resources and renderer the operator tools read).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use calc_graph::model::Resource;
use ipnet::IpNet;
use iptables::render::{Renderer, names};

use super::nflog::Prefix;
use super::{FlowAction, FlowEnd, PolicyHit};

/// A policy's (kind, tier, namespace, name).
type PolicyName = (String, String, Option<String>, String);

/// Endpoint and policy names, by address and by prefix id.
#[derive(Debug, Clone, Default)]
pub struct Names {
    by_ip: HashMap<IpAddr, FlowEnd>,
    /// Network sets' nets, longest prefix first.
    nets: Vec<(IpNet, FlowEnd)>,
    /// Policy chain id (what our prefixes carry) -> (kind, tier, namespace, name).
    policies: HashMap<String, PolicyName>,
    /// The policies the previous [`Names::set_policies`] had and the last one had not: a prefix
    /// logged just before its policy left the kernel still names it (for one more update).
    retired: HashMap<String, PolicyName>,
    /// `_` + the full base64url SHA-256 of each policy chain id -> that id: a prefix too long for
    /// the kernel carries this hash cut to fit instead of the id (`render::rule::nflog_prefix`).
    hashed: BTreeMap<String, String>,
}

fn end(kind: &str, ns: Option<&str>, name: &str, labels: &BTreeMap<String, String>) -> FlowEnd {
    FlowEnd {
        ip: None,
        port: None,
        kind: kind.into(),
        namespace: ns.filter(|n| !n.is_empty()).map(str::to_string),
        name: Some(name.to_string()),
        labels: labels.clone(),
    }
}

impl Names {
    /// The names of `resources` (every node's endpoints) and `renderer`'s policies.
    pub fn of(resources: &BTreeMap<String, Resource>, renderer: &Renderer) -> Names {
        let mut out = Names::default();
        out.set_endpoints(resources);
        out.set_policies(renderer);
        out
    }

    /// Replaces the endpoint and network set names with those of `resources` (every node's
    /// endpoints); the policy names stay.
    pub fn set_endpoints(&mut self, resources: &BTreeMap<String, Resource>) {
        self.by_ip.clear();
        self.nets.clear();
        for res in resources.values() {
            match res {
                Resource::WorkloadEndpoint(w) => {
                    let name = w.spec.pod.as_deref().unwrap_or(&w.metadata.name);
                    let e = end(
                        "wep",
                        w.metadata.namespace.as_deref(),
                        name,
                        &w.metadata.labels,
                    );
                    for n in &w.spec.ip_networks {
                        self.by_ip.entry(n.addr()).or_insert_with(|| e.clone());
                    }
                }
                Resource::HostEndpoint(h) => {
                    let e = end("hep", None, &h.metadata.name, &h.metadata.labels);
                    for a in &h.spec.expected_ips {
                        self.by_ip.entry(*a).or_insert_with(|| e.clone());
                    }
                }
                Resource::NetworkSet(s) => {
                    let e = end(
                        "ns",
                        s.metadata.namespace.as_deref(),
                        &s.metadata.name,
                        &s.metadata.labels,
                    );
                    self.nets
                        .extend(s.spec.nets.iter().map(|n| (*n, e.clone())));
                }
                Resource::GlobalNetworkSet(s) => {
                    let e = end("ns", None, &s.metadata.name, &s.metadata.labels);
                    self.nets
                        .extend(s.spec.nets.iter().map(|n| (*n, e.clone())));
                }
                _ => {}
            }
        }
        self.nets
            .sort_by_key(|(n, _)| std::cmp::Reverse(n.prefix_len()));
    }

    /// Replaces the policy names with `renderer`'s policies. The agent calls this with its
    /// enforced renderer after each render and *before* the kernel gets the rules, so no NFLOG
    /// prefix reaches the collector before its policy's name does.
    pub fn set_policies(&mut self, renderer: &Renderer) {
        let mut policies = HashMap::new();
        for id in renderer.policy_ids() {
            let name = (
                id.kind.as_str().to_string(),
                id.tier.clone(),
                id.namespace.clone(),
                id.name.clone(),
            );
            policies.insert(names::policy_chain_id(id), name);
        }
        let old = std::mem::replace(&mut self.policies, policies);
        self.retired = old
            .into_iter()
            .filter(|(id, _)| !self.policies.contains_key(id))
            .collect();
        self.hashed = self
            .policies
            .keys()
            .chain(self.retired.keys())
            .map(|id| (names::hashed_id("", id, usize::MAX), id.clone()))
            .collect();
    }

    fn policy(&self, chain_id: &str) -> Option<&PolicyName> {
        self.policies
            .get(chain_id)
            .or_else(|| self.retired.get(chain_id))
    }

    /// The end at `ip`: a workload or host endpoint, else the narrowest network set holding it,
    /// else `net`.
    pub fn end(&self, ip: IpAddr, port: Option<u16>) -> FlowEnd {
        let mut e = self
            .by_ip
            .get(&ip)
            .or_else(|| {
                self.nets
                    .iter()
                    .find(|(n, _)| n.contains(&ip))
                    .map(|(_, e)| e)
            })
            .cloned()
            .unwrap_or_else(|| FlowEnd {
                kind: "net".into(),
                ..FlowEnd::default()
            });
        e.ip = Some(ip);
        e.port = port;
        e
    }

    /// The policy whose chain id hashes to `id`, a hash cut to fit a prefix (long enough to name
    /// one policy: at least 16 characters).
    fn unhashed(&self, id: &str) -> Option<&PolicyName> {
        if !id.starts_with('_') || id.len() < 16 {
            return None;
        }
        let (hash, chain_id) = self.hashed.range(id.to_string()..).next()?;
        hash.starts_with(id)
            .then(|| self.policy(chain_id))
            .flatten()
    }

    /// The policy hit a prefix names.
    pub fn hit(&self, p: &Prefix<'_>) -> PolicyHit {
        let action = match p.action {
            "allow" => FlowAction::Allow,
            "pass" => FlowAction::Pass,
            _ => FlowAction::Deny,
        };
        let (kind, tier, namespace, name) = match p.kind {
            "policy" => match self.policy(p.id).or_else(|| self.unhashed(p.id)) {
                Some((k, t, ns, n)) => (k.clone(), Some(t.clone()), ns.clone(), n.clone()),
                // Not (yet) in the view: the prefix's id, as the kernel has it.
                None => ("Policy".into(), None, None, p.id.to_string()),
            },
            "profile" => ("Profile".into(), None, None, p.id.to_string()),
            "tier-end" => (
                "EndOfTier".into(),
                Some(p.id.to_string()),
                None,
                p.id.to_string(),
            ),
            _ => ("NoProfile".into(), None, None, p.id.to_string()),
        };
        PolicyHit {
            kind,
            tier,
            namespace,
            name,
            action,
            rule_index: p.rule,
        }
    }
}

#[cfg(test)]
mod tests {
    use calc_graph::proto::{ActivePolicy, Output, PolicyId, PolicyKind};
    use iptables::render::{RenderConfig, Renderer};

    use super::*;

    fn gnp(name: &str) -> PolicyId {
        PolicyId {
            kind: PolicyKind::GlobalNetworkPolicy,
            tier: "default".into(),
            namespace: None,
            name: name.into(),
        }
    }

    fn updated(name: &str) -> Output {
        Output::PolicyUpdated(ActivePolicy {
            id: gnp(name),
            order: Some(1.0),
            inbound_rules: Vec::new(),
            outbound_rules: Vec::new(),
            untracked: false,
            pre_dnat: false,
            apply_on_forward: false,
        })
    }

    fn named(names: &Names, chain_id: &str) -> (String, String) {
        let prefix = format!("DPI0|{chain_id}");
        let hit = names.hit(&super::super::nflog::parse_prefix(&prefix).expect("a prefix"));
        (hit.kind, hit.name)
    }

    #[test]
    fn policy_names_follow_the_renderer_and_a_removed_one_is_kept_for_one_update() {
        let mut r = Renderer::new(RenderConfig::default()).unwrap();
        let mut names = Names::default();
        assert_eq!(
            named(&names, "gnp/a").0,
            "Policy",
            "unknown before any update"
        );
        r.apply_all(vec![updated("a")]);
        names.set_policies(&r);
        assert_eq!(
            named(&names, "gnp/a"),
            ("GlobalNetworkPolicy".into(), "a".into())
        );
        // Removed from the renderer: a prefix logged just before still names it...
        r.apply_all(vec![Output::PolicyRemoved(gnp("a")), updated("b")]);
        names.set_policies(&r);
        assert_eq!(
            named(&names, "gnp/a"),
            ("GlobalNetworkPolicy".into(), "a".into())
        );
        assert_eq!(named(&names, "gnp/b").1, "b");
        // ...until the next update.
        r.apply_all(vec![updated("c")]);
        names.set_policies(&r);
        assert_eq!(named(&names, "gnp/a"), ("Policy".into(), "gnp/a".into()));
        assert_eq!(named(&names, "gnp/b").1, "b");
        // Endpoints are replaced separately and leave the policies alone.
        names.set_endpoints(&BTreeMap::new());
        assert_eq!(named(&names, "gnp/c").1, "c");
    }
}
