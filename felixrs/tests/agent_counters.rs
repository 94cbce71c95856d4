//! The agent's per-policy counters in `/metrics`: real etcd and the real kernel in a network
//! namespace the test creates; the counter thread reads the kernel on `--counters-interval`
//! (not per scrape) and exports one series per policy, direction and action.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::{Agent, WebNode};

fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn metrics_carry_per_policy_counters_read_on_the_interval() {
    let node = WebNode::start(
        "web-ingress",
        json!({"tier":"default","order":1000,"selector":"app == 'web'",
               "types":["Ingress"],
               "ingress":[{"action":"Allow","protocol":"TCP",
                           "destination":{"ports":[7001]}},
                          {"action":"Deny","protocol":"TCP",
                           "destination":{"ports":[7002]}}]}),
    );
    let state = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        node.ns.name(),
        &node.etcd.client_url(),
        &state.path().join("state"),
        &["--counters-interval", "0.2"],
    );
    agent.wait_applied(node.rev);

    let series = |action: &str| {
        format!(
            "felixrs_policy_packets_total{{family=\"ipv4\",kind=\"networkpolicy\",tier=\"default\",policy=\"ns1/web-ingress\",direction=\"ingress\",action=\"{action}\"}}"
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let (_, m) = agent.get("/metrics").unwrap();
        if metric(&m, "felixrs_counter_reads_total").unwrap_or(0) >= 2
            && m.contains(&series("allow"))
        {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "no per-policy counters in /metrics:\n{m}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    for want in [
        series("allow"),
        series("deny"),
        "felixrs_policy_bytes_total{family=\"ipv6\",kind=\"networkpolicy\"".to_string(),
        "felixrs_policy_packets_total{family=\"ipv4\",kind=\"tier-end\",tier=\"default\",policy=\"\",direction=\"ingress\",action=\"deny\"}".to_string(),
        "felixrs_policy_packets_total{family=\"ipv4\",kind=\"profile\",tier=\"\",policy=\"kns.ns1\",direction=\"egress\",action=\"allow\"}".to_string(),
        "# TYPE felixrs_policy_packets counter".to_string(),
    ] {
        assert!(metrics.contains(&want), "missing {want} in:\n{metrics}");
    }
    assert_eq!(
        metric(&metrics, "felixrs_counter_read_errors_total"),
        Some(0)
    );
    assert_eq!(
        metric(&metrics, "felixrs_policy_counter_rules_missing"),
        Some(0),
        "{metrics}"
    );
    // Counters are read on the interval, not per scrape: reads keep coming without scrapes.
    let reads = metric(&metrics, "felixrs_counter_reads_total").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let (_, m) = agent.get("/metrics").unwrap();
        let now = metric(&m, "felixrs_counter_reads_total").unwrap();
        if now > reads + 1 {
            break;
        }
        assert!(Instant::now() < deadline, "counter reads stalled at {now}");
    }
}
