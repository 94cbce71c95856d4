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
use std::time::{Duration, Instant};

use calc_graph::proto::*;
use felixrs_test_support::netns::Netns;
use iptables::apply::{
    Applier, ApplierConfig, ApplyReport, Backend, DesiredState, ExecRunner, Runner, TableName,
};
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

fn new_appliers(ns: &Netns) -> [Applier<ExecRunner>; 2] {
    [IpVersion::V4, IpVersion::V6].map(|family| {
        Applier::new(
            ExecRunner::in_netns(ns.name()).expect("valid netns name"),
            ApplierConfig {
                family,
                backend: Backend::Nft,
                ..ApplierConfig::default()
            },
        )
    })
}

/// Both families at once, as the agent's two apply threads.
fn apply_both(appliers: &mut [Applier<ExecRunner>; 2], d: [&DesiredState; 2]) -> [ApplyReport; 2] {
    let [a4, a6] = appliers;
    std::thread::scope(|s| {
        let h = s.spawn(|| a6.apply(d[1]).unwrap());
        let r4 = a4.apply(d[0]).unwrap();
        [r4, h.join().unwrap()]
    })
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
    (took, texts.iter().map(String::len).sum(), rules)
}

struct Layout {
    name: &'static str,
    renderer: Renderer,
    ns: Netns,
    appliers: [Applier<ExecRunner>; 2],
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

/// One change through the applier vs the bare restore of the same payload, `rounds` times: the
/// change through the renderer and appliers (timed: render, flush, diff, restore), its revert
/// through them (not timed), then the change's payloads bare (timed) and the revert's payloads
/// bare (not timed), so the kernel and the appliers' views end every round where they began.
fn change_vs_bare(l: &mut Layout, rounds: usize, what: &str, change: &dyn Fn(&mut Renderer, bool)) {
    let runner = ExecRunner::in_netns(l.ns.name()).unwrap();
    let (mut ours, mut bare, mut ratios) = (vec![], vec![], vec![]);
    let mut render_times = vec![];
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
    for _ in 0..rounds {
        let mut step = |forward: bool| {
            let t = Instant::now();
            change(&mut l.renderer, forward);
            assert!(l.renderer.flush().is_empty());
            let rendered = t.elapsed();
            let d = [IpVersion::V4, IpVersion::V6].map(|v| l.renderer.desired_ref(v));
            let reps = apply_both(&mut l.appliers, d);
            let took = t.elapsed();
            render_times.push(rendered);
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
        let (o, fwd) = step(true);
        let (_, rev) = step(false);
        let t = Instant::now();
        restore_all(&fwd);
        let b = t.elapsed();
        restore_all(&rev);
        size = (
            fwd.iter().map(|(_, p)| p.lines().count() - 2).sum(),
            fwd.iter().map(|(_, p)| p.len()).sum(),
        );
        ours.push(o);
        bare.push(b);
        ratios.push(o.as_secs_f64() / b.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "  {:8} {what}: applier {} (render+flush {}) vs bare restore {} = {:.2}x (median per-round ratio {:.2}x); payload v4+v6 {} lines, {} bytes",
        l.name,
        ms(median(ours.clone())),
        ms(median(render_times)),
        ms(median(bare.clone())),
        median(ours).as_secs_f64() / median(bare).as_secs_f64(),
        ratios[ratios.len() / 2],
        size.0,
        size.1
    );
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
        println!(
            "== {n} endpoints, {COMBOS} combinations x {} policies of {} rule(s), {POLICIES} policies, {SETS} sets ==",
            per_combo(),
            if light() { 1 } else { 3 }
        );
        let mut layouts = Vec::new();
        for share in [false, true] {
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
            let floor = bare_cold(&reports);
            let (lines, bytes) = payload_lines(&reports);
            let runner = ExecRunner::in_netns(ns.name()).unwrap();
            let (_, save_bytes, kernel_rules) = saves(&runner);
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
            for _ in 0..3 {
                let t = Instant::now();
                let fresh = render(&inputs, share);
                let mut fresh_appliers = new_appliers(&ns);
                let d = [IpVersion::V4, IpVersion::V6].map(|v| fresh.desired_ref(v));
                let reps = apply_both(&mut fresh_appliers, d);
                restarts.push(t.elapsed());
                assert!(reps.iter().all(ApplyReport::is_empty), "restart wrote");
                floors.push(saves(&runner).0);
            }
            let (rs, fl) = (median(restarts), median(floors));
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
            change_vs_bare(l, rounds, "one-policy change", &|r, fwd| {
                r.apply(Output::PolicyUpdated(policy(0, u16::from(fwd))))
                    .unwrap();
            });
            change_vs_bare(l, rounds, "one pod added", &move |r, fwd| {
                let ep = endpoint(n, 3);
                if fwd {
                    r.apply(Output::EndpointUpdated(ep)).unwrap();
                } else {
                    r.apply(Output::EndpointRemoved(ep.id)).unwrap();
                }
            });
            change_vs_bare(l, rounds, "one pod relabelled", &|r, fwd| {
                let c = if fwd { 1 } else { 0 };
                r.apply(Output::EndpointUpdated(endpoint(0, c))).unwrap();
            });
        }
    }
}
