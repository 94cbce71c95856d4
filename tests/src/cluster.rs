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
//!
//! Pods are dual-stack. IPv6 mirrors IPv4 the way Calico's CNI does it: the pod has `fd78:<node>::<n>/128`
//! on eth0 and a default route via the link-local gateway `fe80::1`, which every `cali` interface holds
//! (so the node answers the pod's neighbour solicitation for it, as proxy ARP does for 169.254.1.1);
//! the node has a /128 route per local pod on its cali interface, `fd77::1x/64` on eth0 and a /128 route
//! per remote pod via the other node. Duplicate address detection is off in every namespace (addresses
//! are usable at once), and node namespaces forward IPv6.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use std::path::Path;

use anyhow::{Context, Result};

use felixrs_test_support::netns::{Netns, unique_name};
use felixrs_test_support::node::wire_pod;

use crate::cases::Expect;
use crate::driver::{Etcd, start_etcd};
use crate::traffic::{Probe, Servers, probe_many};
use crate::world::Family;

/// The host-side interface name Calico's CNI gives a pod: `cali` + 11 hex chars of SHA-1("<ns>.<pod>").
pub fn veth_name(namespace: &str, pod: &str) -> String {
    use sha1::{Digest, Sha1};
    let digest = Sha1::digest(format!("{namespace}.{pod}").as_bytes());
    format!("cali{}", &hex::encode(digest)[..11])
}

pub struct Node {
    pub name: String,
    pub ip: Ipv4Addr,
    pub ip6: Ipv6Addr,
    pub ns: Netns,
}

pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub node: usize,
    pub ip: Ipv4Addr,
    pub ip6: Ipv6Addr,
    pub iface: String,
    pub ns: Netns,
}

