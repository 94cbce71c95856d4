//! Benchmark: a one-policy change on a node with 250 endpoints and 2,000 policies (rendered by the
//! real renderer), applied by the applier vs. the bare `iptables-restore --noflush` of the very
//! same payload (the floor). Runs as root inside a network namespace it creates; both backends.
//!
//! `cargo bench -p iptables --bench apply` (optional args: `legacy`, `nft`, and `rounds=N`).
//!
//! Reported per backend (medians over the rounds, alternating change and revert):
//! * `apply (cached view)`: the applier's default path: diff against its kernel view + restore;
//! * `apply (re-read)`: `reread_every_apply` (Felix's default): iptables-save + parse + diff +
//!   restore;
//! * `bare restore`: `iptables-restore --noflush` of the same payloads, nothing else.
//!
//! Then `felixrs cleanup` of the whole ruleset (`iptables::apply::cleanup`: read both backends and
//! families, plan, write, destroy the sets) vs. its floor, the bare `iptables-restore --noflush` and
//! `ipset restore` of the very payloads cleanup wrote.

use std::time::{Duration, Instant};

use calc_graph::proto::*;
use felixrs_test_support::netns::Netns;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner, Runner, cleanup};
use iptables::desired::diff::{plan_table, simulate};
use iptables::desired::{DesiredState, TableName};
use iptables::parse::ActualTable;
use iptables::render::{RenderConfig, Renderer};

#[path = "support/node_fixture.rs"]
mod node_fixture;
use node_fixture::{ENDPOINTS, POLICIES, outputs, policy};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn bench(backend: Backend, rounds: usize, base: &DesiredState, changed: &DesiredState) {
    let ns = Netns::with_tag("bench");
    let runner = || ExecRunner::in_netns(ns.name()).expect("valid netns name");
    let mk = |reread| {
        Applier::new(
            runner(),
            ApplierConfig {
                backend,
                reread_every_apply: reread,
                ..ApplierConfig::default()
            },
        )
    };
    let mut applier = mk(false);
    let mode = applier.mode().unwrap();
    let t = Instant::now();
    let initial = applier.apply(base).unwrap();
    let initial_time = t.elapsed();
    let rules: usize = base
        .tables
        .values()
        .map(|t| t.chains.values().map(Vec::len).sum::<usize>())
        .sum();

    // Each round: change + revert through the applier (cached view), the same pair through a
    // re-reading applier, and the same two payloads through bare iptables-restore. Interleaving
    // keeps the comparison fair on a loaded machine; the kernel is back at `base` after each
    // step, so every applier's view stays true.
    let runner = runner();
    let program = mode.restore_program(IpVersion::V4);
    let mut reread_applier = mk(true);
    reread_applier.apply(base).unwrap();
    let (mut cached, mut reread, mut bare, mut ratios) = (vec![], vec![], vec![], vec![]);
    let mut payloads: Vec<String> = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        for target in [changed, base] {
            let r = applier.apply(target).unwrap();
            assert!(r.ipset_updates.is_empty() && r.ipset_deletions.is_empty());
            if payloads.len() < 2 {
                payloads.push(r.iptables[&TableName::Filter].clone());
            }
        }
        let c = t.elapsed();
        let t = Instant::now();
        for (k, target) in [changed, base].into_iter().enumerate() {
            let r = reread_applier.apply(target).unwrap();
            assert_eq!(r.iptables[&TableName::Filter], payloads[k]);
        }
        reread.push(t.elapsed() / 2);
        let t = Instant::now();
        for payload in &payloads {
            let out = runner
                .run(&program, mode.restore_args(), Some(payload.as_bytes()))
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let b = t.elapsed();
        ratios.push(c.as_secs_f64() / b.as_secs_f64());
        cached.push(c / 2);
        bare.push(b / 2);
    }
    // Where the applier's own time goes (pure parts, no I/O).
    let t = Instant::now();
    changed.validate().unwrap();
    let validate = t.elapsed();
    let mut view = ActualTable::default();
    let ops = plan_table(
        TableName::Filter,
        base.tables.get(&TableName::Filter),
        &view,
    );
    let ops = ops.unwrap();
    simulate(TableName::Filter, &mut view, &ops).unwrap();
    let mut plans = Vec::new();
    let mut ops = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        ops = plan_table(
            TableName::Filter,
            changed.tables.get(&TableName::Filter),
            &view,
        )
        .unwrap();
        plans.push(t.elapsed());
    }
    let plan = median(plans);
    assert_eq!(ops.len(), payloads[0].lines().count() - 2);
    let t = Instant::now();
    let save = runner
        .run(&mode.save_program(IpVersion::V4), &[], None)
        .unwrap();
    let save_time = t.elapsed();
    let text = String::from_utf8(save.stdout).unwrap();
    let t = Instant::now();
    iptables::parse::parse_save(&text).unwrap();
    let parse = t.elapsed();
    let (c, r, b) = (median(cached), median(reread), median(bare));
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios[ratios.len() / 2];
    println!(
        "backend {mode:?}: {rules} rules in our chains, {} sets",
        base.ip_sets.len()
    );
    println!(
        "  initial apply: {} ({} payload lines)",
        ms(initial_time),
        initial.lines_written()
    );
    println!(
        "  one-policy change payload: {} lines, {} bytes",
        payloads[0].lines().count(),
        payloads[0].len()
    );
    println!(
        "  apply (cached view): {}  = {:.2}x bare (median of per-round ratios {ratio:.2}x)",
        ms(c),
        c.as_secs_f64() / b.as_secs_f64()
    );
    println!(
        "  apply (re-read):     {}  = {:.2}x bare",
        ms(r),
        r.as_secs_f64() / b.as_secs_f64()
    );
    println!("  bare restore:        {}", ms(b));
    println!(
        "  breakdown: diff (incl. validating written rules) {}, full validate (not on the apply path) {}, iptables-save {} ({} bytes), parse {}",
        ms(plan),
        ms(validate),
        ms(save_time),
        text.len(),
        ms(parse)
    );
    bench_cleanup(&runner, &mut applier, base, rounds.min(4));
}

