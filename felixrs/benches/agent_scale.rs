//! The agent binary in a large cluster: memory and graph time (root, real etcd, real kernel).
//!
//! `cargo bench -p felixrs --bench agent_scale`
//!
//! etcd holds the graph bench's generated cluster (`calc-graph/tests/support/cluster.rs`, the
//! same generator): 100k workload endpoints over 1,000 nodes, 10k policies, 100 global network
//! sets; this node (`node-1`) has 250 of the endpoints. Measures the agent's RSS (VmRSS and
//! VmHWM from `/proc`) after the initial sync and after `AGENT_SCALE_STEADY_S` (default 60) s
//! steady, the initial sync's graph time (the agent's own info line "initial sync through the
//! calculation graph"), and a remote pod's label change: the graph time of its batch (the
//! agent's debug line "graph batch") and etcd put → `applied_revision` on `/status`.
//! The floor for memory is the graph bench's VmHWM for the same inputs
//! (`GRAPH_BENCH_SYNC_ONLY=1 cargo bench -p calc-graph --bench graph`), run alongside.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "node_load/mod.rs"]
mod node_load;

#[path = "../../calc-graph/tests/support/mod.rs"]
mod graph_support;

use std::time::{Duration, Instant};

use calc_graph::graph::Update;
use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;
use graph_support::cluster::{generate, pod_update};
use node_load::{put_all_batched, put_and_wait_applied};
use serde_json::json;
use support::{Agent, PREFIX};

/// The node `Agent::start` runs as.
const NODE: &str = "node-1";
/// A remote pod whose app label (a8 / a9) moves it in and out of a source set the node uses
/// (the graph bench's "remote pod, app label" scenario).
const REMOTE: usize = 450;
const CHANGES: usize = 200;

/// etcd key and JSON value of every resource of the generated cluster.
fn cluster_kvs() -> Vec<(String, String)> {
    let (ups, _) = generate(NODE);
    let mut kvs = vec![(
        format!("{PREFIX}tiers/default"),
        json!({"apiVersion":"projectcalico.org/v3","kind":"Tier","metadata":{"name":"default"},
               "spec":{"order":1000000}})
        .to_string(),
    )];
    kvs.extend(ups.into_iter().map(kv));
    kvs
}

fn kv(u: Update) -> (String, String) {
    match u {
        Update::Resource {
            key,
            value: Some(r),
        } => (key.etcd_key(), r.to_json()),
        other => panic!("the generator makes resources only: {other:?}"),
    }
}

/// `VmRSS` and `VmHWM` of `pid`, MiB.
fn rss(pid: u32) -> (f64, f64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |f: &str| {
        s.lines()
            .find(|l| l.starts_with(f))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{f} in /proc/{pid}/status"))
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The log lines carrying `message`, ANSI colours removed.
fn lines_with(log: &str, message: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(message))
        .map(|l| {
            let mut out = String::new();
            let mut esc = false;
            for ch in l.chars() {
                match (esc, ch) {
                    (false, '\u{1b}') => esc = true,
                    (true, 'm') => esc = false,
                    (true, _) => {}
                    (false, c) => out.push(c),
                }
            }
            out
        })
        .collect()
}

/// A numeric `name=value` field of a log line.
fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name}= in {line}"))
}

