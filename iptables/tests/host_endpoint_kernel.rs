//! Host endpoints on the real kernel. A namespace the test creates is the "host" (`fxv-b`); a
//! peer namespace joined by a veth plays "outside" (`fxv-a`), and a third namespace behind a
//! second veth (`fxh-far`) is a network the host routes to. Resources (HostEndpoint,
//! GlobalNetworkPolicy) go through the real calculation graph, renderer and applier:
//! * a deny-all host policy (after one allowing ICMPv6, which IPv6 neighbour discovery needs)
//!   blocks inbound TCP to a port on the host's interface while TCP 22
//!   (a failsafe port, with a listener the test starts) still connects, from the first apply;
//! * an allow policy for one port opens exactly that port;
//! * host egress is denied but for its policies' allows and the outbound failsafe ports;
//! * an `applyOnForward` policy decides forwarded traffic through the interface, while traffic
//!   forwarded through an interface without such a policy is allowed;
//! * `interfaceName: "*"` protects every interface;
//! * an agent restarted from its snapshot keeps the failsafes from its first apply;
//!
//! in IPv4 and IPv6, with the nft and legacy backends.

mod support;

use calc_graph::graph::{CalcGraph, Update};
use calc_graph::model::Resource;
use calc_graph::proto::IpVersion;
use felixrs_test_support::netns::{Netns, VethPair, unique_name, veth};
use iptables::apply::{Applier, ApplierConfig, Backend};
use iptables::render::{RenderConfig, Renderer};
use serde_json::json;
use support::{require_kernel_tools, runner, tcp};

const NODE: &str = "node1";
const OUT6: &str = "fd99::1";
const HOST6: &str = "fd99::2";
const FAR4: &str = "10.98.0.2";
const FAR6: &str = "fd98::2";

struct World {
    pair: VethPair,
    far: Netns,
    graph: CalcGraph,
    renderer: Renderer,
    appliers: [Applier<iptables::apply::ExecRunner>; 2],
    backend: Backend,
    /// The resources applied so far, by key (what a restarted agent reads from the datastore).
    store: std::collections::BTreeMap<calc_graph::model::ResourceKey, serde_json::Value>,
}

fn cmd(ns: &Netns, line: &str) {
    ns.ok("ip", &line.split_whitespace().collect::<Vec<_>>());
}

