//! Host endpoints' preDNAT (mangle) and doNotTrack (raw) policies on the real kernel, in the
//! world of `host_endpoint_kernel.rs` ([`support::host_world`]), through the real graph,
//! renderer and applier, in IPv4 and IPv6, with the nft and legacy backends:
//! * a kube-proxy-style NodePort (a DNAT rule the test installs in nat `PREROUTING`, host port
//!   30080 → a server pod's 9000; pods are namespaces behind `cali` veths with their
//!   WorkloadEndpoints) is denied from outside by a preDNAT policy, *before* the DNAT: the pod
//!   stays reachable directly, so the deny matched the NodePort, not the pod's port; another pod
//!   reaches it directly and through the NodePort, and the pod's own policy (deny 9001) holds; under a deny-all preDNAT policy the
//!   failsafe port 22 still connects while forwarding stops;
//! * a doNotTrack policy allowing port 8080 both ways lets the connection through a host
//!   endpoint whose normal policy denies everything, and creates no conntrack entry (read with
//!   `conntrack -L` in the host), where the failsafe connection to 22 does create one; under a
//!   deny-all doNotTrack policy, 22 still connects (the raw failsafe chains, replies by source
//!   port) and 8080 does not;
//! * DNAT'd host egress (a DNAT the test installs in nat `OUTPUT`: the host's connection to the
//!   outside peer's 7000 goes to its 9000) skips filter `cali-OUTPUT`'s host endpoint dispatch and
//!   is policed in mangle `cali-POSTROUTING`: a normal egress policy denying 9000 stops it there
//!   (with the direct connection), the outbound failsafe port 179 reached through a DNAT still
//!   connects, allowing 9000 opens it, and without host endpoints mangle is gone again.

mod support;

use felixrs_test_support::netns::{Netns, VethPair};
use iptables::apply::Backend;
use serde_json::json;
use support::host_world::*;
use support::tcp;

const NODE_PORT: u16 = 30080;

fn iptables_bin(backend: Backend, v6: bool) -> String {
    let kind = match backend {
        Backend::Legacy => "legacy",
        _ => "nft",
    };
    format!("{}-{kind}", if v6 { "ip6tables" } else { "iptables" })
}

/// kube-proxy's part: host port 30080 DNATs to the pod's 9000, in both families.
fn install_node_port(host: &Netns, backend: Backend, pod: &Pod) {
    for (v6, to) in [
        (false, format!("{}:9000", pod.v4)),
        (true, format!("[{}]:9000", pod.v6)),
    ] {
        let port = NODE_PORT.to_string();
        host.ok(
            &iptables_bin(backend, v6),
            &[
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-p",
                "tcp",
                "--dport",
                &port,
                "-j",
                "DNAT",
                "--to-destination",
                &to,
            ],
        );
    }
}

fn node_port(w: &World) -> [bool; 2] {
    [VethPair::ADDR_B, HOST6].map(|a| tcp::connects(&w.pair.a, a, NODE_PORT))
}

/// ICMPv6 both ways for the host endpoint (IPv6 neighbour discovery), as normal policy.
fn allow_ndp() -> (serde_json::Value, bool) {
    (
        gnp(
            "host-allow-ndp",
            json!({"order": 1, "types": ["Ingress", "Egress"],
                   "ingress": [{"action": "Allow", "protocol": "ICMPv6"}],
                   "egress": [{"action": "Allow", "protocol": "ICMPv6"}]}),
        ),
        true,
    )
}

fn pods(from: &Pod, to: &Pod, port: u16) -> [bool; 2] {
    [&to.v4, &to.v6].map(|a| tcp::connects(&from.ns, a, port))
}

