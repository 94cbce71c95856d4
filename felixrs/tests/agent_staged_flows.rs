//! Staged verdicts in the live agent's flows and counters (issue 27), on the real kernel with
//! real etcd: pods a, b, c, d on one node, all traffic allowed by their profile. A staged
//! deny-all selecting b's ingress changes nothing in the datapath (every connection succeeds),
//! but the flow records of exactly the connections to b carry `pending_action: deny` naming the
//! staged policy, and `felixrs_staged_policy_connections_total` and `felixrs stats` count them. Promoted (the
//! staged policy deleted, the same spec written as a GlobalNetworkPolicy), exactly those
//! connections are dropped, and their records carry `action: deny` naming the policy. Root.

mod support;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use felixrs::flowlog::{FlowAction, FlowRecord, Reporter};
use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;
use felixrs_test_support::node::{Pod, add_pod, connects, exec, serve};
use serde_json::json;
use support::{Agent, put_default_tier, put_json, put_ns1_profile};

const PORT: u16 = 8080;
/// Connections per client and server.
const N: usize = 3;
const POLICY: &str = "stage-deny-b";

fn put_pod(etcd: &Etcd, name: &str, iface: &str, ip: &str) -> i64 {
    let wep = format!("node--1-k8s-{name}-eth0");
    put_json(
        etcd,
        &format!("workloadendpoints/ns1/{wep}"),
        json!({"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint",
               "metadata":{"name":wep,"namespace":"ns1",
                           "labels":{"app":name,"projectcalico.org/namespace":"ns1",
                                     "projectcalico.org/orchestrator":"k8s"}},
               "spec":{"orchestrator":"k8s","node":"node-1","pod":name,"endpoint":"eth0",
                       "interfaceName":iface,"ipNetworks":[format!("{ip}/32")],
                       "profiles":["kns.ns1"]}}),
    )
}

fn deny_b_spec() -> serde_json::Value {
    json!({"tier":"default","order":1,"selector":"app == 'b'","types":["Ingress"],
           "ingress":[{"action":"Deny"}]})
}

/// A 5-tuple and reporter: one connection's record (the hub holds its fresh record and maybe
/// an interval aggregate of it).
type ConnKey = (Reporter, IpAddr, Option<u16>, IpAddr, Option<u16>);

fn key(r: &FlowRecord) -> Option<ConnKey> {
    Some((
        r.reporter,
        r.source.ip?,
        r.source.port,
        r.dest.ip?,
        r.dest.port,
    ))
}

