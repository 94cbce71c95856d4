//! The agent binary end to end: real etcd and the real kernel, both inside a network namespace
//! the test creates (etcd listens on the namespace's loopback, so does the agent's health port).

mod support;

use std::time::Duration;

use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;
use serde_json::json;
use support::{Agent, PREFIX, put_default_tier, put_json, put_ns1_profile, put_web_endpoint};

const IFACE: &str = "cali0000000001";

/// A local endpoint with its namespace profile, and the default tier.
fn seed(etcd: &Etcd) -> i64 {
    put_default_tier(etcd);
    put_ns1_profile(etcd);
    put_web_endpoint(etcd, IFACE, &["kns.ns1"])
}

/// A policy selecting the endpoint that allows TCP to one port (the port identifies its rules).
fn put_policy(etcd: &Etcd, name: &str, port: u16) -> i64 {
    put_json(
        etcd,
        &format!("networkpolicies/ns1/{name}"),
        json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
               "metadata":{"name":name,"namespace":"ns1"},
               "spec":{"tier":"default","order":1000,"selector":"app == 'web'",
                       "types":["Ingress"],
                       "ingress":[{"action":"Allow","protocol":"TCP",
                                   "destination":{"ports":[port]}}]}}),
    )
}

fn save(ns: &Netns) -> String {
    ns.ok("iptables-nft-save", &["-t", "filter"])
}

/// Rules without counters, for before/after comparisons.
fn rules(ns: &Netns) -> Vec<String> {
    save(ns)
        .lines()
        .filter(|l| l.starts_with("-A") || l.starts_with(':'))
        .map(|l| l.split(" [").next().unwrap().to_string())
        .collect()
}

fn has_port(ns: &Netns, port: u16) -> bool {
    save(ns)
        .lines()
        .any(|l| l.contains("cali-pi-") && l.contains(&format!("--dports {port} ")))
}

#[test]
fn agent_syncs_applies_recovers_relists_and_restarts_from_snapshot() {
    let ns = Netns::new();
    let mut etcd = Etcd::start_in(ns.name());
    seed(&etcd);
    let rev = put_policy(&etcd, "p1", 7001);
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    let agent = Agent::start(ns.name(), &etcd.client_url(), &state_dir);

    // Initial sync programs the kernel.
    let s = agent.wait_applied(rev);
    assert_eq!(s["source"], "etcd", "{s}");
    assert_eq!(s["in_sync"], true);
    assert_eq!(s["local_endpoints"], 1, "{s}");
    assert_eq!(s["active_policies"], 1, "{s}");
    let dump = save(&ns);
    assert!(dump.contains(&format!("cali-tw-{IFACE}")), "{dump}");
    assert!(dump.contains("Unknown interface"), "{dump}");
    assert!(has_port(&ns, 7001), "{dump}");
    assert_eq!(agent.get("/readiness").unwrap().0, 200);

    // An update applies and applied_revision follows.
    let rev = put_policy(&etcd, "p2", 7002);
    agent.wait_applied(rev);
    assert!(has_port(&ns, 7002));

    // A write outside the prefix still advances applied_revision.
    let rev = etcd.put("/unrelated/key", "x");
    agent.wait_applied(rev);

    // A malformed value is skipped, counted, and does not stop later updates.
    let bad = etcd.put(&format!("{PREFIX}networkpolicies/ns1/bad"), "{not json");
    agent.wait_applied(bad);
    let (_, metrics) = agent.get("/metrics").unwrap();
    assert!(
        metrics.contains("felixrs_malformed_values_total 1"),
        "{metrics}"
    );

    // etcd restarted: the agent recovers and applies new changes.
    etcd.restart();
    let rev = put_policy(&etcd, "p3", 7003);
    agent.wait_applied(rev);
    assert!(has_port(&ns, 7003));

    // Disconnected and compacted: a deletion made meanwhile is found by the re-list.
    etcd.restart_admin_only();
    etcd.delete(&format!("{PREFIX}networkpolicies/ns1/p1"));
    let rev = etcd.put("/unrelated/bump", "y");
    etcd.compact(rev);
    etcd.restart();
    let s = agent.wait_applied(rev);
    assert!(
        !has_port(&ns, 7001),
        "deleted policy still programmed: {s}\n{}",
        save(&ns)
    );
    assert!(has_port(&ns, 7002) && has_port(&ns, 7003));
    let (_, metrics) = agent.get("/metrics").unwrap();
    assert!(metrics.contains("felixrs_resyncs_total 2"), "{metrics}");

    // Let the debounced snapshot catch up, then kill the agent and take etcd down.
    let s = agent.poll_status(Duration::from_secs(15), |s| {
        s["snapshot_revision"].as_i64().unwrap_or(-1) >= rev
    });
    assert!(s["snapshot_revision"].as_i64().unwrap() >= rev, "{s}");

    // The operator tools read what the agent persisted: its last programmed state.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["render", "--node-name", "node-1", "--state-dir"])
        .arg(&state_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with("# from the agent's snapshot at datastore revision "),
        "{text}"
    );
    let ports = |p: u16| {
        text.lines()
            .any(|l| l.starts_with("-A cali-pi-") && l.contains(&format!("--dports {p} ")))
    };
    assert!(ports(7002) && ports(7003) && !ports(7001), "{text}");
    drop(agent);
    etcd.stop();

    // A restarted agent on a node with an empty kernel programs from the snapshot.
    let ns2 = Netns::new();
    let agent = Agent::start(ns2.name(), &etcd.client_url(), &state_dir);
    let s = agent.wait_applied(rev);
    assert_eq!(s["source"], "snapshot", "{s}");
    assert!(save(&ns2).contains(&format!("cali-tw-{IFACE}")));
    assert!(has_port(&ns2, 7002) && !has_port(&ns2, 7001));
    drop(agent);
}

