//! The host endpoint kernel tests' world ([`World`]): a namespace the test creates is the
//! "host" (`fxv-b`), a peer namespace joined by a veth plays "outside" (`fxv-a`), and a third
//! namespace behind a second veth (`fxh-far`) is a network the host routes to; listeners on
//! each; resources go through the real calculation graph, renderer and applier. Shared by
//! `host_endpoint_kernel.rs` (filter table) and `host_tables_kernel.rs` (mangle, raw).

#![allow(dead_code)]

use calc_graph::graph::{CalcGraph, Update};
use calc_graph::model::Resource;
use calc_graph::proto::IpVersion;
use felixrs_test_support::netns::{Netns, VethPair, unique_name, veth};
use iptables::apply::{Applier, ApplierConfig, Backend};
use iptables::render::{RenderConfig, Renderer};
use serde_json::json;

use super::{require_kernel_tools, runner, tcp};

pub const NODE: &str = "node1";
pub const OUT6: &str = "fd99::1";
pub const HOST6: &str = "fd99::2";
pub const FAR4: &str = "10.98.0.2";
pub const FAR6: &str = "fd98::2";

pub struct World {
    pub pair: VethPair,
    pub far: Netns,
    pub graph: CalcGraph,
    pub renderer: Renderer,
    pub appliers: [Applier<iptables::apply::ExecRunner>; 2],
    pub backend: Backend,
    /// The resources applied so far, by key (what a restarted agent reads from the datastore).
    pub store: std::collections::BTreeMap<calc_graph::model::ResourceKey, serde_json::Value>,
}

pub fn cmd(ns: &Netns, line: &str) {
    ns.ok("ip", &line.split_whitespace().collect::<Vec<_>>());
}

impl World {
    pub fn new(backend: Backend) -> World {
        require_kernel_tools();
        let pair = VethPair::new();
        let far = Netns::create(unique_name("fxf")).expect("far netns");
        veth(&pair.b, "fxh-far", &far, "fxf-h");
        for ns in [&pair.a, &pair.b, &far] {
            for scope in ["all", "default"] {
                ns.sysctl(&format!("net.ipv6.conf.{scope}.accept_dad"), "0")
                    .unwrap();
            }
        }
        cmd(&pair.a, &format!("-6 addr add {OUT6}/64 dev fxv-a nodad"));
        cmd(&pair.b, &format!("-6 addr add {HOST6}/64 dev fxv-b nodad"));
        cmd(&pair.b, "addr add 10.98.0.1/24 dev fxh-far");
        cmd(&pair.b, "-6 addr add fd98::1/64 dev fxh-far nodad");
        cmd(&far, &format!("addr add {FAR4}/24 dev fxf-h"));
        cmd(&far, &format!("-6 addr add {FAR6}/64 dev fxf-h nodad"));
        cmd(&pair.a, "route add 10.98.0.0/24 via 10.99.0.2");
        cmd(&pair.a, "-6 route add fd98::/64 via fd99::2");
        cmd(&far, "route add 10.99.0.0/24 via 10.98.0.1");
        cmd(&far, "-6 route add fd99::/64 via fd98::1");
        pair.b.sysctl("net.ipv4.ip_forward", "1").unwrap();
        pair.b.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
        // Listeners: on the host (22 failsafe, 8080/8081 policy), outside (179 outbound
        // failsafe, 9000 not), and far (9000/9001 forwarded).
        for (ns, addrs, ports) in [
            (&pair.b, [VethPair::ADDR_B, HOST6], &[22u16, 8080, 8081][..]),
            (&pair.a, [VethPair::ADDR_A, OUT6], &[179, 9000][..]),
            (&far, [FAR4, FAR6], &[9000, 9001][..]),
        ] {
            for addr in addrs {
                for port in ports {
                    tcp::serve(ns, addr, *port);
                }
            }
        }
        let (graph, renderer, appliers) = fresh(&pair.b, backend);
        World {
            far,
            graph,
            renderer,
            appliers,
            backend,
            store: Default::default(),
            pair,
        }
    }

    /// A new graph, renderer and appliers on the same host (an agent restart), fed everything
    /// applied so far in one snapshot, and applied once.
    pub fn restart(&mut self) {
        let (graph, renderer, appliers) = fresh(&self.pair.b, self.backend);
        (self.graph, self.renderer, self.appliers) = (graph, renderer, appliers);
        let all = self.store.values().map(|v| (v.clone(), true)).collect();
        self.apply(all);
    }

    /// Applies resources (`None`: delete) through graph, renderer and applier, both families.
    pub fn apply(&mut self, resources: Vec<(serde_json::Value, bool)>) {
        for (v, present) in resources {
            let r = Resource::from_value(v.clone()).expect("valid resource");
            let key = r.key();
            if present {
                self.store.insert(key.clone(), v);
            } else {
                self.store.remove(&key);
            }
            self.graph.apply(Update::Resource {
                key,
                value: present.then_some(r),
            });
        }
        assert!(self.graph.take_errors().is_empty());
        let errors = self.renderer.apply_all(self.graph.flush());
        assert!(errors.is_empty(), "{errors:?}");
        assert!(self.renderer.flush().is_empty());
        for (i, v) in [IpVersion::V4, IpVersion::V6].into_iter().enumerate() {
            self.appliers[i]
                .apply(&self.renderer.desired(v))
                .unwrap_or_else(|e| panic!("apply {v:?}: {e}"));
        }
    }

