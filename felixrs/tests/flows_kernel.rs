//! `felixrs flows` on the real kernel: the node of `node_support` rendered with `--log-denied` and
//! applied (legacy and nft); `felixrs flows --json` runs in the node's namespace and prints the
//! denied packets the datapath really dropped: one denied by a GlobalNetworkPolicy's Deny rule
//! (named), one by the default tier's end, with the pods resolved; and, with `--log-action nflog`,
//! the packet the policy's Log rule logged. Root.

mod node_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use felixrs::cmd::shared::dataplane_args::{DataplaneArgs, LogTo};
use iptables::apply::Backend;
use node_support::{DENIED_PORT, FelixrsNode, NODE, NodeWorld, TELNET_PORT, connects};

fn denied_packets_show_the_deciding_policy(backend: Backend) {
    let args = DataplaneArgs {
        log_denied: true,
        log_action: LogTo::Nflog,
        ..DataplaneArgs::default()
    };
    let w = NodeWorld::with_dataplane(backend, &args);
    let dir = w.work.path().to_str().unwrap().to_string();
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            w.node.name(),
            env!("CARGO_BIN_EXE_felixrs"),
        ])
        .args(["flows", "--manifests", &dir, "--node-name", NODE, "--json"])
        .args(["--count", "3", "--timeout", "60", "--log-denied"])
        .args(["--log-action", "nflog"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("felixrs flows");
    // Wait until it listens (it says so on stderr), then make the kernel log.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("felixrs flows said nothing");
    assert!(first.contains("listening"), "{first}");

    assert!(
        !connects(&w.client.ns, w.server.v4, TELNET_PORT),
        "telnet not denied"
    );
    assert!(
        !connects(&w.client.ns, w.server.v4, DENIED_PORT),
        "9090 not dropped"
    );

    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{:?}",
        rx.try_iter().collect::<Vec<_>>()
    );
    let flows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(flows.len(), 3, "{text}");
    let by_port = |p: u16, action: &str| {
        flows
            .iter()
            .find(|f| f["dst_port"] == p && f["action"] == action)
            .unwrap_or_else(|| panic!("no {action} flow to port {p}: {text}"))
    };
    // The Log rule, to NFLOG group 3, names its policy too.
    let logged = by_port(TELNET_PORT, "log");
    assert_eq!(logged["group"], 3, "{text}");
    assert_eq!(logged["kind"], "policy", "{text}");
    assert!(
        logged["decided_by"]
            .as_str()
            .unwrap()
            .contains("deny-telnet"),
        "{text}"
    );
    let telnet = by_port(TELNET_PORT, "deny");
    assert_eq!(telnet["action"], "deny", "{text}");
    assert_eq!(telnet["kind"], "policy", "{text}");
    assert_eq!(telnet["direction"], "ingress", "{text}");
    assert!(
        telnet["decided_by"]
            .as_str()
            .unwrap()
            .contains("deny-telnet"),
        "{text}"
    );
    assert_eq!(telnet["group"], 1);
    assert_eq!(telnet["src_pod"], "stats/client", "{text}");
    assert_eq!(telnet["dst_pod"], "stats/server", "{text}");
    assert_eq!(telnet["src"], "10.79.0.1");
    let tier_end = by_port(DENIED_PORT, "deny");
    assert_eq!(tier_end["kind"], "tier-end", "{text}");
    assert_eq!(tier_end["decided_by"], "end of tier default", "{text}");
    assert_eq!(tier_end["prefix"], "DPI|default", "{text}");
}

#[test]
fn denied_packets_show_the_deciding_policy_legacy() {
    denied_packets_show_the_deciding_policy(Backend::Legacy);
}

#[test]
fn denied_packets_show_the_deciding_policy_nft() {
    denied_packets_show_the_deciding_policy(Backend::Nft);
}
