//! The acceptance test: the real `policy-controller` and `felixrs agent` binaries, a real etcd, and the
//! real kernel datapath of a two-node cluster built from network namespaces.
//!
//! Phases, on one cluster of dual-stack pods: the upstream NetworkPolicy cases (every ordered pod pair
//! probed per step) over IPv4, a subset plus IPv6 ipBlock cases over IPv6 (`cases_v6`), then the
//! reliability scenarios (restart under probe, restart with etcd down, drift repair, a new pod).
//! Prints a PASS/FAIL line per case, `N passed, M failed`, and the programming latency.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use felixrs_e2e::cases::{self, Expect, Step, T80};
use felixrs_e2e::cases_v6;
use felixrs_e2e::driver::{binary, controller_sync_report};
use felixrs_e2e::env::Env;
use felixrs_e2e::report::Tally;
use felixrs_e2e::ship;
use felixrs_e2e::spoof::{allowed_source_prefixes, protect_step, spoofed_source_is_dropped};
use felixrs_e2e::traffic::{Servers, probe_many, probe_while};
use felixrs_e2e::world::{self, Family, PlacedPod};
use felixrs_test_support::require_root;

const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
const APPLY_TIMEOUT: Duration = Duration::from_secs(30);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn node_of(env: &Env, pod: &str) -> usize {
    env.cluster.pod(pod).node
}

/// Kill -9 and restart the agent that enforces x/b's ingress 20 times while x/a probes x/b continuously.
fn restart_under_probe(env: &mut Env) -> Result<Vec<String>> {
    replace_agent_under_probe(env, 20, "agent restarts", |env, node, _| {
        env.agents[node].kill();
        // The agent is dead: the kernel's rules alone must keep enforcing.
        std::thread::sleep(Duration::from_millis(100));
        let ns = &env.cluster.nodes[node].ns;
        env.agents[node].restart(ns)
    })
}

/// Upgrades the agent that enforces x/b's ingress 3 times, as a DaemonSet rolling update does
/// (SIGTERM, then the new binary starts), while x/a probes x/b continuously: agent B is a different
/// binary file, once on the old state dir and twice on a fresh one (no snapshot: it must wait for
/// etcd while agent A's chains keep enforcing). B must adopt A's chains: the same rule ids, none
/// rewritten (every rule's packet counter only grows).
fn upgrade_under_probe(env: &mut Env) -> Result<Vec<String>> {
    env.apply_step(&protect_step())?;
    let node = node_of(env, "x/b");
    let before = ship::rule_counters(&env.cluster.nodes[node].ns)?;
    let next = ship::next_binary(env.work.path(), env.agents[node].program())?;
    let work = env.work.path().to_path_buf();
    let old_state = env.agents[node].state_dir.clone();
    let mut failures = replace_agent_under_probe(env, 3, "agent upgrades", |env, node, i| {
        let state = match i {
            0 => old_state.clone(),
            _ => work.join(format!("state-upgrade-{i}")),
        };
        let ns = &env.cluster.nodes[node].ns;
        env.agents[node].upgrade(ns, &next, &state)
    })?;
    let after = ship::rule_counters(&env.cluster.nodes[node].ns)?;
    failures.extend(ship::adopted(&before, &after));
    Ok(failures)
}

/// Replaces the agent that enforces x/b's ingress `rounds` times with `replace` (then waits for the
/// new one to be in sync) while x/a probes x/b continuously; no connection may succeed.
fn replace_agent_under_probe(
    env: &mut Env,
    rounds: usize,
    what: &str,
    mut replace: impl FnMut(&mut Env, usize, usize) -> Result<()>,
) -> Result<Vec<String>> {
    env.apply_step(&protect_step())?;
    let from = env.cluster.pod("x/a").ns.name().to_string();
    let to = env.cluster.pod("x/b").ip.into();
    let node = node_of(env, "x/b");
    let (result, attempts, successes) = probe_while(&from, to, || {
        for i in 0..rounds {
            replace(env, node, i)?;
            (env.agents[node].wait_applied(0, APPLY_TIMEOUT))
                .with_context(|| format!("{what}: round {}", i + 1))?;
            std::thread::sleep(Duration::from_millis(200));
        }
        anyhow::Ok(())
    })?;
    result?;
    println!("{what} under probe: {attempts} denied-connection attempts, {successes} succeeded");
    let mut failures = Vec::new();
    if successes > 0 {
        failures.push(format!(
            "{successes} of {attempts} connections x/a -> x/b succeeded across {rounds} {what}"
        ));
    }
    if attempts < 3 * rounds as u32 {
        failures.push(format!("only {attempts} probe attempts were made"));
    }
    failures.extend(env.check(&expect_of(env, &protect_step()))?);
    Ok(failures)
}

