//! Automatic host endpoints end to end: the real `policy-controller` (`sync --once
//! --auto-host-endpoints enabled` on a manifest directory holding the Node) writes
//! `node-1-auto-hep` (`interfaceName: "*"`, profile `projectcalico-default-allow`) to a real etcd,
//! and the real `felixrs agent` programs it into the kernel of a namespace the test creates (the
//! node), reached from a peer namespace over a veth:
//! 1. the auto host endpoint alone leaves a port on the node's address open;
//! 2. a GlobalNetworkPolicy selecting the node's label that denies that port (and allows the rest)
//!    closes it, while TCP 22 (failsafe) stays open;
//! 3. relabelling the Node (re-sync) reopens it; deleting the Node removes the host endpoint and
//!    the host chains.
//!
//! `policy-controller` is not this package's binary: it is taken from the same target directory
//! (`cargo build --workspace --bins`, as `scripts/test.sh` does first).

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use felixrs_test_support::binaries::workspace_binary;
use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::{Netns, in_netns, veth};
use serde_json::{Value, json};
use support::{Agent, PREFIX, put_default_tier, put_json};

const HOST: &str = "10.96.7.2";
const PEER: &str = "10.96.7.1";
const PORT: u16 = 8080;

/// `target/<profile>/policy-controller`, refused when older than its sources.
fn controller_bin() -> PathBuf {
    workspace_binary(
        "policy-controller",
        &["calc-graph", "k8s-convert", "etcd-tls", "policy-controller"],
    )
}

/// Writes the Node `node-1` (labels `role: <role>`, address HOST) as the only manifest, or no
/// manifest at all, and runs the controller once in `ns` (where etcd listens); returns its
/// report's revision.
fn sync(ns: &Netns, dir: &Path, etcd: &Etcd, role: Option<&str>) -> i64 {
    let file = dir.join("node.json");
    match role {
        Some(role) => {
            let node = json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node-1", "labels": {"role": role},
                             "annotations": {"projectcalico.org/IPv4Address": format!("{HOST}/24")}},
                "status": {"addresses": [{"type": "InternalIP", "address": HOST}]},
            });
            std::fs::write(&file, node.to_string()).unwrap();
        }
        None => {
            let _ = std::fs::remove_file(&file);
        }
    }
    let out = ns
        .command(controller_bin())
        .args(["sync", "--once", "--etcd-endpoints", &etcd.client_url()])
        .args(["--auto-host-endpoints", "enabled", "--manifests"])
        .arg(dir)
        .output()
        .expect("run policy-controller");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "policy-controller sync failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("report not JSON ({e}): {stdout}"));
    report["revision"]
        .as_i64()
        .unwrap_or_else(|| panic!("no revision: {report}"))
}

/// A listener on HOST:port in `ns` answering every connection.
fn listen(ns: &Netns, port: u16) {
    let addr: SocketAddr = format!("{HOST}:{port}").parse().unwrap();
    let listener = in_netns(ns.name(), move || TcpListener::bind(addr).expect("bind"));
    std::thread::spawn(move || {
        for mut c in listener.incoming().flatten() {
            let _ = c.write_all(b"ok");
        }
    });
}

fn connects(from: &Netns, port: u16) -> bool {
    let addr: SocketAddr = format!("{HOST}:{port}").parse().unwrap();
    in_netns(from.name(), move || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(700)).is_ok()
    })
}

/// Polls until `connects(from, port) == want` or 30 s pass; whether it got there.
fn reaches(from: &Netns, port: u16, want: bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if connects(from, port) == want {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether the host endpoint's chains are in the node's filter table.
fn host_chains(ns: &Netns) -> bool {
    let dump = ns.ok("iptables-nft-save", &["-t", "filter"]);
    dump.contains(":cali-fh-")
}

#[test]
fn controller_auto_host_endpoint_is_enforced_by_the_agent() {
    let node = Netns::new();
    let peer = Netns::new();
    veth(&node, "fxa-peer", &peer, "fxa-node");
    node.ok(
        "ip",
        &["addr", "add", &format!("{HOST}/24"), "dev", "fxa-peer"],
    );
    peer.ok(
        "ip",
        &["addr", "add", &format!("{PEER}/24"), "dev", "fxa-node"],
    );
    listen(&node, 22);
    listen(&node, PORT);
    assert!(reaches(&peer, PORT, true), "no connectivity before policy");

    let etcd = Etcd::start_in(node.name());
    put_default_tier(&etcd);
    let manifests = tempfile::tempdir().unwrap();
    let rev = sync(&node, manifests.path(), &etcd, Some("locked"));
    let hep_key = format!("{PREFIX}hostendpoints/node-1-auto-hep");
    let hep: Value = serde_json::from_str(&etcd.get(&hep_key).expect("no auto hep in etcd"))
        .expect("auto hep is JSON");
    assert_eq!(hep["spec"]["interfaceName"], "*", "{hep}");
    assert_eq!(hep["metadata"]["labels"]["role"], "locked", "{hep}");

    // 1. The auto host endpoint alone: default-allow profile, the port is open.
    let (_state, state_dir) = support::state_dir();
    let agent = Agent::start(node.name(), &etcd.client_url(), &state_dir);
    let s = agent.wait_applied(rev);
    assert_eq!(s["local_host_endpoints"], 1, "{s}");
    assert!(host_chains(&node), "no host endpoint chains");
    assert!(
        reaches(&peer, PORT, true),
        "auto host endpoint with default-allow blocked {PORT}"
    );

    // 2. Deny the port on nodes labelled locked, allow everything else: closed, 22 still open.
    let rev = put_json(
        &etcd,
        "globalnetworkpolicies/default.lock-port",
        json!({"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkPolicy",
               "metadata":{"name":"default.lock-port"},
               "spec":{"tier":"default","order":10,"selector":"role == \"locked\"",
                       "types":["Ingress"],
                       "ingress":[{"action":"Deny","protocol":"TCP",
                                   "destination":{"ports":[PORT]}},
                                  {"action":"Allow"}]}}),
    );
    agent.wait_applied(rev);
    assert!(
        reaches(&peer, PORT, false),
        "policy on the auto host endpoint left {PORT} open"
    );
    assert!(reaches(&peer, 22, true), "failsafe port 22 was blocked");

    // 3. Relabelled: the policy no longer selects the node, the port reopens.
    let rev = sync(&node, manifests.path(), &etcd, Some("open"));
    agent.wait_applied(rev);
    assert!(
        reaches(&peer, PORT, true),
        "{PORT} still closed after the node lost its label"
    );

    // The Node gone: the controller deletes its host endpoint, the agent its chains.
    let rev = sync(&node, manifests.path(), &etcd, None);
    assert!(etcd.get(&hep_key).is_none(), "auto hep survived its node");
    let s = agent.wait_applied(rev);
    assert_eq!(s["local_host_endpoints"], 0, "{s}");
    assert!(!host_chains(&node), "host chains left after the node went");
    assert!(
        reaches(&peer, PORT, true),
        "{PORT} closed with no host endpoint"
    );
}