/// The records of `/flows` to `PORT`, once each reporter of `expected` connections is there.
fn flows(agent: &Agent, expected: usize) -> Vec<FlowRecord> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = agent.get("/flows?follow=false").unwrap();
        assert_eq!(code, 200, "{body}");
        let records: Vec<FlowRecord> = body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .filter(|r: &FlowRecord| r.dest.port == Some(PORT))
            .collect();
        let keys: BTreeSet<ConnKey> = records.iter().filter_map(key).collect();
        if keys.len() >= expected {
            return records;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {expected} connections: {records:#?}\n{}",
            keys.len(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn staged_counter(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("felixrs_staged_policy_connections_total{")
                && l.contains(&format!("name=\"{POLICY}\""))
                && l.contains("action=\"deny\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn staged_deny_is_predicted_in_flows_and_counters_then_enforced_when_promoted() {
    felixrs_test_support::require_root();
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    put_default_tier(&etcd);
    put_ns1_profile(&etcd);
    let names = ["a", "b", "c", "d"];
    let mut rev = 0;
    let mut pods: Vec<Pod> = Vec::new();
    // Proxy ARP answers for the pods' gateway only if the node routes it elsewhere.
    for argv in [
        "ip link set lo up",
        "ip link add up0 type veth peer name up1",
        "ip addr add 10.71.254.1/24 dev up0",
        "ip link set up0 up",
        "ip link set up1 up",
        "ip route add default via 10.71.254.2",
    ] {
        exec(&ns, &argv.split(' ').collect::<Vec<_>>());
    }
    ns.sysctl("net.ipv4.ip_forward", "1").unwrap();
    ns.sysctl("net.ipv4.conf.all.rp_filter", "0").unwrap();
    ns.sysctl("net.ipv4.conf.default.rp_filter", "0").unwrap();
    for (i, name) in names.iter().enumerate() {
        let iface = format!("cali00000000s{i}");
        let ip = format!("10.71.0.{}", i + 1);
        rev = put_pod(&etcd, name, &iface, &ip);
        let pod = add_pod(&ns, &iface, &ip, &format!("fd71::{}", i + 1));
        serve(&pod.ns, pod.v4, PORT);
        pods.push(pod);
    }
    let (a, b, c, d) = (&pods[0], &pods[1], &pods[2], &pods[3]);
    let (b_ip, d_ip): (IpAddr, IpAddr) = (b.v4, d.v4);

    let state = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        ns.name(),
        &etcd.client_url(),
        &state.path().join("state"),
        &["--flow-logs", "--flow-logs-interval", "60"],
    );
    agent.wait_applied(rev);
    let mut spec = deny_b_spec();
    spec["stagedAction"] = json!("Set");
    let rev = put_json(
        &etcd,
        &format!("stagedglobalnetworkpolicies/{POLICY}"),
        json!({"apiVersion":"projectcalico.org/v3","kind":"StagedGlobalNetworkPolicy",
               "metadata":{"name":POLICY},"spec":spec}),
    );
    agent.wait_applied(rev);

    // Staged: the datapath is unchanged, every connection succeeds.
    let clients = [(a, b_ip), (c, b_ip), (a, d_ip)];
    for (from, to) in clients {
        for _ in 0..N {
            assert!(connects(&from.ns, to, PORT), "{to}\n{}", agent.log());
        }
    }
    // Each connection is reported by its source and its destination.
    let records = flows(&agent, 2 * N * clients.len());
    let mut predicted = BTreeSet::new();
    for r in &records {
        assert_eq!(r.action, FlowAction::Allow, "{r:#?}");
        let to_b = r.dest.ip == Some(b_ip) && r.reporter == Reporter::Dst;
        if to_b {
            assert_eq!(r.pending_action, Some(FlowAction::Deny), "{r:#?}");
            let hit = r.policies.pending.last().expect("a pending hit");
            assert_eq!(
                (hit.kind.as_str(), hit.name.as_str(), hit.tier.as_deref()),
                ("StagedGlobalNetworkPolicy", POLICY, Some("default")),
                "{r:#?}"
            );
            assert_eq!(hit.action, FlowAction::Deny, "{r:#?}");
            // The staged rule that would decide, numbered as the enforced hit numbers it.
            assert_eq!(hit.rule_index, Some(0), "{r:#?}");
            predicted.insert(key(r).unwrap());
        } else {
            assert_eq!(r.pending_action, None, "{r:#?}");
            assert!(r.policies.pending.is_empty(), "{r:#?}");
        }
    }
    assert_eq!(predicted.len(), 2 * N, "{records:#?}");
    let (_, metrics) = agent.get("/metrics").unwrap();
    assert_eq!(
        staged_counter(&metrics),
        Some(predicted.len() as u64),
        "{metrics}"
    );
    // `felixrs stats --state-dir` asks the running agent for the same counts (JSON and table).
    let dir = state.path().join("state");
    let dir = dir.to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_felixrs");
    let args = [
        "stats",
        "--state-dir",
        dir,
        "--node-name",
        "node-1",
        "--flow-logs",
    ];
    let out = ns.ok(bin, &[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        v["staged"],
        json!([{"kind": "StagedGlobalNetworkPolicy", "namespace": "", "name": POLICY,
                "tier": "default", "action": "deny", "connections": predicted.len()}]),
        "{out}"
    );
    let table = ns.ok(bin, &args);
    let line = table
        .lines()
        .skip_while(|l| !l.starts_with("staged policies"))
        .find(|l| l.contains(POLICY))
        .unwrap_or_else(|| panic!("no staged row: {table}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            &predicted.len().to_string(),
            "deny",
            "StagedGlobalNetworkPolicy",
            "default",
            POLICY
        ],
        "{table}"
    );
    // The staged policy is not an active local policy (Felix counts enforced ones only).
    assert_eq!(
        agent.status()["active_policies"],
        json!(0),
        "{}",
        agent.status()
    );

    // Promoted: exactly the predicted connections (to b) are dropped.
    etcd.delete(&format!(
        "{}stagedglobalnetworkpolicies/{POLICY}",
        support::PREFIX
    ));
    let rev = put_json(
        &etcd,
        &format!("globalnetworkpolicies/{POLICY}"),
        json!({"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkPolicy",
               "metadata":{"name":POLICY},"spec":deny_b_spec()}),
    );
    agent.wait_applied(rev);
    let before: BTreeSet<ConnKey> = records.iter().filter_map(key).collect();
    for (from, to) in clients {
        for _ in 0..N {
            assert_eq!(connects(&from.ns, to, PORT), to == d_ip, "{to}");
        }
    }
    let after = flows(&agent, before.len() + 2 * N * clients.len());
    let mut denied = 0;
    for r in after.iter().filter(|r| !before.contains(&key(r).unwrap())) {
        let to_b = r.dest.ip == Some(b_ip);
        if to_b && r.reporter == Reporter::Dst {
            assert_eq!(r.action, FlowAction::Deny, "{r:#?}");
            let hit = r.policies.enforced.last().expect("an enforced hit");
            assert_eq!(
                (hit.kind.as_str(), hit.name.as_str()),
                ("GlobalNetworkPolicy", POLICY),
                "{r:#?}"
            );
            assert_eq!(hit.rule_index, Some(0), "{r:#?}");
            denied += 1;
        } else {
            assert_eq!(r.action, FlowAction::Allow, "{r:#?}");
        }
        assert_eq!(r.pending_action, None, "{r:#?}");
    }
    assert_eq!(denied, 2 * N, "{after:#?}");
}
