//! `felixrs trace` with host endpoints: the demo cluster plus a host endpoint of node-1 (eth0,
//! expectedIPs 10.0.0.1) with a deny-all host policy, a doNotTrack allow (udp 4789) and a preDNAT
//! allow (tcp 30080).

mod support;

use std::path::{Path, PathBuf};

use support::trace::{felixrs, verdict};

const HOST_ENDPOINT: &str = r#"
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: node-1-eth0, labels: {role: host}}
spec: {node: node-1, interfaceName: eth0, expectedIPs: [10.0.0.1]}
---
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: node-2-eth0, labels: {role: host}}
spec: {node: node-2, interfaceName: eth0, expectedIPs: [10.0.0.2]}
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
       egress: [{action: Allow, protocol: UDP, source: {ports: [4789]}}]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: default.host-prednat}
spec: {tier: default, selector: role == 'host', preDNAT: true, applyOnForward: true,
       types: [Ingress],
       ingress: [{action: Allow, protocol: TCP, destination: {ports: [30080]}}]}
"#;

/// The demo cluster's manifests plus [`HOST_ENDPOINT`], in a temporary directory.
fn manifests() -> tempfile::TempDir {
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-cluster");
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&demo).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml") {
            std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    std::fs::write(dir.path().join("50-host-endpoint.yaml"), HOST_ENDPOINT).unwrap();
    dir
}

fn trace_in(dir: &Path, args: &str) -> String {
    felixrs(dir, &format!("trace {args}"))
}

fn has(text: &str, want: &str) {
    assert!(text.contains(want), "missing {want:?} in:\n{text}");
}

#[test]
fn traffic_to_the_host_meets_its_host_endpoint_policy_after_the_failsafes() {
    let dir = manifests();
    // Denied by the host endpoint's policy, found by host:ADDR and arriving on its interface.
    let text = trace_in(
        dir.path(),
        "--from 203.0.113.9 --to host:10.0.0.1 --port 8080",
    );
    assert_eq!(verdict(&text), "DROP", "{text}");
    has(
        &text,
        "to   10.0.0.1: this node (host endpoint node-1-eth0, eth0)",
    );
    has(&text, "in on eth0, out on -");
    has(
        &text,
        "raw table (doNotTrack policy): PREROUTING, from cali-PREROUTING",
    );
    has(
        &text,
        "mangle table (preDNAT policy): PREROUTING, from cali-PREROUTING",
    );
    has(
        &text,
        "cali-fh-eth0 [ingress of host endpoint node-1-eth0 (eth0)] rule",
    );
    has(
        &text,
        "dropped by ingress of GlobalNetworkPolicy default.host-deny (cali-pi-",
    );
    // SSH is a failsafe: accepted before any policy, in every table.
    let text = trace_in(dir.path(), "--from 203.0.113.9 --to 10.0.0.1 --port 22");
    assert_eq!(verdict(&text), "ACCEPT", "{text}");
    has(
        &text,
        "to   10.0.0.1: this node (host endpoint node-1-eth0, eth0)",
    );
    has(
        &text,
        "failsafe: tcp:22 (raw cali-failsafe-in rule 1, before any policy)",
    );
    has(
        &text,
        "failsafe: tcp:22 (mangle cali-failsafe-in rule 1, before any policy)",
    );
    has(
        &text,
        "accepted by failsafe inbound ports (cali-failsafe-in rule 1)",
    );
    has(&text, "failsafe: tcp:22 (before any host endpoint policy)");
    assert!(!text.contains("host-deny"), "{text}");
    // The failsafe list is the flag's: without 22 in it, SSH meets the policy.
    let text = trace_in(
        dir.path(),
        "--from 203.0.113.9 --to 10.0.0.1 --port 22 --failsafe-inbound-host-ports tcp:2222",
    );
    assert_eq!(verdict(&text), "DROP", "{text}");
    let text = trace_in(
        dir.path(),
        "--from 203.0.113.9 --to 10.0.0.1 --port 2222 --failsafe-inbound-host-ports tcp:2222",
    );
    assert_eq!(verdict(&text), "ACCEPT", "{text}");
    has(
        &text,
        "failsafe: tcp:2222 (before any host endpoint policy)",
    );
}

