//! Issue 11's datapath proof, on its own cluster (the real binaries, a real etcd, the real kernel in
//! network namespaces): L3 default deny and Calico ICMP rules over IPv4 and IPv6
//! ([`felixrs_e2e::cases_icmp`]), and IPv6 neighbour discovery surviving a pod's deny-all policy,
//! towards its gateway `fe80::1` and from the node. Prints a PASS/FAIL line per case.

use std::net::IpAddr;

use anyhow::Result;
use felixrs_e2e::cases::{Step, T80};
use felixrs_e2e::cases_icmp::{self, PING};
use felixrs_e2e::cluster::GATEWAY6;
use felixrs_e2e::driver::binary;
use felixrs_e2e::harness::{Harness, PROBE_TIMEOUT};
use felixrs_e2e::traffic::probe_many;
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
fn neighbour_discovery_survives_deny_all(h: &mut Harness) -> Result<Vec<String>> {
    h.apply_step(&Step::new(vec![DENY_ALL_X], vec![], |_| {}))?;
    h.forget_neighbours()?;
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
    h.forget_neighbours()?;
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

#[test]
fn icmp_and_l3_default_deny() {
    require_root();
    binary("felixrs");
    binary("policy-controller");
    let mut h = Harness::start().expect("cluster, etcd and agents start");
    let (mut passed, mut failed) = (0, 0);
    let mut report = |name: &str, result: Result<Vec<String>>| match result {
        Ok(f) if f.is_empty() => {
            passed += 1;
            println!("PASS {name}");
        }
        Ok(f) => {
            failed += 1;
            println!("FAIL {name}");
            for line in f {
                println!("    {line}");
            }
        }
        Err(e) => {
            failed += 1;
            println!("FAIL {name}: {e:#}");
        }
    };
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
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        for a in &h.agents {
            println!("--- agent {} log tail ---\n{}", a.node_name, a.log_tail(40));
        }
    }
    assert!(passed >= cases.len(), "only {passed} cases ran");
    assert_eq!(failed, 0, "{failed} ICMP / L3 cases failed");
}
