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

/// Endpoint and policy names, by address and by prefix id.
#[derive(Debug, Clone, Default)]
pub struct Names {
    by_ip: HashMap<IpAddr, FlowEnd>,
    /// Network sets' nets, longest prefix first.
    nets: Vec<(IpNet, FlowEnd)>,
    /// Policy chain id (what our prefixes carry) -> (kind, tier, namespace, name).
    policies: HashMap<String, (String, String, Option<String>, String)>,
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
                        out.by_ip.entry(n.addr()).or_insert_with(|| e.clone());
                    }
                }
                Resource::HostEndpoint(h) => {
                    let e = end("hep", None, &h.metadata.name, &h.metadata.labels);
                    for a in &h.spec.expected_ips {
                        out.by_ip.entry(*a).or_insert_with(|| e.clone());
                    }
                }
                Resource::NetworkSet(s) => {
                    let e = end(
                        "ns",
                        s.metadata.namespace.as_deref(),
                        &s.metadata.name,
                        &s.metadata.labels,
                    );
                    out.nets.extend(s.spec.nets.iter().map(|n| (*n, e.clone())));
                }
                Resource::GlobalNetworkSet(s) => {
                    let e = end("ns", None, &s.metadata.name, &s.metadata.labels);
                    out.nets.extend(s.spec.nets.iter().map(|n| (*n, e.clone())));
                }
                _ => {}
            }
        }
        out.nets
            .sort_by_key(|(n, _)| std::cmp::Reverse(n.prefix_len()));
        for id in renderer.policy_ids() {
            let kind = id.kind.as_str();
            let chain_id = names::policy_chain_id(id);
            out.hashed.insert(
                names::hashed_id("", &chain_id, usize::MAX),
                chain_id.clone(),
            );
            out.policies.insert(
                chain_id,
                (
                    kind.to_string(),
                    id.tier.clone(),
                    id.namespace.clone(),
                    id.name.clone(),
                ),
            );
        }
        out
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
    fn unhashed(&self, id: &str) -> Option<&(String, String, Option<String>, String)> {
        if !id.starts_with('_') || id.len() < 16 {
            return None;
        }
        let (hash, chain_id) = self.hashed.range(id.to_string()..).next()?;
        hash.starts_with(id)
            .then(|| self.policies.get(chain_id))
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
            "policy" => match self.policies.get(p.id).or_else(|| self.unhashed(p.id)) {
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