#[test]
fn do_not_track_and_pre_dnat_allows_are_accepted_by_the_filter_table() {
    let dir = manifests();
    let text = trace_in(
        dir.path(),
        "--from 203.0.113.9 --to 10.0.0.1 --protocol udp --port 4789",
    );
    assert_eq!(verdict(&text), "ACCEPT", "{text}");
    has(
        &text,
        "allowed by ingress of GlobalNetworkPolicy default.host-untracked (cali-pi-",
    );
    has(
        &text,
        "untracked: the raw table's NOTRACK gave it no conntrack entry",
    );
    has(&text, "accepted by cali-INPUT (cali-INPUT rule 2)");
    let text = trace_in(dir.path(), "--from 203.0.113.9 --to 10.0.0.1 --port 30080");
    assert_eq!(verdict(&text), "ACCEPT", "{text}");
    has(
        &text,
        "allowed by ingress of GlobalNetworkPolicy default.host-prednat (cali-pi-",
    );
    assert!(!text.contains("untracked:"), "{text}");
}

#[test]
fn traffic_from_the_host_and_from_pods() {
    let dir = manifests();
    // From the host: raw OUTPUT, then filter OUTPUT's cali-th-eth0.
    let text = trace_in(
        dir.path(),
        "--from host:10.0.0.1 --to 203.0.113.9 --port 443",
    );
    assert_eq!(verdict(&text), "DROP", "{text}");
    has(&text, "from the node itself: OUTPUT, from cali-OUTPUT");
    has(&text, "in on -, out on eth0");
    has(
        &text,
        "raw table (doNotTrack policy): OUTPUT, from cali-OUTPUT",
    );
    has(
        &text,
        "cali-th-eth0 [egress of host endpoint node-1-eth0 (eth0)] rule",
    );
    has(
        &text,
        "dropped by egress of GlobalNetworkPolicy default.host-deny (cali-po-",
    );
    // A pod to the host: the workload's egress and DefaultEndpointToHostAction, never the host
    // endpoint's policy (as Felix).
    let text = trace_in(
        dir.path(),
        "--from shop/web-0 --to 10.0.0.1 --protocol udp --port 53",
    );
    assert_eq!(verdict(&text), "ACCEPT", "{text}");
    has(&text, "to the node itself: INPUT, from cali-INPUT");
    has(&text, "accepted by cali-wl-to-host");
    assert!(!text.contains("host-deny"), "{text}");
    // Forwarded from outside to a pod: the forward chains allow by default (no applyOnForward
    // filter policy), then the pod's ingress.
    let text = trace_in(dir.path(), "--from 203.0.113.9 --to shop/web-0 --port 8080");
    has(
        &text,
        "cali-fhfw-eth0 [forwarded ingress of host endpoint node-1-eth0 (eth0)] rule",
    );
    assert_eq!(
        verdict(&text),
        "ACCEPT (policy accepted it; FORWARD's appended felixrs rule accepts it)",
        "{text}"
    );
    // Another node's host endpoint address is not this node.
    let text = trace_in(dir.path(), "--from 203.0.113.9 --to 10.0.0.2 --port 8080");
    has(&text, "to   10.0.0.2: no pod of the manifests");
}

/// Without a host endpoint, no raw or mangle walk is shown (the report is as it was).
#[test]
fn without_a_host_endpoint_the_report_is_unchanged() {
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-cluster");
    let text = trace_in(&demo, "--from 203.0.113.9 --to host:10.0.0.1 --port 22");
    assert!(!text.contains(" table ("), "{text}");
    assert!(!text.contains("failsafe"), "{text}");
    has(&text, "to   10.0.0.1: this node\n");
}
