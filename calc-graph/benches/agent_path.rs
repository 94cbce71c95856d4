//! The agent's per-key graph path from etcd bytes, without the agent: for each key,
//! `Validated::from_etcd(key, value)` (decode, unknown-field check, key check, validation) then
//! `CalcGraph::apply` and the failed-safe/error look-ups the agent's pipeline makes
//! (`felixrs/src/agent/pipeline.rs`), and `flush` — what the agent logs as `update_us` +
//! `flush_us`. Inputs: the generated cluster of the graph bench and `agent_scale`
//! (`tests/support/cluster.rs`), encoded as `agent_scale` writes it to etcd (canonical JSON under
//! the etcd key, the `default` tier added), in etcd's key order.
//!
//! Measures (a) the initial sync (every key, `InSync`, one flush), split into decode + validation
//! alone and the whole path, and (b) one remote pod's app-label flip (pod 450: a8 / a9 moves it in
//! and out of a source set this node uses), bytes to flushed output, per change; the same change
//! given to the graph already decoded (`Update::Valid`) is the floor the decode adds to. Then the
//! same change with the caches emptied before it (as the agent's other work between changes
//! leaves them), split into decode and apply, and once more with only the code warmed (a small
//! graph takes the same change first): code misses against data misses.
//!
//! Run: `cargo bench -p calc-graph --bench agent_path` (`AGENT_PATH_ITERS=n` label changes,
//! default 2,000; `AGENT_PATH_SYNC_ONLY=1` stops after the initial sync, for a profile of it).

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use calc_graph::graph::{CalcGraph, Update};
use calc_graph::model::Validated;
use support::cluster::*;

const NODE: &str = "node-1";
const REMOTE: usize = 450;

fn kv(u: Update) -> (String, Vec<u8>) {
    match u {
        Update::Resource {
            key,
            value: Some(r),
        } => (key.etcd_key(), r.to_json().into_bytes()),
        other => panic!("the generator makes resources only: {other:?}"),
    }
}