    /// From outside to the host, in both families.
    pub fn inbound(&self, port: u16) -> [bool; 2] {
        [VethPair::ADDR_B, HOST6].map(|a| tcp::connects(&self.pair.a, a, port))
    }

    pub fn outbound(&self, port: u16) -> [bool; 2] {
        [VethPair::ADDR_A, OUT6].map(|a| tcp::connects(&self.pair.b, a, port))
    }

    pub fn forwarded(&self, port: u16) -> [bool; 2] {
        [FAR4, FAR6].map(|a| tcp::connects(&self.pair.a, a, port))
    }
}

pub type Fresh = (
    CalcGraph,
    Renderer,
    [Applier<iptables::apply::ExecRunner>; 2],
);

pub fn fresh(host: &Netns, backend: Backend) -> Fresh {
    let mk = |family| {
        Applier::new(
            runner(host),
            ApplierConfig {
                family,
                backend,
                ..ApplierConfig::default()
            },
        )
    };
    let mut graph = CalcGraph::new(NODE);
    graph.apply(Update::InSync);
    let renderer = Renderer::new(RenderConfig::default()).unwrap();
    (graph, renderer, [mk(IpVersion::V4), mk(IpVersion::V6)])
}

pub fn hep(iface: &str) -> serde_json::Value {
    json!({"apiVersion": "projectcalico.org/v3", "kind": "HostEndpoint",
           "metadata": {"name": "node1-hep", "labels": {"role": "host"}},
           "spec": {"node": NODE, "interfaceName": iface,
                    "expectedIPs": [VethPair::ADDR_B, HOST6]}})
}

pub fn gnp(name: &str, spec: serde_json::Value) -> serde_json::Value {
    let mut s = json!({"selector": "role == 'host'", "order": 10});
    s.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    json!({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
           "metadata": {"name": name}, "spec": s})
}

pub const OPEN: [bool; 2] = [true, true];
pub const SHUT: [bool; 2] = [false, false];

pub fn eventually(f: impl Fn() -> [bool; 2]) -> [bool; 2] {
    let mut last = f();
    for _ in 0..4 {
        if last == OPEN {
            break;
        }
        last = f();
    }
    last
}

/// A "pod": a namespace behind a `cali` veth of the host (`iface` on the host, `eth0` inside),
/// addressed and routed as Calico does (a /32 and /128, default routes via a link address on
/// the host side), with listeners on 9000 and 9001, and its WorkloadEndpoint resource (labels
/// `role: pod`, `name: <name>`), which the caller applies.
pub struct Pod {
    pub ns: Netns,
    pub v4: String,
    pub v6: String,
    pub resource: serde_json::Value,
}

impl World {
    pub fn add_pod(&self, name: &str, iface: &str, n: u8) -> Pod {
        let ns = Netns::create(unique_name("fxp")).expect("pod netns");
        for scope in ["all", "default"] {
            ns.sysctl(&format!("net.ipv6.conf.{scope}.accept_dad"), "0")
                .unwrap();
        }
        veth(&self.pair.b, iface, &ns, "eth0");
        let (v4, v6) = (format!("10.97.1.{n}"), format!("fd97::{n}"));
        let host = &self.pair.b;
        cmd(host, &format!("addr add 169.254.1.1/32 dev {iface}"));
        cmd(host, &format!("-6 addr add fe80::1/64 dev {iface} nodad"));
        cmd(host, &format!("route add {v4}/32 dev {iface}"));
        cmd(host, &format!("-6 route add {v6}/128 dev {iface}"));
        cmd(&ns, &format!("addr add {v4}/32 dev eth0"));
        cmd(&ns, &format!("-6 addr add {v6}/128 dev eth0 nodad"));
        cmd(&ns, "route add 169.254.1.1 dev eth0 scope link");
        cmd(&ns, "route add default via 169.254.1.1");
        cmd(&ns, "-6 route add default via fe80::1 dev eth0");
        for addr in [&v4, &v6] {
            for port in [9000, 9001] {
                tcp::serve(&ns, addr, port);
            }
        }
        // Outside reaches the pod network through the host.
        cmd(
            &self.pair.a,
            &format!("route replace {v4}/32 via 10.99.0.2"),
        );
        cmd(
            &self.pair.a,
            &format!("-6 route replace {v6}/128 via fd99::2"),
        );
        let resource = json!({
            "apiVersion": "projectcalico.org/v3", "kind": "WorkloadEndpoint",
            "metadata": {"name": format!("node1-k8s-{name}-eth0"), "namespace": "ns",
                         "labels": {"role": "pod", "name": name,
                                    "projectcalico.org/namespace": "ns"}},
            "spec": {"orchestrator": "k8s", "node": NODE, "pod": name, "endpoint": "eth0",
                     "interfaceName": iface, "profiles": [],
                     "ipNetworks": [format!("{v4}/32"), format!("{v6}/128")]},
        });
        Pod {
            ns,
            v4,
            v6,
            resource,
        }
    }
}
