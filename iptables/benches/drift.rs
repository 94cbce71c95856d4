//! Benchmark: the fast drift check's idle cost and repair time on a node with 250 endpoints and
//! 2,000 policies (rendered by the real renderer), both families, as the agent runs it: inside the
//! node's network namespace (one this bench creates), so nft answers with its generation id.
//!
//! `cargo bench -p iptables --bench drift` (optional args: `legacy`, `nft`, `rounds=N`).
//!
//! Reported per backend: the check with nothing changed, on the fast signal alone (median wall
//! time of both families' checks, and the CPU time they cost, this process and its children,
//! from `/proc/self/stat`), as a share of one core at the default 2 s interval; its parts (the
//! fast signal alone; the one `ipset save` both families' set checks share, as the agent's);
//! legacy's slow signal (the save hash) and its cadence at the default `save_hash_factor`, with
//! the share it adds; then one workload chain flushed: the check that finds and repairs it.

use std::time::{Duration, Instant};

use calc_graph::proto::IpVersion;
use felixrs_test_support::netns::Netns;
use iptables::apply::signal::{NftGeneration, legacy_info, save_hash};
use iptables::apply::xt_info::XtInfo;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner, Mode, Runner};
use iptables::render::{RenderConfig, Renderer};

#[path = "support/node_fixture.rs"]
mod node_fixture;
use node_fixture::{ENDPOINTS, POLICIES, outputs};

const INTERVAL: Duration = Duration::from_secs(2);

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// CPU time of this process and its waited-for children so far.
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = after.split(' ').map(|x| x.parse().unwrap_or(0)).collect();
    // Fields 14-17 (utime, stime, cutime, cstime), counted from 3 after the name.
    let ticks: u64 = f[11..15].iter().sum();
    Duration::from_millis(ticks * 10) // USER_HZ = 100
}

