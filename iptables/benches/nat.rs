//! Benchmark: an IP pool change (natOutgoing toggled on one of 200 pools) through the renderer
//! and the applier, vs. the bare `ipset restore` of the very same payload (the floor). A pool
//! change never rewrites a chain: the applier's whole kernel write is that ipset payload.
//! Runs as root inside a network namespace it creates (nft backend, the distribution default).
//!
//! `cargo bench -p iptables --bench nat` (optional arg: `rounds=N`).

use std::time::{Duration, Instant};

use calc_graph::proto::{IpPool, IpVersion, Output};
use felixrs_test_support::netns::Netns;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner, Runner};
use iptables::render::{RenderConfig, Renderer};

const POOLS: usize = 200;

fn pool(i: usize, masquerade: bool) -> Output {
    Output::IpPoolUpdated(IpPool {
        name: format!("pool-{i}"),
        cidr: format!("10.{}.{}.0/24", i / 256, i % 256).parse().unwrap(),
        masquerade,
        load_balancer_only: false,
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let rounds = std::env::args()
        .skip(1)
        .find_map(|a| a.strip_prefix("rounds=").and_then(|n| n.parse().ok()))
        .unwrap_or(20usize)
        .max(2)
        / 2
        * 2;
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    let mut all: Vec<Output> = (0..POOLS).map(|i| pool(i, i % 2 == 0)).collect();
    all.push(Output::InSync);
    assert!(r.apply_all(all).is_empty());
    r.flush();
    r.take_delta(IpVersion::V4);
    r.take_delta(IpVersion::V6);

    // Renderer: one pool change (apply + flush + v4 delta).
    let mut render_times = Vec::new();
    for round in 0..rounds {
        let t = Instant::now();
        r.apply(pool(1, round % 2 == 0)).unwrap();
        r.flush();
        let d = r.take_delta(IpVersion::V4);
        render_times.push(t.elapsed());
        assert!(d.chains.is_empty() && d.ip_sets.len() == 1, "{d:?}");
    }
    // Back to the base state (pool-1 not masquerading).
    r.apply(pool(1, false)).unwrap();
    r.flush();
    let base = r.desired(IpVersion::V4);
    r.apply(pool(1, true)).unwrap();
    r.flush();
    let changed = r.desired(IpVersion::V4);

    let ns = Netns::with_tag("bench");
    let runner = ExecRunner::in_netns(ns.name()).expect("valid netns name");
    let mut applier = Applier::new(
        ExecRunner::in_netns(ns.name()).expect("valid netns name"),
        ApplierConfig {
            backend: Backend::Nft,
            ..ApplierConfig::default()
        },
    );
    let t = Instant::now();
    applier.apply(&base).unwrap();
    let initial = t.elapsed();
    let (mut applies, mut bares, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut payloads: Vec<String> = Vec::new();
    for round in 0..rounds {
        let target = if round % 2 == 0 { &changed } else { &base };
        let t = Instant::now();
        let report = applier.apply(target).unwrap();
        let a = t.elapsed();
        assert!(report.iptables.is_empty(), "{report:?}");
        if payloads.len() < 2 {
            payloads.push(report.ipset_updates.clone());
        }
        // The floor: the same payload back and forth with the bare tool.
        let undo = &payloads[(round + 1) % payloads.len().max(1)];
        let redo = &payloads[round % payloads.len()];
        if payloads.len() < 2 {
            applies.push(a);
            continue;
        }
        let t = Instant::now();
        for p in [undo, redo] {
            let out = runner
                .run("ipset", &["restore"], Some(p.as_bytes()))
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let b = t.elapsed() / 2;
        // Leave the kernel where the applier believes it is.
        applies.push(a);
        bares.push(b);
        ratios.push(a.as_secs_f64() / b.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    let (a, b) = (median(applies), median(bares));
    println!("{POOLS} pools (100 natOutgoing), {rounds} rounds");
    println!("  initial apply (nat chains + 2 sets): {}", ms(initial));
    println!("  renderer, one pool change: {}", us(median(render_times)));
    println!(
        "  pool change payload: {:?}",
        payloads.first().map(|p| p.trim()).unwrap_or("")
    );
    println!(
        "  apply (cached view): {} = {:.2}x bare (median of per-round ratios {:.2}x)",
        ms(a),
        a.as_secs_f64() / b.as_secs_f64(),
        ratios[ratios.len() / 2]
    );
    println!("  bare ipset restore: {}", ms(b));
}
