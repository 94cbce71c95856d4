//! Per-policy counters on the real kernel: a node namespace with two pod namespaces wired as
//! Calico's CNI does, the rendered rules applied with the real applier (legacy and nft backends),
//! TCP over IPv4 and IPv6 that one policy allows and the tier end drops; then `felixrs stats`
//! (library and binary) must show the counters move for exactly that policy and that tier end.
//! Needs root and iptables/ipset/iproute2 (CI has them); fails loudly otherwise.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use calc_graph::proto::IpVersion;
use felixrs::dataplane_args::DataplaneArgs;
use felixrs::render_cmd::{SourceArgs, render_node};
use felixrs::stats_cmd::{Row, Stats, collect};
use felixrs_test_support::netns::{Netns, unique_name};
use iptables::apply::backend::Mode;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner};
use iptables::render::Renderer;

const NODE: &str = "node-1";
const ALLOWED_PORT: u16 = 8080;
const DENIED_PORT: u16 = 9090;

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: stats}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: stats, labels: {app: client}}
spec: {nodeName: node-1, containers: [{name: c, image: x}]}
status: {phase: Running, podIPs: [{ip: 10.79.0.1}, {ip: "fd79::1"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: stats, labels: {app: server}}
spec: {nodeName: node-1, containers: [{name: s, image: x}]}
status: {phase: Running, podIPs: [{ip: 10.79.0.2}, {ip: "fd79::2"}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-web, namespace: stats}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
    - from: [{podSelector: {matchLabels: {app: client}}}]
      ports: [{port: 8080, protocol: TCP}]
"#;

struct Pod {
    ns: Netns,
    v4: IpAddr,
    v6: IpAddr,
}

fn exec(ns: &Netns, argv: &[&str]) {
    ns.exec(argv)
        .unwrap_or_else(|e| panic!("{argv:?} in {}: {e}", ns.name()));
}

/// A pod namespace behind host interface `iface` of `node`, as Calico's CNI wires it.
fn add_pod(node: &Netns, iface: &str, v4: &str, v6: &str) -> Pod {
    let ns = Netns::create(unique_name("stp")).expect("pod netns");
    for scope in ["all", "default"] {
        ns.sysctl(&format!("net.ipv6.conf.{scope}.accept_dad"), "0")
            .unwrap();
    }
    ns.sysctl("net.ipv6.bindv6only", "1").unwrap();
    exec(
        node,
        &[
            "ip",
            "link",
            "add",
            iface,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ],
    );
    node.sysctl(&format!("net.ipv4.conf.{iface}.proxy_arp"), "1")
        .unwrap();
    node.sysctl(&format!("net.ipv4.neigh.{iface}.proxy_delay"), "0")
        .unwrap();
    node.sysctl(&format!("net.ipv4.conf.{iface}.rp_filter"), "0")
        .unwrap();
    exec(node, &["ip", "link", "set", iface, "up"]);
    exec(
        node,
        &["ip", "route", "add", &format!("{v4}/32"), "dev", iface],
    );
    exec(
        node,
        &[
            "ip",
            "-6",
            "addr",
            "add",
            "fe80::1/64",
            "dev",
            iface,
            "nodad",
        ],
    );
    exec(
        node,
        &[
            "ip",
            "-6",
            "route",
            "add",
            &format!("{v6}/128"),
            "dev",
            iface,
        ],
    );
    exec(
        &ns,
        &["ip", "addr", "add", &format!("{v4}/32"), "dev", "eth0"],
    );
    exec(
        &ns,
        &[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{v6}/128"),
            "dev",
            "eth0",
            "nodad",
        ],
    );
    exec(&ns, &["ip", "link", "set", "eth0", "up"]);
    exec(
        &ns,
        &[
            "ip",
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ],
    );
    exec(
        &ns,
        &[
            "ip",
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ],
    );
    exec(
        &ns,
        &[
            "ip", "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
        ],
    );
    Pod {
        ns,
        v4: v4.parse().unwrap(),
        v6: v6.parse().unwrap(),
    }
}

fn serve(ns: &Netns, addr: IpAddr, port: u16) {
    let sock = SocketAddr::new(addr, port);
    let listener = ns.in_thread(move || TcpListener::bind(sock).expect("bind in pod netns"));
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let _ = conn.write_all(b"ok");
        }
    });
}