/// One key through the graph as the agent's pipeline gives it (`GraphPipeline::update`).
fn update(g: &mut CalcGraph, key: &str, value: &[u8]) {
    let valid = Validated::from_etcd(key, value).expect("generated cluster is valid");
    let rk = valid.key().clone();
    g.apply(Update::Valid(valid));
    black_box(g.failed_safe_rules_of(&rk).len());
    assert!(g.take_errors().is_empty(), "{rk}");
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let (ups, _) = generate(NODE);
    let mut kvs: Vec<(String, Vec<u8>)> = vec![(
        "/calico/resources/v3/projectcalico.org/tiers/default".to_string(),
        br#"{"apiVersion":"projectcalico.org/v3","kind":"Tier","metadata":{"name":"default"},"spec":{"order":1000000}}"#.to_vec(),
    )];
    kvs.extend(ups.into_iter().map(kv));
    kvs.sort();
    let bytes: usize = kvs.iter().map(|(k, v)| k.len() + v.len()).sum();
    println!(
        "agent path bench: {} keys, {:.1} MiB of keys and values",
        kvs.len(),
        bytes as f64 / (1024.0 * 1024.0)
    );

    // Floor: parsing the same bytes at all (serde_json, nothing kept).
    let t = Instant::now();
    for (_, v) in &kvs {
        black_box(serde_json::from_slice::<serde::de::IgnoredAny>(v).unwrap());
    }
    let parse = t.elapsed();
    // Decode + validation alone (dropped at once), for its share of the sync.
    let t = Instant::now();
    for (k, v) in &kvs {
        black_box(Validated::from_etcd(k, v).expect("generated cluster is valid"));
    }
    let decode = t.elapsed();

    let mut g = CalcGraph::new(NODE);
    let t = Instant::now();
    for (k, v) in &kvs {
        update(&mut g, k, v);
    }
    let updated = t.elapsed();
    g.apply(Update::InSync);
    let out = g.flush();
    let sync = t.elapsed();
    println!(
        "decode + validation of every key: {decode:.2?} = {:.2}x the floor (serde_json parsing the same bytes, nothing kept: {parse:.2?})",
        decode.as_secs_f64() / parse.as_secs_f64()
    );
    println!(
        "initial sync: {sync:.2?} = update {updated:.2?} ({:.2} us/key) + flush {:.2?}, {} outputs",
        updated.as_secs_f64() * 1e6 / kvs.len() as f64,
        sync - updated,
        out.len()
    );
    drop(out);
    if std::env::var_os("AGENT_PATH_SYNC_ONLY").is_some() {
        return;
    }

    let iters: usize = std::env::var("AGENT_PATH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let flips: Vec<(String, Vec<u8>)> = (0..2)
        .map(|k| kv(pod_update(NODE, REMOTE, 8 + k, REMOTE % 97)))
        .collect();
    let mut from_bytes = Vec::with_capacity(iters);
    let mut decoded = Vec::with_capacity(iters);
    let mut outputs = 0;
    // Alternate the two measures (a8 from bytes, back to a9 already decoded: both change the
    // pod's set membership) so the machine's noise falls on both alike.
    for _ in 0..iters {
        let (k, v) = &flips[0];
        let t = Instant::now();
        update(&mut g, k, v);
        let out = g.flush();
        from_bytes.push(t.elapsed());
        outputs += out.len();
        black_box(out);

        let (k, v) = &flips[1];
        let valid = Validated::from_etcd(k, v).unwrap();
        let t = Instant::now();
        g.apply(Update::Valid(valid));
        black_box(g.flush());
        decoded.push(t.elapsed());
    }
    // The agent's thread does other work between two changes (etcd, the raw view, metrics): the
    // same change with the caches emptied before it (64 MiB written between changes).
    let mut evict = vec![0u8; 64 << 20];
    let cold_iters = iters.min(500);
    let mut cold = Vec::with_capacity(cold_iters);
    let (mut cold_decode, mut cold_apply) = (Vec::new(), Vec::new());
    // Code or data? A small graph (namespace 4 alone: its profile, policies and pods, the
    // tiers) takes the same change just before the timed one, which warms the code and the
    // allocator's paths but none of the big graph's data.
    let mut small = CalcGraph::new(NODE);
    for (k, v) in &kvs {
        if k.contains("/ns4/") || k.ends_with("/kns.ns4") || k.contains("/tiers/") {
            update(&mut small, k, v);
        }
    }
    small.apply(Update::InSync);
    small.flush();
    let mut code_warm = Vec::with_capacity(cold_iters);
    let mut empty_caches = |i: usize| {
        for (j, c) in evict.chunks_mut(64).enumerate() {
            c[0] = (i + j) as u8;
        }
        black_box(&evict);
    };
    for i in 0..cold_iters {
        empty_caches(i);
        let (k, v) = &flips[i % 2];
        let t = Instant::now();
        update(&mut g, k, v);
        black_box(g.flush());
        cold.push(t.elapsed());
        // Split: the decode alone, then the apply of the other version already decoded.
        empty_caches(i);
        let (k, v) = &flips[(i + 1) % 2];
        let t = Instant::now();
        let valid = Validated::from_etcd(k, v).unwrap();
        cold_decode.push(t.elapsed());
        empty_caches(i);
        let t = Instant::now();
        g.apply(Update::Valid(valid));
        black_box(g.flush());
        cold_apply.push(t.elapsed());
        empty_caches(i);
        let (k, v) = &flips[i % 2];
        update(&mut small, k, v);
        black_box(small.flush());
        let t = Instant::now();
        update(&mut g, k, v);
        black_box(g.flush());
        code_warm.push(t.elapsed());
    }
    code_warm.sort_unstable();
    cold.sort_unstable();
    cold_decode.sort_unstable();
    cold_apply.sort_unstable();
    from_bytes.sort_unstable();
    decoded.sort_unstable();
    let (b50, b99) = (percentile(&from_bytes, 0.5), percentile(&from_bytes, 0.99));
    let (d50, d99) = (percentile(&decoded, 0.5), percentile(&decoded, 0.99));
    println!(
        "remote pod app label, etcd bytes -> flushed output: p50 {b50:.2?}, p99 {b99:.2?}, {} outputs/change",
        outputs / iters
    );
    println!(
        "floor: the same change already decoded (apply + flush): p50 {d50:.2?}, p99 {d99:.2?} => bytes/floor {:.2}x p50",
        b50.as_secs_f64() / d50.as_secs_f64()
    );
    println!(
        "the same change from etcd bytes, caches emptied before each: p50 {:.2?}, p99 {:.2?} (split, caches emptied before each part: decode + validation p50 {:.2?}, apply + flush p50 {:.2?})",
        percentile(&cold, 0.5),
        percentile(&cold, 0.99),
        percentile(&cold_decode, 0.5),
        percentile(&cold_apply, 0.5),
    );
    println!(
        "the same, caches emptied then the code warmed on a small graph (namespace 4 alone) taking the same change: p50 {:.2?}, p99 {:.2?}",
        percentile(&code_warm, 0.5),
        percentile(&code_warm, 0.99)
    );
    println!(
        "targets: initial sync <= 1 s: {}; remote relabel p50 <= 20 us: {}",
        if sync <= Duration::from_secs(1) {
            "met"
        } else {
            "MISSED"
        },
        if b50 <= Duration::from_micros(20) {
            "met"
        } else {
            "MISSED"
        }
    );
}
