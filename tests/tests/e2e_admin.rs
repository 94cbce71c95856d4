//! Admin policy on the kernel datapath: the real `policy-controller` converts AdminNetworkPolicy,
//! BaselineAdminNetworkPolicy and ClusterNetworkPolicy manifests into tiered GlobalNetworkPolicies in
//! etcd, the real agents program them, and every case of [`admin_cases`] is probed pod to pod (every
//! ordered pair, every probe of the step) on one two-node netns cluster, over IPv4, then over IPv6
//! ([`admin_cases::all_v6`], with IPv6 CIDR peers and neighbour discovery under policy). The same expectations are
//! checked against the independent evaluator and `felixrs trace` in `tests/admin_cases.rs`.
//!
//! Also checks that the kernel's filter table reads like Calico's: the tier chains and comments.

use anyhow::{Context, Result};
use felixrs_e2e::admin_cases;
use felixrs_e2e::driver::binary;
use felixrs_e2e::env::Env;
use felixrs_e2e::world::Family;
use felixrs_test_support::require_root;

/// After a step with an admin, a NetworkPolicy and a baseline policy on x/a, node-1's filter table
/// holds the three tiers in Calico's order with Calico's comments and the admin policy chains.
fn kernel_reads_like_calico(env: &mut Env) -> Result<Vec<String>> {
    let case = admin_cases::all()
        .into_iter()
        .find(|c| c.name.starts_with("admin, NetworkPolicy, baseline"))
        .context("the integration case")?;
    env.apply_step(&case.steps[0])?;
    let node = &env.cluster.nodes[0];
    let out = node.ns.exec(&["iptables-save", "-t", "filter"])?;
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let iface = env.cluster.pod("x/a").iface.clone();
    let tw = format!("-A cali-tw-{iface} ");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with(&tw)).collect();
    let find = |needle: &str| lines.iter().position(|l| l.contains(needle));
    let mut failures = Vec::new();
    let wanted = [
        "Start of tier kube-admin",
        "Start of tier default",
        "End of tier default. Drop if no policies passed packet",
        "Start of tier kube-baseline",
    ];
    let mut at = Vec::new();
    for w in wanted {
        match find(w) {
            None => failures.push(format!("cali-tw-{iface} has no rule commented {w:?}")),
            Some(i) if at.last().is_some_and(|l| i < *l) => {
                failures.push(format!("{w:?} is out of order in cali-tw-{iface}"))
            }
            Some(i) => at.push(i),
        }
    }
    for tier in ["kube-admin", "kube-baseline"] {
        if find(&format!("End of tier {tier}")).is_some() {
            failures.push(format!("tier {tier} defaults to Pass but ends with a drop"));
        }
    }
    // Each tier block jumps to its policy's chain.
    if let [admin, default, _, baseline] = at[..] {
        let jumps = |a: usize, b: usize| lines[a..b].iter().any(|l| l.contains("-j cali-pi-"));
        if !jumps(admin, default) || !jumps(default, baseline) || !jumps(baseline, lines.len()) {
            failures.push(format!(
                "a tier block of cali-tw-{iface} jumps to no policy chain"
            ));
        }
    }
    if failures.is_empty() && lines.is_empty() {
        failures.push(format!("no cali-tw-{iface} chain"));
    }
    Ok(failures)
}

#[test]
fn admin_policy_conformance_on_the_kernel() {
    require_root();
    binary("felixrs");
    binary("policy-controller");
    let mut env = Env::start().expect("cluster, etcd and agents start");
    let mut passed = 0;
    let mut failed = 0;
    let mut report = |name: &str, result: Result<Vec<String>>| match result {
        Ok(f) if f.is_empty() => {
            passed += 1;
            println!("PASS {name}");
        }
        Ok(f) => {
            failed += 1;
            println!("FAIL {name}");
            for line in f {
                println!("    {line}");
            }
        }
        Err(e) => {
            failed += 1;
            println!("FAIL {name}: {e:#}");
        }
    };
    for case in admin_cases::all() {
        let r = env.run_case(&case, Family::V4);
        report(case.name, r);
    }
    for case in admin_cases::all_v6() {
        let r = env.run_case(&case, Family::V6);
        report(&format!("ipv6: {}", case.name), r);
    }
    let r = kernel_reads_like_calico(&mut env);
    report("the kernel's tier chains read like Calico's", r);
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        for a in &env.agents {
            println!("--- agent {} log tail ---\n{}", a.node_name, a.log_tail(40));
        }
    }
    assert_eq!(failed, 0, "{failed} admin end-to-end cases failed");
}
