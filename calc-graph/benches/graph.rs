//! Calculation-graph benchmark on a generated cluster (`tests/support/cluster.rs`, shared with
//! felixrs's `agent_scale` bench; fixed shapes, no randomness between runs): 100k workload endpoints over 1,000 nodes and 1,000 namespaces, 10k policies (9k
//! Kubernetes-converted NetworkPolicies with pod and namespace selectors and named ports, 1k
//! GlobalNetworkPolicies), 100 global network sets; this node has 250 local endpoints.
//!
//! Measures the initial sync (apply everything + InSync + flush), peak memory (VmHWM), and the
//! latency of one pod label change to flushed output, for a local and a remote pod; compares the
//! latter with a naive evaluate-every-selector baseline.
//!
//! Run: `cargo bench -p calc-graph --bench graph` (`GRAPH_BENCH_ITERS=n` changes the number of
//! label changes per scenario, default 2,000; more makes a profile of the changes clearer).

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use calc_graph::graph::{CalcGraph, Update};
use calc_graph::model::Kind;
use calc_graph::selector::{Selector, parse};
use support::cluster::*;
use support::naive::{NaiveItem, brute_force_members};
use support::*;

const NODE: &str = "node0";

fn status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Applies `iters` updates alternating between two versions of pod `pod` (`flip(k)` gives the
/// update of iteration `k`), timing apply + flush of each.
/// (description, pod, update of iteration k).
type Scenario = (&'static str, usize, Box<dyn Fn(usize) -> Update>);
/// (description, update of iteration k).
type Change = (&'static str, Box<dyn Fn(usize) -> Update>);

fn measure_changes(
    g: &mut CalcGraph,
    iters: usize,
    flip: impl Fn(usize) -> Update,
) -> (Duration, Duration, usize) {
    let updates: Vec<Update> = (0..iters).map(flip).collect();
    let mut times = Vec::with_capacity(iters);
    let mut outputs = 0;
    for u in updates {
        let t = Instant::now();
        g.apply(u);
        let out = g.flush();
        times.push(t.elapsed());
        outputs += out.len();
        black_box(out);
    }
    times.sort_unstable();
    (
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        outputs / iters,
    )
}

fn main() {
    println!(
        "felixrs calc-graph bench: {PODS} endpoints / {NODES} nodes / {NAMESPACES} namespaces, {} policies",
        NAMESPACES * NPS_PER_NS + GNPS
    );
    let rss_start = status("VmRSS:");
    let t = Instant::now();
    let (ups, selectors) = generate(NODE);
    let n_updates = ups.len();
    println!(
        "generated {n_updates} updates in {:.2?} (not timed below)",
        t.elapsed()
    );
    let rss_inputs = status("VmRSS:");

    // The model's validation is part of the graph's apply; time it alone to show its share.
    let t = Instant::now();
    for u in &ups {
        if let Update::Resource { value: Some(r), .. } = u {
            black_box(r.validate().is_ok());
        }
    }
    let validation = t.elapsed();

    let mut g = CalcGraph::new(NODE);
    let t = Instant::now();
    for u in ups {
        g.apply(u);
    }
    let applied = t.elapsed();
    g.apply(Update::InSync);
    let out = g.flush();
    let sync = t.elapsed();
    let s = g.stats();
    println!(
        "initial sync: {sync:.2?} (apply {applied:.2?} of which Resource::validate ~{validation:.2?}, flush {:.2?}), {} outputs",
        sync - applied,
        out.len()
    );
    println!(
        "state: {} local endpoints, {} active policies, {} active profiles, {} ip sets, {} members, unindexed selectors (policy, ipset) = {:?}",
        s.local_endpoints,
        s.active_policies,
        s.active_profiles,
        s.ip_sets,
        s.ip_set_members,
        s.unindexed_selectors
    );
    drop(out);
    let rss_graph = status("VmRSS:");
    let hwm = status("VmHWM:");
    println!(
        "memory: VmHWM {:.0} MiB (inputs included); graph RSS ~{:.0} MiB after inputs were consumed => ~{:.0} bytes per endpoint",
        hwm as f64 / 1024.0,
        rss_graph.saturating_sub(rss_start) as f64 / 1024.0,
        rss_graph.saturating_sub(rss_start) as f64 * 1024.0 / PODS as f64
    );
    let _ = rss_inputs;
    assert!(
        g.take_errors().is_empty(),
        "generated cluster must be valid"
    );
    if std::env::var_os("GRAPH_BENCH_SYNC_ONLY").is_some() {
        return;
    }

    let iters: usize = std::env::var("GRAPH_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let local = 407; // 407 % 400 == 7: on this node
    // A remote pod in the local pod's namespace; with app a8 it is in the source set of the
    // active NetworkPolicy knp.default.np3 of ns4, with a9 it is not.
    let remote = 450;
    let scenarios: [Scenario; 3] = [
        (
            "local pod, label no policy selects (pod-template-hash)",
            local,
            Box::new(move |k| pod_update(NODE, local, local % 20, 1000 + k % 2)),
        ),
        (
            "local pod, app label (changes which policies apply)",
            local,
            Box::new(move |k| pod_update(NODE, local, (local + 1 - k % 2) % 20, local % 97)),
        ),
        (
            "remote pod, app label (changes IP set membership)",
            remote,
            Box::new(move |k| pod_update(NODE, remote, 8 + k % 2, remote % 97)),
        ),
    ];
    let mut medians = Vec::new();
    for (what, _, flip) in &scenarios {
        let evals0 = g.stats().selector_evaluations;
        let (med, p99, outs) = measure_changes(&mut g, iters, flip);
        let evals = (g.stats().selector_evaluations - evals0) / iters as u64;
        println!(
            "label change -> flushed output, {what}: median {med:.2?}, p99 {p99:.2?}, {outs} outputs/change, {evals} selector evaluations/change"
        );
        medians.push(med);
    }
    let rmed = medians[2];
    let med = medians.iter().copied().max().unwrap_or_default();

    // Other incremental changes, alternating between two states (no target; for scale).
    // Pod 407 ends the flips above with app a7, so ns4's np3 is active and its rule needs the
    // set of ns4's a8 pods.
    let pod_in_ns4 =
        |name: &'static str, node: &'static str, ip: &'static str, app: &'static str| {
            move |k: usize| {
                if k.is_multiple_of(2) {
                    upd(mk_wep_res(
                        "ns4",
                        name,
                        node,
                        &[ip],
                        &[("app", app), ("tier", "db")],
                    ))
                } else {
                    del(Kind::WorkloadEndpoint, Some("ns4"), name)
                }
            }
        };
    let others: [Change; 3] = [
        (
            "new local pod created / deleted (gains ns4's policies and profiles)",
            Box::new(pod_in_ns4("podnew-local", NODE, "10.200.0.1/32", "a7")),
        ),
        (
            "new remote pod created / deleted (joins the source set of ns4's np3)",
            Box::new(pod_in_ns4("podnew-remote", "node1", "10.200.0.2/32", "a8")),
        ),
        (
            "active policy deleted / re-created (ns0 np7, selects local pod 7)",
            Box::new(|k: usize| {
                if k.is_multiple_of(2) {
                    del(Kind::NetworkPolicy, Some("ns0"), "knp.default.np7")
                } else {
                    network_policy(0, 7).0
                }
            }),
        ),
    ];
    for (what, change) in &others {
        let evals0 = g.stats().selector_evaluations;
        let (med, p99, outs) = measure_changes(&mut g, iters, change);
        let evals = (g.stats().selector_evaluations - evals0) / iters as u64;
        println!(
            "change -> flushed output, {what}: median {med:.2?}, p99 {p99:.2?}, {outs} outputs/change, {evals} selector evaluations/change"
        );
    }
    assert!(
        g.take_errors().is_empty(),
        "the changes must be valid resources"
    );
    // Naive baselines.
    let parsed: Vec<Selector> = selectors.iter().map(|s| parse(s).unwrap()).collect();
    let mut items: Vec<NaiveItem> = Vec::with_capacity(PODS);
    for i in 0..PODS {
        let n = i / PODS_PER_NS;
        let mut l: std::collections::BTreeMap<String, String> =
            pod_labels(i, i % 20, i % 97).into_iter().collect();
        l.insert("projectcalico.org/namespace".into(), format!("ns{n}"));
        l.insert("projectcalico.org/orchestrator".into(), "k8s".into());
        l.insert("projectcalico.org/serviceaccount".into(), "default".into());
        l.insert("pcns.team".into(), format!("t{}", n % 10));
        l.insert(
            "pcns.env".into(),
            (if n.is_multiple_of(2) { "prod" } else { "dev" }).into(),
        );
        l.insert("pcns.projectcalico.org/name".into(), format!("ns{n}"));
        items.push(NaiveItem {
            labels: l,
            nets: vec![net(&format!(
                "10.{}.{}.{}/32",
                i >> 16,
                (i >> 8) & 255,
                i & 255
            ))],
            ports: Vec::new(),
        });
    }
    // (a) Per change, evaluate every policy and rule selector against the changed pod.
    let changed = &items[remote].labels;
    let reps = 20;
    let t = Instant::now();
    let mut hits = 0;
    for _ in 0..reps {
        hits += parsed.iter().filter(|s| s.matches(changed)).count();
    }
    let scan = t.elapsed() / reps;
    black_box(hits);
    println!(
        "baseline (a) scan all {} selectors for one changed pod: {scan:.2?} => naive/indexed {:.0}x",
        parsed.len(),
        scan.as_secs_f64() / rmed.as_secs_f64()
    );
    // (b) Recompute memberships from scratch: every active set's selector against every pod;
    // measured on a sample of selectors and scaled to the number of active sets.
    let sample = 20;
    let t = Instant::now();
    let mut total = 0;
    for s in parsed.iter().step_by(parsed.len() / sample).take(sample) {
        total += brute_force_members(s, &items).len();
    }
    let per_sel = t.elapsed() / sample as u32;
    black_box(total);
    let full = per_sel * s.ip_sets as u32;
    println!(
        "baseline (b) from-scratch membership: {per_sel:.2?} per selector x {} active sets = ~{full:.2?} per change => naive/indexed {:.0}x",
        s.ip_sets,
        full.as_secs_f64() / rmed.as_secs_f64()
    );
    println!(
        "targets: initial sync <= 2 s: {}; VmHWM <= 1 GiB: {}; label change median (every scenario) <= 50 us: {}",
        if sync <= Duration::from_secs(2) {
            "met"
        } else {
            "MISSED"
        },
        if hwm <= 1024 * 1024 { "met" } else { "MISSED" },
        if med <= Duration::from_micros(50) {
            "met"
        } else {
            "MISSED"
        },
    );
}
