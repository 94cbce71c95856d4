//! An independent evaluator of the cluster-scoped admin policy API (kubernetes-sigs/network-policy-api:
//! AdminNetworkPolicy and BaselineAdminNetworkPolicy v1alpha1, ClusterNetworkPolicy v1alpha2), written
//! from the API reference, not from felixrs: it reads the YAML itself and knows nothing of tiers, marks or
//! Calico. Every admin case's expectation is checked against it.
//!
//! One direction of a connection (egress of the source, ingress of the destination) is decided by the
//! first of these layers that has an opinion:
//! 1. the admin layer: AdminNetworkPolicies and Admin-tier ClusterNetworkPolicies selecting the pod,
//!    lowest priority first; within a policy, rules in order. The first matching rule decides: Allow
//!    (Accept) admits, Deny drops, Pass skips the rest of the admin layer;
//! 2. NetworkPolicy: if some NetworkPolicy isolates the pod in that direction, its verdict;
//! 3. the baseline layer: the BaselineAdminNetworkPolicy and Baseline-tier ClusterNetworkPolicies, the
//!    same way (Pass, for a ClusterNetworkPolicy, skips the rest of the layer);
//! 4. otherwise the connection is admitted.
//!
//! A rule matches when one of its peers matches the other pod (namespaces: the namespace's labels;
//! pods: namespace and pod labels; networks: the pod's address; nodes: the pod's address is in the status
//! of a node the selector matches) and, if it lists ports, one of them
//! matches the destination port (numbers and ranges with their protocol, default TCP; a named port
//! matches a container port of the destination pod with that name, number and protocol).

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use crate::evaluator::{Direction, PodInfo, World, selector_matches};
use crate::traffic::{Probe, Proto};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Allow,
    Deny,
    Pass,
}

#[derive(Debug, Clone)]
enum Peer {
    Namespaces(LabelSelector),
    Pods(LabelSelector, LabelSelector),
    Networks(Vec<IpNet>),
    /// Nodes by label: the addresses in their status.
    Nodes(LabelSelector),
}

#[derive(Debug, Clone)]
enum Port {
    Number(String, u16),
    Range(String, u16, u16),
    Named(String),
}

#[derive(Debug, Clone)]
struct Rule {
    action: Action,
    peers: Vec<Peer>,
    /// `None`: every port and protocol.
    ports: Option<Vec<Port>>,
}

#[derive(Debug, Clone)]
struct Policy {
    name: String,
    priority: i64,
    subject: Peer,
    ingress: Vec<Rule>,
    egress: Vec<Rule>,
}

/// The cluster state an admin verdict depends on: the NetworkPolicy world plus the two admin layers.
#[derive(Debug, Clone, Default)]
pub struct AdminWorld {
    pub base: World,
    admin: Vec<Policy>,
    baseline: Vec<Policy>,
    /// Nodes: labels and the addresses in their status.
    nodes: Vec<(BTreeMap<String, String>, Vec<std::net::IpAddr>)>,
}

fn selector(v: &Value) -> LabelSelector {
    serde_json::from_value(v.clone()).expect("label selector")
}

fn peer(v: &Value) -> Peer {
    if let Some(ns) = v.get("namespaces") {
        Peer::Namespaces(selector(ns))
    } else if let Some(p) = v.get("pods") {
        Peer::Pods(
            selector(&p["namespaceSelector"]),
            selector(&p["podSelector"]),
        )
    } else if let Some(n) = v.get("nodes") {
        Peer::Nodes(selector(n))
    } else if let Some(n) = v.get("networks") {
        Peer::Networks(
            n.as_array()
                .expect("networks list")
                .iter()
                .map(|c| c.as_str().expect("cidr").parse().expect("valid CIDR"))
                .collect(),
        )
    } else {
        panic!("unsupported peer in a case: {v}")
    }
}

fn u16_of(v: &Value) -> u16 {
    u16::try_from(v.as_u64().expect("port number")).expect("port fits")
}

fn proto_of(v: &Value) -> String {
    v.get("protocol")
        .and_then(Value::as_str)
        .unwrap_or("TCP")
        .to_string()
}

/// v1alpha1 `ports`.
fn anp_port(v: &Value) -> Port {
    if let Some(n) = v.get("portNumber") {
        Port::Number(proto_of(n), u16_of(&n["port"]))
    } else if let Some(r) = v.get("portRange") {
        Port::Range(proto_of(r), u16_of(&r["start"]), u16_of(&r["end"]))
    } else {
        Port::Named(v["namedPort"].as_str().expect("named port").to_string())
    }
}