fn connects(ns: &Netns, addr: IpAddr, port: u16) -> bool {
    let sock = SocketAddr::new(addr, port);
    ns.in_thread(
        move || match TcpStream::connect_timeout(&sock, Duration::from_millis(1000)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                let mut buf = [0u8; 2];
                s.read_exact(&mut buf).is_ok() && &buf == b"ok"
            }
            Err(_) => false,
        },
    )
}

fn row<'a>(
    stats: &'a Stats,
    family: &str,
    kind: &str,
    policy: &str,
    action: &str,
) -> Option<&'a Row> {
    stats.counters.iter().find(|r| {
        r.family == family
            && r.kind == kind
            && r.policy == policy
            && r.action == action
            && r.direction == "ingress"
    })
}

fn packets(stats: &Stats, family: &str, kind: &str, policy: &str, action: &str) -> u64 {
    row(stats, family, kind, policy, action).map_or(0, |r| r.packets)
}

fn render(dir: &Path) -> Renderer {
    let view = render_node(
        &SourceArgs::manifests(vec![dir.to_path_buf()]),
        NODE,
        &DataplaneArgs::default(),
    )
    .expect("render");
    assert!(view.problems.is_empty(), "{:?}", view.problems);
    view.renderer
}

fn counters_move_for_the_right_policy(backend: Backend, mode: Mode) {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&[
        "ip",
        "ipset",
        "iptables-legacy-save",
        "iptables-nft-save",
        "ip6tables-legacy-save",
        "ip6tables-nft-save",
    ]);
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("cluster.yaml"), MANIFESTS).unwrap();
    let renderer = render(work.path());
    let iface_of = |pod: &str| {
        renderer
            .local_endpoints()
            .find(|e| e.id.name.contains(pod))
            .map(|e| e.interface_name.clone())
            .unwrap_or_else(|| panic!("no endpoint for {pod}"))
    };
    let node = Netns::with_tag("stats");
    for scope in ["all", "default"] {
        node.sysctl(&format!("net.ipv6.conf.{scope}.accept_dad"), "0")
            .unwrap();
    }
    node.sysctl("net.ipv4.ip_forward", "1").unwrap();
    node.sysctl("net.ipv4.conf.all.rp_filter", "0").unwrap();
    node.sysctl("net.ipv4.conf.default.rp_filter", "0").unwrap();
    // Proxy ARP answers for the pods' gateway 169.254.1.1 only if the node routes it elsewhere:
    // a default route out of a veth pair of its own (nothing is ever sent there).
    exec(
        &node,
        &[
            "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1",
        ],
    );
    exec(
        &node,
        &["ip", "addr", "add", "10.79.255.1/24", "dev", "up0"],
    );
    exec(&node, &["ip", "link", "set", "up0", "up"]);
    exec(&node, &["ip", "link", "set", "up1", "up"]);
    exec(
        &node,
        &["ip", "route", "add", "default", "via", "10.79.255.2"],
    );
    node.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
    let client = add_pod(&node, &iface_of("client"), "10.79.0.1", "fd79::1");
    let server = add_pod(&node, &iface_of("server"), "10.79.0.2", "fd79::2");
    for addr in [server.v4, server.v6] {
        serve(&server.ns, addr, ALLOWED_PORT);
        serve(&server.ns, addr, DENIED_PORT);
    }

    assert!(
        (0..5).any(|_| connects(&client.ns, server.v4, ALLOWED_PORT)),
        "no connectivity before any rule"
    );
    let runner = ExecRunner::in_netns(node.name()).unwrap();
    for v in [IpVersion::V4, IpVersion::V6] {
        let mut applier = Applier::new(
            runner.clone(),
            ApplierConfig {
                family: v,
                backend,
                ..ApplierConfig::default()
            },
        );
        applier.apply(renderer.desired_ref(v)).expect("apply");
    }
    let before = collect(&renderer, &runner, mode).expect("stats before traffic");
    assert_eq!(before.rules_missing, 0, "{before:?}");
    assert!(before.rules_found > 0, "{before:?}");
    let policy = "stats/knp.default.allow-web";
    for fam in ["ipv4", "ipv6"] {
        assert!(
            row(&before, fam, "networkpolicy", policy, "allow").is_some(),
            "no {fam} allow row for {policy}: {before:?}"
        );
    }

    let (mut allowed, mut denied) = ([0u64; 2], [0u64; 2]);
    for (i, dst) in [server.v4, server.v6].into_iter().enumerate() {
        for _ in 0..3 {
            if connects(&client.ns, dst, ALLOWED_PORT) {
                allowed[i] += 1;
            }
        }
        assert!(allowed[i] > 0, "no allowed connection to {dst}");
        assert!(
            !connects(&client.ns, dst, DENIED_PORT),
            "port {DENIED_PORT} of {dst} was not dropped"
        );
        denied[i] += 1;
    }

    let after = collect(&renderer, &runner, mode).expect("stats after traffic");
    for (i, fam) in ["ipv4", "ipv6"].into_iter().enumerate() {
        let allow_delta = packets(&after, fam, "networkpolicy", policy, "allow")
            - packets(&before, fam, "networkpolicy", policy, "allow");
        // One new connection is one NEW packet through policy (the rest is ESTABLISHED).
        assert!(
            allow_delta >= allowed[i],
            "{fam}: {policy} allowed {allow_delta} packets, {} connections went through: {after:?}",
            allowed[i]
        );
        let drop_delta = packets(&after, fam, "tier-end", "", "deny")
            - packets(&before, fam, "tier-end", "", "deny");
        assert!(
            drop_delta >= denied[i],
            "{fam}: the default tier end dropped {drop_delta}: {after:?}"
        );
        // Nothing was attributed to the other direction's or other actions' rules of the policy.
        assert_eq!(
            packets(&after, fam, "networkpolicy", policy, "deny"),
            0,
            "{after:?}"
        );
        let tier_end = row(&after, fam, "tier-end", "", "deny").unwrap();
        assert_eq!(tier_end.tier, "default");
    }
    // Sorted by hits.
    assert!(
        after
            .counters
            .windows(2)
            .all(|w| w[0].packets >= w[1].packets),
        "{after:?}"
    );

    // The binary, in the node's namespace, says the same (JSON and table).
    let bin = env!("CARGO_BIN_EXE_felixrs");
    let backend_flag = match mode {
        Mode::Legacy => "legacy",
        Mode::Nft => "nft",
    };
    let dir = work.path().to_str().unwrap();
    let json = node.ok(
        bin,
        &[
            "stats",
            "--manifests",
            dir,
            "--node-name",
            NODE,
            "--iptables-backend",
            backend_flag,
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&json).expect("stats --json");
    assert_eq!(v["backend"], backend_flag);
    let allow4 = v["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["policy"] == policy
                && r["family"] == "ipv4"
                && r["action"] == "allow"
                && r["direction"] == "ingress"
        })
        .unwrap_or_else(|| panic!("no ipv4 allow row in {json}"));
    assert!(allow4["packets"].as_u64().unwrap() >= allowed[0], "{json}");
    let table = node.ok(
        bin,
        &[
            "stats",
            "--manifests",
            dir,
            "--node-name",
            NODE,
            "--iptables-backend",
            backend_flag,
        ],
    );
    let first = table.lines().nth(1).unwrap_or_default();
    assert!(table.starts_with("PACKETS"), "{table}");
    assert!(table.contains(policy), "{table}");
    assert!(
        !first.trim_start().starts_with('0'),
        "busiest row first:\n{table}"
    );
}

#[test]
fn counters_move_for_the_right_policy_legacy() {
    counters_move_for_the_right_policy(Backend::Legacy, Mode::Legacy);
}

#[test]
fn counters_move_for_the_right_policy_nft() {
    counters_move_for_the_right_policy(Backend::Nft, Mode::Nft);
}