impl Pod {
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What every end-to-end phase starts from: the cluster of [`crate::cases::standard_layout`] (its
/// addresses checked against the layout's), a server in every pod, a real etcd on the infra bridge
/// and one agent per node, started by `start_agent(node netns, node name, etcd URL, work dir)`.
pub struct StandardCluster<A> {
    pub work: tempfile::TempDir,
    pub cluster: Cluster,
    pub servers: Vec<Servers>,
    pub etcd: Etcd,
    pub agents: Vec<A>,
}

impl<A> StandardCluster<A> {
    /// Builds it in a work directory named after `prefix`.
    pub fn start(
        prefix: &str,
        mut start_agent: impl FnMut(&Netns, &str, &str, &Path) -> Result<A>,
    ) -> Result<Self> {
        let work = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let mut cluster = Cluster::new(2)?;
        let layout = crate::cases::standard_layout();
        for p in &layout {
            let node = (cluster.nodes.iter())
                .position(|n| n.name == p.node_name)
                .context("layout names a known node")?;
            cluster.add_pod(&p.namespace, &p.name, node)?;
        }
        let placed: Vec<_> = (cluster.placed_pods().iter())
            .map(|p| (p.id(), p.ip, p.ip6))
            .collect();
        let want: Vec<_> = layout.iter().map(|p| (p.id(), p.ip, p.ip6)).collect();
        anyhow::ensure!(
            placed == want,
            "cluster addresses differ from the evaluator's layout"
        );
        let servers = (cluster.pods.iter())
            .map(|p| Servers::start(p.ns.name()))
            .collect::<Result<Vec<_>>>()?;
        let etcd = start_etcd(&cluster.infra, "10.77.0.1", work.path());
        let agents = (cluster.nodes.iter())
            .map(|n| start_agent(&n.ns, &n.name, &etcd.client_url(), work.path()))
            .collect::<Result<Vec<_>>>()?;
        Ok(StandardCluster {
            work,
            cluster,
            servers,
            etcd,
            agents,
        })
    }
}

pub struct Cluster {
    pub pods: Vec<Pod>,
    pub nodes: Vec<Node>,
    /// Dropped last: it holds the bridge (and etcd) that the nodes hang off.
    pub infra: Netns,
    next_host: [u8; 2],
}

/// How long one probe waits for an answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

pub const INFRA_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

pub use felixrs_test_support::node::GATEWAY6;

/// The IPv6 address `Cluster::add_pod` gives the `host`-th pod of `node` (index): `fd78:<node+1>::<host>`.
pub fn pod_ip6(node: usize, host: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd78, node as u16 + 1, 0, 0, 0, 0, 0, u16::from(host))
}

/// No duplicate address detection on interfaces created in `ns` from now on: addresses work at once.
fn no_dad(ns: &Netns) -> Result<()> {
    for scope in ["all", "default"] {
        ns.sysctl(&format!("net.ipv6.conf.{scope}.accept_dad"), "0")?;
        ns.sysctl(&format!("net.ipv6.conf.{scope}.dad_transmits"), "0")?;
    }
    Ok(())
}

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
            no_dad(&ns)?;
            let ip = Ipv4Addr::new(10, 77, 0, 11 + i as u8);
            let ip6 = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 0x11 + i as u16);
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
            ns.exec(&[
                "ip",
                "-6",
                "addr",
                "add",
                &format!("{ip6}/64"),
                "dev",
                "eth0",
                "nodad",
            ])?;
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
            ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
            nodes.push(Node {
                name: format!("node-{}", i + 1),
                ip,
                ip6,
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
        let ip6 = pod_ip6(node, host);
        let iface = veth_name(namespace, name);
        let ns = Netns::create(unique_name("p"))?;
        no_dad(&ns)?;
        // Servers bind `[::]` for IPv6 next to `0.0.0.0` for IPv4: v6-only, so the two do not collide.
        ns.sysctl("net.ipv6.bindv6only", "1")?;
        let n = &self.nodes[node];
        wire_pod(&n.ns, &ns, &iface, ip, ip6)?;
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
                other.ns.exec(&[
                    "ip",
                    "-6",
                    "route",
                    "add",
                    &format!("{ip6}/128"),
                    "via",
                    &n.ip6.to_string(),
                ])?;
            }
        }
        self.pods.push(Pod {
            namespace: namespace.to_string(),
            name: name.to_string(),
            node,
            ip,
            ip6,
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
                ip6: p.ip6,
            })
            .collect()
    }

    /// Probes every cell of `expect` to the destinations' `family` addresses; cells that disagree are
    /// probed twice more before they count. Returns the disagreements. Bare-IP-protocol probes,
    /// whose conntrack flows are keyed by addresses alone (see [`Probe::is_raw`]), run in two rounds
    /// (no pair in both directions at once) after their flows are deleted on every node.
    pub fn check(&self, expect: &Expect, family: Family) -> Result<Vec<String>> {
        let cells: Vec<(String, String, Probe)> = expect
            .cells
            .iter()
            .map(|(f, t, p, _)| (f.clone(), t.clone(), *p))
            .collect();
        expect.disagreements(|idx| {
            let some: Vec<_> = idx.iter().map(|&i| cells[i].clone()).collect();
            self.probe(&some, family)
        })
    }

    /// Deletes every node's conntrack flows of the bare IP protocols in `probes` (for both families).
    pub fn forget_raw_flows(&self, probes: &[Probe]) -> Result<()> {
        let mut protos: Vec<String> = probes
            .iter()
            .filter(|p| p.is_raw())
            .map(|p| p.port.to_string())
            .collect();
        protos.sort();
        protos.dedup();
        for n in &self.nodes {
            for proto in &protos {
                for family in ["ipv4", "ipv6"] {
                    // Exit status 1 means "nothing to delete".
                    n.ns.exec_unchecked(&["conntrack", "-D", "-f", family, "-p", proto])?;
                }
            }
        }
        Ok(())
    }

    /// Probes `(from pod, to pod, probe)` to the destinations' `family` addresses.
    pub fn probe(&self, cells: &[(String, String, Probe)], family: Family) -> Result<Vec<bool>> {
        let job = |(f, t, p): &(String, String, Probe)| {
            let to = self.pod(t);
            let dst = match family {
                Family::V4 => IpAddr::V4(to.ip),
                Family::V6 => IpAddr::V6(to.ip6),
            };
            (self.pod(f).ns.name().to_string(), dst, *p)
        };
        let mut results = vec![false; cells.len()];
        let plain: Vec<usize> = (0..cells.len()).filter(|&i| !cells[i].2.is_raw()).collect();
        let probes: Vec<Probe> = cells.iter().map(|c| c.2).collect();
        // Raw pairs one way, then the other, each round after the flows are gone.
        let forward: Vec<usize> = (0..cells.len())
            .filter(|&i| cells[i].2.is_raw() && cells[i].0 < cells[i].1)
            .collect();
        let backward: Vec<usize> = (0..cells.len())
            .filter(|&i| cells[i].2.is_raw() && cells[i].0 > cells[i].1)
            .collect();
        for (k, round) in [plain, forward, backward].into_iter().enumerate() {
            if round.is_empty() {
                continue;
            }
            if k > 0 {
                self.forget_raw_flows(&probes)?;
            }
            let jobs: Vec<_> = round.iter().map(|&i| job(&cells[i])).collect();
            for (i, r) in round.iter().zip(probe_many(&jobs, PROBE_TIMEOUT)?) {
                results[*i] = r;
            }
        }
        Ok(results)
    }

    /// Empties every pod's and node's IPv6 neighbour cache, so each probe needs neighbour discovery
    /// between pod and node to succeed under the policy in force (NDP must survive policy, as in Felix).
    pub fn forget_neighbours(&self) -> Result<()> {
        let pods = self.pods.iter().map(|p| &p.ns);
        for ns in pods.chain(self.nodes.iter().map(|n| &n.ns)) {
            ns.exec(&["ip", "-6", "neigh", "flush", "all"])?;
        }
        Ok(())
    }
    pub fn pod(&self, id: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.id() == id)
            .unwrap_or_else(|| panic!("no pod {id} in the cluster"))
    }
}
