//! FelixConfiguration from the datastore (issue 25), on the real kernel with a real etcd: the
//! node of [`faults_support::World`] (a server pod admitting only the client pod, an intruder
//! probing it) and the real `felixrs agent`, on nft and on legacy.
//!
//! 1. `default` says Drop, `node.node-1` says Return: the node's wins (`/status` and the
//!    kernel's `Configured DefaultEndpointToHostAction` rule); `bpfEnabled` is reported once.
//! 2. Live changes (`logSeverityScreen: Debug`, `iptablesRefreshInterval: 1s`): the same process
//!    (start time) logs at debug and refreshes the kernel every second.
//! 3. An invalid value (`Reject`): an error naming the resource and field, the last good value
//!    (Return) stays, no restart.
//! 4. A restart-needing change (node says Drop): the agent re-execs (same pid, a new start time),
//!    programs Drop, and the intruder's prober gets nothing delivered throughout.
//! 5. Restarted with `--default-endpoint-to-host-action accept` and `FELIX_INTERFACEPREFIX`,
//!    `FELIX_LOGSEVERITYSCREEN`: the flag beats both resources, the variables beat them too
//!    (`tap+` dispatched in the kernel).

mod faults_support;
mod support;

use std::time::{Duration, Instant};

use faults_support::{Prober, World};
use serde_json::json;
use support::{Agent, put_json};

const WAIT: Duration = Duration::from_secs(60);

fn put_config(w: &World, name: &str, spec: serde_json::Value) -> i64 {
    put_json(
        &w.etcd,
        &format!("felixconfigurations/{name}"),
        json!({"apiVersion":"projectcalico.org/v3","kind":"FelixConfiguration",
               "metadata":{"name":name},"spec":spec}),
    )
}

/// The kernel's `Configured DefaultEndpointToHostAction` rule's target (v4 and v6 must agree).
fn endpoint_to_host(w: &World, backend: &str) -> String {
    let mut targets = Vec::new();
    for tool in [
        format!("iptables-{backend}"),
        format!("ip6tables-{backend}"),
    ] {
        let tool = tool.as_str();
        let out = w
            .node()
            .ok(tool, &["-t", "filter", "-S", "cali-wl-to-host"]);
        let line = out
            .lines()
            .find(|l| l.contains("Configured DefaultEndpointToHostAction"))
            .unwrap_or_else(|| panic!("no endpoint-to-host rule ({tool}):\n{out}"))
            .to_string();
        targets.push(line.rsplit(' ').next().unwrap().to_string());
    }
    assert_eq!(targets[0], targets[1], "v4 and v6 differ");
    targets.remove(0)
}

fn fc(s: &serde_json::Value) -> &serde_json::Value {
    &s["felix_configuration"]
}

fn started(s: &serde_json::Value) -> u64 {
    s["started_at_unix_ms"].as_u64().unwrap_or(0)
}