/// Hostile manifests through controller → etcd → agent → kernel (see `ship::hostile_step`): the
/// policy at the size limits is enforced, each invalid object is reported by kind, namespace and
/// name and stored nowhere, no hostile string reaches any kernel table, and on x/b's node the
/// kernel holds exactly the rules the agent's snapshot renders (`felixrs trace --check-kernel`).
fn hostile_manifests(env: &mut Env) -> Result<Vec<String>> {
    let step = ship::hostile_step();
    let dir = env.work.path().join("manifests");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("cluster.yaml"),
        world::manifests(&step, &env.placed()),
    )?;
    let report = controller_sync_report(&env.cluster.infra, &env.etcd.client_url(), &dir)?;
    let rev = report["revision"].as_i64().context("revision")?;
    for a in &mut env.agents {
        a.wait_applied(rev, APPLY_TIMEOUT)?;
    }
    let mut failures = Vec::new();
    let skips = report["skips"].as_array().cloned().unwrap_or_default();
    for (ns, name) in ship::hostile_rejects() {
        let named = skips.iter().any(|s| {
            s["kind"] == "NetworkPolicy"
                && s["namespace"] == ns.as_str()
                && s["name"] == name.as_str()
        });
        if !named {
            failures.push(format!(
                "the controller did not report NetworkPolicy {ns:?}/{name:?}: {skips:?}"
            ));
        }
    }
    for s in &skips {
        if s["name"].as_str().is_some_and(|n| n.len() == 253) {
            failures.push(format!(
                "the valid policy at the size limits was skipped: {s}"
            ));
        }
    }
    failures.extend(env.check(&expect_of(env, &step))?);
    for node in &env.cluster.nodes {
        for program in [
            "iptables-legacy-save",
            "iptables-nft-save",
            "ip6tables-legacy-save",
            "ip6tables-nft-save",
        ] {
            let out = node.ns.exec_unchecked(&[program])?;
            let text = String::from_utf8_lossy(&out.stdout);
            for bad in ship::NEVER_IN_KERNEL {
                if text.contains(bad) {
                    failures.push(format!("{program} on {} carries {bad:?}", node.name));
                }
            }
        }
        let sets = node.ns.exec_unchecked(&["ipset", "save"])?;
        let text = String::from_utf8_lossy(&sets.stdout);
        for bad in ship::NEVER_IN_KERNEL {
            if text.contains(bad) {
                failures.push(format!("ipset save on {} carries {bad:?}", node.name));
            }
        }
    }
    let node = node_of(env, "x/b");
    let felixrs = binary("felixrs");
    let state = env.agents[node].state_dir.clone();
    for (from, verdict) in [("x/c", "verdict: ACCEPT"), ("x/a", "verdict: DROP")] {
        let out = env.cluster.nodes[node].ns.exec_unchecked(&[
            felixrs.to_str().context("utf-8 path")?,
            "trace",
            "--state-dir",
            state.to_str().context("utf-8 path")?,
            "--node-name",
            &env.cluster.nodes[node].name,
            "--workload-source-spoofing",
            "Any",
            "--from",
            from,
            "--to",
            "x/b",
            "--protocol",
            "tcp",
            "--port",
            "80",
            "--check-kernel",
        ])?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            failures.push(format!(
                "trace --check-kernel {from} -> x/b: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        } else if !stdout.contains(verdict) {
            failures.push(format!(
                "trace {from} -> x/b does not say {verdict}:\n{stdout}"
            ));
        }
    }
    Ok(failures)
}

