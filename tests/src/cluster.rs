//! A two-node "cluster" built from network namespaces, wired the way Calico's CNI wires pods.
//!
//! ```text
//!   infra netns: bridge br0 10.77.0.1/24 (etcd listens here), no forwarding
//!      ├── veth ── node-1 netns: eth0 10.77.0.11/24, ip_forward, default via 10.77.0.1
//!      │              ├── cali<sha1(ns.pod)[:11]> (proxy ARP) ── pod netns: eth0 10.78.1.N/32, default via 169.254.1.1
//!      │              └── ...
//!      └── veth ── node-2 netns: eth0 10.77.0.12/24 ... pods 10.78.2.N/32
//! ```
//! Each node has a /32 route per local pod on its cali interface and a /32 route per remote pod via the
//! other node. Only addresses assigned inside these namespaces are ever used; nothing leaves the machine.

use std::net::Ipv4Addr;

use anyhow::Result;

use felixrs_test_support::netns::{Netns, unique_name};

/// The host-side interface name Calico's CNI gives a pod: `cali` + 11 hex chars of SHA-1("<ns>.<pod>").
pub fn veth_name(namespace: &str, pod: &str) -> String {
    use sha1::{Digest, Sha1};
    let digest = Sha1::digest(format!("{namespace}.{pod}").as_bytes());
    format!("cali{}", &hex::encode(digest)[..11])
}

pub struct Node {
    pub name: String,
    pub ip: Ipv4Addr,
    pub ns: Netns,
}

pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub node: usize,
    pub ip: Ipv4Addr,
    pub iface: String,
    pub ns: Netns,
}

impl Pod {
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

pub struct Cluster {
    pub pods: Vec<Pod>,
    pub nodes: Vec<Node>,
    /// Dropped last: it holds the bridge (and etcd) that the nodes hang off.
    pub infra: Netns,
    next_host: [u8; 2],
}

pub const INFRA_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

impl Cluster {
    /// Creates the infra namespace with its bridge and `node_count` node namespaces (node-1, node-2, ...).
    pub fn new(node_count: usize) -> Result<Cluster> {
        assert!(
            node_count <= 2,
            "the addressing plan has room for two nodes"
        );
        let infra = Netns::create(unique_name("i"))?;
        infra.exec(&["ip", "link", "add", "br0", "type", "bridge"])?;
        infra.exec(&["ip", "addr", "add", "10.77.0.1/24", "dev", "br0"])?;
        infra.exec(&["ip", "link", "set", "br0", "up"])?;
        let mut nodes = Vec::new();
        for i in 0..node_count {
            let ns = Netns::create(unique_name("n"))?;
            let ip = Ipv4Addr::new(10, 77, 0, 11 + i as u8);
            let port = format!("n{i}");
            infra.exec(&[
                "ip",
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns.name(),
            ])?;
            infra.exec(&["ip", "link", "set", &port, "master", "br0", "up"])?;
            ns.exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            ns.exec(&["ip", "link", "set", "eth0", "up"])?;
            ns.exec(&[
                "ip",
                "route",
                "add",
                "default",
                "via",
                &INFRA_IP.to_string(),
            ])?;
            ns.sysctl("net.ipv4.ip_forward", "1")?;
            ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
            ns.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
            nodes.push(Node {
                name: format!("node-{}", i + 1),
                ip,
                ns,
            });
        }
        Ok(Cluster {
            pods: Vec::new(),
            nodes,
            infra,
            next_host: [10, 10],
        })
    }

    /// Creates a pod namespace on `node` (index), wires it like Calico's CNI and routes it from every node.
    pub fn add_pod(&mut self, namespace: &str, name: &str, node: usize) -> Result<usize> {
        let host = self.next_host[node];
        self.next_host[node] += 1;
        let ip = Ipv4Addr::new(10, 78, node as u8 + 1, host);
        let iface = veth_name(namespace, name);
        let ns = Netns::create(unique_name("p"))?;
        let n = &self.nodes[node];
        n.ns.exec(&[
            "ip",
            "link",
            "add",
            &iface,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ])?;
        n.ns.sysctl(&format!("net.ipv4.conf.{iface}.proxy_arp"), "1")?;
        n.ns.sysctl(&format!("net.ipv4.neigh.{iface}.proxy_delay"), "0")?;
        n.ns.sysctl(&format!("net.ipv4.conf.{iface}.rp_filter"), "0")?;
        n.ns.exec(&["ip", "link", "set", &iface, "up"])?;
        n.ns.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", &iface])?;
        ns.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
        ns.exec(&["ip", "link", "set", "eth0", "up"])?;
        ns.exec(&[
            "ip",
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ])?;
        ns.exec(&[
            "ip",
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ])?;
        for (j, other) in self.nodes.iter().enumerate() {
            if j != node {
                other.ns.exec(&[
                    "ip",
                    "route",
                    "add",
                    &format!("{ip}/32"),
                    "via",
                    &n.ip.to_string(),
                ])?;
            }
        }
        self.pods.push(Pod {
            namespace: namespace.to_string(),
            name: name.to_string(),
            node,
            ip,
            iface,
            ns,
        });
        Ok(self.pods.len() - 1)
    }

    /// The placement of every pod, for manifests and the evaluator.
    pub fn placed_pods(&self) -> Vec<crate::world::PlacedPod> {
        self.pods
            .iter()
            .map(|p| crate::world::PlacedPod {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                node_name: self.nodes[p.node].name.clone(),
                ip: p.ip,
            })
            .collect()
    }

    pub fn pod(&self, id: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.id() == id)
            .unwrap_or_else(|| panic!("no pod {id} in the cluster"))
    }
}
