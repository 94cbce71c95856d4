//! Admin policy on the kernel datapath: the real `policy-controller` converts AdminNetworkPolicy,
//! BaselineAdminNetworkPolicy and ClusterNetworkPolicy manifests into tiered GlobalNetworkPolicies in
//! etcd, the real agents program them, and every case of [`admin_cases`] is probed pod to pod (every
//! ordered pair, every probe of the step) on one two-node netns cluster, over IPv4, then over IPv6
//! ([`admin_cases::all_v6`], with IPv6 CIDR peers and neighbour discovery under policy). The same expectations are
//! checked against the independent evaluator and `felixrs trace` in `tests/admin_cases.rs`.
//!
//! Also checks that the kernel's filter table reads like Calico's: the tier chains and comments.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use felixrs::cmd::shared::dataplane_args::DataplaneArgs;
use felixrs::cmd::shared::node_view::{SourceArgs, render_node};
use felixrs::cmd::trace::{PacketArgs, Verdict, trace_packet};
use felixrs_e2e::admin_cases;
use felixrs_e2e::cases::{Step, T80, T81};
use felixrs_e2e::driver::binary;
use felixrs_e2e::env::Env;
use felixrs_e2e::report::Tally;
use felixrs_e2e::traffic::{Probe, Servers, probe_many};
use felixrs_e2e::world::Family;
use felixrs_test_support::require_root;

/// `nodes` peers select the addresses in the Node objects' status: x's pods may not reach node-2 on
/// port 80 (Deny), may reach every node on 81 (an earlier Allow), and y's pods are not subjects.
const ANP_X_EGRESS_NODES: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: nodes}
spec:
  priority: 5
  subject: {namespaces: {matchLabels: {ns: x}}}
  egress:
  - name: allow-every-node-81
    action: Allow
    to: [{nodes: {}}]
    ports: [{portNumber: {protocol: TCP, port: 81}}]
  - name: deny-node-2
    action: Deny
    to: [{nodes: {matchLabels: {kubernetes.io/hostname: node-2}}}]
"#;