fn pct<T: Copy + PartialOrd>(v: &mut [T], p: f64) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let t = Instant::now();
    let kvs = cluster_kvs();
    let bytes: usize = kvs.iter().map(|(k, v)| k.len() + v.len()).sum();
    eprintln!(
        "generated {} keys ({:.0} MiB of keys and values) in {:.1?}",
        kvs.len(),
        bytes as f64 / (1024.0 * 1024.0),
        t.elapsed()
    );
    let n_keys = kvs.len();
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    let t = Instant::now();
    let rev = put_all_batched(ns.name(), &etcd.admin_url(), kvs);
    eprintln!("seeded in {:.1?}", t.elapsed());

    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    let t = Instant::now();
    let agent = Agent::start_with(
        ns.name(),
        &etcd.client_url(),
        &state_dir,
        &["--log", "info,felixrs::agent::state=debug"],
    );
    let pid = agent.pid().unwrap();
    // Not `wait_applied` (30 s): etcd's list alone takes seconds on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(300);
    let s = loop {
        let (_, body) = agent
            .get(&format!("/status?min_revision={rev}&timeout_ms=5000"))
            .expect("GET /status");
        let s: serde_json::Value = serde_json::from_str(&body).expect("status json");
        if s["applied_revision"].as_i64().unwrap_or(0) >= rev {
            break s;
        }
        assert!(Instant::now() < deadline, "never applied {rev}: {s}");
    };
    let initial = t.elapsed();
    let (rss_sync, hwm_sync) = rss(pid);
    let log = agent.log();
    let sync = lines_with(&log, "initial sync through the calculation graph");
    let sync = sync.first().expect("the agent's initial sync line");
    assert_eq!(s["in_sync"], true, "{s}");

    let steady = std::env::var("AGENT_SCALE_STEADY_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    std::thread::sleep(Duration::from_secs(steady));
    let (rss_steady, hwm_steady) = rss(pid);

    // The remote pod's label, flipped; each change waits for its revision in the kernel.
    let before = agent.log().len();
    let mut e2e = Vec::new();
    for c in 0..CHANGES {
        let kv = kv(pod_update(NODE, REMOTE, 8 + (c + 1) % 2, REMOTE % 97));
        e2e.push(put_and_wait_applied(ns.name(), &etcd.admin_url(), agent.health, kv).ms);
    }
    let log = agent.log();
    for l in lines_with(&log, "free memory returned") {
        println!(
            "agent: {}",
            l.split_once(": ").map_or(l.as_str(), |(_, m)| m)
        );
    }
    let batches = lines_with(&log[before..], "graph batch");
    let mut graph_us: Vec<u64> = batches
        .iter()
        .filter(|l| field(l, "keys") == 1)
        .map(|l| field(l, "total_us"))
        .collect();
    let mut update_us: Vec<u64> = batches
        .iter()
        .filter(|l| field(l, "keys") == 1)
        .map(|l| field(l, "update_us"))
        .collect();
    assert!(
        graph_us.len() >= CHANGES * 9 / 10,
        "a graph batch per change: {} of {CHANGES}",
        graph_us.len()
    );
    let (rss_end, hwm_end) = rss(pid);

    println!(
        "keys={n_keys} (100k endpoints, 1,000 nodes, 10k policies; 250 local) node={NODE} local_endpoints={} rules={}",
        s["local_endpoints"], s["rules"]
    );
    println!(
        "initial sync + program: {:.0} ms; graph: {} keys, update {:.0} ms (decode, validation, apply), flush {:.0} ms, total {:.0} ms",
        initial.as_secs_f64() * 1000.0,
        field(sync, "keys"),
        field(sync, "update_us") as f64 / 1000.0,
        field(sync, "flush_us") as f64 / 1000.0,
        field(sync, "total_us") as f64 / 1000.0
    );
    println!("memory after initial sync: VmRSS {rss_sync:.0} MiB, VmHWM {hwm_sync:.0} MiB");
    println!(
        "memory after {steady} s steady: VmRSS {rss_steady:.0} MiB, VmHWM {hwm_steady:.0} MiB"
    );
    println!(
        "memory after {CHANGES} remote label changes: VmRSS {rss_end:.0} MiB, VmHWM {hwm_end:.0} MiB"
    );
    println!(
        "remote pod label change, graph time per batch (decode + apply + flush): p50 {} us, p99 {} us (update alone p50 {} us); {} batches",
        pct(&mut graph_us, 0.5),
        pct(&mut graph_us, 0.99),
        pct(&mut update_us, 0.5),
        graph_us.len()
    );
    println!(
        "remote pod label change, etcd put -> applied: p50 {:.1} ms, p99 {:.1} ms",
        pct(&mut e2e, 0.5),
        pct(&mut e2e, 0.99)
    );
    println!(
        "targets: VmRSS <= 300 MiB: {}; initial sync graph <= 1 s: {}; remote label change graph p50 <= 20 us: {}",
        if rss_steady.max(rss_sync) <= 300.0 {
            "met"
        } else {
            "MISSED"
        },
        if field(sync, "total_us") <= 1_000_000 {
            "met"
        } else {
            "MISSED"
        },
        if pct(&mut graph_us, 0.5) <= 20 {
            "met"
        } else {
            "MISSED"
        },
    );
}