#[test]
fn no_rule_is_touched_before_in_sync_and_sigterm_leaves_rules() {
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    seed(&etcd);
    let rev = put_policy(&etcd, "p1", 7101);
    let state = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(ns.name(), &etcd.client_url(), &state.path().join("a"));
    agent.wait_applied(rev);
    let programmed = rules(&ns);
    assert!(programmed.iter().any(|l| l.contains("cali-tw-")));

    // SIGTERM: graceful exit, kernel rules stay.
    agent.signal(libc::SIGTERM);
    assert!(agent.wait().success());
    assert_eq!(rules(&ns), programmed);

    // A new agent that cannot reach etcd and whose snapshot is corrupt reports it and leaves the
    // kernel alone.
    drop(etcd);
    let corrupt = state.path().join("corrupt");
    std::fs::create_dir_all(&corrupt).unwrap();
    std::fs::write(corrupt.join("datastore.snapshot"), b"FXRSNAP\n garbage").unwrap();
    let agent = Agent::start(ns.name(), "http://127.0.0.1:9", &corrupt);
    agent.poll_status(Duration::from_secs(15), |s| s["snapshot_error"].is_string());
    // Give a misbehaving agent time to touch the kernel before looking.
    std::thread::sleep(Duration::from_secs(1));
    let s = agent.status();
    let err = s["snapshot_error"].as_str().unwrap_or_default().to_string();
    assert!(err.contains("truncated"), "{s}");
    assert_eq!(
        (s["in_sync"].clone(), s["source"].clone()),
        (json!(false), json!("none")),
        "{s}"
    );
    assert_eq!(agent.get("/readiness").unwrap().0, 503);
    assert_eq!(rules(&ns), programmed, "rules changed before in-sync");
}

/// Flows of an address that left a local endpoint are deleted once its rules are gone (an
/// established flow would otherwise pass the `ESTABLISHED` accept of the next pod to get the
/// address); every other flow stays.
#[test]
fn conntrack_flows_of_a_removed_endpoint_are_deleted() {
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    let rev = seed(&etcd);
    let (_state, state_dir) = support::state_dir();
    let agent = Agent::start(ns.name(), &etcd.client_url(), &state_dir);
    agent.wait_applied(rev);

    // `reply` is the reply direction's source, when a DNAT put it elsewhere than `dst`.
    let nat_flow = |src: &str, dst: &str, reply: &str, sport: &str| {
        let mut args = vec!["-I", "-s", src, "-d", dst, "-p", "tcp", "--sport", sport];
        args.extend(["--dport", "80", "--state", "ESTABLISHED", "-t", "300"]);
        if reply != dst {
            args.extend(["-r", reply, "-q", src, "--reply-port-src", "80"]);
            args.extend(["--reply-port-dst", sport]);
        }
        ns.ok("conntrack", &args);
    };
    let flow = |src: &str, dst: &str, sport: &str| nat_flow(src, dst, dst, sport);
    flow("10.70.0.1", "10.70.0.9", "40000"); // the pod started it
    flow("10.70.0.9", "10.70.0.1", "40001"); // the pod answered it
    nat_flow("10.70.0.9", "10.96.0.10", "10.70.0.1", "40003"); // it answered a service's address
    flow("10.70.0.2", "10.70.0.9", "40002"); // not the pod's
    let listed = |addr: &str| {
        ns.ok("conntrack", &["-L", "-f", "ipv4"])
            .lines()
            .filter(|l| l.contains(&format!("src={addr} ")))
            .count()
    };
    assert_eq!(listed("10.70.0.1"), 3);

    let rev = etcd.delete(&format!(
        "{PREFIX}workloadendpoints/ns1/node--1-k8s-web-eth0"
    ));
    let s = agent.wait_applied(rev);
    assert_eq!(s["local_endpoints"], 0, "{s}");
    assert!(!save(&ns).contains(&format!("cali-tw-{IFACE}")));
    // The deletion runs on the agent's conntrack thread right after the apply (before any later
    // apply could give the address to another endpoint): counted once it is done.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let metrics = loop {
        let (_, metrics) = agent.get("/metrics").unwrap();
        if metrics.contains("felixrs_conntrack_flows_deleted_total 3")
            || std::time::Instant::now() > deadline
        {
            break metrics;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        metrics.contains("felixrs_conntrack_flows_deleted_total 3"),
        "{metrics}"
    );
    assert_eq!(
        listed("10.70.0.1"),
        0,
        "flows of the removed endpoint remain"
    );
    assert_eq!(listed("10.70.0.2"), 1, "another address's flow was deleted");
    assert!(
        metrics.contains("felixrs_conntrack_errors_total 0"),
        "{metrics}"
    );
}