/// v1alpha2 `protocols`.
fn cnp_port(v: &Value) -> Port {
    if let Some(n) = v.get("destinationNamedPort") {
        return Port::Named(n.as_str().expect("named port").to_string());
    }
    for (key, proto) in [("tcp", "TCP"), ("udp", "UDP"), ("sctp", "SCTP")] {
        if let Some(p) = v.get(key) {
            let dp = &p["destinationPort"];
            return match (dp.get("number"), dp.get("range")) {
                (Some(n), _) => Port::Number(proto.into(), u16_of(n)),
                (_, Some(r)) => Port::Range(proto.into(), u16_of(&r["start"]), u16_of(&r["end"])),
                _ => Port::Range(proto.into(), 1, 65535),
            };
        }
    }
    panic!("unsupported protocol entry in a case: {v}")
}

fn rules(spec: &Value, dir: &str, v2: bool) -> Vec<Rule> {
    let peers_key = if dir == "ingress" { "from" } else { "to" };
    spec.get(dir)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| Rule {
            action: match r["action"].as_str().expect("action") {
                "Allow" | "Accept" => Action::Allow,
                "Deny" => Action::Deny,
                "Pass" => Action::Pass,
                other => panic!("unknown action {other}"),
            },
            peers: r[peers_key]
                .as_array()
                .expect("peers")
                .iter()
                .map(peer)
                .collect(),
            ports: if v2 {
                r.get("protocols")
                    .and_then(Value::as_array)
                    .map(|ps| ps.iter().map(cnp_port).collect())
            } else {
                r.get("ports")
                    .and_then(Value::as_array)
                    .map(|ps| ps.iter().map(anp_port).collect())
            },
        })
        .collect()
}