/// `cleanup::plan` + `cleanup::execute` of the whole ruleset vs. the bare restores of the payloads
/// it writes. Each round re-applies `base` first (not timed).
fn bench_cleanup(
    runner: &ExecRunner,
    applier: &mut Applier<ExecRunner>,
    base: &DesiredState,
    rounds: usize,
) {
    let (mut ours, mut floor, mut plans) = (vec![], vec![], vec![]);
    let mut lines = 0;
    for _ in 0..rounds {
        applier.invalidate();
        applier.apply(base).unwrap();
        let t = Instant::now();
        let plan = cleanup::plan(runner).unwrap();
        plans.push(t.elapsed());
        let report = cleanup::execute(runner, &plan);
        ours.push(t.elapsed());
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        lines = plan.describe().lines().count();

        applier.invalidate();
        applier.apply(base).unwrap();
        let t = Instant::now();
        for tc in &plan.tables {
            let out = runner
                .run(
                    &tc.program(),
                    tc.mode.restore_args(),
                    Some(tc.payload.as_bytes()),
                )
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let destroy: String = plan.sets.iter().map(|s| format!("destroy {s}\n")).collect();
        let out = runner
            .run("ipset", &["restore"], Some(destroy.as_bytes()))
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        floor.push(t.elapsed());
    }
    let (o, f, p) = (median(ours), median(floor), median(plans));
    println!(
        "  cleanup (read both backends and families + plan + write): {} = {:.2}x bare ({} payload lines; reading and planning {})",
        ms(o),
        o.as_secs_f64() / f.as_secs_f64(),
        lines,
        ms(p)
    );
    println!("  bare restore of the cleanup payloads: {}", ms(f));
}

fn main() {
    let (rounds, backends) = node_fixture::args(10);
    // An even number of rounds (at least two): they alternate change and revert.
    let rounds = rounds.max(2) / 2 * 2;
    let t = Instant::now();
    let mut renderer = Renderer::new(RenderConfig::default()).unwrap();
    assert!(renderer.apply_all(outputs()).is_empty());
    assert!(renderer.flush().is_empty());
    let base = renderer.desired(IpVersion::V4);
    renderer.apply(Output::PolicyUpdated(policy(0, 1))).unwrap();
    assert!(renderer.flush().is_empty());
    let changed = renderer.desired(IpVersion::V4);
    println!(
        "{ENDPOINTS} endpoints x {POLICIES} policies rendered in {} ({rounds} rounds per measure)",
        ms(t.elapsed())
    );
    for b in backends {
        bench(b, rounds, &base, &changed);
    }
}
