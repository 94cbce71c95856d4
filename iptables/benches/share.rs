//! Issue 13: shared endpoint policy chains vs Felix's inlined endpoint chains, same inputs, same
//! run, on the real kernel (root; each measure in network namespaces it creates, nft backend).
//!
//! `cargo bench -p iptables --bench share` (args: `endpoints=250,1000`, `rounds=N`).
//!
//! Node: N local endpoints in 25 distinct policy combinations (20 policies each, in a Pass tier
//! and a Deny tier, ingress and egress, 3 rules per policy with sets, OR-blocks and negated
//! CIDRs), 2,000 policies in the cluster, 500 IP sets, two profiles per namespace.
//!
//! For each layout (`inlined` = `share_chains: false`, today's renderer; `shared`):
//! * rules, chains and bytes of the cold-start payloads (v4 + v6) and of the kernel's saves;
//! * cold programming: the applier (v4 ∥ v6, as the agent) on an empty kernel vs the floor, the
//!   bare `ipset restore` + `ip(6)tables-nft-restore` of the same payloads;
//! * restart: render from scratch + fresh appliers (v4 ∥ v6) on the programmed kernel (what the
//!   agent does after a restart from its snapshot) vs the floor, the two saves run concurrently;
//! * one-policy change, one pod added, one pod relabelled to another combination: the applier
//!   (cached view) vs the bare `iptables-nft-restore` of the very same payload, alternating.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use calc_graph::proto::*;
use felixrs_test_support::netns::Netns;
use iptables::apply::{Applier, ApplierConfig, ApplyReport, Backend, ExecRunner, Runner};
use iptables::desired::{Changes, DesiredState, TableName};
use iptables::render::{RenderConfig, Renderer};

const POLICIES: usize = 2000;
const COMBOS: usize = 25;
const PER_COMBO: usize = 20;

/// Policies per combination: 20, or `SHARE_BENCH_PER_COMBO`.
fn per_combo() -> usize {
    std::env::var("SHARE_BENCH_PER_COMBO")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PER_COMBO)
}

/// `SHARE_BENCH_LIGHT=1`: policies of one rule (allow TCP 80/443 from a set), a typical
/// Kubernetes NetworkPolicy, instead of three.
fn light() -> bool {
    std::env::var_os("SHARE_BENCH_LIGHT").is_some()
}
const SETS: usize = 500;

/// `SHARE_BENCH_ONLY_SHARED=1`: skip the inlined layout (quicker runs while working on the shared one).
fn only_shared() -> bool {
    std::env::var_os("SHARE_BENCH_ONLY_SHARED").is_some()
}

fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

fn policy_id(i: usize) -> PolicyId {
    PolicyId {
        kind: PolicyKind::NetworkPolicy,
        tier: if i.is_multiple_of(2) {
            "security".into()
        } else {
            "default".into()
        },
        namespace: Some(format!("ns{}", i % COMBOS)),
        name: format!("policy-{i}"),
    }
}

/// The render bench's policy shape: set + ports, an OR-block of CIDRs, a deny with exceptions.
fn policy(i: usize, variant: u16) -> ActivePolicy {
    let rules = vec![
        ParsedRule {
            action: Some(Action::Allow),
            protocol: Some(Protocol::Tcp),
            src_ip_set_ids: vec![format!("s:set{:04}", i % SETS)],
            dst_ports: vec![
                PortRange {
                    first: 80 + variant,
                    last: 80 + variant,
                },
                PortRange {
                    first: 443,
                    last: 443,
                },
            ],
            ..Default::default()
        },
        ParsedRule {
            action: Some(Action::Allow),
            protocol: Some(Protocol::Udp),
            src_nets: vec![
                net(&format!("10.{}.0.0/16", i % 250)),
                net(&format!("172.16.{}.0/24", i % 250)),
                net("fd00::/64"),
            ],
            dst_ports: vec![PortRange {
                first: 53,
                last: 53,
            }],
            ..Default::default()
        },
        ParsedRule {
            action: Some(Action::Deny),
            src_nets: vec![net("10.0.0.0/8")],
            not_src_nets: vec![net(&format!("10.{}.0.0/16", i % 250)), net("10.255.0.0/16")],
            ..Default::default()
        },
    ];
    let rules = if light() { rules[..1].to_vec() } else { rules };
    ActivePolicy {
        id: policy_id(i),
        order: Some(i as f64),
        inbound_rules: rules.clone(),
        outbound_rules: rules,
        untracked: false,
        pre_dnat: false,
        apply_on_forward: false,
    }
}