impl AdminWorld {
    /// Adds one admin policy or Node document; returns `false` when the document is neither.
    pub fn add(&mut self, doc: &Value) -> bool {
        let kind = doc["kind"].as_str().unwrap_or("");
        if kind == "Node" {
            let labels =
                serde_json::from_value(doc["metadata"]["labels"].clone()).unwrap_or_default();
            let addresses = doc["status"]["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| matches!(a["type"].as_str(), Some("InternalIP" | "ExternalIP")))
                .filter_map(|a| a["address"].as_str()?.parse().ok())
                .collect();
            self.nodes.push((labels, addresses));
            return true;
        }
        let spec = &doc["spec"];
        let v2 = kind == "ClusterNetworkPolicy";
        if !matches!(
            kind,
            "AdminNetworkPolicy" | "BaselineAdminNetworkPolicy" | "ClusterNetworkPolicy"
        ) {
            return false;
        }
        let p = Policy {
            name: doc["metadata"]["name"].as_str().unwrap_or("").to_string(),
            // The BaselineAdminNetworkPolicy has no priority. Next to Baseline-tier
            // ClusterNetworkPolicies (upstream does not define their mix) it counts as 1000, the
            // highest priority value: our documented choice.
            priority: spec["priority"].as_i64().unwrap_or(1000),
            subject: peer(&spec["subject"]),
            ingress: rules(spec, "ingress", v2),
            egress: rules(spec, "egress", v2),
        };
        let baseline = kind == "BaselineAdminNetworkPolicy"
            || (v2 && spec["tier"].as_str() == Some("Baseline"));
        if baseline {
            self.baseline.push(p);
        } else {
            self.admin.push(p);
        }
        true
    }

    pub fn allowed(&self, from: &PodInfo, to: &PodInfo, probe: Probe) -> bool {
        self.direction(Direction::Egress, from, to, probe)
            && self.direction(Direction::Ingress, to, from, probe)
    }

    fn direction(&self, dir: Direction, subject: &PodInfo, peer: &PodInfo, probe: Probe) -> bool {
        let dst = if dir == Direction::Ingress {
            subject
        } else {
            peer
        };
        if let Some(v) = self.layer(&self.admin, dir, subject, peer, dst, probe) {
            return v;
        }
        if let Some(v) = self.base.verdict(dir, subject, peer, probe) {
            return v;
        }
        self.layer(&self.baseline, dir, subject, peer, dst, probe)
            .unwrap_or(true)
    }

    /// The layer's verdict, `None` for no match or Pass.
    fn layer(
        &self,
        policies: &[Policy],
        dir: Direction,
        subject: &PodInfo,
        peer: &PodInfo,
        dst: &PodInfo,
        probe: Probe,
    ) -> Option<bool> {
        let mut sorted: Vec<&Policy> = policies
            .iter()
            .filter(|p| self.peer_matches(&p.subject, subject))
            .collect();
        sorted.sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
        for p in sorted {
            let rules = if dir == Direction::Ingress {
                &p.ingress
            } else {
                &p.egress
            };
            for r in rules {
                let peer_ok = r.peers.iter().any(|x| self.peer_matches(x, peer));
                let port_ok = r
                    .ports
                    .as_ref()
                    .is_none_or(|ps| ps.iter().any(|x| port_matches(x, dst, probe)));
                if peer_ok && port_ok {
                    return match r.action {
                        Action::Allow => Some(true),
                        Action::Deny => Some(false),
                        Action::Pass => None,
                    };
                }
            }
        }
        None
    }

    fn peer_matches(&self, peer: &Peer, pod: &PodInfo) -> bool {
        let empty = BTreeMap::new();
        let ns_labels = self.base.namespaces.get(&pod.namespace).unwrap_or(&empty);
        match peer {
            Peer::Namespaces(ns) => selector_matches(ns, ns_labels),
            Peer::Pods(ns, p) => {
                selector_matches(ns, ns_labels) && selector_matches(p, &pod.labels)
            }
            Peer::Networks(nets) => nets.iter().any(|n| n.contains(&pod.ip)),
            Peer::Nodes(sel) => self
                .nodes
                .iter()
                .any(|(labels, addrs)| selector_matches(sel, labels) && addrs.contains(&pod.ip)),
        }
    }
}

fn port_matches(p: &Port, dst: &PodInfo, probe: Probe) -> bool {
    let probe_proto = match probe.proto {
        Proto::Tcp => "TCP",
        Proto::Udp => "UDP",
        // Admin policy ports are TCP, UDP or SCTP: only a rule without ports admits ICMP or a bare IP protocol.
        Proto::Icmp | Proto::Ip => return false,
    };
    match p {
        Port::Number(proto, n) => proto == probe_proto && *n == probe.port,
        Port::Range(proto, a, b) => proto == probe_proto && (*a..=*b).contains(&probe.port),
        Port::Named(name) => dst
            .ports
            .iter()
            .any(|(n, port, pr)| n == name && *port == probe.port && pr == probe_proto),
    }
}

/// The evaluator's view of a step with admin policies: the NetworkPolicies go to the
/// NetworkPolicy [`World`], the admin documents to the two layers.
pub fn admin_world(
    step: &crate::cases::Step,
    pods: &[crate::world::PlacedPod],
    family: crate::world::Family,
) -> AdminWorld {
    let mut admin = AdminWorld::default();
    let mut nps = Vec::new();
    for doc in &step.policies {
        let v: Value = serde_yaml::from_str(&crate::world::instantiate(doc, pods))
            .expect("case policy is valid YAML");
        if !admin.add(&v) {
            nps.push(*doc);
        }
    }
    let np_step = crate::cases::Step {
        policies: nps,
        ns_labels: step.ns_labels.clone(),
        pod_labels: step.pod_labels.clone(),
        pod_annotations: step.pod_annotations.clone(),
        probes: step.probes.clone(),
        expect: step.expect,
    };
    admin.base = crate::world::world(&np_step, pods, family)
        .expect("admin cases use Kubernetes NetworkPolicies only");
    admin
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn pod(ns: &str, name: &str, ip: u8) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: name.into(),
            labels: [("pod".to_string(), name.to_string())].into(),
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, ip)),
            ports: vec![("web".into(), 80, "TCP".into())],
        }
    }

    fn world(docs: &[&str]) -> AdminWorld {
        let mut w = AdminWorld::default();
        for ns in ["x", "y"] {
            w.base
                .namespaces
                .insert(ns.into(), [("ns".to_string(), ns.to_string())].into());
        }
        for d in docs {
            assert!(w.add(&serde_yaml::from_str(d).unwrap()));
        }
        w
    }

    const T80: Probe = Probe {
        port: 80,
        proto: Proto::Tcp,
    };

    #[test]
    fn pass_skips_to_baseline_and_deny_is_final() {
        let anp = "kind: AdminNetworkPolicy\nmetadata: {name: a}\nspec: {priority: 1, subject: {namespaces: {matchLabels: {ns: x}}}, ingress: [{action: Pass, from: [{namespaces: {}}]}]}";
        let banp = "kind: BaselineAdminNetworkPolicy\nmetadata: {name: default}\nspec: {subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {matchLabels: {ns: y}}}]}]}";
        let w = world(&[anp, banp]);
        assert!(!w.allowed(&pod("y", "b", 2), &pod("x", "a", 1), T80));
        assert!(w.allowed(&pod("x", "b", 2), &pod("x", "a", 1), T80));
    }

    #[test]
    fn named_ports_resolve_on_the_destination() {
        let anp = "kind: AdminNetworkPolicy\nmetadata: {name: a}\nspec: {priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}], ports: [{namedPort: web}]}]}";
        let w = world(&[anp]);
        assert!(!w.allowed(&pod("y", "b", 2), &pod("x", "a", 1), T80));
        let t81 = Probe {
            port: 81,
            proto: Proto::Tcp,
        };
        assert!(w.allowed(&pod("y", "b", 2), &pod("x", "a", 1), t81));
    }
}
