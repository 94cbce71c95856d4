//! One step's cluster state, rendered two ways: as Kubernetes manifests for `policy-controller sync
//! --manifests`, and as the evaluator's `World`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;

use crate::calico_eval;
use crate::cases::Step;
use crate::evaluator::{PodInfo, World};

/// The address family a pass of probes (and the evaluator's verdicts) uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// Where a pod runs and its addresses: all that manifests and the evaluator need of the cluster.
#[derive(Debug, Clone)]
pub struct PlacedPod {
    pub namespace: String,
    pub name: String,
    pub node_name: String,
    pub ip: Ipv4Addr,
    pub ip6: Ipv6Addr,
}

impl PlacedPod {
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn addr(&self, family: Family) -> IpAddr {
        match family {
            Family::V4 => IpAddr::V4(self.ip),
            Family::V6 => IpAddr::V6(self.ip6),
        }
    }
}

pub const PORTS: [(&str, u16, &str); 6] = [
    ("serve-80-tcp", 80, "TCP"),
    ("serve-81-tcp", 81, "TCP"),
    ("serve-80-udp", 80, "UDP"),
    ("serve-81-udp", 81, "UDP"),
    ("serve-80-sctp", 80, "SCTP"),
    ("serve-81-sctp", 81, "SCTP"),
];

fn ns_labels(step: &Step, ns: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        ("ns".to_string(), ns.to_string()),
        ("kubernetes.io/metadata.name".to_string(), ns.to_string()),
    ]);
    for (n, k, v) in &step.ns_labels {
        if *n == ns {
            labels.insert(k.to_string(), v.to_string());
        }
    }
    labels
}

fn pod_labels(step: &Step, id: &str, name: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([("pod".to_string(), name.to_string())]);
    for (p, k, v) in &step.pod_labels {
        if *p == id {
            match v {
                Some(v) => labels.insert(k.to_string(), v.to_string()),
                None => labels.remove(*k),
            };
        }
    }
    labels
}

/// Substitutes cluster-specific placeholders in a policy document: `__XB__` = the IPv4 address of pod
/// x/b, `__XB6__` = its IPv6 address.
pub fn instantiate(doc: &str, pods: &[PlacedPod]) -> String {
    let xb = pods.iter().find(|p| p.id() == "x/b");
    let xb4 = xb
        .map(|p| p.ip.to_string())
        .unwrap_or_else(|| "10.78.255.255".to_string());
    let xb6 = xb
        .map(|p| p.ip6.to_string())
        .unwrap_or_else(|| "fd78:ffff::ffff".to_string());
    doc.replace("__XB6__", &xb6).replace("__XB__", &xb4)
}

/// The namespaces the cluster's pods live in, in order.
fn namespaces(pods: &[PlacedPod]) -> Vec<String> {
    let mut v: Vec<String> = pods.iter().map(|p| p.namespace.clone()).collect();
    v.sort();
    v.dedup();
    v
}

/// Multi-document YAML with every Namespace, ServiceAccount, Pod and policy of the step.
pub fn manifests(step: &Step, pods: &[PlacedPod]) -> String {
    let mut docs: Vec<String> = Vec::new();
    for ns in namespaces(pods) {
        // The evaluator sees the API server's view, where every namespace carries
        // `kubernetes.io/metadata.name`; manifest files usually do not: the controller adds it.
        let mut labels = ns_labels(step, &ns);
        labels.remove("kubernetes.io/metadata.name");
        docs.push(
            serde_yaml::to_string(&json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": labels},
            }))
            .expect("yaml"),
        );
        docs.push(
            serde_yaml::to_string(&json!({
                "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": ns},
            }))
            .expect("yaml"),
        );
    }
    for pod in pods {
        let ports: Vec<_> = PORTS
            .iter()
            .map(|(name, port, proto)| json!({"name": name, "containerPort": port, "protocol": proto}))
            .collect();
        let annotations: BTreeMap<&str, &str> = step
            .pod_annotations
            .iter()
            .filter(|(id, _, _)| *id == pod.id())
            .map(|(_, k, v)| (*k, *v))
            .collect();
        docs.push(
            serde_yaml::to_string(&json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod.name, "namespace": pod.namespace,
                             "labels": pod_labels(step, &pod.id(), &pod.name),
                             "annotations": annotations},
                "spec": {"nodeName": pod.node_name, "serviceAccountName": "default",
                         "containers": [{"name": "serve", "image": "agnhost", "ports": ports}]},
                "status": {"phase": "Running", "podIP": pod.ip.to_string(),
                           "podIPs": [{"ip": pod.ip.to_string()}, {"ip": pod.ip6.to_string()}]},
            }))
            .expect("yaml"),
        );
    }
    for doc in &step.policies {
        docs.push(instantiate(doc, pods));
    }
    let mut out = String::new();
    for d in docs {
        let _ = writeln!(out, "---\n{}", d.trim());
    }
    out
}

/// The evaluator's view of the step for probes over `family` (pods are known by their address of that
/// family), or `None` when the step uses Calico-native policy beyond what [`calico_eval`] models, or
/// admin policy (those cases rely on their hand-written expectations, or on the admin evaluator).
pub fn world(step: &Step, pods: &[PlacedPod], family: Family) -> Option<World> {
    let mut w = World::default();
    for ns in namespaces(pods) {
        w.namespaces.insert(ns.clone(), ns_labels(step, &ns));
    }
    for pod in pods {
        w.pods.push(PodInfo {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            labels: pod_labels(step, &pod.id(), &pod.name),
            ip: pod.addr(family),
            ports: PORTS
                .iter()
                .map(|(n, p, pr)| (n.to_string(), *p, pr.to_string()))
                .collect(),
        });
    }
    for doc in &step.policies {
        let doc = instantiate(doc, pods);
        // Admin policy (policy.networking.k8s.io) has its own evaluator: `admin_evaluator::admin_world`.
        if doc.contains("policy.networking.k8s.io/") {
            return None;
        }
        if doc.contains("projectcalico.org/v3") {
            match calico_eval::parse(&doc) {
                Ok(calico_eval::Doc::Tier(t)) => w.tiers.push(t),
                Ok(calico_eval::Doc::Gnp(g)) => w.global_policies.push(g),
                Err(_) => return None,
            }
            continue;
        }
        let np: NetworkPolicy = serde_yaml::from_str(&doc).expect("case policy is valid YAML");
        w.policies.push(np);
    }
    Some(w)
}
