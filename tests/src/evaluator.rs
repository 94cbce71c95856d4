//! An independent evaluator of Kubernetes NetworkPolicy semantics (networking.k8s.io/v1), written from the
//! API reference and nothing else of felixrs. Every case's hand-written expectation is checked against it,
//! so a typo in a case cannot hide a bug in the agent.
//!
//! A connection from pod S to pod D on (port, protocol) is allowed iff
//! * S is not egress-isolated, or some egress rule of a policy selecting S allows D and the port; and
//! * D is not ingress-isolated, or some ingress rule of a policy selecting D allows S and the port.
//!
//! A pod is isolated for a direction when a policy in its namespace selects it and lists that direction in
//! `policyTypes` (which defaults to Ingress, plus Egress when the policy has egress rules).
//!
//! Calico Tiers and GlobalNetworkPolicies ([`crate::calico_eval`]) join by Calico's tier semantics: per
//! direction, the tiers (by order, then name) with at least one policy selecting the pod are walked in
//! order, and in each its selecting policies (by order, none last, then name; a NetworkPolicy is a
//! policy of tier `default` with order 1000 whose rules all Allow). The first rule that matches
//! decides: Allow and Deny for good, Pass on to the next tier. A tier where nothing matched drops,
//! unless its default action is Pass. Past the last tier the namespace's profile allows.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::calico_eval::{self, Act, Endpoint, Gnp, Tier};
use crate::traffic::{Probe, Proto};

/// What the evaluator knows of a pod.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The address the probe reaches the pod on (its IPv4 or its IPv6 address).
    pub ip: IpAddr,
    /// Container ports: (name, port, protocol).
    pub ports: Vec<(String, u16, String)>,
}

/// The cluster state a verdict depends on.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub pods: Vec<PodInfo>,
    pub policies: Vec<NetworkPolicy>,
    /// Calico Tiers (the `default` tier need not be listed).
    pub tiers: Vec<Tier>,
    pub global_policies: Vec<Gnp>,
}

/// A rule's peers (`from`/`to`) and ports, whichever direction it is for.
type RuleView<'a> = (
    Option<&'a Vec<NetworkPolicyPeer>>,
    Option<&'a Vec<NetworkPolicyPort>>,
);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

impl World {
    pub fn allowed(&self, from: &PodInfo, to: &PodInfo, probe: Probe) -> bool {
        self.direction_allows(Direction::Egress, from, to, probe)
            && self.direction_allows(Direction::Ingress, to, from, probe)
    }

