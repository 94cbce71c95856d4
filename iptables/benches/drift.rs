//! Benchmark: the fast drift check's idle cost and repair time on a node with 250 endpoints and
//! 2,000 policies (rendered by the real renderer), both families, as the agent runs it: inside the
//! node's network namespace (one this bench creates), so nft answers with its generation id.
//!
//! `cargo bench -p iptables --bench drift` (optional args: `legacy`, `nft`, `rounds=N`).
//!
//! Reported per backend: the check with nothing changed (median wall time of both families'
//! checks, and the CPU time they cost, this process and its children, from `/proc/self/stat`),
//! as a share of one core at the default 2 s interval; its parts (the change signal alone:
//! nft's generation, legacy's table summaries and contents hash; the one `ipset save` both
//! families' set checks share, as the agent's); a check whose signal moved with nothing of ours
//! changed (a foreign rule), and the body check's share of it; then the tampers: one workload
//! chain flushed, and one of its rules replaced in place keeping its id (`-j DROP` ->
//! `-j ACCEPT`, the same size in a legacy table): the v4 check that finds and repairs each.
//! The first check after the apply asserts that no rule the renderer wrote is taken for edited
//! (every rule of both families re-saved by the kernel and compared).

use std::time::{Duration, Instant};

use calc_graph::proto::IpVersion;
use felixrs_test_support::netns::Netns;
use iptables::apply::drift::verify_bodies;
use iptables::apply::signal::{NftGeneration, legacy_contents, legacy_info};
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
    // The first checks learn the signal (with nft, each family's apply moved the generation),
    // re-reading the tables: every rule of ours as the kernel re-saved it is what we wrote.
    for (family, a) in &mut appliers {
        let (d, report) = a.check_drift(renderer.desired_ref(*family), None).unwrap();
        assert_eq!(d.listings, 1, "{family:?}: {d:?}");
        assert!(
            d.drifted.is_empty() && d.edited.is_empty() && report.is_none(),
            "{family:?}: the body check flags a rule the kernel only re-saved: {d:?}"
        );
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
    let mut xt = [IpVersion::V4, IpVersion::V6].map(|f| XtInfo::open(f).unwrap());
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
        // The slower signal: each family's tables' contents hashed (IPT_SO_GET_ENTRIES).
        let factor = ApplierConfig::default().contents_hash_factor;
        let mut walls = [Vec::new(), Vec::new()];
        let cpu0 = cpu();
        for _ in 0..rounds {
            for (x, wall) in xt.iter_mut().zip(&mut walls) {
                let t = Instant::now();
                std::hint::black_box(legacy_contents(x).unwrap());
                wall.push(t.elapsed());
            }
        }
        let contents_cpu = (cpu() - cpu0) / rounds as u32;
        let [v4, v6] = walls.map(median);
        // Each applier takes it again once `factor` times its last duration has passed; the
        // shorter family's cadence for both: an upper bound of the share.
        let cadence = v4.min(v6) * factor;
        let added = contents_cpu.as_secs_f64() / cadence.as_secs_f64() * 100.0;
        println!(
            "  slower signal, the contents hash: v4 {} + v6 {} wall (median), {} CPU both (mean); every {:.1} s at contents_hash_factor {factor}: +{added:.2}% of one core at most, {:.2}% in all",
            ms(v4),
            ms(v6),
            ms(contents_cpu),
            cadence.as_secs_f64(),
            share + added
        );
    }
    // The signal moved, nothing of ours changed (a foreign rule appended below our hook): the
    // v4 check re-reads, checks every body and plans, and repairs nothing.
    let list = mode.list_program(IpVersion::V4);
    let foreign = ["INPUT", "-s", "192.0.2.9/32", "-j", "ACCEPT"];
    let mut moved = Vec::new();
    for _ in 0..rounds.min(5) {
        let add = runner.run(&list, &[&["-A"][..], &foreign].concat(), None);
        assert!(add.unwrap().status.success());
        let (family, a) = &mut appliers[0];
        let t = Instant::now();
        let (d, report) = a.check_drift(renderer.desired_ref(*family), None).unwrap();
        moved.push(t.elapsed());
        assert!(
            d.listings == 1 && d.drifted.is_empty() && report.is_none(),
            "{d:?}"
        );
        let del = runner.run(&list, &[&["-D"][..], &foreign].concat(), None);
        assert!(del.unwrap().status.success());
        a.check_drift(renderer.desired_ref(*family), None).unwrap();
    }
    // The body check alone, on that save.
    let save = runner
        .run(&mode.save_program(IpVersion::V4), &[], None)
        .unwrap();
    let save = String::from_utf8(save.stdout).unwrap();
    let mut tables = iptables::parse::read_tables(&save);
    let desired = renderer.desired_ref(IpVersion::V4);
    let mut bodies = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let edited = verify_bodies(&save, desired, &mut tables);
        bodies.push(t.elapsed());
        assert!(edited.is_empty(), "{edited:?}");
    }
    let rules: usize = desired
        .tables
        .values()
        .flat_map(|t| t.chains.values())
        .map(Vec::len)
        .sum();
    println!(
        "  signal moved, nothing of ours changed: one v4 check {} (median); of which the body check of {rules} rules: {}",
        ms(median(moved)),
        ms(median(bodies))
    );
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
    // A tamper: its rule (a goto to its shared chain) replaced in place by an accept, its id
    // kept: the same size in a legacy table (both are standard targets).
    let rules = &renderer.desired_ref(IpVersion::V4).tables[&iptables::desired::TableName::Filter]
        .chains[&tw];
    let (i, rule) = (rules.iter().enumerate())
        .find(|(_, r)| r.body().starts_with("-g ") || r.body().contains(" -g "))
        .unwrap_or_else(|| panic!("no goto in {tw}: {rules:?}"));
    let comment = format!("cali:{}", rule.hash);
    let index = (i + 1).to_string();
    let mut args = vec!["-R", &tw, &index, "-m", "comment", "--comment", &comment];
    let matches = rule.body().split("-g ").next().unwrap().trim_end();
    args.extend(matches.split(' ').filter(|t| !t.is_empty()));
    args.extend(["-j", "ACCEPT"]);
    // Checked every 2 s as the agent does (legacy's same-size edit waits for the contents
    // hash's cadence): the time from the tamper to its repair.
    let mut repairs = Vec::new();
    for _ in 0..rounds.min(3) {
        let out = runner
            .run(&mode.list_program(IpVersion::V4), &args, None)
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let (family, a) = &mut appliers[0];
        let t = Instant::now();
        loop {
            let tick = Instant::now();
            let (d, report) = a.check_drift(renderer.desired_ref(*family), None).unwrap();
            if !d.edited.is_empty() {
                assert_eq!(d.edited, vec![format!("filter/{tw}")], "{d:?}");
                assert!(report.is_some());
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(120), "never repaired");
            std::thread::sleep(INTERVAL.saturating_sub(tick.elapsed()));
        }
        repairs.push(t.elapsed());
        a.check_drift(renderer.desired_ref(*family), None).unwrap();
    }
    println!(
        "  {tw} rule {} made ACCEPT in place, id kept, checks every {INTERVAL:?}: repaired {} after the tamper (median), {} at worst",
        i + 1,
        ms(median(repairs.clone())),
        ms(*repairs.iter().max().unwrap())
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
