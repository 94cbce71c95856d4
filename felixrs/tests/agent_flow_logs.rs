//! `felixrs agent --flow-logs` end to end: real etcd and the real kernel in a network namespace
//! the test creates, one pod (`ns1/web`) behind its veth; the pod connects to the node on an
//! allowed and a denied port. `/flows` streams both records (the egress policy and rule that
//! decided, the pod's namespace and labels), `/metrics` counts them, the file gets the interval
//! aggregates, and `felixrs flows` on the same node says the agent holds the NFLOG groups and
//! names `/flows`. Root.

mod support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use felixrs::flowlog::{FlowAction, FlowRecord, Reporter};
use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;
use felixrs_test_support::node::{connects, serve};
use serde_json::json;
use support::{Agent, WebNode, put_default_tier};

const HOST: &str = "10.70.255.1";

#[test]
fn flows_stream_from_the_agent_with_the_deciding_policy() {
    felixrs_test_support::require_root();
    let node = WebNode::start(
        "web-egress",
        json!({"tier":"default","order":1000,"selector":"app == 'web'",
               "types":["Egress"],
               "egress":[{"action":"Allow","protocol":"TCP",
                          "destination":{"ports":[7001]}},
                         {"action":"Deny","protocol":"TCP",
                          "destination":{"ports":[7002]}}]}),
    );
    let (ns, etcd, rev) = (&node.ns, &node.etcd, node.rev);
    let pod = node.add_web_pod(HOST);
    let host: IpAddr = HOST.parse().unwrap();
    serve(ns, host, 7001);
    serve(ns, host, 7002);
    assert!(
        (0..5).any(|_| connects(&pod.ns, host, 7001)),
        "no connectivity before any rule"
    );

    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("logs/flows.jsonl");
    let agent = Agent::start_with(
        ns.name(),
        &etcd.client_url(),
        &state.path().join("state"),
        &[
            "--flow-logs",
            "--flow-logs-interval",
            "1",
            "--flow-logs-file",
            file.to_str().unwrap(),
            "--flow-logs-file-keep",
            "2",
        ],
    );
    agent.wait_applied(rev);

    assert!(connects(&pod.ns, host, 7001), "{}", agent.log());
    assert!(!connects(&pod.ns, host, 7002));

    let find = |records: &[FlowRecord], port: u16| {
        records
            .iter()
            .find(|r| {
                r.dest.port == Some(port)
                    && r.reporter == Reporter::Src
                    && r.source.name.as_deref() == Some("web")
                    && !r.policies.enforced.is_empty()
                    && r.policies.enforced[0].tier.is_some()
            })
            .cloned()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (allowed, denied) = loop {
        let (code, body) = agent.get("/flows?follow=false").unwrap();
        assert_eq!(code, 200, "{body}");
        let records: Vec<FlowRecord> = body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if let (Some(a), Some(d)) = (find(&records, 7001), find(&records, 7002)) {
            break (a, d);
        }
        assert!(
            Instant::now() < deadline,
            "records: {records:#?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(allowed.action, FlowAction::Allow, "{allowed:#?}");
    let hit = &allowed.policies.enforced[0];
    assert_eq!(
        (
            hit.kind.as_str(),
            hit.namespace.as_deref(),
            hit.name.as_str()
        ),
        ("NetworkPolicy", Some("ns1"), "web-egress")
    );
    assert_eq!(
        (hit.tier.as_deref(), hit.rule_index),
        (Some("default"), Some(0))
    );
    assert_eq!(allowed.source.namespace.as_deref(), Some("ns1"));
    assert_eq!(
        allowed.source.labels.get("app").map(String::as_str),
        Some("web")
    );
    assert_eq!(allowed.dest.kind, "net");
    assert_eq!(denied.action, FlowAction::Deny, "{denied:#?}");
    assert_eq!(denied.policies.enforced[0].rule_index, Some(1));

    // Flow logs without `--web-view`: no web view.
    assert_eq!(agent.get("/ui/").unwrap().0, 404);

    let (_, metrics) = agent.get("/metrics").unwrap();
    for name in [
        "felixrs_flow_logs_records_total",
        "felixrs_flow_logs_connections_total",
        "felixrs_flow_logs_dropped_total 0",
        "felixrs_flow_logs_live_entries",
        "felixrs_flow_logs_nflog_socket_drops_total 0",
        "felixrs_flow_logs_conntrack_socket_drops_total 0",
    ] {
        assert!(metrics.contains(name), "no {name} in:\n{metrics}");
    }

    // The interval aggregates reach the file.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if text.lines().any(|l| l.contains("\"port\":7002")) {
            break;
        }
        assert!(Instant::now() < deadline, "file: {text}\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(200));
    }

    // `felixrs flows` cannot bind the agent's groups and says what to use instead.
    let out = ns
        .command(env!("CARGO_BIN_EXE_felixrs"))
        .args(["flows", "--state-dir"])
        .arg(state.path().join("state"))
        .args(["--node-name", "node-1", "--timeout", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("nflog group 1") && err.contains("/flows"),
        "{err}"
    );
}

#[test]
fn without_the_flag_there_is_no_flows_route_nor_metric() {
    felixrs_test_support::require_root();
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    let rev = put_default_tier(&etcd);
    let state = tempfile::tempdir().unwrap();
    let agent = Agent::start(ns.name(), &etcd.client_url(), &state.path().join("state"));
    agent.wait_applied(rev);
    let (code, _) = agent.get("/flows?follow=false").unwrap();
    assert_eq!(code, 404);
    assert_eq!(
        agent.get("/ui/").unwrap().0,
        404,
        "no web view without --web-view"
    );
    let (_, metrics) = agent.get("/metrics").unwrap();
    assert!(!metrics.contains("flow_logs"), "{metrics}");
    assert!(!state.path().join("state/flows.jsonl").exists());
}
