//! `felixrs render` on the demo cluster and on a manifest set with a bad object.

use std::path::{Path, PathBuf};
use std::process::Command;

fn demo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-cluster")
}

/// `felixrs render --node-name node-1 <flags> --manifests <demo> <extra>`: it must succeed;
/// returns (stdout, stderr).
fn render(flags: &[&str], extra: &[&Path]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["render", "--node-name", "node-1"])
        .args(flags)
        .arg("--manifests")
        .arg(demo())
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

#[test]
fn renders_the_demo_cluster_for_node_1() {
    let (text, stderr) = render(&[], &[]);
    assert!(stderr.is_empty(), "demo cluster should be clean: {stderr}");
    for want in [
        "# ipset restore (IPv4)",
        "# iptables-restore --noflush (IPv4, filter)",
        "# iptables-restore --noflush (IPv6, filter)",
        // Named port "pg" of db-0 and "http" of both web pods (one on node-2).
        "10.65.1.11,tcp:5432",
        "10.65.2.10,tcp:8080",
        // ipBlock except, and the tiered global policy.
        "192.0.2.0/24",
        "Start of tier security",
        "198.51.100.0/24",
        "Unknown interface",
        // The IP pools: nat-outgoing in the nat table, the pool sets filled first.
        "# iptables-restore --noflush (IPv4, nat)",
        "-A cali-nat-outgoing -m comment --comment \"cali:",
        "-m set --match-set cali40masq-ipam-pools src -m set ! --match-set cali40all-ipam-pools dst -j MASQUERADE --random-fully",
        "add cali40masq-ipam-pools 10.65.0.0/16",
        "add cali40all-ipam-pools 10.65.0.0/16",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // The IPv6 pool does not masquerade: no rule, so no (unreferenced) IPv6 pool sets.
    assert!(!text.contains("cali60all-ipam-pools"), "{text}");
    // node-2's pods get no endpoint chains on node-1: two local endpoints, two cali-tw chains.
    let tw = text.lines().filter(|l| l.starts_with(":cali-tw-")).count();
    assert_eq!(tw, 4, "two endpoints x two families:\n{text}");
    // Their policies are in shared chains (db-0 and web-0 have different policies: one each,
    // per direction and family), which their own chains goto; the jumps name the policies.
    let shared = |p: &str| text.lines().filter(|l| l.starts_with(p)).count();
    assert_eq!(shared(":cali-si-"), 4, "{text}");
    assert_eq!(shared(":cali-so-"), 4, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("-A cali-tw-") && l.contains(" -g cali-si-")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("-A cali-si-")
            && l.contains("--comment \"NetworkPolicy shop/knp.default.db-from-web\"")),
        "{text}"
    );
}

#[test]
fn share_chains_false_renders_felix_inlined_endpoint_chains() {
    let (text, _) = render(&["--share-chains", "false"], &[]);
    assert!(
        !text.contains("cali-si-") && !text.contains("cali-so-"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("-A cali-tw-") && l.contains("Drop if no profiles matched")),
        "{text}"
    );
}

#[test]
fn reports_invalid_objects_and_renders_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: broken, namespace: shop}\nspec:\n  podSelector: {}\n  ingress:\n    - ports: [{protocol: TCP, port: 70000}]\n",
    )
    .unwrap();
    let (text, stderr) = render(&[], &[dir.path()]);
    assert!(stderr.contains("broken"), "object not named: {stderr}");
    assert!(stderr.contains("port"), "field not named: {stderr}");
    assert!(text.contains("Start of tier security"), "rest not rendered");
}

/// A pod's `allowedSourcePrefixes` reach raw `cali-rpf-skip` only with `--workload-source-spoofing Any`.
#[test]
fn allowed_source_prefixes_follow_the_spoofing_flag() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("vm.yaml"),
        r#"apiVersion: v1
kind: Pod
metadata:
  name: vm
  namespace: shop
  annotations: {cni.projectcalico.org/allowedSourcePrefixes: '["10.200.0.9/16"]'}