/// Pods to node addresses under an egress `nodes` peer, probed in the kernel and traced.
fn nodes_peers(env: &mut Env) -> Result<Vec<String>> {
    let mut servers = Vec::new();
    let mut node_docs: Vec<&'static str> = Vec::new();
    for n in &env.cluster.nodes {
        // The servers bind `[::]` next to `0.0.0.0` (v6-only, as in the pod namespaces).
        n.ns.sysctl("net.ipv6.bindv6only", "1")?;
        servers.push(Servers::start(n.ns.name())?);
        let doc = format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {0}, labels: {{kubernetes.io/hostname: {0}}}}}\n\
             status: {{addresses: [{{type: InternalIP, address: {1}}}, {{type: InternalIP, address: \"{2}\"}}]}}\n",
            n.name, n.ip, n.ip6
        );
        node_docs.push(Box::leak(doc.into_boxed_str()));
    }
    let mut failures = Vec::new();
    for with_policy in [true, false] {
        let mut policies = node_docs.clone();
        if with_policy {
            policies.push(ANP_X_EGRESS_NODES);
        }
        env.apply_step(&Step::new(policies, vec![T80], |_| {}))?;
        let source = SourceArgs::manifests(vec![env.work.path().join("manifests")]);
        let mut cells: Vec<(String, usize, IpAddr, Probe, bool)> = Vec::new();
        for pod in ["x/a", "x/b", "y/a", "y/b"] {
            for (i, n) in env.cluster.nodes.iter().enumerate() {
                for (addr, probe) in [
                    (IpAddr::V4(n.ip), T80),
                    (IpAddr::V4(n.ip), T81),
                    (IpAddr::V6(n.ip6), T80),
                ] {
                    let denied =
                        with_policy && pod.starts_with("x/") && n.name == "node-2" && probe == T80;
                    cells.push((pod.to_string(), i, addr, probe, !denied));
                }
            }
        }
        let jobs: Vec<(String, IpAddr, Probe)> = cells
            .iter()
            .map(|(p, _, a, pr, _)| (env.cluster.pod(p).ns.name().to_string(), *a, *pr))
            .collect();
        let mut got = probe_many(&jobs, Duration::from_millis(1000))?;
        for _ in 0..2 {
            let bad: Vec<usize> = (0..jobs.len()).filter(|&i| got[i] != cells[i].4).collect();
            if bad.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
            let again: Vec<_> = bad.iter().map(|&i| jobs[i].clone()).collect();
            for (k, r) in probe_many(&again, Duration::from_millis(1000))?
                .into_iter()
                .enumerate()
            {
                got[bad[k]] = r;
            }
        }
        for (k, (pod, node, addr, probe, want)) in cells.iter().enumerate() {
            let state = if with_policy { "with" } else { "without" };
            if got[k] != *want {
                failures.push(format!(
                    "{state} the nodes policy, {pod} -> {addr} {probe}: connected {}, expected {want}",
                    got[k]
                ));
            }
            // The trace on the pod's node agrees (to its own node: the host path).
            let pod_node = env.cluster.pod(pod).node;
            let node_name = &env.cluster.nodes[pod_node].name;
            let view = render_node(&source, node_name, &DataplaneArgs::default())?;
            let packet = PacketArgs {
                from: pod.clone(),
                to: if pod_node == *node {
                    format!("host:{addr}")
                } else {
                    addr.to_string()
                },
                protocol: "tcp".into(),
                port: probe.port,
                source_port: 40000,
                icmp_type: None,
                icmp_code: 0,
                ipv6: addr.is_ipv6(),
            };
            let traced = trace_packet(&view, node_name, &packet)?.verdict;
            if (traced != Verdict::Drop) != got[k] {
                failures.push(format!(
                    "{state} the nodes policy, {pod} -> {addr} {probe}: the kernel says {} but trace says {traced:?}",
                    got[k]
                ));
            }
        }
    }
    drop(servers);
    Ok(failures)
}

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
    let chain_lines = |chain: &str| -> Vec<&str> {
        let prefix = format!("-A {chain} ");
        out.lines().filter(|l| l.starts_with(&prefix)).collect()
    };
    // With shared chains (the default) the endpoint's chain is one goto to its shared chain
    // (`cali-si-<hash>`), which holds the tiers; inlined, the endpoint's chain holds them.
    let own = format!("cali-tw-{iface}");
    let shared = chain_lines(&own).iter().find_map(|l| {
        l.split(" -g ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .map(str::to_string)
    });
    let chain = shared.unwrap_or(own);
    let lines: Vec<&str> = chain_lines(&chain);
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
            None => failures.push(format!("{chain} has no rule commented {w:?}")),
            Some(i) if at.last().is_some_and(|l| i < *l) => {
                failures.push(format!("{w:?} is out of order in {chain}"))
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
            failures.push(format!("a tier block of {chain} jumps to no policy chain"));
        }
    }
    if failures.is_empty() && lines.is_empty() {
        failures.push(format!("no {chain} chain"));
    }
    Ok(failures)
}

#[test]
fn admin_policy_conformance_on_the_kernel() {
    require_root();
    binary("felixrs");
    binary("policy-controller");
    let mut env = Env::start().expect("cluster, etcd and agents start");
    let mut tally = Tally::default();
    let mut report = |name: &str, result: Result<Vec<String>>| tally.record(name, result);
    for case in admin_cases::all() {
        let r = env.run_case(&case, Family::V4);
        report(case.name, r);
    }
    for case in admin_cases::all_v6() {
        let r = env.run_case(&case, Family::V6);
        report(&format!("ipv6: {}", case.name), r);
    }
    let r = nodes_peers(&mut env);
    report(
        "admin egress to nodes peers (Node status addresses), kernel and trace",
        r,
    );
    let r = kernel_reads_like_calico(&mut env);
    report("the kernel's tier chains read like Calico's", r);
    let Tally { passed, failed } = tally;
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        for a in &env.agents {
            println!("--- agent {} log tail ---\n{}", a.node_name, a.log_tail(40));
        }
    }
    assert_eq!(failed, 0, "{failed} admin end-to-end cases failed");
}