/// The dataplane flags reach the kernel: workloads behind another interface prefix are policed
/// (and the default `cali` one still is), and workload-to-host traffic follows
/// `--default-endpoint-to-host-action`.
#[test]
fn interface_prefix_and_endpoint_to_host_action_flags_reach_the_kernel() {
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    put_default_tier(&etcd);
    let rev = put_web_endpoint(&etcd, "tap0000000001", &[]);
    let (_state, state_dir) = support::state_dir();
    let agent = Agent::start_with(
        ns.name(),
        &etcd.client_url(),
        &state_dir,
        &[
            "--interface-prefix",
            "tap,cali",
            "--default-endpoint-to-host-action",
            "Drop",
        ],
    );
    let s = agent.wait_applied(rev);
    let text = save(&ns);
    for want in [
        "-A cali-FORWARD -i tap+ -m comment",
        "-A cali-FORWARD -i cali+ -m comment",
        ":cali-tw-tap0000000001",
        ":cali-fw-tap0000000001",
    ] {
        assert!(text.contains(want), "missing {want:?} ({s}):\n{text}");
    }
    let to_host = text
        .lines()
        .find(|l| l.starts_with("-A cali-wl-to-host") && l.contains("DefaultEndpointToHostAction"))
        .unwrap_or_else(|| panic!("no configured action in:\n{text}"));
    assert!(to_host.ends_with("-j DROP"), "{to_host}");

    // A prefix the kernel cannot hold is refused at start, naming it, and nothing is programmed.
    let ns2 = Netns::new();
    let (_state2, state_dir2) = support::state_dir();
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns2.name(),
            env!("CARGO_BIN_EXE_felixrs"),
            "agent",
        ])
        .args([
            "--etcd-endpoints",
            &etcd.client_url(),
            "--node-name",
            "node-1",
        ])
        .arg("--state-dir")
        .arg(&state_dir2)
        .args(["--interface-prefix", "bad prefix!"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("\"bad prefix!\""), "{stderr}");
    assert!(!save(&ns2).contains("cali-"), "{}", save(&ns2));
}

