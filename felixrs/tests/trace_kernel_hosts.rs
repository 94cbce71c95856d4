//! `felixrs trace --kernel --check-kernel` for host endpoint traffic on the real kernel: the node
//! of `node_support` with a host endpoint on its uplink `up0` (10.79.255.1) under a deny-all host
//! policy, a doNotTrack allow (udp 4789) and a preDNAT allow (tcp 30080), applied with legacy and
//! nft; the kernel's raw, mangle and filter chains agree with the rendered path for host-bound
//! 8080 (denied), 22 (failsafe), 4789 (untracked), 30080 (preDNAT), the host's own traffic and
//! a pod's traffic to the host; a foreign rule ahead of our raw hook is named. Root.

mod node_support;

use felixrs::cmd::stats::{Stats, collect};
use iptables::apply::Backend;
use iptables::apply::backend::Mode;
use node_support::{NODE, NodeWorld, with_manifest};

const HOST_ENDPOINT: &str = r#"
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: node-1-up0, labels: {role: host}}
spec: {node: node-1, interfaceName: up0, expectedIPs: [10.79.255.1]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: default.host-deny}
spec: {tier: default, selector: role == 'host', types: [Ingress, Egress],
       ingress: [{action: Deny}], egress: [{action: Deny}]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: default.host-untracked}
spec: {tier: default, selector: role == 'host', doNotTrack: true, applyOnForward: true,
       types: [Ingress, Egress],
       ingress: [{action: Allow, protocol: UDP, destination: {ports: [4789]}}],
       egress: [{action: Allow, protocol: UDP, destination: {ports: [4789]}}]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: default.host-prednat}
spec: {tier: default, selector: role == 'host', preDNAT: true, applyOnForward: true,
       types: [Ingress], ingress: [{action: Allow, protocol: TCP, destination: {ports: [30080]}}]}
"#;

/// `felixrs trace --kernel --check-kernel` in the node's namespace: (exit code, stdout).
fn trace(w: &NodeWorld, args: &str) -> (i32, String) {
    let dir = w.work.path().to_str().unwrap();
    let mut argv = vec![
        "trace",
        "--manifests",
        dir,
        "--node-name",
        NODE,
        "--kernel",
        "--check-kernel",
    ];
    argv.extend(args.split_whitespace());
    let out = w.node.run(env!("CARGO_BIN_EXE_felixrs"), &argv);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.is_empty() || out.status.code() == Some(2),
        "{args}: {err}\n{text}"
    );
    (out.status.code().unwrap_or(-1), text)
}

fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{text}"))
}

fn agrees(w: &NodeWorld, save: &str, args: &str, want: &str) -> String {
    let (code, text) = trace(w, args);
    assert_eq!(code, 0, "{args}:\n{text}");
    assert_eq!(
        line(&text, "verdict: ").split(' ').next(),
        Some(want),
        "{args}:\n{text}"
    );
    assert!(
        line(&text, "kernel verdict: ").starts_with(want),
        "{args}:\n{text}"
    );
    for want in [
        format!("kernel ({save} -t filter, ipset save):"),
        "  every chain the packet entered holds the rendered rules".to_string(),
        "the kernel agrees with the rendered rules".to_string(),
    ] {
        assert!(text.contains(&want), "{args}: missing {want:?}:\n{text}");
    }
    text
}

/// The packets of a GlobalNetworkPolicy's row.
fn packets(stats: &Stats, policy: &str, direction: &str, action: &str) -> u64 {
    (stats.counters.iter())
        .filter(|r| r.family == "ipv4" && r.kind == "globalnetworkpolicy" && r.policy == policy)
        .filter(|r| r.direction == direction && r.action == action)
        .map(|r| r.packets)
        .sum()
}

