//! Benchmark: one per-policy counter refresh, and one fast drift check, on a node with 250 endpoints and 2,000 policies (the
//! applier benchmark's node, rendered by the real renderer and applied to a network namespace this
//! creates), vs the bare `iptables-save -c -t filter` it runs (the floor). Root; both backends.
//!
//! `cargo bench -p iptables --bench counters` (optional args: `legacy`, `nft`, `rounds=N`).
//!
//! Reported per backend (medians, alternating):
//! * `bare save`: `iptables-save -c -t filter` alone;
//! * `refresh`: the same save through the counter reader + scan + attribution to policies;
//! * `attribution build`: what the apply thread does once per change of the filter chains;
//! * `drift check`: one fast drift check (`iptables -S` of the hook and root chains) with nothing
//!   drifted, and its cost per second of wall time at the agent's default interval.

use std::time::{Duration, Instant};

use calc_graph::proto::IpVersion;
use felixrs_test_support::netns::Netns;
use iptables::apply::counters::read_filter_counters;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner, Runner};
use iptables::render::{RenderConfig, Renderer};
use iptables::stats::Attribution;

#[path = "support/node_fixture.rs"]
mod node_fixture;
use node_fixture::{ENDPOINTS, POLICIES, outputs};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn bench(backend: Backend, rounds: usize, renderer: &Renderer) {
    let ns = Netns::with_tag("bench");
    let runner = ExecRunner::in_netns(ns.name()).expect("valid netns name");
    let mut applier = Applier::new(
        runner.clone(),
        ApplierConfig {
            backend,
            ..ApplierConfig::default()
        },
    );
    let mode = applier.mode().unwrap();
    applier.apply(renderer.desired_ref(IpVersion::V4)).unwrap();
    let t = Instant::now();
    let attribution = Attribution::new(renderer, IpVersion::V4);
    let build = t.elapsed();
    let program = mode.save_program(IpVersion::V4);
    let (mut bare, mut refresh, mut ratios) = (vec![], vec![], vec![]);
    let mut bytes = 0;
    let mut keys = 0;
    let mut found = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let out = runner.run(&program, &["-c", "-t", "filter"], None).unwrap();
        assert!(out.status.success());
        let b = t.elapsed();
        bytes = out.stdout.len();
        let t = Instant::now();
        let save = read_filter_counters(&runner, mode, IpVersion::V4).unwrap();
        let tally = attribution.attribute(&save);
        let r = t.elapsed();
        assert_eq!(tally.rules_missing, 0);
        keys = tally.counters.len();
        found = tally.rules_found;
        ratios.push(r.as_secs_f64() / b.as_secs_f64());
        bare.push(b);
        refresh.push(r);
    }
    let save = read_filter_counters(&runner, mode, IpVersion::V4).unwrap();
    let t = Instant::now();
    let _ = attribution.attribute(&save);
    let attribute = t.elapsed();
    // The fast drift check with nothing drifted: what it costs every interval.
    let mut checks = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let (d, repaired) = applier
            .check_drift(renderer.desired_ref(IpVersion::V4), None)
            .unwrap();
        checks.push(t.elapsed());
        assert!(d.drifted.is_empty() && repaired.is_none(), "{d:?}");
    }
    let check = median(checks);
    ratios.sort_by(f64::total_cmp);
    let (b, r) = (median(bare), median(refresh));
    println!("backend {mode:?}: save of {bytes} bytes, {found} attributed rules, {keys} keys");
    println!("  bare iptables-save -c -t filter: {}", ms(b));
    println!(
        "  counter refresh:                 {}  = {:.2}x bare (median per-round {:.2}x)",
        ms(r),
        r.as_secs_f64() / b.as_secs_f64(),
        ratios[ratios.len() / 2]
    );
    println!(
        "  of which scan + attribution: {}; attribution build (per change, apply thread): {}",
        ms(attribute),
        ms(build)
    );
    println!(
        "  drift check, nothing changed (IPv4: the change signal, then one ipset save): {} = {:.1} ms per second of wall time at the default 2 s interval",
        ms(check),
        check.as_secs_f64() * 1e3 / 2.0
    );
}

fn main() {
    let (rounds, backends) = node_fixture::args(10);
    let mut renderer = Renderer::new(RenderConfig::default()).unwrap();
    assert!(renderer.apply_all(outputs()).is_empty());
    assert!(renderer.flush().is_empty());
    println!("{ENDPOINTS} endpoints x {POLICIES} policies ({rounds} rounds per measure)");
    for b in backends {
        bench(b, rounds, &renderer);
    }
}