    /// `subject` is the pod the policies select; `peer` the other end. Ports always belong to the
    /// destination pod (`to` for egress is the peer, for ingress the subject).
    fn direction_allows(
        &self,
        dir: Direction,
        subject: &PodInfo,
        peer: &PodInfo,
        probe: Probe,
    ) -> bool {
        // Every policy selecting the subject in this direction: (tier, order, name, its verdict).
        let mut applicable: Vec<(String, Option<f64>, String, Option<Act>)> = Vec::new();
        for np in &self.policies {
            if let Some(allowed) = self.k8s_policy_allows(np, dir, subject, peer, probe) {
                let name = format!("knp.default.{}", np.metadata.name.as_deref().unwrap_or(""));
                let verdict = allowed.then_some(Act::Allow);
                applicable.push(("default".into(), Some(1000.0), name, verdict));
            }
        }
        let empty = BTreeMap::new();
        fn endpoint<'a>(
            p: &'a PodInfo,
            namespaces: &'a BTreeMap<String, BTreeMap<String, String>>,
            empty: &'a BTreeMap<String, String>,
        ) -> Endpoint<'a> {
            Endpoint {
                namespace: &p.namespace,
                labels: &p.labels,
                ns_labels: namespaces.get(&p.namespace).unwrap_or(empty),
                ip: p.ip,
            }
        }
        let ep = |p| endpoint(p, &self.namespaces, &empty);
        let ingress = dir == Direction::Ingress;
        let (src, dst) = if ingress {
            (ep(peer), ep(subject))
        } else {
            (ep(subject), ep(peer))
        };
        let pkt = calico_eval::Packet::of(probe, subject.ip.is_ipv6());
        for g in &self.global_policies {
            if g.selects(&ep(subject), ingress) {
                let v = g.verdict(ingress, &src, &dst, &pkt);
                applicable.push((g.tier.clone(), g.order, g.name.clone(), v));
            }
        }
        let tier_of = |name: &str| {
            self.tiers
                .iter()
                .find(|t| t.name == name)
                .cloned()
                .unwrap_or(Tier {
                    name: name.to_string(),
                    order: if name == "default" {
                        1_000_000.0
                    } else {
                        f64::INFINITY
                    },
                    pass_default: false,
                })
        };
        let mut tiers: Vec<Tier> = applicable.iter().map(|a| tier_of(&a.0)).collect();
        tiers.sort_by(|a, b| a.order.total_cmp(&b.order).then(a.name.cmp(&b.name)));
        tiers.dedup_by(|a, b| a.name == b.name);
        applicable.sort_by(|a, b| {
            let (oa, ob) = (a.1.unwrap_or(f64::INFINITY), b.1.unwrap_or(f64::INFINITY));
            oa.total_cmp(&ob).then(a.2.cmp(&b.2))
        });
        'tiers: for t in &tiers {
            for (_, _, _, verdict) in applicable.iter().filter(|a| a.0 == t.name) {
                match verdict {
                    Some(Act::Allow) => return true,
                    Some(Act::Deny) => return false,
                    Some(Act::Pass) => continue 'tiers,
                    Some(Act::Log) | None => {}
                }
            }
            if !t.pass_default {
                return false;
            }
        }
        true
    }

    /// The NetworkPolicies' verdict for one direction of `subject`'s traffic, or `None` when no policy
    /// isolates `subject` in that direction (then the NetworkPolicies have nothing to say).
    pub fn verdict(
        &self,
        dir: Direction,
        subject: &PodInfo,
        peer: &PodInfo,
        probe: Probe,
    ) -> Option<bool> {
        let mut verdict = None;
        for np in &self.policies {
            match self.k8s_policy_allows(np, dir, subject, peer, probe) {
                Some(true) => return Some(true),
                Some(false) => verdict = Some(false),
                None => {}
            }
        }
        verdict
    }

    /// `None` when the NetworkPolicy does not select `subject` for `dir`; otherwise whether one of
    /// its rules allows the packet.
    fn k8s_policy_allows(
        &self,
        np: &NetworkPolicy,
        dir: Direction,
        subject: &PodInfo,
        peer: &PodInfo,
        probe: Probe,
    ) -> Option<bool> {
        let dst = if dir == Direction::Ingress {
            subject
        } else {
            peer
        };
        let ns = np.metadata.namespace.as_deref().unwrap_or("default");
        let spec = np.spec.as_ref()?;
        if ns != subject.namespace
            || !spec
                .pod_selector
                .as_ref()
                .is_none_or(|s| selector_matches(s, &subject.labels))
            || !policy_types(np).contains(&dir)
        {
            return None;
        }
        let rules: Vec<RuleView<'_>> = match dir {
            Direction::Ingress => spec
                .ingress
                .iter()
                .flatten()
                .map(|r| (r.from.as_ref(), r.ports.as_ref()))
                .collect(),
            Direction::Egress => spec
                .egress
                .iter()
                .flatten()
                .map(|r| (r.to.as_ref(), r.ports.as_ref()))
                .collect(),
        };
        Some(rules.into_iter().any(|(peers, ports)| {
            let peer_ok = match peers {
                None => true,
                Some(list) if list.is_empty() => true,
                Some(list) => list.iter().any(|p| self.peer_matches(ns, p, peer)),
            };
            let port_ok = match ports {
                None => true,
                Some(list) if list.is_empty() => true,
                Some(list) => list.iter().any(|p| port_matches(p, dst, probe)),
            };
            peer_ok && port_ok
        }))
    }

    fn peer_matches(&self, policy_ns: &str, peer: &NetworkPolicyPeer, pod: &PodInfo) -> bool {
        if let Some(block) = &peer.ip_block {
            let ip = pod.ip;
            let Ok(cidr) = block.cidr.parse::<IpNet>() else {
                return false;
            };
            let excepted = block
                .except
                .iter()
                .flatten()
                .filter_map(|e| e.parse::<IpNet>().ok())
                .any(|e| e.contains(&ip));
            return cidr.contains(&ip) && !excepted;
        }
        let ns_ok = match &peer.namespace_selector {
            None => pod.namespace == policy_ns,
            Some(sel) => {
                let empty = BTreeMap::new();
                let labels = self.namespaces.get(&pod.namespace).unwrap_or(&empty);
                selector_matches(sel, labels)
            }
        };
        let pod_ok = match &peer.pod_selector {
            None => true,
            Some(sel) => selector_matches(sel, &pod.labels),
        };
        ns_ok && pod_ok
    }
}

fn policy_types(np: &NetworkPolicy) -> Vec<Direction> {
    let spec = np.spec.as_ref().expect("policy has a spec");
    match &spec.policy_types {
        Some(types) if !types.is_empty() => types
            .iter()
            .map(|t| match t.as_str() {
                "Egress" => Direction::Egress,
                _ => Direction::Ingress,
            })
            .collect(),
        _ => {
            let mut v = vec![Direction::Ingress];
            if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
                v.push(Direction::Egress);
            }
            v
        }
    }
}