/// Endpoint `e` (namespace `ns<e % 25>`) in combination `c`: the policies `c*80 .. c*80+20`
/// (10 in each tier; the first `per_combo()` of them), and the profiles of namespace `ns<c>`.
fn endpoint(e: usize, c: usize) -> LocalEndpoint {
    let pols: Vec<PolicyId> = (0..per_combo()).map(|k| policy_id(c * 80 + k)).collect();
    let (sec, def): (Vec<_>, Vec<_>) = pols.into_iter().partition(|p| p.tier == "security");
    let tier = |name: &str, ps: Vec<PolicyId>, action| TierInfo {
        name: name.into(),
        default_action: action,
        ingress_policies: ps.clone(),
        egress_policies: ps,
    };
    LocalEndpoint {
        id: EndpointId {
            namespace: format!("ns{}", e % COMBOS),
            name: format!("pod-{e}"),
        },
        interface_name: format!(
            "cali{:011x}",
            (e as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20
        ),
        ipv4_nets: vec![net(&format!("10.65.{}.{}/32", e / 250, e % 250))],
        ipv6_nets: vec![net(&format!("fd00::{e:x}/128"))],
        tiers: vec![
            tier("security", sec, Action::Pass),
            tier("default", def, Action::Deny),
        ],
        profile_ids: vec![format!("kns.ns{c}"), format!("ksa.ns{c}.default")],
        allow_spoofed_source_prefixes: vec![],
        staged_tiers: None,
    }
}

fn inputs(endpoints: usize) -> Vec<Output> {
    let mut out = Vec::new();
    for s in 0..SETS {
        let members = (0..20)
            .map(|m| IpSetMember::Net(net(&format!("10.{}.{}.{}/32", s % 250, m, s / 250))))
            .chain([IpSetMember::Net(net(&format!("fd00::{s:x}:1/128")))])
            .collect();
        out.push(Output::IpSetCreated {
            id: format!("s:set{s:04}"),
            kind: IpSetKind::Net,
            members,
        });
    }
    for i in 0..POLICIES {
        out.push(Output::PolicyUpdated(policy(i, 0)));
    }
    for ns in 0..COMBOS {
        let allow = ParsedRule {
            action: Some(Action::Allow),
            ..Default::default()
        };
        out.push(Output::ProfileUpdated(ActiveProfile {
            id: format!("kns.ns{ns}"),
            inbound_rules: vec![allow.clone()],
            outbound_rules: vec![allow],
        }));
        out.push(Output::ProfileUpdated(ActiveProfile {
            id: format!("ksa.ns{ns}.default"),
            inbound_rules: vec![],
            outbound_rules: vec![],
        }));
    }
    for e in 0..endpoints {
        out.push(Output::EndpointUpdated(endpoint(e, e % COMBOS)));
    }
    out.push(Output::InSync);
    out
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn render(inputs: &[Output], share_chains: bool) -> Renderer {
    let mut r = Renderer::new(RenderConfig {
        share_chains,
        ..RenderConfig::default()
    })
    .unwrap();
    assert!(r.apply_all(inputs.iter().cloned()).is_empty());
    assert!(r.flush().is_empty());
    r
}

/// The real runner, adding the wall time spent in the programs it runs to `spent` (ns): an
/// apply's time minus that is the applier's own cost (parse, plan, render of the payload).
#[derive(Clone)]
struct TimedRunner {
    inner: ExecRunner,
    spent: Arc<AtomicU64>,
}

impl Runner for TimedRunner {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<std::process::Output, iptables::apply::RunError> {
        let t = Instant::now();
        let out = self.inner.run(program, args, stdin);
        self.spent
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
}

impl TimedRunner {
    fn take(&self) -> Duration {
        Duration::from_nanos(self.spent.swap(0, Ordering::Relaxed))
    }
}

type BenchApplier = Applier<TimedRunner>;

fn new_appliers(ns: &Netns) -> [BenchApplier; 2] {
    [IpVersion::V4, IpVersion::V6].map(|family| {
        Applier::new(
            TimedRunner {
                inner: ExecRunner::in_netns(ns.name()).expect("valid netns name"),
                spent: Arc::default(),
            },
            ApplierConfig {
                family,
                backend: Backend::Nft,
                ..ApplierConfig::default()
            },
        )
    })
}

/// Both families at once, as the agent's two apply threads.
fn apply_both(appliers: &mut [BenchApplier; 2], d: [&DesiredState; 2]) -> [ApplyReport; 2] {
    apply_both_timed(appliers, d, None).0
}

/// [`apply_both`], with each family's apply time.
/// With `changes` (the renderer's change log of each family), as the agent: only those are
/// planned.
fn apply_both_timed(
    appliers: &mut [BenchApplier; 2],
    d: [&DesiredState; 2],
    changes: Option<&[Changes; 2]>,
) -> ([ApplyReport; 2], [Duration; 2]) {
    let [a4, a6] = appliers;
    let go = |a: &mut BenchApplier, i: usize| match changes {
        Some(c) => a.apply_changes(d[i], &c[i]).unwrap(),
        None => a.apply(d[i]).unwrap(),
    };
    let ([r4, r6], took) = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let t = Instant::now();
            let r = go(a6, 1);
            (r, t.elapsed())
        });
        let t = Instant::now();
        let r4 = go(a4, 0);
        let t4 = t.elapsed();
        let (r6, t6) = h.join().unwrap();
        ([r4, r6], [t4, t6])
    });
    ([r4, r6], took)
}

