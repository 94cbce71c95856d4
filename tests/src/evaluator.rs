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

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

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
        self.verdict(dir, subject, peer, probe).unwrap_or(true)
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
        let dst = if dir == Direction::Ingress {
            subject
        } else {
            peer
        };
        let mut isolated = false;
        for np in &self.policies {
            let ns = np.metadata.namespace.as_deref().unwrap_or("default");
            let Some(spec) = &np.spec else { continue };
            if ns != subject.namespace
                || !spec
                    .pod_selector
                    .as_ref()
                    .is_none_or(|s| selector_matches(s, &subject.labels))
            {
                continue;
            }
            if !policy_types(np).contains(&dir) {
                continue;
            }
            isolated = true;
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
            for (peers, ports) in rules {
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
                if peer_ok && port_ok {
                    return Some(true);
                }
            }
        }
        if isolated { Some(false) } else { None }
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
        // NetworkPolicy ports cannot name ICMP: only a rule without ports admits it.
        Proto::Icmp => return false,
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