fn expect_of(env: &Env, step: &Step) -> Expect {
    let ids: Vec<String> = env.placed().iter().map(PlacedPod::id).collect();
    let mut e = Expect::all_allowed(&ids, &step.probes);
    (step.expect)(&mut e);
    e
}

/// etcd down, agent restarted: policy is enforced from the snapshot; etcd back: a change applies.
fn restart_with_etcd_down(env: &mut Env) -> Result<Vec<String>> {
    env.apply_step(&protect_step())?;
    env.etcd.stop();
    let node = node_of(env, "x/b");
    env.agents[node].kill();
    let ns = &env.cluster.nodes[node].ns;
    env.agents[node].restart(ns)?;
    let mut failures = Vec::new();
    let snap = felixrs_e2e::driver::wait_for(APPLY_TIMEOUT, || {
        env.agents[node]
            .status()
            .filter(|s| s["source"] == "snapshot" && s["in_sync"] == true)
    });
    if snap.is_none() {
        failures.push(format!(
            "agent did not report source=snapshot with etcd down (status {:?})",
            env.agents[node].status()
        ));
    }
    failures.extend(env.check(&expect_of(env, &protect_step()))?);
    env.etcd.restart();
    let open = Step::new(vec![], vec![T80], |_| {});
    env.apply_step(&open)?;
    failures.extend(env.check(&expect_of(env, &open))?);
    Ok(failures)
}

/// Flush x/b's `cali-tw-` chain and delete the FORWARD hook by hand; the agent repairs both.
fn drift_repair(env: &mut Env) -> Result<Vec<String>> {
    env.apply_step(&protect_step())?;
    let node = node_of(env, "x/b");
    let ns = &env.cluster.nodes[node].ns;
    let iface = env.cluster.pod("x/b").iface.clone();
    let chain = format!("cali-tw-{iface}");
    // Whichever backend the agent chose holds our chains.
    let iptables = ["iptables-nft", "iptables-legacy"]
        .into_iter()
        .find(|b| {
            ns.exec_unchecked(&[b, "-w", "-S", &chain])
                .map(|o| o.status.success())
                .unwrap_or(false)
        })
        .context("no backend holds the endpoint chain")?;
    ns.exec(&[iptables, "-w", "-F", &chain])?;
    let hook = ns.exec(&[iptables, "-w", "-S", "FORWARD"])?;
    let hook = String::from_utf8_lossy(&hook.stdout)
        .lines()
        .find(|l| l.contains("cali-FORWARD"))
        .context("FORWARD has a cali-FORWARD hook")?
        .replacen("-A FORWARD", "", 1);
    let mut del = vec![iptables, "-w", "-D", "FORWARD"];
    let parts = shell_words(&hook);
    del.extend(parts.iter().map(String::as_str));
    ns.exec(&del)?;
    let repaired = felixrs_e2e::driver::wait_for(Duration::from_secs(15), || {
        let rules = ns.exec(&[iptables, "-w", "-S", &chain]).ok()?;
        let fwd = ns.exec(&[iptables, "-w", "-S", "FORWARD"]).ok()?;
        let chain_ok = String::from_utf8_lossy(&rules.stdout).lines().count() > 1;
        let hook_ok = String::from_utf8_lossy(&fwd.stdout).contains("cali-FORWARD");
        (chain_ok && hook_ok).then_some(())
    });
    let mut failures = Vec::new();
    if repaired.is_none() {
        failures.push("the flushed chain and deleted hook were not repaired within 15 s".into());
    }
    failures.extend(env.check(&expect_of(env, &protect_step()))?);
    Ok(failures)
}