spec: {nodeName: node-1, containers: [{name: vm, image: x}]}
status: {phase: Running, podIP: 10.65.1.99}
"#,
    )
    .unwrap();
    let render = |flags: &[&str]| render(flags, &[dir.path()]).0;
    let on = render(&["--workload-source-spoofing", "any"]);
    let skip: Vec<&str> = on
        .lines()
        .filter(|l| l.starts_with("-A cali-rpf-skip"))
        .collect();
    assert_eq!(skip.len(), 1, "{on}");
    assert!(
        skip[0].contains("-s 10.200.0.0/16 -i cali") && skip[0].ends_with("-j ACCEPT"),
        "{skip:?}"
    );
    assert!(
        on.contains("-j cali-rpf-skip"),
        "no jump to the skip chain:\n{on}"
    );
    for off in [
        render(&[]),
        render(&["--workload-source-spoofing", "Disabled"]),
    ] {
        assert!(!off.contains("cali-rpf-skip"), "{off}");
        assert!(off.contains("-m rpfilter --invert -j DROP"), "{off}");
    }
}

/// `--interface-prefix` names the veths the way the controller would with the same prefix, and
/// polices that prefix; the other dataplane flags are the agent's.
#[test]
fn dataplane_flags_are_the_agents() {
    let (text, _) = render(
        &[
            "--interface-prefix",
            "tap",
            "--default-endpoint-to-host-action",
            "return",
            "--mark-mask",
            "0xff00",
        ],
        &[],
    );
    let tw: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(":cali-tw-"))
        .collect();
    assert!(
        !tw.is_empty() && tw.iter().all(|l| l.starts_with(":cali-tw-tap")),
        "{tw:?}"
    );
    assert!(text.contains("-i tap+"), "{text}");
    assert!(
        !text.contains("cali+"),
        "the default prefix is replaced:\n{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("-A cali-wl-to-host")
            && l.contains("DefaultEndpointToHostAction")
            && l.ends_with("-j RETURN")),
        "{text}"
    );
    // The accept bit is the mask's lowest bit.
    assert!(
        text.contains("--mark 0x100/0x100"),
        "mark mask not used:\n{text}"
    );
}

#[test]
fn rules_that_fail_safe_are_reported_by_render_and_trace() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo.yaml");
    std::fs::write(
        &typo,
        r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: strict-typo}
spec:
  order: 1
  selector: projectcalico.org/namespace == 'shop'
  types: [Ingress]
  ingress:
  - action: Allow
    source: {selectr: "role == 'x'"}
  - action: Deny
    protocol: TCP
    destination: {domains: [example.com]}
"#,
    )
    .unwrap();
    let (text, stderr) = render(&[], &[&typo]);
    for want in [
        "failed safe: globalnetworkpolicies/strict-typo spec.ingress[0]: Allow rule not rendered: unknown field spec.ingress[0].source.selectr",
        "failed safe: globalnetworkpolicies/strict-typo spec.ingress[1]: Deny rule rendered with only its enforced matches: spec.ingress[1].destination.domains: domains are enforced only in egress rules",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
    // The Allow is gone; the Deny stays with its protocol match.
    let chain: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("-A cali-pi-gnp/strict-typo "))
        .collect();
    assert!(
        chain
            .iter()
            .all(|l| !l.contains("--set-xmark 0x10000/0x10000")
                && !l.contains("-g cali-verdict-accept")),
        "{chain:#?}"
    );
    assert!(
        chain
            .iter()
            .any(|l| l.contains("-p tcp") && l.ends_with("-g cali-verdict-drop")),
        "{chain:#?}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["trace", "--node-name", "node-1", "--manifests"])
        .arg(demo())
        .arg(&typo)
        .args([
            "--from",
            "shop/web-0",
            "--to",
            "shop/db-0",
            "--port",
            "5432",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("rules not rendered as written")
            && text.contains("globalnetworkpolicies/strict-typo spec.ingress[0]: Allow rule not rendered: unknown field spec.ingress[0].source.selectr"),
        "{text}"
    );
    assert!(text.contains("verdict: DROP"), "{text}");
}

#[test]
fn renders_the_node_s_host_endpoints_with_failsafes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hep.yaml"),
        r#"
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: node-1-eth0, labels: {role: host}}
spec: {node: node-1, interfaceName: eth0, expectedIPs: [10.0.0.1]}
---
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: node-2-eth0, labels: {role: host}}
spec: {node: node-2, interfaceName: eth9, expectedIPs: [10.0.0.2]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: default.host-ssh}
spec: {tier: default, selector: role == 'host', types: [Ingress],
       ingress: [{action: Allow, protocol: TCP, destination: {ports: [2222]}}]}