fn bench(backend: Backend, rounds: usize, renderer: &Renderer) {
    let mut appliers: Vec<_> = [IpVersion::V4, IpVersion::V6]
        .into_iter()
        .map(|family| {
            let config = ApplierConfig {
                family,
                backend,
                // The fast signal alone; the slow one is measured below.
                save_hash_factor: u32::MAX,
                ..ApplierConfig::default()
            };
            (family, Applier::new(ExecRunner::new(), config))
        })
        .collect();
    let mut mode = Mode::Nft;
    for (family, a) in &mut appliers {
        mode = a.mode().unwrap();
        a.apply(renderer.desired_ref(*family)).unwrap();
    }
    // The first checks learn the signal (with nft, each family's apply moved the generation).
    for (family, a) in &mut appliers {
        a.check_drift(renderer.desired_ref(*family), None).unwrap();
    }
    let mut walls = Vec::new();
    let cpu0 = cpu();
    for _ in 0..rounds {
        let t = Instant::now();
        // As the agent: one `ipset save` for both families.
        let sets = ExecRunner::new().run("ipset", &["save"], None).unwrap();
        let sets = String::from_utf8_lossy(&sets.stdout);
        for (family, a) in &mut appliers {
            let (d, report) = a
                .check_drift(renderer.desired_ref(*family), Some(&sets))
                .unwrap();
            assert!(
                d.drifted.is_empty() && report.is_none() && d.listings == 0,
                "{d:?}"
            );
        }
        walls.push(t.elapsed());
    }
    let per_check = (cpu() - cpu0) / rounds as u32;
    if let Ok(script) = std::env::var("H4_PROBE") {
        let out = std::process::Command::new("python3")
            .arg(script)
            .output()
            .unwrap();
        println!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let share = per_check.as_secs_f64() / INTERVAL.as_secs_f64() * 100.0;
    println!("backend {mode:?} ({ENDPOINTS} endpoints x {POLICIES} policies, v4 + v6):");
    println!(
        "  idle check, both families: {} wall (median), {} CPU (mean, children included) = {share:.2}% of one core at {INTERVAL:?}",
        ms(median(walls)),
        ms(per_check)
    );
    // The parts: the fast signal alone, and the sets read.
    let runner = ExecRunner::new();
    let mut signal = Vec::new();
    let mut generation = NftGeneration::open().unwrap();
    let xt = [IpVersion::V4, IpVersion::V6].map(|f| XtInfo::open(f).unwrap());
    for _ in 0..rounds {
        let t = Instant::now();
        match mode {
            Mode::Nft => {
                std::hint::black_box(generation.get().unwrap());
            }
            Mode::Legacy => {
                for x in &xt {
                    std::hint::black_box(legacy_info(x).unwrap());
                }
            }
        }
        signal.push(t.elapsed());
    }
    let mut sets = Vec::new();
    let mut bytes = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let out = runner.run("ipset", &["save"], None).unwrap();
        bytes = out.stdout.len();
        sets.push(t.elapsed());
    }
    println!(
        "  of which the fast signal ({}): {}; the one ipset save ({bytes} bytes): {}",
        match mode {
            Mode::Nft => "the generation id",
            Mode::Legacy => "both families' table summaries",
        },
        ms(median(signal)),
        ms(median(sets))
    );
    if mode == Mode::Legacy {
        // The slow signal: each family's save, hashed.
        let factor = ApplierConfig::default().save_hash_factor;
        let mut walls = [Vec::new(), Vec::new()];
        let cpu0 = cpu();
        for _ in 0..rounds {
            for (family, wall) in [IpVersion::V4, IpVersion::V6].into_iter().zip(&mut walls) {
                let t = Instant::now();
                let out = runner.run(&mode.save_program(family), &[], None).unwrap();
                std::hint::black_box(save_hash(&String::from_utf8_lossy(&out.stdout)));
                wall.push(t.elapsed());
            }
        }
        let hash_cpu = (cpu() - cpu0) / rounds as u32;
        let [v4, v6] = walls.map(median);
        // Each applier hashes again once `factor` times its last hash's wall time has passed;
        // the shorter family's cadence for both: an upper bound of the share.
        let cadence = v4.min(v6) * factor;
        let added = hash_cpu.as_secs_f64() / cadence.as_secs_f64() * 100.0;
        println!(
            "  slow signal, the save hash: v4 {} + v6 {} wall (median), {} CPU both (mean); every {:.1} s at save_hash_factor {factor} (about every {} checks): +{added:.2}% of one core at most, {:.2}% in all",
            ms(v4),
            ms(v6),
            ms(hash_cpu),
            cadence.as_secs_f64(),
            (cadence.as_secs_f64() / INTERVAL.as_secs_f64()).round(),
            share + added
        );
    }
    // A tamper: one workload chain flushed; the check that finds and repairs it.
    let tw = renderer
        .desired_ref(IpVersion::V4)
        .tables
        .values()
        .flat_map(|t| t.chains.keys())
        .find(|c| c.starts_with("cali-tw-"))
        .unwrap()
        .clone();
    let mut repairs = Vec::new();
    for _ in 0..rounds.min(5) {
        let out = runner
            .run(&mode.list_program(IpVersion::V4), &["-F", &tw], None)
            .unwrap();
        assert!(out.status.success());
        let (family, a) = &mut appliers[0];
        let t = Instant::now();
        let (d, report) = a.check_drift(renderer.desired_ref(*family), None).unwrap();
        repairs.push(t.elapsed());
        assert_eq!(d.drifted, vec![format!("filter/{tw}")]);
        assert!(report.is_some());
        a.check_drift(renderer.desired_ref(*family), None).unwrap();
    }
    println!(
        "  {tw} flushed: found and repaired by one v4 check in {} (median)",
        ms(median(repairs))
    );
}

fn main() {
    let (rounds, backends) = node_fixture::args(20);
    for b in backends {
        let ns = Netns::with_tag("bench");
        ns.in_thread(move || {
            let mut renderer = Renderer::new(RenderConfig::default()).unwrap();
            assert!(renderer.apply_all(outputs()).is_empty());
            assert!(renderer.flush().is_empty());
            bench(b, rounds, &renderer)
        });
    }
}
