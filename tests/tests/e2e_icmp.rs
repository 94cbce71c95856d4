//! Issue 11's datapath proof, on its own cluster (the real binaries, a real etcd, the real kernel in
//! network namespaces): L3 default deny and Calico ICMP rules over IPv4 and IPv6
//! ([`felixrs_e2e::cases_icmp`]), IPv6 neighbour discovery surviving a pod's deny-all policy,
//! towards its gateway `fe80::1` and from the node, and a pod's packets of every protocol to its own
//! node (kernel and `felixrs trace` agree). Prints a PASS/FAIL line per case.

use std::net::IpAddr;

use anyhow::Result;
use felixrs_e2e::cases::{Step, T80};
use felixrs_e2e::cases_icmp::{self, PING, RAW};
use felixrs_e2e::cluster::GATEWAY6;
use felixrs_e2e::driver::binary;
use felixrs_e2e::env::{Env, PROBE_TIMEOUT};
use felixrs_e2e::report::Tally;
use felixrs_e2e::traffic::{Probe, Proto, Servers, probe_many};
use felixrs_e2e::world::Family;
use felixrs_test_support::require_root;

const DENY_ALL_X: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
"#;

/// The neighbour entry's state (`REACHABLE`, `STALE`, ..., `FAILED`), or "" when there is none.
fn neighbour_state(ns: &felixrs_test_support::netns::Netns, addr: &str) -> Result<String> {
    let out = ns.exec(&["ip", "-6", "neigh", "show", addr, "dev", "eth0"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .to_string())
}

/// Under a deny-all policy on x's pods, with every neighbour cache empty: x/a's (dropped) connection
/// still resolves its gateway fe80::1, and the node (whose traffic to its pods is not policed, as in
/// Felix) pings x/a, which needs neighbour discovery both ways.
fn neighbour_discovery_survives_deny_all(h: &mut Env) -> Result<Vec<String>> {
    h.apply_step(&Step::new(vec![DENY_ALL_X], vec![], |_| {}))?;
    h.cluster.forget_neighbours()?;
    let mut failures = Vec::new();
    let xa = h.cluster.pod("x/a");
    let ya = h.cluster.pod("y/a");
    let node = &h.cluster.nodes[xa.node];
    let out = probe_many(
        &[(xa.ns.name().to_string(), IpAddr::V6(ya.ip6), T80)],
        PROBE_TIMEOUT,
    )?;
    if out[0] {
        failures.push("x/a -> y/a over IPv6 connected under deny-all".to_string());
    }
    let state = neighbour_state(&xa.ns, GATEWAY6)?;
    if !["REACHABLE", "STALE", "DELAY", "PROBE"].contains(&state.as_str()) {
        failures.push(format!(
            "x/a's neighbour entry for its gateway {GATEWAY6} is {state:?} after a dropped connection: neighbour discovery was blocked"
        ));
    }
    h.cluster.forget_neighbours()?;
    let out = probe_many(
        &[(node.ns.name().to_string(), IpAddr::V6(xa.ip6), PING)],
        PROBE_TIMEOUT * 3,
    )?;
    if !out[0] {
        failures.push(format!(
            "{} cannot ping6 its pod x/a under deny-all: neighbour discovery (or the host's unpoliced traffic to its pods) was blocked",
            node.name
        ));
    }
    Ok(failures)
}

const DENY_EGRESS_XA: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress-a, namespace: x}
spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress]}
"#;

