//! Fast drift repair: the agent (real etcd, the real kernel, in a network namespace the test creates)
//! runs with a full refresh an hour away and a fast drift check every half second; a flushed root
//! chain, a foreign rule pushed above our hook and an edited rule of ours are each repaired within
//! a few seconds, with a log line and a metric per repair.

mod support;

use std::time::{Duration, Instant};

use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;
use serde_json::json;
use support::{Agent, put_default_tier, put_json, put_web_endpoint};

/// Repairs must land within this (the check runs every 0.5 s; the machine is loaded).
const BOUND: Duration = Duration::from_secs(10);

fn list(ns: &Netns, chain: &str) -> Vec<String> {
    ns.ok("iptables-nft", &["-S", chain])
        .lines()
        .filter(|l| l.starts_with("-A "))
        .map(str::to_string)
        .collect()
}

fn metric(agent: &Agent, name: &str) -> u64 {
    let (_, m) = agent.get("/metrics").unwrap();
    m.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn repaired_within(what: &str, f: impl Fn() -> bool, agent: &Agent) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < BOUND,
            "{what}: not repaired within {BOUND:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

#[test]
fn tampered_chains_are_repaired_within_the_bound() {
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    put_default_tier(&etcd);
    put_json(
        &etcd,
        "profiles/kns.ns1",
        json!({"apiVersion":"projectcalico.org/v3","kind":"Profile",
               "metadata":{"name":"kns.ns1"},
               "spec":{"ingress":[{"action":"Allow"}],"egress":[{"action":"Allow"}]}}),
    );
    let rev = put_web_endpoint(&etcd, "cali0000000001", &["kns.ns1"]);
    let state = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        ns.name(),
        &etcd.client_url(),
        &state.path().join("state"),
        &["--refresh-interval", "3600", "--drift-interval", "0.5"],
    );
    agent.wait_applied(rev);
    let forward = list(&ns, "cali-FORWARD");
    assert!(forward.len() >= 3, "{forward:?}");
    let hook = list(&ns, "FORWARD")[0].clone();
    assert!(hook.contains("-j cali-FORWARD"), "{hook}");
    // Nothing drifted yet: checks run and repair nothing.
    let deadline = Instant::now() + BOUND;
    while metric(&agent, "felixrs_drift_checks_total") < 3 {
        assert!(
            Instant::now() < deadline,
            "no drift checks:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let repairs = metric(&agent, "felixrs_drift_repairs_total");
    assert_eq!(repairs, 0, "spurious repairs:\n{}", agent.log());

    // 1. Our root chain flushed.
    ns.ok("iptables-nft", &["-F", "cali-FORWARD"]);
    let took = repaired_within(
        "flushed cali-FORWARD",
        || list(&ns, "cali-FORWARD") == forward,
        &agent,
    );
    eprintln!("flushed chain repaired in {took:?}");

    // 2. A foreign rule pushed above our hook: the hook goes back to the top, the foreign rule stays.
    ns.ok(
        "iptables-nft",
        &["-I", "FORWARD", "1", "-s", "192.0.2.1/32", "-j", "ACCEPT"],
    );
    let took = repaired_within(
        "displaced hook",
        || {
            let f = list(&ns, "FORWARD");
            f.first() == Some(&hook) && f.iter().any(|l| l.contains("192.0.2.1"))
        },
        &agent,
    );
    eprintln!("displaced hook repaired in {took:?}");

    // 3. One of our rules edited in place.
    ns.ok("iptables-nft", &["-R", "cali-FORWARD", "2", "-j", "ACCEPT"]);
    let took = repaired_within(
        "edited rule",
        || list(&ns, "cali-FORWARD") == forward,
        &agent,
    );
    eprintln!("edited rule repaired in {took:?}");

    let deadline = Instant::now() + BOUND;
    while metric(&agent, "felixrs_drift_repairs_total") < 3 {
        assert!(
            Instant::now() < deadline,
            "drift repairs not counted:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // One repair per tampered chain (FORWARD once, cali-FORWARD twice), nothing more.
    assert_eq!(
        metric(&agent, "felixrs_drift_repairs_total"),
        3,
        "{}",
        agent.log()
    );
    let log = agent.log();
    assert!(
        log.matches("drift: chain differed from what we wrote; repaired")
            .count()
            >= 3,
        "{log}"
    );
    assert!(
        log.contains("filter/cali-FORWARD") && log.contains("filter/FORWARD"),
        "{log}"
    );
}