fn port_matches(p: &NetworkPolicyPort, dst: &PodInfo, probe: Probe) -> bool {
    let proto = p.protocol.as_deref().unwrap_or("TCP");
    let probe_proto = match probe.proto {
        Proto::Tcp => "TCP",
        Proto::Udp => "UDP",
        // NetworkPolicy ports cannot name ICMP or another IP protocol: only a rule without ports
        // admits them.
        Proto::Icmp | Proto::Ip => return false,
    };
    if proto != probe_proto {
        return false;
    }
    match &p.port {
        None => true,
        Some(IntOrString::Int(n)) => {
            let first = *n as i64;
            let last = p.end_port.map(i64::from).unwrap_or(first);
            (first..=last).contains(&i64::from(probe.port))
        }
        Some(IntOrString::String(name)) => dst
            .ports
            .iter()
            .any(|(n, port, pr)| n == name && *port == probe.port && pr == proto),
    }
}

/// Kubernetes LabelSelector semantics: matchLabels AND every matchExpression; empty selects everything.
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        let got = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => got.is_some_and(|v| values.contains(v)),
            "NotIn" => got.is_none_or(|v| !values.contains(v)),
            "Exists" => got.is_some(),
            "DoesNotExist" => got.is_none(),
            other => panic!("unknown label selector operator {other}"),
        }
    });
    labels_ok && exprs_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn mk_pod(ns: &str, name: &str, ip: u8) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: name.into(),
            labels: [("pod".to_string(), name.to_string())].into(),
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, ip)),
            ports: vec![("serve-80-tcp".into(), 80, "TCP".into())],
        }
    }

    fn mk_np(yaml: &str) -> NetworkPolicy {
        serde_yaml::from_str(yaml).expect("policy yaml")
    }

    const TCP80: Probe = Probe {
        port: 80,
        proto: Proto::Tcp,
    };

    #[test]
    fn no_policy_allows_everything() {
        let w = World::default();
        assert!(w.allowed(&mk_pod("x", "a", 1), &mk_pod("y", "b", 2), TCP80));
    }

    #[test]
    fn default_deny_ingress_isolates_only_ingress() {
        let w = World {
            policies: vec![mk_np(
                "metadata: {name: deny, namespace: x}\nspec: {podSelector: {}}",
            )],
            ..Default::default()
        };
        let (xa, yb) = (mk_pod("x", "a", 1), mk_pod("y", "b", 2));
        assert!(!w.allowed(&yb, &xa, TCP80));
        assert!(w.allowed(&xa, &yb, TCP80), "egress from x is not isolated");
    }

    #[test]
    fn named_port_resolves_against_the_destination() {
        let w = World {
            policies: vec![mk_np(
                "metadata: {name: np, namespace: x}\nspec: {podSelector: {}, ingress: [{ports: [{port: serve-80-tcp}]}]}",
            )],
            ..Default::default()
        };
        let (xa, yb) = (mk_pod("x", "a", 1), mk_pod("y", "b", 2));
        assert!(w.allowed(&yb, &xa, TCP80));
        assert!(!w.allowed(
            &yb,
            &xa,
            Probe {
                port: 81,
                proto: Proto::Tcp
            }
        ));
    }

    #[test]
    fn ip_block_except_carves_out() {
        let w = World {
            policies: vec![mk_np(
                "metadata: {name: np, namespace: x}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/24, except: [10.0.0.2/32]}}]}]}",
            )],
            ..Default::default()
        };
        let xa = mk_pod("x", "a", 1);
        assert!(!w.allowed(&mk_pod("y", "b", 2), &xa, TCP80));
        assert!(w.allowed(&mk_pod("y", "c", 3), &xa, TCP80));
    }

    #[test]
    fn ip_blocks_match_only_their_own_family() {
        let w = World {
            policies: vec![mk_np(
                "metadata: {name: np, namespace: x}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 0.0.0.0/0}}, {ipBlock: {cidr: 'fd00::/8', except: ['fd00::2/128']}}]}]}",
            )],
            ..Default::default()
        };
        let xa = mk_pod("x", "a", 1);
        let v6 = |name: &str, last: u16| PodInfo {
            ip: IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last)),
            ..mk_pod("y", name, 0)
        };
        assert!(w.allowed(&mk_pod("y", "b", 2), &xa, TCP80));
        assert!(w.allowed(&v6("c", 3), &xa, TCP80));
        assert!(!w.allowed(&v6("b", 2), &xa, TCP80), "excepted v6 address");
        let v4_only = World {
            policies: vec![mk_np(
                "metadata: {name: np, namespace: x}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 0.0.0.0/0}}]}]}",
            )],
            ..Default::default()
        };
        assert!(
            !v4_only.allowed(&v6("c", 3), &xa, TCP80),
            "0.0.0.0/0 is not ::/0"
        );
    }
}
