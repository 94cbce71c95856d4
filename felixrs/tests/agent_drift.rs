//! Fast drift repair (issue 23): the agent (real etcd, the real kernel, in a network namespace the
//! test creates) runs with the default `--drift-interval` (2 s) and a full refresh an hour away.
//! Every tamper of the table, v4 and v6, on both backends, must be undone within 5 s
//! (polled): hook deleted, foreign rule above our hook (reported, kept), set flushed, set members
//! swapped, `accept` in `cali-FORWARD` through `nft`, the pod's `cali-tw-` chain flushed (iptables
//! and nft), `-j ACCEPT` on top of it and of its `cali-pi-` chain, the dispatch rule and the chain
//! deleted, a raw, mangle and nat chain of ours edited. A log line and a metric name each object.
//! legacy runs on its fast signal (the tables' summaries, the agent being in the namespace); on a
//! node this small its slow one (the save hash) is cheap enough to be taken on most checks too.

mod support;

use std::time::{Duration, Instant};

use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;
use serde_json::json;
use support::{Agent, put_default_tier, put_json};

/// The bound.
const BOUND: Duration = Duration::from_secs(5);

fn metric(agent: &Agent, line_start: &str) -> u64 {
    let (_, m) = agent.get("/metrics").unwrap();
    m.lines()
        .find(|l| l.starts_with(line_start) && l[line_start.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Our rules and chains of both families, and our sets, as the kernel has them (no counters).
fn ours(ns: &Netns, backend: &str) -> String {
    let mut text = String::new();
    for tool in ["iptables", "ip6tables"] {
        let save = ns.ok(&format!("{tool}-{backend}-save"), &[]);
        text.extend(
            save.lines()
                .filter(|l| l.contains("cali") && !l.starts_with('#') && !l.starts_with(':'))
                .map(|l| format!("{tool} {l}\n")),
        );
    }
    let mut sets: Vec<String> = ns
        .ok("ipset", &["save"])
        .lines()
        .map(str::to_string)
        .collect();
    sets.sort();
    text + &sets.join("\n")
}

/// The `-A` lines of one chain.
fn rules(ns: &Netns, tool: &str, table: &str, chain: &str) -> Vec<String> {
    ns.ok(tool, &["-t", table, "-S", chain])
        .lines()
        .filter(|l| l.starts_with("-A "))
        .map(str::to_string)
        .collect()
}

/// The first chain of ours named `prefix…` in `table` with at least one rule.
fn chain(ns: &Netns, tool: &str, table: &str, prefix: &str) -> String {
    let save = ns.ok(&format!("{tool}-save"), &["-t", table]);
    save.lines()
        .filter_map(|l| l.strip_prefix("-A "))
        .filter_map(|l| l.split(' ').next())
        .find(|c| c.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} chain in {table}:\n{save}"))
        .to_string()
}

fn ok_all(ns: &Netns, steps: &[Vec<String>]) {
    for s in steps {
        let args: Vec<&str> = s[1..].iter().map(String::as_str).collect();
        ns.ok(&s[0], &args);
    }
}

fn drift(backend: &str) {
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    put_default_tier(&etcd);
    put_json(
        &etcd,
        "profiles/kns.ns1",
        json!({"apiVersion":"projectcalico.org/v3","kind":"Profile","metadata":{"name":"kns.ns1"},
               "spec":{"ingress":[{"action":"Allow"}],"egress":[{"action":"Allow"}]}}),
    );
    put_json(
        &etcd,
        "ippools/pool1",
        json!({"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"pool1"},
               "spec":{"cidr":"10.70.0.0/16","natOutgoing":true}}),
    );
    for (pod, iface, v4, v6) in [
        ("web", "cali0000000001", "10.70.0.1/32", "fd00:70::1/128"),
        ("db", "cali0000000002", "10.70.0.2/32", "fd00:70::2/128"),
    ] {
        put_json(
            &etcd,
            &format!("workloadendpoints/ns1/node--1-k8s-{pod}-eth0"),
            json!({"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint",
                   "metadata":{"name":format!("node--1-k8s-{pod}-eth0"),"namespace":"ns1",
                               "labels":{"app":pod,"projectcalico.org/namespace":"ns1",
                                         "projectcalico.org/orchestrator":"k8s"}},
                   "spec":{"orchestrator":"k8s","node":"node-1","pod":pod,"endpoint":"eth0",
                           "interfaceName":iface,"ipNetworks":[v4, v6],"profiles":["kns.ns1"]}}),
        );
    }
    let rev = put_json(
        &etcd,
        "networkpolicies/ns1/db-to-web",
        json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
               "metadata":{"name":"db-to-web","namespace":"ns1"},
               "spec":{"tier":"default","order":100,"selector":"app == 'web'","types":["Ingress"],
                       "ingress":[{"action":"Allow","source":{"selector":"app == 'db'"}}]}}),
    );
    let state = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        ns.name(),
        &etcd.client_url(),
        &state.path().join("state"),
        &[
            "--refresh-interval",
            "3600",
            "--iptables-backend",
            backend,
            // The DNS hold's chains: a mangle chain of ours.
            "--dns-trusted-servers",
            "10.96.0.10,[fd00::10]:53",
        ],
    );
    agent.wait_applied(rev);
    let ipt = format!("iptables-{backend}");
    let ip6t = format!("ip6tables-{backend}");
    let tw = "cali-tw-cali0000000001";
    let pi = chain(&ns, &ipt, "filter", "cali-pi-");
    let set4 = ns
        .ok("ipset", &["list", "-n"])
        .lines()
        .find(|s| s.starts_with("cali40s:"))
        .unwrap()
        .to_string();
    let set6 = set4.replacen("cali40", "cali60", 1);
    let dispatch = rules(&ns, &ipt, "filter", "cali-to-wl-dispatch");
    let at = 1 + dispatch.iter().position(|r| r.contains(tw)).unwrap();
    // Let the first checks learn the kernel as written: nothing of ours is repaired.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        metric(&agent, "felixrs_drift_repairs_total"),
        0,
        "{}",
        agent.log()
    );
    assert!(
        metric(&agent, "felixrs_drift_checks_total") >= 1,
        "{}",
        agent.log()
    );
    let base = ours(&ns, backend);
    let hook = rules(&ns, &ipt, "filter", "FORWARD")[0].clone();

    let cmd = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<String>>();
    let mut cases: Vec<(String, Vec<Vec<String>>)> = vec![
        (
            "hook deleted".into(),
            vec![cmd(&format!("{ipt} -D FORWARD 1"))],
        ),
        (
            "v6 hook deleted".into(),
            vec![cmd(&format!("{ip6t} -D FORWARD 1"))],
        ),
        (
            "set flushed".into(),
            vec![cmd(&format!("ipset flush {set4}"))],
        ),
        (
            "v6 set flushed".into(),
            vec![cmd(&format!("ipset flush {set6}"))],
        ),
        (
            "set members swapped".into(),
            vec![
                cmd(&format!("ipset del {set4} 10.70.0.2")),
                cmd(&format!("ipset add {set4} 10.70.9.9")),
            ],
        ),
        (
            "workload chain flushed".into(),
            vec![cmd(&format!("{ipt} -F {tw}"))],
        ),
        (
            "v6 workload chain flushed".into(),
            vec![cmd(&format!("{ip6t} -F {tw}"))],
        ),
        (
            "accept on top of the workload chain".into(),
            vec![cmd(&format!("{ipt} -I {tw} 1 -j ACCEPT"))],
        ),
        (
            "accept on top of the policy chain".into(),
            vec![cmd(&format!("{ipt} -I {pi} 1 -j ACCEPT"))],
        ),
        (
            "v6 accept on top of the policy chain".into(),
            vec![cmd(&format!("{ip6t} -I {pi} 1 -j ACCEPT"))],
        ),
        (
            "dispatch rule deleted".into(),
            vec![cmd(&format!("{ipt} -D cali-to-wl-dispatch {at}"))],
        ),
        (
            "dispatch rule and chain deleted".into(),
            vec![
                cmd(&format!("{ipt} -D cali-to-wl-dispatch {at}")),
                cmd(&format!("{ipt} -F {tw}")),
                cmd(&format!("{ipt} -X {tw}")),
            ],
        ),
    ];
    for table in ["raw", "mangle", "nat"] {
        let c = chain(&ns, &ipt, table, "cali-");
        cases.push((
            format!("{table} chain {c} edited"),
            vec![cmd(&format!("{ipt} -t {table} -I {c} 1 -j ACCEPT"))],
        ));
    }
    if backend == "nft" {
        cases.push((
            "accept in cali-FORWARD through nft".into(),
            vec![cmd("nft insert rule ip filter cali-FORWARD accept")],
        ));
        cases.push((
            "workload chain flushed through nft".into(),
            vec![cmd(&format!("nft flush chain ip filter {tw}"))],
        ));
        cases.push((
            "v6 workload chain flushed through nft".into(),
            vec![cmd(&format!("nft flush chain ip6 filter {tw}"))],
        ));
    }
    let mut slowest = Duration::ZERO;
    for (what, steps) in &cases {
        ok_all(&ns, steps);
        let start = Instant::now();
        while ours(&ns, backend) != base {
            assert!(
                start.elapsed() < BOUND,
                "{backend}: {what}: not repaired within {BOUND:?}\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        slowest = slowest.max(start.elapsed());
        eprintln!("{backend}: {what}: repaired in {:?}", start.elapsed());
    }

    // A foreign rule above our hook: reported (the hook goes back on top), never removed.
    ns.ok(
        &ipt,
        &["-I", "FORWARD", "1", "-s", "192.0.2.1/32", "-j", "ACCEPT"],
    );
    let start = Instant::now();
    loop {
        let f = rules(&ns, &ipt, "filter", "FORWARD");
        if f[0] == hook && f.iter().any(|l| l.contains("192.0.2.1")) {
            break;
        }
        assert!(
            start.elapsed() < BOUND,
            "{backend}: displaced hook: {f:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "{backend}: displaced hook repaired in {:?}; slowest repair {slowest:?}",
        start.elapsed()
    );

    // A log line and a metric per repaired object, naming it.
    let log = agent.log();
    // legacy: the tables' summaries were asked all along (the agent runs in the namespace).
    assert!(
        !log.contains("legacy tables' summaries"),
        "{backend}: the fast signal failed\n{log}"
    );
    for object in [
        format!("ipv4 filter/{tw}"),
        format!("ipv6 filter/{tw}"),
        format!("ipv4 ipset/{set4}"),
        format!("ipv4 filter/{pi}"),
    ] {
        assert!(
            log.contains(&object),
            "{backend}: {object} not logged\n{log}"
        );
    }
    let line =
        format!("felixrs_drift_repaired_objects_total{{family=\"ipv4\",object=\"filter/{tw}\"}}");
    assert!(
        metric(&agent, &line) >= 3,
        "{backend}: {line}\n{}",
        agent.get("/metrics").unwrap().1
    );
    assert!(metric(&agent, "felixrs_drift_repairs_total") as usize > cases.len());
}

#[test]
fn every_tamper_is_repaired_within_5s_nft() {
    drift("nft");
}

#[test]
fn every_tamper_is_repaired_within_5s_legacy() {
    drift("legacy");
}
