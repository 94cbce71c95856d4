//! Fast drift repair (issue 23): the agent (real etcd, the real kernel, in a network namespace the
//! test creates) runs with the default `--drift-interval` (2 s) and a full refresh an hour away.
//! Every tamper of the table, v4 and v6, on both backends, must be undone within 5 s
//! (polled): hook deleted, foreign rule above our hook (reported, kept), set flushed, set members
//! swapped, `accept` in `cali-FORWARD` through `nft`, the pod's `cali-tw-` chain flushed (iptables
//! and nft), `-j ACCEPT` on top of it and of its `cali-pi-` chain, the dispatch rule and the chain
//! deleted, a raw, mangle and nat chain of ours edited; and rules of ours replaced in place
//! keeping their `cali:` ids (`iptables -R`, and `nft replace rule` on nft): the workload chain's
//! `DROP` made `ACCEPT`, the policy chain's port changed and its rule made `ACCEPT`, v4 and v6 (on
//! legacy most of these keep the table's size). A log line and a metric name each object. legacy
//! runs on its signal of the tables' summaries and contents (the agent being in the namespace).

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
        if s[0] == "nft-replace" {
            nft_replace(ns, &s[1], &s[2], s[3].parse().unwrap(), &s[4..]);
            continue;
        }
        let args: Vec<&str> = s[1..].iter().map(String::as_str).collect();
        ns.ok(&s[0], &args);
    }
}

/// `iptables -R`: rule `i` (0-based) of `chain`, as `-S` prints it, made `edit` of itself, its
/// `cali:` comment kept.
fn replace_in_place(
    ns: &Netns,
    tool: &str,
    chain: &str,
    pick: impl Fn(&str) -> bool,
    edit: impl Fn(&str) -> String,
) -> Vec<String> {
    let all = rules(ns, tool, "filter", chain);
    let (i, line) = (all.iter().enumerate())
        .find(|(_, l)| l.contains("\"cali:") && pick(l))
        .unwrap_or_else(|| panic!("no such rule in {chain}: {all:?}"));
    let edited = edit(line);
    assert_ne!(&edited, line);
    let spec = edited.strip_prefix(&format!("-A {chain} ")).unwrap();
    let mut args = vec![
        tool.to_string(),
        "-R".into(),
        chain.into(),
        (i + 1).to_string(),
    ];
    args.extend(
        iptables::parse::Tokens { rest: spec }.map(|t| iptables::parse::unquote(t).to_string()),
    );
    args
}

/// `nft replace rule`: rule `i` of `chain` (its handle looked up now) made `stmt`, with nft's own
/// comment holding the rule's `cali:` id (iptables-nft reads it back as `-m comment`).
fn nft_replace(ns: &Netns, family: &str, chain: &str, i: usize, stmt: &[String]) {
    let tool = if family == "ip" {
        "iptables-nft"
    } else {
        "ip6tables-nft"
    };
    let line = rules(ns, tool, "filter", chain)[i].clone();
    let id = (line.split(' '))
        .find_map(|t| t.strip_prefix("\"cali:"))
        .unwrap_or_else(|| panic!("no id in {line}"))
        .trim_end_matches('"')
        .to_string();
    let listing = ns.ok("nft", &["-a", "list", "chain", family, "filter", chain]);
    let handle = (listing.lines())
        .filter(|l| !l.contains("chain ") && l.contains("# handle "))
        .nth(i)
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no rule {i} in {listing}"))
        .to_string();
    let comment = format!("\"cali:{id}\"");
    let mut args = vec![
        "replace", "rule", family, "filter", chain, "handle", &handle,
    ];
    args.extend(stmt.iter().map(String::as_str));
    args.extend(["comment", &comment]);
    ns.ok("nft", &args);
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
                       "ingress":[{"action":"Allow","protocol":"TCP",
                                   "source":{"selector":"app == 'db'"},
                                   "destination":{"ports":[5432]}}]}}),
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
    // Rules of ours replaced in place, their ids kept.
    // The workload chain goes to its shared chain (`cali-si-`), which holds the rules.
    let shared = (rules(&ns, &ipt, "filter", tw).iter())
        .find_map(|l| l.split(" -g ").nth(1).map(str::to_string))
        .unwrap_or_else(|| panic!("{tw} goes to no shared chain"));
    let any_rule = |_: &str| true;
    let goto_accepts = |l: &str| format!("{} -j ACCEPT", l.split(" -g ").next().unwrap());
    let drop_rule = |l: &str| l.ends_with(" -j DROP");
    let to_accept = |l: &str| l.replace(" -j DROP", " -j ACCEPT");
    let port_rule = |l: &str| l.contains("5432");
    let port_changed = |l: &str| l.replace("5432", "5433");
    let port_rule_accepts = |l: &str| {
        let matches = l
            .split(" -j ")
            .next()
            .unwrap()
            .split(" -g ")
            .next()
            .unwrap();
        format!("{matches} -j ACCEPT")
    };
    for (v, tool) in [("", &ipt), ("v6 ", &ip6t)] {
        cases.push((
            format!("{v}workload chain rule made ACCEPT in place"),
            vec![replace_in_place(&ns, tool, tw, any_rule, goto_accepts)],
        ));
        cases.push((
            format!("{v}shared workload chain rule's DROP made ACCEPT in place"),
            vec![replace_in_place(&ns, tool, &shared, drop_rule, to_accept)],
        ));
        cases.push((
            format!("{v}policy chain rule's port changed in place"),
            vec![replace_in_place(&ns, tool, &pi, port_rule, port_changed)],
        ));
        cases.push((
            format!("{v}policy chain rule made ACCEPT in place"),
            vec![replace_in_place(
                &ns,
                tool,
                &pi,
                port_rule,
                port_rule_accepts,
            )],
        ));
    }
    if backend == "nft" {
        let at = |chain: &str, pick: &dyn Fn(&str) -> bool| {
            (rules(&ns, &ipt, "filter", chain).iter())
                .position(|l| l.contains("\"cali:") && pick(l))
                .unwrap()
                .to_string()
        };
        let port_at = at(&pi, &port_rule);
        for family in ["ip", "ip6"] {
            let replace = |chain: &str, i: &str, stmt: &str| {
                let mut step = vec![
                    "nft-replace".to_string(),
                    family.into(),
                    chain.into(),
                    i.into(),
                ];
                step.extend(stmt.split(' ').map(str::to_string));
                vec![step]
            };
            cases.push((
                format!("{family}: workload chain rule replaced by an accept through nft"),
                replace(tw, "0", "counter accept"),
            ));
            cases.push((
                format!("{family}: policy chain rule's port changed through nft"),
                replace(
                    &pi,
                    &port_at,
                    "meta l4proto tcp tcp dport 5433 counter accept",
                ),
            ));
        }
    }
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
    // legacy: the tables' contents were asked all along (the agent runs in the namespace).
    assert!(
        !log.contains("legacy tables' contents"),
        "{backend}: the fast signal failed\n{log}"
    );
    // An edit in place is named as such, with its chain.
    for chain in [tw, shared.as_str(), pi.as_str()] {
        assert!(
            log.lines()
                .any(|l| l.contains("holds another body") && l.contains(chain)),
            "{backend}: the edit in place of {chain} not logged\n{log}"
        );
    }
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