fn pre_dnat_deny_of_a_node_port(backend: Backend) {
    let mut w = World::new(backend);
    // Two pods; every pod allows all, and the server pod's own policy denies 9001.
    let client = w.add_pod("client", "calih9c", 1);
    let server = w.add_pod("server", "calih9s", 2);
    w.apply(vec![
        (client.resource.clone(), true),
        (server.resource.clone(), true),
        (
            gnp(
                "pods-allow",
                json!({"selector": "role == 'pod'", "types": ["Ingress", "Egress"],
                       "ingress": [{"action": "Allow"}], "egress": [{"action": "Allow"}]}),
            ),
            true,
        ),
        (
            gnp(
                "server-no-9001",
                json!({"selector": "name == 'server'", "order": 1, "types": ["Ingress"],
                       "ingress": [{"action": "Deny", "protocol": "TCP",
                                    "destination": {"ports": [9001]}}]}),
            ),
            true,
        ),
    ]);
    install_node_port(&w.pair.b, backend, &server);
    assert_eq!(
        eventually(|| node_port(&w)),
        OPEN,
        "no NodePort before policy"
    );
    assert_eq!(
        eventually(|| pods(&client, &server, 9000)),
        OPEN,
        "no pod-to-pod"
    );

    // The host endpoint with a normal policy allowing the host's own ports, and a preDNAT
    // policy denying the NodePort from outside.
    w.apply(vec![
        (hep("fxv-b"), true),
        allow_ndp(),
        (
            gnp(
                "host-allow",
                json!({"order": 5, "types": ["Ingress", "Egress"],
                       "ingress": [{"action": "Allow"}], "egress": [{"action": "Allow"}]}),
            ),
            true,
        ),
        (
            gnp(
                "deny-node-port",
                json!({"order": 1, "preDNAT": true, "applyOnForward": true, "types": ["Ingress"],
                       "ingress": [{"action": "Deny", "protocol": "TCP",
                                    "destination": {"ports": [NODE_PORT]}}]}),
            ),
            true,
        ),
    ]);
    assert_eq!(node_port(&w), SHUT, "preDNAT policy left the NodePort open");
    // The same pod, not through the NodePort: the deny matched the pre-DNAT port.
    assert_eq!(
        eventually(|| [&server.v4, &server.v6].map(|a| tcp::connects(&w.pair.a, a, 9000))),
        OPEN,
        "preDNAT deny of the NodePort blocked the pod itself"
    );
    // Pods: direct and through the NodePort (from a workload interface: no preDNAT policy),
    // and the server pod's own policy still decides.
    assert_eq!(
        eventually(|| pods(&client, &server, 9000)),
        OPEN,
        "pod-to-pod blocked"
    );
    assert_eq!(
        eventually(|| [VethPair::ADDR_B, HOST6].map(|a| tcp::connects(&client.ns, a, NODE_PORT))),
        OPEN,
        "preDNAT policy blocked a pod's NodePort connection"
    );
    assert_eq!(
        pods(&client, &server, 9001),
        SHUT,
        "the pod's own policy stopped working"
    );
    assert_eq!(
        eventually(|| w.inbound(8080)),
        OPEN,
        "host policy stopped working"
    );

    // The `*` endpoint: preDNAT policy on every interface, but workload traffic never meets it.
    w.apply(vec![(hep("*"), true)]);
    assert_eq!(node_port(&w), SHUT, "* endpoint left the NodePort open");
    assert_eq!(
        eventually(|| [VethPair::ADDR_B, HOST6].map(|a| tcp::connects(&client.ns, a, NODE_PORT))),
        OPEN,
        "the * endpoint's preDNAT policy blocked a pod's NodePort connection"
    );

    // Deny-all preDNAT: everything from outside stops before DNAT, but failsafe 22.
    w.apply(vec![(
        gnp(
            "deny-node-port",
            json!({"order": 1, "preDNAT": true, "applyOnForward": true, "types": ["Ingress"],
                   "ingress": [{"action": "Deny"}]}),
        ),
        true,
    )]);
    assert_eq!(
        w.forwarded(9000),
        SHUT,
        "deny-all preDNAT left forwarding open"
    );
    assert_eq!(
        eventually(|| pods(&client, &server, 9000)),
        OPEN,
        "deny-all preDNAT blocked pods"
    );
    assert_eq!(w.inbound(8080), SHUT, "deny-all preDNAT left 8080 open");
    assert_eq!(
        eventually(|| w.inbound(22)),
        OPEN,
        "deny-all preDNAT blocked failsafe 22"
    );

    // Removing the policy opens the NodePort again (the preDNAT chains and hook go; the
    // endpoints' DNAT'd host egress stays in mangle POSTROUTING).
    w.apply(vec![(gnp("deny-node-port", json!({})), false)]);
    assert_eq!(eventually(|| node_port(&w)), OPEN, "NodePort stayed shut");
    for v in [
        calc_graph::proto::IpVersion::V4,
        calc_graph::proto::IpVersion::V6,
    ] {
        let d = w.renderer.desired(v);
        let mangle = &d.tables[&iptables::desired::TableName::Mangle];
        assert!(!mangle.chains.contains_key("cali-PREROUTING"));
        assert!(!mangle.chains.contains_key("cali-from-host-endpoint"));
        assert!(mangle.hooks.iter().all(|h| h.kernel_chain == "POSTROUTING"));
    }
    drop((w.far, client.ns, server.ns));
}

