//! Per-policy counters on the real kernel: a node namespace with two pod namespaces wired as
//! Calico's CNI does, the rendered rules applied with the real applier (legacy and nft backends),
//! TCP over IPv4 and IPv6 that one policy allows, one GlobalNetworkPolicy logs and denies, and the
//! tier end drops; then `felixrs stats` (library and binary) must show the counters move for
//! exactly those policies and that tier end.
//! Needs root and iptables/ipset/iproute2 (CI has them); fails loudly otherwise.

mod node_support;

use felixrs::cmd::stats::{Row, Stats, collect};
use iptables::apply::Backend;
use iptables::apply::backend::Mode;
use node_support::{
    ALLOWED_PORT, DENIED_PORT, FelixrsNode, NODE, NodeWorld, TELNET_PORT, connects,
};

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
    let w = NodeWorld::new(backend);
    let (renderer, runner, node, client, server, work) = (
        &w.renderer,
        &w.runner,
        &w.node,
        &w.client,
        &w.server,
        &w.work,
    );
    let before = collect(renderer, runner, mode).expect("stats before traffic");
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
        // The GlobalNetworkPolicy's Log and Deny rules (not the tier end).
        assert!(
            !connects(&client.ns, dst, TELNET_PORT),
            "{dst} telnet not denied"
        );
    }

    let after = collect(renderer, runner, mode).expect("stats after traffic");
    for fam in ["ipv4", "ipv6"] {
        let gnp = "default.deny-telnet";
        for action in ["log", "deny"] {
            let delta = packets(&after, fam, "globalnetworkpolicy", gnp, action)
                - packets(&before, fam, "globalnetworkpolicy", gnp, action);
            assert!(delta >= 1, "{fam}: {gnp} {action} moved {delta}: {after:?}");
        }
    }
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
