//! Felix's cluster-wide counts (its `StatsCollector`) from the agent's datastore view.

use std::collections::HashMap;
use std::sync::Arc;

use calc_graph::model::CALICO_PREFIX;

/// What a counted key of the datastore view is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counted {
    WorkloadEndpoint,
    HostEndpoint,
    Node,
    Policy,
    Profile,
    Tier,
}

/// Felix's cluster-wide counts (its `StatsCollector`), kept from each key the agent's view gains
/// or loses: hosts are the distinct node names of Node resources and of workload and host
/// endpoints.
#[derive(Debug, Default)]
pub struct ClusterCounts {
    keys: HashMap<Arc<str>, (Counted, Option<String>)>,
    keys_by_host: HashMap<String, usize>,
    by_kind: [usize; 6],
}

impl ClusterCounts {
    /// `key` is now in the view with `value` (accepted by the graph).
    pub fn put(&mut self, key: &Arc<str>, value: &[u8]) {
        let Some(kind) = counted(key) else {
            return;
        };
        let host = host_of(kind, key, value);
        if let Some((_, old)) = self.keys.get(key) {
            if *old == host {
                return;
            }
            self.delete(key);
        }
        self.by_kind[kind as usize] += 1;
        if let Some(h) = &host {
            *self.keys_by_host.entry(h.clone()).or_default() += 1;
        }
        self.keys.insert(key.clone(), (kind, host));
    }

    /// `key` left the view.
    pub fn delete(&mut self, key: &str) {
        let Some((kind, host)) = self.keys.remove(key) else {
            return;
        };
        self.by_kind[kind as usize] -= 1;
        if let Some(h) = host
            && let Some(n) = self.keys_by_host.get_mut(&h)
        {
            *n -= 1;
            if *n == 0 {
                self.keys_by_host.remove(&h);
            }
        }
    }

    pub fn hosts(&self) -> usize {
        self.keys_by_host.len()
    }

    pub(super) fn count(&self, kind: Counted) -> usize {
        self.by_kind[kind as usize]
    }
}

fn counted(key: &str) -> Option<Counted> {
    let rest = key.strip_prefix(CALICO_PREFIX)?;
    Some(match rest.split('/').next()? {
        "workloadendpoints" => Counted::WorkloadEndpoint,
        "hostendpoints" => Counted::HostEndpoint,
        "nodes" => Counted::Node,
        "networkpolicies" | "globalnetworkpolicies" => Counted::Policy,
        "profiles" => Counted::Profile,
        "tiers" => Counted::Tier,
        _ => return None,
    })
}

/// The node a key belongs to: a Node's name; a workload endpoint's node from its name (Calico
/// names them `<node>-<orchestrator>-<workload>-<endpoint>`, each `-` inside a part doubled); a
/// host endpoint's `spec.node`.
fn host_of(kind: Counted, key: &str, value: &[u8]) -> Option<String> {
    let name = key.rsplit('/').next().unwrap_or_default();
    match kind {
        Counted::Node => Some(name.to_string()),
        Counted::WorkloadEndpoint => {
            let b = name.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'-' {
                    if b.get(i + 1) == Some(&b'-') {
                        i += 2;
                        continue;
                    }
                    return Some(name[..i].replace("--", "-"));
                }
                i += 1;
            }
            None
        }
        Counted::HostEndpoint => {
            #[derive(serde::Deserialize)]
            struct Hep {
                spec: Spec,
            }
            #[derive(serde::Deserialize)]
            struct Spec {
                node: Option<String>,
            }
            serde_json::from_slice::<Hep>(value)
                .ok()
                .and_then(|h| h.spec.node)
                .filter(|n| !n.is_empty())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_endpoint_names_give_their_node() {
        let wep = |n: &str| {
            host_of(
                Counted::WorkloadEndpoint,
                &format!("{CALICO_PREFIX}workloadendpoints/ns/{n}"),
                b"",
            )
        };
        assert_eq!(wep("node--1-k8s-web-eth0").as_deref(), Some("node-1"));
        assert_eq!(wep("n1-k8s-a--b-eth0").as_deref(), Some("n1"));
        assert_eq!(wep("nodash"), None);
    }

    #[test]
    fn cluster_counts_follow_keys_in_and_out() {
        let mut c = ClusterCounts::default();
        let k = |s: &str| -> Arc<str> { Arc::from(format!("{CALICO_PREFIX}{s}").as_str()) };
        let w1 = k("workloadendpoints/ns/node--1-k8s-a-eth0");
        let w2 = k("workloadendpoints/ns/node--2-k8s-b-eth0");
        let hep = k("hostendpoints/h");
        c.put(&w1, b"{}");
        c.put(&w1, b"{}");
        c.put(&w2, b"{}");
        c.put(&k("nodes/node-1"), b"{}");
        c.put(&hep, br#"{"spec":{"node":"node-3"}}"#);
        c.put(&k("globalnetworkpolicies/p"), b"{}");
        c.put(&k("ipamblocks/x"), b"{}");
        assert_eq!(c.hosts(), 3);
        assert_eq!(c.count(Counted::WorkloadEndpoint), 2);
        assert_eq!(c.count(Counted::HostEndpoint), 1);
        assert_eq!(c.count(Counted::Policy), 1);
        // The host endpoint moves to node-1: one host fewer.
        c.put(&hep, br#"{"spec":{"node":"node-1"}}"#);
        assert_eq!((c.hosts(), c.count(Counted::HostEndpoint)), (2, 1));
        c.delete(&w2);
        c.delete(&w2);
        assert_eq!((c.hosts(), c.count(Counted::WorkloadEndpoint)), (1, 1));
    }
}