/// On the node, `felixrs trace --state-dir … --check-kernel` traces what the agent persisted and
/// finds every traced rule in the kernel; a flushed chain or a foreign rule ahead of our hook is
/// reported, with exit status 2.
#[test]
fn trace_checks_the_kernel_it_runs_on() {
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    seed(&etcd);
    put_policy(&etcd, "p1", 7001);
    // A policy with a source selector: its chain, which the trace traverses, uses an IP set.
    let rev = put_json(
        &etcd,
        "networkpolicies/ns1/from-web",
        json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
               "metadata":{"name":"from-web","namespace":"ns1"},
               "spec":{"tier":"default","order":1000,"selector":"app == 'web'",
                       "types":["Ingress"],
                       "ingress":[{"action":"Allow","protocol":"TCP",
                                   "source":{"selector":"app == 'web'"},
                                   "destination":{"ports":[7009]}}]}}),
    );
    let (_state, state_dir) = support::state_dir();
    let agent = Agent::start(ns.name(), &etcd.client_url(), &state_dir);
    agent.wait_applied(rev);
    let s = agent.poll_status(Duration::from_secs(15), |s| {
        s["snapshot_revision"].as_i64().unwrap_or(-1) >= rev
    });
    assert!(s["snapshot_revision"].as_i64().unwrap() >= rev, "{s}");
    drop(agent); // its rules stay in the kernel
    let trace = || {
        let out = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                ns.name(),
                env!("CARGO_BIN_EXE_felixrs"),
                "trace",
            ])
            .arg("--state-dir")
            .arg(&state_dir)
            .args([
                "--node-name",
                "node-1",
                "--from",
                "10.70.9.9",
                "--to",
                "ns1/web",
            ])
            .args(["--port", "7001", "--check-kernel"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.code(),
            text,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, text, err) = trace();
    assert_eq!(code, Some(0), "{text}{err}");
    assert!(text.contains("verdict: ACCEPT"), "{text}");
    assert!(
        text.contains("every chain the packet entered holds the rendered rules, and our hook is first in FORWARD"),
        "{text}"
    );
    assert!(
        text.contains("the IP sets those chains use hold what they should"),
        "{text}"
    );

    // A member gone from the set, another added behind the agent's back.
    let sets = ns.ok("ipset", &["list", "-n"]);
    let set = sets
        .lines()
        .find(|l| l.starts_with("cali40"))
        .unwrap_or_else(|| panic!("no set of ours: {sets}"))
        .to_string();
    ns.ok("ipset", &["del", &set, "10.70.0.1"]);
    ns.ok("ipset", &["add", &set, "10.70.0.99"]);
    let (code, text, err) = trace();
    assert_eq!(code, Some(2), "{text}{err}");
    for want in [
        format!("differs: ip set {set} lacks 10.70.0.1"),
        format!("differs: ip set {set} also holds 10.70.0.99"),
    ] {
        assert!(text.contains(&want), "missing {want:?} in:\n{text}");
    }
    ns.ok("ipset", &["add", &set, "10.70.0.1"]);
    ns.ok("ipset", &["del", &set, "10.70.0.99"]);

    ns.ok(
        "iptables-nft",
        &[
            "-w",
            "-I",
            "FORWARD",
            "1",
            "-s",
            "10.70.9.9",
            "-j",
            "ACCEPT",
        ],
    );
    ns.ok("iptables-nft", &["-w", "-F", &format!("cali-tw-{IFACE}")]);
    let (code, text, err) = trace();
    assert_eq!(code, Some(2), "{text}{err}");
    for want in [
        "differs: FORWARD rule 1 is not ours and runs before cali-FORWARD: -A FORWARD -s 10.70.9.9/32 -j ACCEPT",
        &format!(
            "differs: cali-tw-{IFACE} rule 1: the kernel has nothing where the rendered rules have cali:"
        ),
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // Our hook gone (it is second now, behind the foreign rule): nothing of ours runs.
    ns.ok("iptables-nft", &["-w", "-D", "FORWARD", "2"]);
    let (code, text, err) = trace();
    assert_eq!(code, Some(2), "{text}{err}");
    assert!(
        text.contains("differs: FORWARD has no hook to cali-FORWARD: none of our rules run"),
        "{text}"
    );
}

/// `felixrs_endpoint_programming_seconds`: `(count, sum)` from `/metrics`.
fn endpoint_programming(agent: &Agent) -> (u64, f64) {
    let (_, metrics) = agent.get("/metrics").unwrap();
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{name} in:\n{metrics}"))
            .parse::<f64>()
            .unwrap()
    };
    (
        value("felixrs_endpoint_programming_seconds_count") as u64,
        value("felixrs_endpoint_programming_seconds_sum"),
    )
}

/// One new local endpoint is one observation of its programming time, no longer than the test's
/// own put → `applied_revision` wait; a change that is not an endpoint's adds none.
#[test]
fn one_new_endpoint_is_one_programming_observation() {
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    put_default_tier(&etcd);
    let rev = put_json(
        &etcd,
        "profiles/kns.ns1",
        json!({"apiVersion":"projectcalico.org/v3","kind":"Profile",
               "metadata":{"name":"kns.ns1"},
               "spec":{"ingress":[{"action":"Allow"}],"egress":[{"action":"Allow"}]}}),
    );
    let (_state, state_dir) = support::state_dir();
    let agent = Agent::start(ns.name(), &etcd.client_url(), &state_dir);
    agent.wait_applied(rev);
    assert_eq!(endpoint_programming(&agent), (0, 0.0));

    let t = std::time::Instant::now();
    let rev = put_web_endpoint(&etcd, IFACE, &["kns.ns1"]);
    agent.wait_applied(rev);
    let bound = t.elapsed().as_secs_f64();
    let (count, sum) = endpoint_programming(&agent);
    assert_eq!(count, 1);
    assert!(
        sum > 0.0 && sum <= bound,
        "observed {sum} s, put to applied {bound} s"
    );
    assert!(
        save(&ns).contains(&format!(":cali-tw-{IFACE}")),
        "{}",
        save(&ns)
    );

    // A policy that selects no endpoint programs no endpoint.
    let rev = put_json(
        &etcd,
        "networkpolicies/ns1/none",
        json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
               "metadata":{"name":"none","namespace":"ns1"},
               "spec":{"tier":"default","order":1000,"selector":"app == 'nothing'",
                       "types":["Ingress"],"ingress":[{"action":"Allow"}]}}),
    );
    agent.wait_applied(rev);
    assert_eq!(endpoint_programming(&agent), (1, sum));
}