/// Splits an `iptables -S` rule into arguments, honouring double quotes.
fn shell_words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' if quoted => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            ' ' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A pod whose interface appears after the agent runs has no connectivity, over IPv4 or IPv6, until its
/// endpoint is programmed.
fn new_pod_fail_closed(env: &mut Env) -> Result<Vec<String>> {
    let open = Step::new(vec![], vec![T80], |_| {});
    env.apply_step(&open)?;
    let idx = env.cluster.add_pod("x", "d", 0)?;
    let pod = &env.cluster.pods[idx];
    let servers = Servers::start(pod.ns.name())?;
    let a = env.cluster.pod("x/a");
    let (a_ns, d_ns) = (a.ns.name().to_string(), pod.ns.name().to_string());
    let jobs = vec![
        (a_ns.clone(), IpAddr::V4(pod.ip), T80),
        (d_ns.clone(), IpAddr::V4(a.ip), T80),
        (a_ns, IpAddr::V6(pod.ip6), T80),
        (d_ns, IpAddr::V6(a.ip6), T80),
    ];
    let label = |results: &[bool]| -> String {
        ["x/a->x/d v4", "x/d->x/a v4", "x/a->x/d v6", "x/d->x/a v6"]
            .iter()
            .zip(results)
            .map(|(l, ok)| format!("{l} {ok}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut failures = Vec::new();
    let before = probe_many(&jobs, PROBE_TIMEOUT)?;
    if before.iter().any(|ok| *ok) {
        failures.push(format!(
            "new pod x/d had connectivity before its endpoint existed ({})",
            label(&before)
        ));
    }
    env.apply_step(&open)?;
    let after = probe_many(&jobs, PROBE_TIMEOUT)?;
    if !after.iter().all(|ok| *ok) {
        failures.push(format!(
            "new pod x/d still isolated after its endpoint was programmed ({})",
            label(&after)
        ));
    }
    drop(servers);
    Ok(failures)
}

const DENY_EGRESS_XA: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress-a, namespace: x}
spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress]}
"#;

/// Traffic from a pod to its own node goes through the pod's egress policy and then the agent's
/// DefaultEndpointToHostAction (Accept), and `felixrs trace --to host:ADDR` says what the kernel
/// does: x/a's connection to a server on node-1's own address is dropped while an egress
/// policy isolates x/a, and accepted without it.
fn pod_to_its_node_matches_trace(env: &mut Env) -> Result<Vec<String>> {
    use felixrs::cmd::shared::dataplane_args::{DataplaneArgs, WorkloadSourceSpoofing};
    use felixrs::cmd::shared::node_view::{SourceArgs, render_node};
    use felixrs::cmd::trace::{PacketArgs, Verdict, trace_packet};
    let a = env.cluster.pod("x/a");
    let node = &env.cluster.nodes[a.node];
    let (a_ns, node_ip, node_name) = (a.ns.name().to_string(), node.ip, node.name.clone());
    // The servers bind `[::]` next to `0.0.0.0` (v6-only, as in the pod namespaces).
    node.ns.sysctl("net.ipv6.bindv6only", "1")?;
    let servers = Servers::start(node.ns.name())?;
    let mut failures = Vec::new();
    for (policies, want) in [(vec![DENY_EGRESS_XA], false), (vec![], true)] {
        let step = Step::new(policies, vec![T80], |_| {});
        env.apply_step(&step)?;
        let got = probe_many(&[(a_ns.clone(), IpAddr::V4(node_ip), T80)], PROBE_TIMEOUT)?[0];
        // The same manifests, traced as the agents run them.
        let source = SourceArgs::manifests(vec![env.work.path().join("manifests")]);
        let dataplane = DataplaneArgs {
            workload_source_spoofing: WorkloadSourceSpoofing::Any,
            ..DataplaneArgs::default()
        };
        let view = render_node(&source, &node_name, &dataplane)?;
        let packet = PacketArgs {
            from: "x/a".into(),
            to: format!("host:{node_ip}"),
            protocol: "tcp".into(),
            port: 80,
            source_port: 40000,
            icmp_type: None,
            icmp_code: 0,
            ipv6: false,
        };
        let traced = trace_packet(&view, &node_name, &packet)?.verdict;
        let state = if want { "without" } else { "with" };
        if got != want {
            failures.push(format!(
                "{state} the egress policy, x/a -> its node {node_ip}:80 connected: {got}, expected {want}"
            ));
        }
        if (traced == Verdict::Accept) != got {
            failures.push(format!(
                "{state} the egress policy, the kernel says connected={got} but trace says {traced:?}"
            ));
        }
    }
    drop(servers);
    Ok(failures)
}