fn host_endpoint_traffic_agrees(backend: Backend, save: &str) {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&["ip", "ipset", save]);
    let w = with_manifest(backend, HOST_ENDPOINT);
    let outside = "--from 10.79.255.2 --to host:10.79.255.1";
    // Denied by the host endpoint's policy: raw and mangle walked first, then INPUT.
    let text = agrees(&w, save, &format!("{outside} --port 8080"), "DROP");
    for want in [
        format!("kernel ({save} -t raw), from PREROUTING:"),
        format!("kernel ({save} -t mangle), from PREROUTING:"),
        "  cali-fh-up0 [ingress of host endpoint node-1-up0 (up0)] rule".to_string(),
        "dropped by ingress of GlobalNetworkPolicy default.host-deny".to_string(),
    ] {
        assert!(text.contains(&want), "missing {want:?}:\n{text}");
    }
    // SSH: the failsafe accepts it in every table, before any policy.
    let text = agrees(&w, save, &format!("{outside} --port 22"), "ACCEPT");
    assert!(
        text.contains("failsafe: tcp:22 (before any host endpoint policy)"),
        "{text}"
    );
    assert!(
        line(&text, "kernel verdict: ").contains("cali-failsafe-in rule 1"),
        "{text}"
    );
    // doNotTrack and preDNAT allows: the filter table accepts on the mark they leave.
    let text = agrees(
        &w,
        save,
        &format!("{outside} --protocol udp --port 4789"),
        "ACCEPT",
    );
    assert!(
        text.contains("untracked: the raw table's NOTRACK"),
        "{text}"
    );
    agrees(&w, save, &format!("{outside} --port 30080"), "ACCEPT");
    // The host's own traffic out of up0: raw OUTPUT, then cali-th-up0's deny.
    let text = agrees(
        &w,
        save,
        "--from host:10.79.255.1 --to 10.79.255.2 --port 443",
        "DROP",
    );
    assert!(
        text.contains(&format!("kernel ({save} -t raw), from OUTPUT:")),
        "{text}"
    );
    // A pod to the host: the workload's chains and DefaultEndpointToHostAction (accept), never
    // the host endpoint's policy.
    let text = agrees(
        &w,
        save,
        "--from stats/client --to host:10.79.255.1 --port 8080",
        "ACCEPT",
    );
    assert!(text.contains("accepted by cali-wl-to-host"), "{text}");
    assert!(!text.contains("host-deny"), "{text}");

    // stats: the host's own traffic out of up0 (locally generated, so it meets raw OUTPUT and
    // filter OUTPUT whether or not the next hop answers) counts for the doNotTrack allow (raw)
    // and the deny-all (filter).
    let mode = match backend {
        Backend::Legacy => Mode::Legacy,
        _ => Mode::Nft,
    };
    let before = collect(&w.renderer, &w.runner, mode).expect("stats");
    assert_eq!(before.rules_missing, 0, "{before:?}");
    for port in ["udp/10.79.255.5/4789", "tcp/10.79.255.5/443"] {
        // The TCP connect fails (dropped); the exit status does not matter.
        let _ = w.node.run(
            "timeout",
            &["2", "bash", "-c", &format!("echo x > /dev/{port}")],
        );
    }
    let after = collect(&w.renderer, &w.runner, mode).expect("stats");
    let moved = |policy: &str, direction: &str, action: &str| {
        packets(&after, policy, direction, action) - packets(&before, policy, direction, action)
    };
    assert!(
        moved("default.host-untracked", "egress", "allow") >= 1,
        "{after:?}"
    );
    assert!(
        moved("default.host-deny", "egress", "deny") >= 1,
        "{after:?}"
    );
    assert_eq!(
        moved("default.host-untracked", "ingress", "allow"),
        0,
        "{after:?}"
    );

    // An admin's rule ahead of our raw hook: named, and the check fails (exit 2).
    let ipt = save.trim_end_matches("-save");
    w.node.ok(
        ipt,
        &[
            "-t",
            "raw",
            "-I",
            "PREROUTING",
            "1",
            "-p",
            "tcp",
            "--dport",
            "8080",
            "-j",
            "ACCEPT",
        ],
    );
    let (code, text) = trace(&w, &format!("{outside} --port 8080"));
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("differs: raw PREROUTING rule 1 is not ours and runs before cali-PREROUTING"),
        "{text}"
    );
}

#[test]
fn host_endpoint_traffic_agrees_legacy() {
    host_endpoint_traffic_agrees(Backend::Legacy, "iptables-legacy-save");
}

#[test]
fn host_endpoint_traffic_agrees_nft() {
    host_endpoint_traffic_agrees(Backend::Nft, "iptables-nft-save");
}