/// The host's conntrack entries of family `v6` to TCP port `port`.
fn conntrack_entries(host: &Netns, v6: bool, port: u16) -> usize {
    let out = host.run(
        "conntrack",
        &[
            "-L",
            "-f",
            if v6 { "ipv6" } else { "ipv4" },
            "-p",
            "tcp",
            "--dport",
            &port.to_string(),
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("tcp"))
        .count()
}

fn untracked(
    name: &str,
    ingress: serde_json::Value,
    egress: serde_json::Value,
) -> serde_json::Value {
    gnp(
        name,
        json!({"order": 1, "doNotTrack": true, "applyOnForward": true,
               "types": ["Ingress", "Egress"], "ingress": ingress, "egress": egress}),
    )
}

fn do_not_track_allow_without_conntrack(backend: Backend) {
    let mut w = World::new(backend);
    // Normal host policy: only ICMPv6 (the endpoint is otherwise default-deny); doNotTrack:
    // ICMPv6 untracked too, and 8080 both ways (in to 8080, out from 8080).
    w.apply(vec![
        (hep("fxv-b"), true),
        allow_ndp(),
        (
            untracked(
                "untracked-8080",
                json!([{"action": "Allow", "protocol": "ICMPv6"},
                       {"action": "Allow", "protocol": "TCP", "destination": {"ports": [8080]}}]),
                json!([{"action": "Allow", "protocol": "ICMPv6"},
                       {"action": "Allow", "protocol": "TCP", "source": {"ports": [8080]}}]),
            ),
            true,
        ),
    ]);
    w.pair.b.ok("conntrack", &["-F"]);
    assert_eq!(
        eventually(|| w.inbound(8080)),
        OPEN,
        "doNotTrack allow failed"
    );
    assert_eq!(w.inbound(8081), SHUT, "normal host policy left 8081 open");
    assert_eq!(eventually(|| w.inbound(22)), OPEN, "failsafe 22 blocked");
    for v6 in [false, true] {
        assert_eq!(
            conntrack_entries(&w.pair.b, v6, 8080),
            0,
            "untracked connections were tracked (v6: {v6})"
        );
        assert!(
            conntrack_entries(&w.pair.b, v6, 22) > 0,
            "conntrack is not tracking this namespace (v6: {v6}): the check proves nothing"
        );
    }

    // Deny-all doNotTrack (ICMPv6 still allowed for neighbour discovery): 22 survives.
    w.apply(vec![(
        untracked(
            "untracked-8080",
            json!([{"action": "Allow", "protocol": "ICMPv6"}, {"action": "Deny"}]),
            json!([{"action": "Allow", "protocol": "ICMPv6"}, {"action": "Deny"}]),
        ),
        true,
    )]);
    assert_eq!(w.inbound(8080), SHUT, "deny-all doNotTrack left 8080 open");
    assert_eq!(
        eventually(|| w.inbound(22)),
        OPEN,
        "deny-all doNotTrack blocked failsafe 22"
    );
    assert_eq!(
        eventually(|| w.outbound(179)),
        OPEN,
        "deny-all doNotTrack blocked failsafe out"
    );

    // A restarted agent keeps the failsafes in raw from its first apply.
    w.restart();
    assert_eq!(w.inbound(8080), SHUT, "restart opened 8080");
    assert_eq!(
        eventually(|| w.inbound(22)),
        OPEN,
        "restart blocked failsafe 22"
    );
    drop(w.far);
}

/// The host's own DNATs to the outside peer: `7000 → 9000` and `7179 → 179`, both families.
fn install_output_dnat(host: &Netns, backend: Backend) {
    for (v6, peer, to) in [
        (false, VethPair::ADDR_A, VethPair::ADDR_A.to_string()),
        (true, OUT6, format!("[{OUT6}]")),
    ] {
        for (from, port) in [(7000, 9000), (7179, 179)] {
            let dport = from.to_string();
            let to = format!("{to}:{port}");
            host.ok(
                &iptables_bin(backend, v6),
                &[
                    "-t",
                    "nat",
                    "-A",
                    "OUTPUT",
                    "-d",
                    peer,
                    "-p",
                    "tcp",
                    "--dport",
                    &dport,
                    "-j",
                    "DNAT",
                    "--to-destination",
                    &to,
                ],
            );
        }
    }
}

fn host_egress(port: u16) -> serde_json::Value {
    gnp(
        "host-egress",
        json!({"order": 5, "types": ["Ingress", "Egress"],
               "ingress": [{"action": "Allow"}],
               "egress": [{"action": "Deny", "protocol": "TCP", "destination": {"ports": [port]}},
                          {"action": "Allow"}]}),
    )
}

fn dnat_host_egress_in_mangle(backend: Backend) {
    let mut w = World::new(backend);
    install_output_dnat(&w.pair.b, backend);
    let dnat =
        |w: &World, port: u16| [VethPair::ADDR_A, OUT6].map(|a| tcp::connects(&w.pair.b, a, port));
    assert_eq!(eventually(|| dnat(&w, 7000)), OPEN, "no DNAT before policy");

    w.apply(vec![
        (hep("fxv-b"), true),
        allow_ndp(),
        (host_egress(9000), true),
    ]);
    assert_eq!(w.outbound(9000), SHUT, "egress policy left 9000 open");
    assert_eq!(
        dnat(&w, 7000),
        SHUT,
        "DNAT'd host egress escaped the host endpoint's egress policy"
    );
    assert_eq!(
        eventually(|| dnat(&w, 7179)),
        OPEN,
        "mangle blocked the outbound failsafe port reached through a DNAT"
    );

    // A policy that allows 9000 (denying another port) lets the DNAT'd connection through:
    // RETURN is mangle's allow action, and the reply is established.
    w.apply(vec![(host_egress(9999), true)]);
    assert_eq!(
        eventually(|| dnat(&w, 7000)),
        OPEN,
        "DNAT'd egress stayed shut"
    );
    assert_eq!(
        eventually(|| w.outbound(9000)),
        OPEN,
        "direct egress stayed shut"
    );

    // Without host endpoints, mangle (chains and hook) is gone.
    w.apply(vec![(hep("fxv-b"), false)]);
    assert_eq!(
        eventually(|| dnat(&w, 7000)),
        OPEN,
        "DNAT'd egress shut without endpoints"
    );
    for v in [
        calc_graph::proto::IpVersion::V4,
        calc_graph::proto::IpVersion::V6,
    ] {
        let d = w.renderer.desired(v);
        assert!(!d.tables.contains_key(&iptables::desired::TableName::Mangle));
    }
    drop(w.far);
}

#[test]
fn dnat_host_egress_in_mangle_nft() {
    dnat_host_egress_in_mangle(Backend::Nft);
}

#[test]
fn dnat_host_egress_in_mangle_legacy() {
    dnat_host_egress_in_mangle(Backend::Legacy);
}

#[test]
fn pre_dnat_deny_of_a_node_port_nft() {
    pre_dnat_deny_of_a_node_port(Backend::Nft);
}

#[test]
fn pre_dnat_deny_of_a_node_port_legacy() {
    pre_dnat_deny_of_a_node_port(Backend::Legacy);
}

#[test]
fn do_not_track_allow_without_conntrack_nft() {
    do_not_track_allow_without_conntrack(Backend::Nft);
}

#[test]
fn do_not_track_allow_without_conntrack_legacy() {
    do_not_track_allow_without_conntrack(Backend::Legacy);
}