/// Issue 18: a typo'd Allow rule from manifests leaves x/b isolated and is reported by its agent;
/// spelt right, it lets x/a in (see `felixrs_e2e::strict`).
fn typo_allow_rule_fails_safe(env: &mut Env) -> Result<Vec<String>> {
    use felixrs_e2e::driver::{HEALTH_ADDR, http_get};
    use felixrs_e2e::strict;
    let node = node_of(env, "x/b");
    let mut failures = Vec::new();
    for (step, reported) in [
        (
            strict::typo_step(),
            strict::typo_reported as fn(&_, &str, &str) -> Vec<String>,
        ),
        (strict::fixed_step(), strict::fixed_reported),
    ] {
        env.apply_step(&step)?;
        failures.extend(env.check(&expect_of(env, &step))?);
        let agent = &env.agents[node];
        let status = agent.status().context("agent /status")?;
        let (_, metrics) = http_get(&agent.netns, HEALTH_ADDR, "/metrics")?;
        failures.extend(reported(&status, &metrics, &agent.log_tail(5000)));
    }
    Ok(failures)
}

#[test]
fn netpol_conformance_and_reliability() {
    require_root();
    binary("felixrs");
    binary("policy-controller");
    let mut env = Env::start().expect("cluster, etcd and agents start");
    let mut tally = Tally::default();
    let mut report = |name: &str, result: Result<Vec<String>>| tally.record(name, result);
    for case in cases::all() {
        let r = env.run_case(&case, Family::V4);
        report(case.name, r);
    }
    for case in cases_v6::all() {
        let r = env.run_case(&case, Family::V6);
        report(&format!("ipv6: {}", case.name), r);
    }
    // Before the reliability scenarios: x/d (added by one of them) has no server afterwards.
    let r = typo_allow_rule_fails_safe(&mut env);
    report(
        "strict: a typo'd Allow rule leaves the pod isolated and is reported",
        r,
    );
    let r = restart_under_probe(&mut env);
    report("reliability: 20 agent restarts under probe", r);
    let r = upgrade_under_probe(&mut env);
    report(
        "upgrade: a new agent binary adopts the old agent's chains, no window",
        r,
    );
    let r = restart_with_etcd_down(&mut env);
    report("reliability: agent restart with etcd down", r);
    let r = hostile_manifests(&mut env);
    report(
        "hostile manifests: size limits, unicode, quotes, newlines, option-like and injecting strings",
        r,
    );
    let r = drift_repair(&mut env);
    report("reliability: drift repair", r);
    let r = new_pod_fail_closed(&mut env);
    report("reliability: new pod is fail-closed", r);
    let r = spoofed_source_is_dropped(&mut env);
    report(
        "reliability: a pod claiming another pod's address is dropped",
        r,
    );
    let r = allowed_source_prefixes(&mut env);
    report(
        "reliability: a pod may send from its allowedSourcePrefixes and nothing else",
        r,
    );
    let r = pod_to_its_node_matches_trace(&mut env);
    report(
        "pod to its own node: egress policy, then DefaultEndpointToHostAction (kernel and trace)",
        r,
    );

    let mut lat = env.latencies.clone();
    lat.sort();
    println!(
        "programming latency over {} steps: p50 {:?}, p99 {:?}",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
    let Tally { passed, failed } = tally;
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        for a in &env.agents {
            println!("--- agent {} log tail ---\n{}", a.node_name, a.log_tail(40));
        }
    }
    assert_eq!(failed, 0, "{failed} end-to-end cases failed");
}