/// Polls `/status` (through a re-exec, when nothing answers for a moment) until the agent is
/// programmed and `done` holds.
fn programmed(a: &Agent, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    let mut last = serde_json::Value::Null;
    while Instant::now() < deadline {
        if let Ok((200, body)) = a.get("/status") {
            last = serde_json::from_str(&body).expect("status json");
            if last["programmed"] == true && done(&last) {
                return last;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("not reached: {last}");
}

/// A sample of the agent's `/metrics` (0 when absent).
fn metric(agent: &Agent, name: &str) -> u64 {
    let (_, m) = agent.get("/metrics").expect("GET /metrics");
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Lines of the agent's log reporting `field` unsupported.
fn unsupported_reports(a: &Agent, field: &str) -> usize {
    a.log()
        .lines()
        .filter(|l| l.contains("not implemented by felixrs") && l.contains(field))
        .count()
}

/// The agent on `backend`, with `extra` flags and `env` (and the world's private xtables lock).
fn spawn(w: &World, backend: &str, extra: &[&str], env: &[(&str, &str)]) -> Agent {
    let lock = w.lock_file.to_string_lossy().into_owned();
    let mut args = vec!["--iptables-backend", backend];
    args.extend(extra);
    let mut env = env.to_vec();
    env.push(("XTABLES_LOCKFILE", &lock));
    Agent::spawn(
        w.node().name(),
        &w.etcd.client_url(),
        &w.work.path().join("state"),
        &args,
        &env,
    )
}

#[test]
fn felix_configuration_nft() {
    precedence_live_invalid_and_restart("nft");
}

#[test]
fn felix_configuration_legacy() {
    precedence_live_invalid_and_restart("legacy");
}

fn precedence_live_invalid_and_restart(backend: &str) {
    let w = World::new();
    put_config(
        &w,
        "default",
        json!({"defaultEndpointToHostAction":"Drop","bpfEnabled":false,
               "logSeverityScreen":"Info",
               "failsafeInboundHostPorts":[{"protocol":"TCP","port":22},
                                           {"protocol":"UDP","port":68}]}),
    );
    put_config(
        &w,
        "node.node-1",
        json!({"defaultEndpointToHostAction":"Return"}),
    );
    // Another node's resource is not ours.
    put_config(
        &w,
        "node.node-2",
        json!({"defaultEndpointToHostAction":"Accept"}),
    );

    // 1. Per-node over global.
    let mut a = spawn(&w, backend, &[], &[]);
    let s = programmed(&a, |s| {
        fc(s)["values"]["defaultEndpointToHostAction"] == "Return"
    });
    assert_eq!(
        fc(&s)["sources"]["defaultEndpointToHostAction"],
        "node",
        "{s}"
    );
    assert_eq!(fc(&s)["sources"]["logSeverityScreen"], "global", "{s}");
    assert_eq!(fc(&s)["sources"]["interfacePrefix"], "default", "{s}");
    assert_eq!(
        fc(&s)["values"]["failsafeInboundHostPorts"],
        "tcp:22,udp:68",
        "{s}"
    );
    assert_eq!(
        fc(&s)["sources"]["failsafeOutboundHostPorts"],
        "default",
        "{s}"
    );
    assert_eq!(fc(&s)["unsupported_fields"], json!(["bpfEnabled"]), "{s}");
    assert_eq!(
        fc(&s)["resources"],
        json!(["default", "node.node-1"]),
        "{s}"
    );
    assert_eq!(endpoint_to_host(&w, backend), "RETURN");
    w.await_client(WAIT);
    let t0 = started(&s);
    assert!(t0 > 0, "{s}");

    // 2. Live: the log level, without a restart.
    assert!(!a.log().contains("DEBUG"), "debug before the change");
    let applies = metric(&a, "felixrs_apply_seconds_count");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        metric(&a, "felixrs_apply_seconds_count"),
        applies,
        "a refresh within 2 s of the 90 s period"
    );
    put_config(
        &w,
        "default",
        json!({"defaultEndpointToHostAction":"Drop","bpfEnabled":false,
               "logSeverityScreen":"Debug","iptablesRefreshInterval":"1s",
               "failsafeInboundHostPorts":[{"protocol":"TCP","port":22},
                                           {"protocol":"UDP","port":68}]}),
    );
    programmed(&a, |s| {
        fc(s)["values"]["logSeverityScreen"] == "debug"
            && fc(s)["values"]["iptablesRefreshInterval"] == "1s"
    });
    let applies = metric(&a, "felixrs_apply_seconds_count");
    let deadline = Instant::now() + WAIT;
    while metric(&a, "felixrs_apply_seconds_count") < applies + 3 {
        assert!(Instant::now() < deadline, "no refreshes every second");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A change for the apply thread to log at debug.
    let rev = w.put_policy(
        "live",
        json!([{"action":"Allow","source":{"selector":"app == 'client'"}}]),
    );
    let s = a.wait_applied(rev);
    assert_eq!(started(&s), t0, "a live change restarted the agent: {s}");
    assert!(a.wait_exit(Duration::ZERO).is_none());
    let deadline = Instant::now() + WAIT;
    while !a.log().contains("DEBUG") {
        assert!(Instant::now() < deadline, "no debug line:\n{}", a.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        unsupported_reports(&a, "bpfEnabled"),
        1,
        "the unsupported field is reported once:\n{}",
        a.log()
    );

    // 3. Invalid: named, the last good value stays, no restart.
    let rev = put_config(
        &w,
        "node.node-1",
        json!({"defaultEndpointToHostAction":"Reject"}),
    );
    a.wait_applied(rev);
    let s = programmed(&a, |s| {
        fc(s)["errors"].as_array().is_some_and(|e| !e.is_empty())
    });
    let errors = fc(&s)["errors"].to_string();
    assert!(
        errors.contains(
            r#"felixconfigurations/node.node-1: defaultEndpointToHostAction: \"Reject\" is not one of Drop, Accept, Return"#
        ),
        "{s}"
    );
    assert_eq!(fc(&s)["values"]["defaultEndpointToHostAction"], "Return");
    assert_eq!(started(&s), t0, "{s}");
    assert_eq!(endpoint_to_host(&w, backend), "RETURN");
    assert!(
        a.log().contains("defaultEndpointToHostAction"),
        "not logged"
    );

    // 4. Restart-needing: re-exec, programmed again, nothing of the intruder's delivered.
    let probe = Prober::start(&w);
    std::thread::sleep(Duration::from_millis(500));
    let changed = Instant::now();
    put_config(
        &w,
        "node.node-1",
        json!({"defaultEndpointToHostAction":"Drop"}),
    );
    let s = programmed(&a, |s| {
        started(s) > t0 && fc(s)["values"]["defaultEndpointToHostAction"] == "Drop"
    });
    let restarted_in = changed.elapsed();
    assert!(
        a.wait_exit(Duration::ZERO).is_none(),
        "the process exited instead of re-exec'ing"
    );
    assert_eq!(fc(&s)["sources"]["defaultEndpointToHostAction"], "node");
    assert_eq!(fc(&s)["errors"], json!([]), "{s}");
    assert_eq!(endpoint_to_host(&w, backend), "DROP");
    w.await_client(WAIT);
    std::thread::sleep(Duration::from_millis(500));
    let probed = probe.stop();
    assert!(probed.attempts > 0);
    assert_eq!(probed.delivered, 0, "the intruder got through: {probed:?}");
    eprintln!(
        "{backend}: re-exec'd and programmed {restarted_in:?} after the change; intruder probes {probed:?}"
    );
    assert!(a.log().contains("re-exec"), "{}", a.log());
    drop(a);

    // 5. A flag and Felix's variables over both resources.
    let a = spawn(
        &w,
        backend,
        &["--default-endpoint-to-host-action", "accept"],
        &[
            ("FELIX_INTERFACEPREFIX", "cali,tap"),
            ("FELIX_LOGSEVERITYSCREEN", "Warning"),
        ],
    );
    let s = programmed(&a, |s| fc(s)["sources"]["interfacePrefix"] == "environment");
    assert_eq!(unsupported_reports(&a, "bpfEnabled"), 1, "{}", a.log());
    assert_eq!(
        fc(&s)["sources"]["defaultEndpointToHostAction"],
        "flag",
        "{s}"
    );
    assert_eq!(
        fc(&s)["values"]["defaultEndpointToHostAction"],
        "Accept",
        "{s}"
    );
    assert_eq!(fc(&s)["sources"]["logSeverityScreen"], "environment", "{s}");
    assert_eq!(fc(&s)["values"]["logSeverityScreen"], "warn", "{s}");
    assert_eq!(endpoint_to_host(&w, backend), "ACCEPT");
    let forward = w.node().ok(
        &format!("iptables-{backend}"),
        &["-t", "filter", "-S", "cali-FORWARD"],
    );
    assert!(forward.contains("-i tap+"), "{forward}");
    assert!(forward.contains("-i cali+"), "{forward}");
    w.await_client(WAIT);
}

/// With the DNS learner's queue open, a restart-needing change exits (status 1, naming the
/// fields) instead of re-exec'ing, and the kernel keeps its rules.
#[test]
fn a_restart_with_the_dns_queue_open_is_an_exit() {
    let w = World::new();
    let mut a = spawn(&w, "nft", &["--dns-trusted-servers", "10.96.0.10"], &[]);
    programmed(&a, |s| {
        fc(s)["values"]["dnsTrustedServers"] == "[10.96.0.10:53]"
    });
    assert_eq!(endpoint_to_host(&w, "nft"), "ACCEPT");
    put_config(
        &w,
        "node.node-1",
        json!({"defaultEndpointToHostAction":"Drop"}),
    );
    let status = a.wait_exit(WAIT).expect("the agent exits");
    assert_eq!(status.code(), Some(1), "{}", a.log());
    let log = a.log();
    assert!(
        log.contains("FelixConfiguration fields defaultEndpointToHostAction need a restart"),
        "{log}"
    );
    assert!(!log.contains("re-exec'ing for"), "{log}");
    // Nothing was flushed on the way out.
    assert_eq!(endpoint_to_host(&w, "nft"), "ACCEPT");
}