impl World {
    fn new(backend: Backend) -> World {
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
    fn restart(&mut self) {
        let (graph, renderer, appliers) = fresh(&self.pair.b, self.backend);
        (self.graph, self.renderer, self.appliers) = (graph, renderer, appliers);
        let all = self.store.values().map(|v| (v.clone(), true)).collect();
        self.apply(all);
    }

    /// Applies resources (`None`: delete) through graph, renderer and applier, both families.
    fn apply(&mut self, resources: Vec<(serde_json::Value, bool)>) {
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
    fn inbound(&self, port: u16) -> [bool; 2] {
        [VethPair::ADDR_B, HOST6].map(|a| tcp::connects(&self.pair.a, a, port))
    }

    fn outbound(&self, port: u16) -> [bool; 2] {
        [VethPair::ADDR_A, OUT6].map(|a| tcp::connects(&self.pair.b, a, port))
    }

    fn forwarded(&self, port: u16) -> [bool; 2] {
        [FAR4, FAR6].map(|a| tcp::connects(&self.pair.a, a, port))
    }
}

type Fresh = (
    CalcGraph,
    Renderer,
    [Applier<iptables::apply::ExecRunner>; 2],
);

fn fresh(host: &Netns, backend: Backend) -> Fresh {
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

fn hep(iface: &str) -> serde_json::Value {
    json!({"apiVersion": "projectcalico.org/v3", "kind": "HostEndpoint",
           "metadata": {"name": "node1-hep", "labels": {"role": "host"}},
           "spec": {"node": NODE, "interfaceName": iface,
                    "expectedIPs": [VethPair::ADDR_B, HOST6]}})
}

fn gnp(name: &str, spec: serde_json::Value) -> serde_json::Value {
    let mut s = json!({"selector": "role == 'host'", "order": 10});
    s.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    json!({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
           "metadata": {"name": name}, "spec": s})
}

const OPEN: [bool; 2] = [true, true];
const SHUT: [bool; 2] = [false, false];

fn eventually(f: impl Fn() -> [bool; 2]) -> [bool; 2] {
    let mut last = f();
    for _ in 0..4 {
        if last == OPEN {
            break;
        }
        last = f();
    }
    last
}

fn host_policy_with_failsafes(backend: Backend) {
    let mut w = World::new(backend);
    assert_eq!(
        eventually(|| w.inbound(8080)),
        OPEN,
        "no connectivity before policy"
    );

    // First apply: the host endpoint and a deny-all ingress policy together. SSH survives.
    // (IPv6 needs neighbour discovery through host policy, as with Felix: one policy allows
    // ICMPv6 both ways, ahead of the deny-all.)
    w.apply(vec![
        (hep("fxv-b"), true),
        (
            gnp(
                "host-allow-ndp",
                json!({"order": 1, "types": ["Ingress", "Egress"],
                       "ingress": [{"action": "Allow", "protocol": "ICMPv6"}],
                       "egress": [{"action": "Allow", "protocol": "ICMPv6"}]}),
            ),
            true,
        ),
        (gnp("host-deny", json!({"types": ["Ingress"]})), true),
    ]);
    assert_eq!(w.inbound(8080), SHUT, "deny-all host policy left 8080 open");
    assert_eq!(
        eventually(|| w.inbound(22)),
        OPEN,
        "failsafe port 22 was blocked"
    );

    // An allow policy for one port, before the deny-all: that port only.
    w.apply(vec![(
        gnp(
            "host-allow-8080",
            json!({"order": 5, "types": ["Ingress"],
                   "ingress": [{"action": "Allow", "protocol": "TCP",
                                "destination": {"ports": [8080]}}]}),
        ),
        true,
    )]);
    assert_eq!(
        eventually(|| w.inbound(8080)),
        OPEN,
        "allowed port stayed shut"
    );
    assert_eq!(
        w.inbound(8081),
        SHUT,
        "a port the policy does not allow opened"
    );

    // Outbound: the endpoint's only egress policy allows ICMPv6, so TCP out is dropped except
    // to the outbound failsafe ports (BGP 179); an egress allow policy opens its port.
    assert_eq!(w.outbound(9000), SHUT, "host egress left 9000 open");
    assert_eq!(
        eventually(|| w.outbound(179)),
        OPEN,
        "outbound failsafe blocked"
    );
    w.apply(vec![(
        gnp(
            "host-allow-out",
            json!({"order": 5, "types": ["Egress"],
                   "egress": [{"action": "Allow", "protocol": "TCP",
                               "destination": {"ports": [9000]}}]}),
        ),
        true,
    )]);
    assert_eq!(
        eventually(|| w.outbound(9000)),
        OPEN,
        "egress allow policy failed"
    );
    assert_eq!(eventually(|| w.inbound(22)), OPEN);

    // Forwarded traffic: allowed through the host endpoint while no applyOnForward policy
    // selects it; an applyOnForward policy then decides it (9000 allowed, 9001 not).
    assert_eq!(
        eventually(|| w.forwarded(9001)),
        OPEN,
        "forwarding blocked by default"
    );
    w.apply(vec![(
        gnp(
            "host-forward",
            json!({"order": 1, "applyOnForward": true, "types": ["Ingress"],
                   "ingress": [{"action": "Allow", "protocol": "TCP",
                                "destination": {"ports": [9000]}}]}),
        ),
        true,
    )]);
    assert_eq!(
        eventually(|| w.forwarded(9000)),
        OPEN,
        "applyOnForward allow failed"
    );
    assert_eq!(
        w.forwarded(9001),
        SHUT,
        "applyOnForward policy did not apply"
    );

    // `interfaceName: "*"`: the same policies on every interface (the far side too: host
    // traffic to far is blocked now, 22 still open on both interfaces).
    w.apply(vec![(
        gnp("host-forward", json!({"applyOnForward": true})),
        false,
    )]);
    assert_eq!(
        eventually(|| [FAR4, FAR6].map(|a| tcp::connects(&w.pair.b, a, 9001))),
        OPEN,
        "fxh-far has no host endpoint yet"
    );
    w.apply(vec![(hep("*"), true)]);
    assert_eq!(w.inbound(8081), SHUT, "* endpoint left 8081 open");
    assert_eq!(
        eventually(|| w.inbound(22)),
        OPEN,
        "* endpoint blocked failsafe 22"
    );
    assert_eq!(
        [FAR4, FAR6].map(|a| tcp::connects(&w.pair.b, a, 9001)),
        SHUT,
        "* endpoint did not police the other interface"
    );
    // No applyOnForward policy on it: forwarded traffic is allowed.
    assert_eq!(eventually(|| w.forwarded(9001)), OPEN);

    // A restarted agent programs the same state from its snapshot in its first apply: the
    // failsafes are there with the host policy.
    w.restart();
    assert_eq!(w.inbound(8081), SHUT, "restart opened 8081");
    assert_eq!(
        eventually(|| w.inbound(22)),
        OPEN,
        "restart blocked failsafe 22"
    );

    // Deleting the host endpoint opens the host again (its chains and the failsafes go).
    w.apply(vec![(hep("*"), false)]);
    assert_eq!(eventually(|| w.inbound(8081)), OPEN);
    drop(w.far);
}

#[test]
fn host_policy_with_failsafes_nft() {
    host_policy_with_failsafes(Backend::Nft);
}

#[test]
fn host_policy_with_failsafes_legacy() {
    host_policy_with_failsafes(Backend::Legacy);
}