fn run_ok(r: &ExecRunner, program: &str, args: &[&str], stdin: Option<&str>) -> String {
    let out = r.run(program, args, stdin.map(str::as_bytes)).unwrap();
    assert!(
        out.status.success(),
        "{program}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const RESTORE: [&str; 2] = ["iptables-nft-restore", "ip6tables-nft-restore"];
const SAVE: [&str; 2] = ["iptables-nft-save", "ip6tables-nft-save"];
const RESTORE_ARGS: &[&str] = &["--noflush", "-w", "10"];

/// The bare floor of a cold start: the same ipset and iptables payloads, nothing else.
fn bare_cold(reports: &[ApplyReport; 2]) -> Duration {
    let ns = Netns::with_tag("share");
    let r = ExecRunner::in_netns(ns.name()).unwrap();
    let t = Instant::now();
    for rep in reports {
        if !rep.ipset_updates.is_empty() {
            run_ok(
                &r,
                "ipset",
                &["-exist", "restore"],
                Some(&rep.ipset_updates),
            );
        }
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = reports
            .iter()
            .zip(RESTORE)
            .map(|(rep, prog)| {
                let r = r.clone();
                s.spawn(move || {
                    for payload in rep.iptables.values() {
                        run_ok(&r, prog, RESTORE_ARGS, Some(payload));
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
    });
    t.elapsed()
}

/// The two whole saves a restart reads, concurrently; returns (time, v4 + v6 bytes, v4 + v6 rules).
fn saves(r: &ExecRunner) -> (Duration, usize, usize) {
    let (took, bytes, rules, _) = saves_text(r);
    (took, bytes, rules)
}

/// [`saves`], with the v4 save's text.
fn saves_text(r: &ExecRunner) -> (Duration, usize, usize, String) {
    let t = Instant::now();
    let texts: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = SAVE
            .iter()
            .map(|p| s.spawn(move || run_ok(r, p, &[], None)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = t.elapsed();
    let rules = texts
        .iter()
        .flat_map(|t| t.lines())
        .filter(|l| l.starts_with("-A") && l.contains("cali"))
        .count();
    let bytes = texts.iter().map(String::len).sum();
    (took, bytes, rules, texts.into_iter().next().unwrap())
}

struct Layout {
    name: &'static str,
    renderer: Renderer,
    ns: Netns,
    appliers: [BenchApplier; 2],
}

fn payload_lines(reports: &[ApplyReport; 2]) -> (usize, usize) {
    let texts = reports.iter().flat_map(|r| r.iptables.values());
    let (mut lines, mut bytes) = (0, 0);
    for t in texts {
        lines += t.lines().filter(|l| l.starts_with("-A")).count();
        bytes += t.len();
    }
    (lines, bytes)
}

/// Restore payloads by family (0: IPv4, 1: IPv6).
type Payloads = Vec<(usize, String)>;

/// One change through the applier vs the bare restore of the same payload, `rounds` times: the
/// change through the renderer and appliers (timed: render, flush, diff, restore), its revert
/// through them (not timed), then the change's payloads bare (timed) and the revert's payloads
/// bare (not timed; in odd rounds the bare pair runs first), so the kernel and the appliers'
/// views end every round where they began.
fn change_vs_bare(l: &mut Layout, rounds: usize, what: &str, change: &dyn Fn(&mut Renderer, bool)) {
    let runner = ExecRunner::in_netns(l.ns.name()).unwrap();
    let (mut ours, mut bare, mut ratios) = (vec![], vec![], vec![]);
    let mut render_times = vec![];
    let mut own_times = vec![];
    let mut prog_times = vec![];
    let mut size = (0, 0);
    let restore_all = |payloads: &[(usize, String)]| {
        std::thread::scope(|s| {
            let hs: Vec<_> = payloads
                .iter()
                .map(|(i, p)| {
                    let r = runner.clone();
                    s.spawn(move || run_ok(&r, RESTORE[*i], RESTORE_ARGS, Some(p)))
                })
                .collect();
            hs.into_iter().for_each(|h| {
                h.join().unwrap();
            });
        })
    };
    let mut last: (Payloads, Payloads) = Default::default();
    for round in 0..rounds {
        let mut step = |forward: bool| {
            let t = Instant::now();
            change(&mut l.renderer, forward);
            assert!(l.renderer.flush().is_empty());
            let rendered = t.elapsed();
            let changes = [IpVersion::V4, IpVersion::V6].map(|v| l.renderer.take_changes(v));
            let d = [IpVersion::V4, IpVersion::V6].map(|v| l.renderer.desired_ref(v));
            for a in &l.appliers {
                a.runner().take();
            }
            let (reps, each) = apply_both_timed(&mut l.appliers, d, Some(&changes));
            let took = t.elapsed();
            if forward {
                render_times.push(rendered);
                let progs = [0, 1].map(|i| l.appliers[i].runner().take());
                prog_times.push(progs[0].max(progs[1]));
                own_times.push(
                    each[0]
                        .saturating_sub(progs[0])
                        .max(each[1].saturating_sub(progs[1])),
                );
            }
            for r in &reps {
                assert!(r.ipset_updates.is_empty() && r.ipset_deletions.is_empty());
                assert!(r.iptables.keys().all(|t| *t == TableName::Filter));
            }
            let payloads: Vec<(usize, String)> = reps
                .iter()
                .enumerate()
                .flat_map(|(i, r)| r.iptables.get(&TableName::Filter).map(|p| (i, p.clone())))
                .collect();
            (took, payloads)
        };
        // Odd rounds time the bare restores first (the previous round's payloads: the same
        // change), so neither side always runs right after the other's revert.
        let bare_first = round % 2 == 1 && !last.0.is_empty();
        let mut b = Duration::ZERO;
        if bare_first {
            let t = Instant::now();
            restore_all(&last.0);
            b = t.elapsed();
            restore_all(&last.1);
        }
        let (o, fwd) = step(true);
        let (_, rev) = step(false);
        if !bare_first {
            let t = Instant::now();
            restore_all(&fwd);
            b = t.elapsed();
            restore_all(&rev);
        }
        size = (
            fwd.iter().map(|(_, p)| p.lines().count() - 2).sum(),
            fwd.iter().map(|(_, p)| p.len()).sum(),
        );
        ours.push(o);
        bare.push(b);
        ratios.push(o.as_secs_f64() / b.as_secs_f64());
        if bare_first {
            assert_eq!(fwd, last.0, "the bare restore timed another payload");
        }
        last = (fwd, rev);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "  {:8} {what}: applier {} (render+flush {}, applier's own {}, its restores {}) vs bare restore {} = {:.2}x (median per-round ratio {:.2}x); payload v4+v6 {} lines, {} bytes",
        l.name,
        ms(median(ours.clone())),
        ms(median(render_times)),
        ms(median(own_times)),
        ms(median(prog_times)),
        ms(median(bare.clone())),
        median(ours).as_secs_f64() / median(bare).as_secs_f64(),
        ratios[ratios.len() / 2],
        size.0,
        size.1
    );
}

type Change = Box<dyn Fn(&mut Renderer, bool)>;

/// The three changes: forward (`true`) and back.
fn changes(n: usize) -> Vec<(&'static str, Change)> {
    vec![
        (
            "one-policy change",
            Box::new(|r: &mut Renderer, fwd: bool| {
                r.apply(Output::PolicyUpdated(policy(0, u16::from(fwd))))
                    .unwrap();
            }),
        ),
        (
            "one pod added",
            Box::new(move |r: &mut Renderer, fwd: bool| {
                let ep = endpoint(n, 3);
                if fwd {
                    r.apply(Output::EndpointUpdated(ep)).unwrap();
                } else {
                    r.apply(Output::EndpointRemoved(ep.id)).unwrap();
                }
            }),
        ),
        (
            "one pod relabelled",
            Box::new(|r: &mut Renderer, fwd: bool| {
                let c = if fwd { 1 } else { 0 };
                r.apply(Output::EndpointUpdated(endpoint(0, c))).unwrap();
            }),
        ),
    ]
}

/// A kernel that holds nothing and takes every write: what is left of an apply is the applier's
/// own work (plan, validate, render the payload, keep its view), without any program's time.
struct NullRunner;

impl Runner for NullRunner {
    fn run(
        &self,
        _program: &str,
        _args: &[&str],
        _stdin: Option<&[u8]>,
    ) -> Result<std::process::Output, iptables::apply::RunError> {
        use std::os::unix::process::ExitStatusExt;
        Ok(std::process::Output {
            status: std::process::ExitStatus::from_raw(0),
            stdout: Vec::new(),
            stderr: Vec::new(),
        })
    }
}

/// Rules and bytes of the cold-start payloads (v4 + v6) of both layouts, as the applier writes
/// them into an empty kernel (in process, no root): the rule counts of the table above.
fn cold_payload_counts(inputs: &[Output]) {
    for share in [false, true] {
        let renderer = render(inputs, share);
        let reports = [IpVersion::V4, IpVersion::V6].map(|family| {
            let mut a = Applier::new(
                NullRunner,
                ApplierConfig {
                    family,
                    backend: Backend::Nft,
                    ..ApplierConfig::default()
                },
            );
            a.apply(renderer.desired_ref(family)).unwrap()
        });
        let (lines, bytes) = payload_lines(&reports);
        let sets: usize = [IpVersion::V4, IpVersion::V6]
            .map(|v| renderer.desired_ref(v).ip_sets.len())
            .iter()
            .sum();
        println!(
            "  {:8} cold payload {lines} rules, {} KiB, {sets} IP sets (v4 + v6, in process)",
            if share { "shared" } else { "inlined" },
            bytes / 1024
        );
    }
}

/// The applier's own cost per change (shared layout, one family at a time, in process: no
/// kernel, no root), median of `rounds`; the change's render + flush is reported apart.
fn own_cost(inputs: &[Output], n: usize, rounds: usize) {
    let mut renderer = render(inputs, true);
    let mut appliers = [IpVersion::V4, IpVersion::V6].map(|family| {
        Applier::new(
            NullRunner,
            ApplierConfig {
                family,
                backend: Backend::Nft,
                ..ApplierConfig::default()
            },
        )
    });
    for (a, v) in appliers.iter_mut().zip([IpVersion::V4, IpVersion::V6]) {
        a.apply(renderer.desired_ref(v)).unwrap();
        renderer.take_changes(v);
    }
    for (what, change) in changes(n) {
        for whole in [true, false] {
            let (mut own, mut rendered) = (vec![], vec![]);
            for round in 0..rounds * 2 {
                let fwd = round % 2 == 0;
                let t = Instant::now();
                change(&mut renderer, fwd);
                assert!(renderer.flush().is_empty());
                let r = t.elapsed();
                let t = Instant::now();
                for (a, v) in appliers.iter_mut().zip([IpVersion::V4, IpVersion::V6]) {
                    let changes = renderer.take_changes(v);
                    let rep = if whole {
                        a.apply(renderer.desired_ref(v)).unwrap()
                    } else {
                        a.apply_changes(renderer.desired_ref(v), &changes).unwrap()
                    };
                    assert!(!rep.iptables.is_empty());
                }
                if fwd {
                    own.push(t.elapsed());
                    rendered.push(r);
                }
            }
            println!(
                "  shared   {what}: applier's own work (v4 + v6, one after the other, no programs), {}: {} (render+flush {})",
                if whole {
                    "whole plan (apply)"
                } else {
                    "change log (apply_changes)"
                },
                ms(median(own)),
                ms(median(rendered))
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds = args
        .iter()
        .find_map(|a| a.strip_prefix("rounds=").and_then(|n| n.parse().ok()))
        .unwrap_or(6usize);
    let sizes: Vec<usize> = args
        .iter()
        .find_map(|a| a.strip_prefix("endpoints="))
        .map(|s| s.split(',').map(|n| n.parse().unwrap()).collect())
        .unwrap_or_else(|| vec![250, 1000]);
    for n in sizes {
        let inputs = inputs(n);
        if std::env::var_os("SHARE_BENCH_OWN_ONLY").is_some() {
            cold_payload_counts(&inputs);
            own_cost(&inputs, n, rounds.max(20));
            continue;
        }
        println!(
            "== {n} endpoints, {COMBOS} combinations x {} policies of {} rule(s), {POLICIES} policies, {SETS} sets ==",
            per_combo(),
            if light() { 1 } else { 3 }
        );
        let mut layouts = Vec::new();
        for share in [false, true] {
            if only_shared() && !share {
                continue;
            }
            let name = if share { "shared" } else { "inlined" };
            let mut renders = Vec::new();
            let mut r = None;
            for _ in 0..3 {
                let t = Instant::now();
                r = Some(black_box(render(&inputs, share)));
                renders.push(t.elapsed());
            }
            let renderer = r.unwrap();
            let ns = Netns::with_tag("share");
            let mut appliers = new_appliers(&ns);
            let d = [IpVersion::V4, IpVersion::V6].map(|v| renderer.desired_ref(v));
            let t = Instant::now();
            let reports = apply_both(&mut appliers, d);
            let cold = t.elapsed();
            let mut renderer = renderer;
            for v in [IpVersion::V4, IpVersion::V6] {
                renderer.take_changes(v);
            }
            let floor = bare_cold(&reports);
            let (lines, bytes) = payload_lines(&reports);
            let runner = ExecRunner::in_netns(ns.name()).unwrap();
            let (_, save_bytes, kernel_rules, v4_save) = saves_text(&runner);
            let t = Instant::now();
            black_box(iptables::parse::parse_save_lenient(&v4_save).unwrap());
            println!("  {name:8} typed parse alone: {}", ms(t.elapsed()));
            let t = Instant::now();
            black_box(iptables::parse::scan_save(&v4_save));
            println!("  {name:8} scan alone: {}", ms(t.elapsed()));
            let t = Instant::now();
            let tables = black_box(iptables::parse::read_tables(&v4_save));
            println!(
                "  {name:8} the applier's parse of the v4 save ({} KiB, {} rules): {}",
                v4_save.len() / 1024,
                tables.values().map(|t| t.rule_count()).sum::<usize>(),
                ms(t.elapsed())
            );
            println!(
                "  {name:8} render {} | cold payload {lines} rules, {} KiB | kernel (saves) {kernel_rules} rules, {} KiB | shared chains {}",
                ms(median(renders)),
                bytes / 1024,
                save_bytes / 1024,
                renderer.shared_chain_count()
            );
            println!(
                "  {name:8} cold programming: applier {} vs bare restore {} = {:.2}x",
                ms(cold),
                ms(floor),
                cold.as_secs_f64() / floor.as_secs_f64()
            );
            // Restart on the programmed kernel: render from scratch + fresh appliers (v4 ∥ v6),
            // which read the kernel and find nothing to write; floor: the two saves.
            let (mut restarts, mut floors) = (vec![], vec![]);
            let (mut r_render, mut r_read, mut r_progs, mut r_plan) =
                (vec![], vec![], vec![], vec![]);
            for _ in 0..3 {
                // As the agent: the appliers read the kernel while the renderer renders.
                let mut fresh_appliers = new_appliers(&ns);
                let t = Instant::now();
                let fresh = std::thread::scope(|s| {
                    let [a4, a6] = &mut fresh_appliers;
                    let read = |a: &mut BenchApplier| {
                        let t = Instant::now();
                        a.read_kernel().unwrap();
                        t.elapsed()
                    };
                    let h4 = s.spawn(move || read(a4));
                    let h6 = s.spawn(move || read(a6));
                    let fresh = render(&inputs, share);
                    r_render.push(t.elapsed());
                    r_read.push(h4.join().unwrap().max(h6.join().unwrap()));
                    fresh
                });
                let progs = [0, 1].map(|i| fresh_appliers[i].runner().take());
                r_progs.push(progs[0].max(progs[1]));
                let d = [IpVersion::V4, IpVersion::V6].map(|v| fresh.desired_ref(v));
                let (reps, each) = apply_both_timed(&mut fresh_appliers, d, None);
                restarts.push(t.elapsed());
                r_plan.push(each[0].max(each[1]));
                assert!(reps.iter().all(ApplyReport::is_empty), "restart wrote");
                floors.push(saves(&runner).0);
            }
            let (rs, fl) = (median(restarts), median(floors));
            println!(
                "  {name:8} restart: render {} | meanwhile read the kernel {} (of which the saves {}) | then plan {}",
                ms(median(r_render)),
                ms(median(r_read)),
                ms(median(r_progs)),
                ms(median(r_plan)),
            );
            println!(
                "  {name:8} restart (render + read kernel + diff, nothing to write): {} vs two concurrent saves {} = {:.2}x",
                ms(rs),
                ms(fl),
                rs.as_secs_f64() / fl.as_secs_f64()
            );
            layouts.push(Layout {
                name,
                renderer,
                ns,
                appliers,
            });
        }
        for l in &mut layouts {
            for (what, change) in changes(n) {
                change_vs_bare(l, rounds, what, &*change);
            }
        }
        if !only_shared() || std::env::var_os("SHARE_BENCH_OWN").is_some() {
            own_cost(&inputs, n, rounds.max(20));
        }
    }
}