"#,
    )
    .unwrap();
    let (text, stderr) = render(
        &["--failsafe-inbound-host-ports", "tcp:22,udp:68"],
        &[dir.path()],
    );
    assert!(stderr.is_empty(), "{stderr}");
    for want in [
        "-A cali-INPUT -m comment --comment \"cali:",
        "-j cali-from-host-endpoint",
        "-i eth0 -g cali-fh-eth0",
        "-A cali-fh-eth0 ",
        "-j cali-failsafe-in",
        "-A cali-failsafe-in ",
        "--dports 2222 ",
    ] {
        assert!(text.contains(want), "missing {want:?}:\n{text}");
    }
    // Only this node's endpoint; the failsafe flag decides the list.
    assert!(!text.contains("eth9"), "{text}");
    let failsafes = text
        .lines()
        .filter(|l| l.starts_with("-A cali-failsafe-in "))
        .count();
    assert_eq!(failsafes, 4, "two entries in each family:\n{text}");
}

/// doNotTrack and preDNAT host endpoint policy is printed in the raw and mangle tables, each
/// host endpoint chain after its failsafe jump; without a FelixConfiguration or flag the
/// failsafe lists are Felix's defaults.
#[test]
fn renders_host_endpoints_raw_and_mangle_chains_with_default_failsafes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hep.yaml"),
        r#"
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: node-1-eth0, labels: {role: host}}
spec: {node: node-1, interfaceName: eth0, expectedIPs: [10.0.0.1]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: default.host-untracked}
spec: {tier: default, selector: role == 'host', doNotTrack: true, applyOnForward: true,
       types: [Ingress], ingress: [{action: Allow, protocol: UDP, destination: {ports: [4789]}}]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: default.host-prednat}
spec: {tier: default, selector: role == 'host', preDNAT: true, applyOnForward: true,
       types: [Ingress], ingress: [{action: Allow, protocol: TCP, destination: {ports: [30080]}}]}
"#,
    )
    .unwrap();
    let (text, stderr) = render(&[], &[dir.path()]);
    assert!(stderr.is_empty(), "{stderr}");
    let section = |name: &str| {
        let start = text
            .find(&format!("# iptables-restore --noflush (IPv4, {name})"))
            .unwrap_or_else(|| panic!("no IPv4 {name} section:\n{text}"));
        let rest = &text[start..];
        let end = rest[1..].find("\n# ").map_or(rest.len(), |e| e + 1);
        rest[..end].to_string()
    };
    let raw = section("raw");
    let mangle = section("mangle");
    for (table, want) in [
        (&raw, "-i eth0 -g cali-fh-eth0"),
        (&raw, "-j NOTRACK"),
        (&raw, "--dports 4789"),
        (&raw, "-A cali-failsafe-in "),
        (&mangle, "-i eth0 -g cali-fh-eth0"),
        (&mangle, "--dports 30080"),
        (&mangle, "-A cali-failsafe-in "),
    ] {
        assert!(table.contains(want), "missing {want:?}:\n{table}");
    }
    for (table, chain) in [(&raw, "cali-fh-eth0"), (&mangle, "cali-fh-eth0")] {
        let first = table
            .lines()
            .find(|l| l.starts_with(&format!("-A {chain} ")))
            .unwrap_or_else(|| panic!("no {chain}:\n{table}"));
        assert!(first.ends_with("-j cali-failsafe-in"), "{first}");
    }
    // Felix's default inbound failsafes (SSH first), in the filter copy as well.
    let filter = section("filter");
    let ssh = "-A cali-failsafe-in -m comment --comment \"cali:";
    for table in [&filter, &raw, &mangle] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(ssh)
                    && l.ends_with("-p tcp -m multiport --dports 22 -j ACCEPT")),
            "no SSH failsafe:\n{table}"
        );
    }
}