/// A pod's packets to its own node go through its egress policy (then the agent's
/// DefaultEndpointToHostAction, Accept) for every protocol: x/a's TCP, echo and bare-IP-protocol
/// packets to node-1's IPv4 and IPv6 addresses are dropped while an egress policy isolates x/a,
/// and reach the node without it. `felixrs trace --to host:ADDR` says the same for each.
fn pod_to_its_node_every_protocol(h: &mut Env) -> Result<Vec<String>> {
    use felixrs::cmd::shared::dataplane_args::{DataplaneArgs, WorkloadSourceSpoofing};
    use felixrs::cmd::shared::node_view::{SourceArgs, render_node};
    use felixrs::cmd::trace::{PacketArgs, Verdict, trace_packet};
    let xa = h.cluster.pod("x/a");
    let node = &h.cluster.nodes[xa.node];
    let (xa_ns, node_name) = (xa.ns.name().to_string(), node.name.clone());
    let addrs = [IpAddr::V4(node.ip), IpAddr::V6(node.ip6)];
    // The servers bind `[::]` next to `0.0.0.0` (v6-only, as in the pod namespaces).
    node.ns.sysctl("net.ipv6.bindv6only", "1")?;
    let servers = Servers::start(node.ns.name())?;
    let probes: [Probe; 3] = [T80, PING, RAW];
    let mut failures = Vec::new();
    for (policies, want) in [(vec![DENY_EGRESS_XA], false), (vec![], true)] {
        h.apply_step(&Step::new(policies, vec![], |_| {}))?;
        h.cluster.forget_raw_flows(&probes)?;
        let source = SourceArgs::manifests(vec![h.manifests_dir()]);
        let dataplane = DataplaneArgs {
            workload_source_spoofing: WorkloadSourceSpoofing::Any,
            ..DataplaneArgs::default()
        };
        let view = render_node(&source, &node_name, &dataplane)?;
        for addr in addrs {
            let jobs: Vec<_> = probes.iter().map(|p| (xa_ns.clone(), addr, *p)).collect();
            let got = probe_many(&jobs, PROBE_TIMEOUT)?;
            for (probe, got) in probes.iter().zip(got) {
                let state = if want { "without" } else { "with" };
                if got != want {
                    failures.push(format!(
                        "{state} the egress policy, x/a -> its node {addr} {probe}: got {got}, expected {want}"
                    ));
                }
                let packet = PacketArgs {
                    from: "x/a".into(),
                    to: format!("host:{addr}"),
                    protocol: match probe.proto {
                        Proto::Icmp => "icmp".into(),
                        Proto::Ip => probe.port.to_string(),
                        p => p.as_str().to_string(),
                    },
                    port: probe.port,
                    source_port: 40000,
                    icmp_type: None,
                    icmp_code: 0,
                    ipv6: addr.is_ipv6(),
                };
                let traced = trace_packet(&view, &node_name, &packet)?.verdict;
                if (traced == Verdict::Accept) != got {
                    failures.push(format!(
                        "{state} the egress policy, x/a -> its node {addr} {probe}: the kernel says {got}, trace says {traced:?}"
                    ));
                }
            }
        }
    }
    drop(servers);
    Ok(failures)
}

#[test]
fn icmp_and_l3_default_deny() {
    require_root();
    binary("felixrs");
    binary("policy-controller");
    let mut h = Env::start().expect("cluster, etcd and agents start");
    let mut tally = Tally::default();
    let mut report = |name: &str, result: Result<Vec<String>>| tally.record(name, result);
    let cases = cases_icmp::all();
    for (family, case) in &cases {
        let label = match family {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        };
        let r = h.run_case(case, *family);
        report(&format!("{label}: {}", case.name), r);
    }
    let r = neighbour_discovery_survives_deny_all(&mut h);
    report(
        "ipv6: neighbour discovery survives deny-all (gateway and node)",
        r,
    );
    let r = pod_to_its_node_every_protocol(&mut h);
    report(
        "pod to its own node, every protocol, both families: egress policy, then DefaultEndpointToHostAction (kernel and trace)",
        r,
    );
    let Tally { passed, failed } = tally;
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        for a in &h.agents {
            println!("--- agent {} log tail ---\n{}", a.node_name, a.log_tail(40));
        }
    }
    assert!(passed >= cases.len(), "only {passed} cases ran");
    assert_eq!(failed, 0, "{failed} ICMP / L3 cases failed");
}
