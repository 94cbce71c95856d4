//! Which pod is this address: the workload endpoints of a node view (every node's), as the
//! operator commands (`trace`, `flows`) name them (`namespace/pod`).

use std::collections::HashMap;
use std::net::IpAddr;

use calc_graph::model::Resource;

use crate::cmd::shared::node_view::NodeView;

/// A workload endpoint of the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    /// `namespace/pod` (the endpoint's name when it names no pod).
    pub id: String,
    /// Its node (empty if it names none).
    pub node: String,
    /// Its interface on its node (empty if it names none).
    pub iface: String,
    pub addrs: Vec<IpAddr>,
}

/// The view's pods, by address and by `namespace/pod`.
#[derive(Debug, Clone, Default)]
pub struct Pods {
    pods: Vec<Pod>,
    /// Address -> index in `pods` (the first pod holding it, in key order).
    by_addr: HashMap<IpAddr, usize>,
}

impl Pods {
    /// The workload endpoints among `view`'s resources (decoded once, when the view was built).
    pub fn of(view: &NodeView) -> Pods {
        let mut out = Pods::default();
        for res in view.resources.values() {
            let Resource::WorkloadEndpoint(w) = res else {
                continue;
            };
            let ns = w.metadata.namespace.clone().unwrap_or_default();
            let name = w
                .spec
                .pod
                .clone()
                .unwrap_or_else(|| w.metadata.name.clone());
            let addrs: Vec<IpAddr> = w.spec.ip_networks.iter().map(|n| n.addr()).collect();
            for a in &addrs {
                out.by_addr.entry(*a).or_insert(out.pods.len());
            }
            out.pods.push(Pod {
                id: format!("{ns}/{name}"),
                node: w.spec.node.clone().unwrap_or_default(),
                iface: w.spec.interface_name.clone().unwrap_or_default(),
                addrs,
            });
        }
        out
    }

    /// The pod holding `addr`.
    pub fn by_addr(&self, addr: IpAddr) -> Option<&Pod> {
        self.by_addr.get(&addr).map(|&i| &self.pods[i])
    }

    /// The pod named `namespace/pod`.
    pub fn by_id(&self, id: &str) -> Option<&Pod> {
        self.pods.iter().find(|p| p.id == id)
    }
}
