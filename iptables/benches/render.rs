//! Renderer benchmark with fixed inputs (no criterion: a plain timed binary, `harness = false`).
//!
//! Scenario: 250 local endpoints x 2,000 active policies; each endpoint has 20 policies in 2 tiers
//! (10 ingress+egress each), policies have 3 rules each (selector set + ports, several CIDRs
//! (OR block), deny with negated CIDRs); 500 selector IP sets of 20 members.
//!
//! Run: `cargo bench -p iptables --bench render`
//!
//! Pod churn (issue 26): at 250 and 1,000 local endpoints, 200 pods added and 200 deleted (the
//! oldest), each with its address joining / leaving two selector IP sets; the renderer's cost per
//! add and per delete, and the dispatch tree's share: `DispatchTree::update` against the tree
//! rendered from scratch (`dispatch_chains`) for the same names.
//!
//! `RENDER_BENCH_ONLY=full|change|endpoint` runs one full render, takes its deltas, and then only
//! that scenario (`full`: none), printing nothing: for instruction counts (`valgrind
//! --tool=cachegrind --cache-sim=no`), where a scenario's cost is its run's count minus `full`'s.

use std::hint::black_box;
use std::time::{Duration, Instant};

use calc_graph::proto::*;
use iptables::render::{RenderConfig, Renderer};

const ENDPOINTS: usize = 250;
const POLICIES: usize = 2000;
const PER_ENDPOINT: usize = 20;
const SETS: usize = 500;

fn policy_id(i: usize) -> PolicyId {
    PolicyId {
        kind: PolicyKind::NetworkPolicy,
        tier: if i.is_multiple_of(2) {
            "security".into()
        } else {
            "default".into()
        },
        namespace: Some(format!("ns{}", i % 50)),
        name: format!("policy-{i}"),
    }
}

fn net(s: String) -> ipnet::IpNet {
    s.parse().unwrap()
}

fn policy(i: usize, variant: u16) -> ActivePolicy {
    let set = format!("s:set{:04}", i % SETS);
    let rules = vec![
        ParsedRule {
            action: Some(Action::Allow),
            protocol: Some(Protocol::Tcp),
            src_ip_set_ids: vec![set.clone()],
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
                net(format!("10.{}.0.0/16", i % 250)),
                net(format!("172.16.{}.0/24", i % 250)),
                net("fd00::/64".into()),
            ],
            dst_ports: vec![PortRange {
                first: 53,
                last: 53,
            }],
            ..Default::default()
        },
        ParsedRule {
            action: Some(Action::Deny),
            src_nets: vec![net("10.0.0.0/8".into())],
            not_src_nets: vec![
                net(format!("10.{}.0.0/16", i % 250)),
                net("10.255.0.0/16".into()),
            ],
            ..Default::default()
        },
    ];
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

fn endpoint(e: usize) -> LocalEndpoint {
    let pols: Vec<PolicyId> = (0..PER_ENDPOINT)
        .map(|k| policy_id((e * 8 + k) % POLICIES))
        .collect();
    let (sec, def): (Vec<_>, Vec<_>) = pols.into_iter().partition(|p| p.tier == "security");
    let tier = |name: &str, ps: Vec<PolicyId>, action| TierInfo {
        name: name.into(),
        default_action: action,
        ingress_policies: ps.clone(),
        egress_policies: ps,
    };
    LocalEndpoint {
        id: EndpointId {
            namespace: format!("ns{}", e % 50),
            name: format!("pod-{e}"),
        },
        interface_name: format!(
            "cali{:011x}",
            (e as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20
        ),
        ipv4_nets: vec![net(format!("10.65.{}.{}/32", e / 250, e % 250))],
        ipv6_nets: vec![net(format!("fd00::{e:x}/128"))],
        tiers: vec![
            tier("security", sec, Action::Pass),
            tier("default", def, Action::Deny),
        ],
        profile_ids: vec![
            format!("kns.ns{}", e % 50),
            format!("ksa.ns{}.default", e % 50),
        ],
        allow_spoofed_source_prefixes: vec![],
        staged_tiers: None,
    }
}

fn inputs() -> Vec<Output> {
    inputs_with(ENDPOINTS)
}

/// The scenario's outputs with `endpoints` local endpoints.
fn inputs_with(endpoints: usize) -> Vec<Output> {
    let mut out = Vec::new();
    for s in 0..SETS {
        let members = (0..20)
            .map(|m| IpSetMember::Net(net(format!("10.{}.{}.{}/32", s % 250, m, s / 250))))
            .chain([IpSetMember::Net(net(format!("fd00::{s:x}:1/128")))])
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
    for ns in 0..50 {
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
        out.push(Output::EndpointUpdated(endpoint(e)));
    }
    out.push(Output::InSync);
    out
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn rules_and_bytes(r: &Renderer, v: IpVersion) -> (usize, usize, usize) {
    let d = r.desired(v);
    let mut rules = 0;
    let mut bytes = 0;
    let mut chains = 0;
    for t in d.tables.values() {
        chains += t.chains.len();
        for rs in t.chains.values() {
            rules += rs.len();
            bytes += rs
                .iter()
                .map(|r| r.restore_spec().len() + 20)
                .sum::<usize>();
        }
    }
    (chains, rules, bytes)
}

fn main() {
    let inputs = inputs();

    // Full render from scratch: apply every output, flush, build both families' DesiredState.
    let mut full = Vec::new();
    let mut flush_only = Vec::new();
    let mut renderer = None;
    let only = std::env::var("RENDER_BENCH_ONLY").ok();
    let only = only.as_deref();
    let full_only = std::env::var_os("RENDER_BENCH_FULL_ONLY").is_some();
    let runs = if full_only || only.is_some() { 1 } else { 3 };
    for _ in 0..runs {
        let t = Instant::now();
        let mut r = Renderer::new(RenderConfig::default()).unwrap();
        let errs = r.apply_all(inputs.iter().cloned());
        assert!(errs.is_empty(), "{errs:?}");
        assert!(r.flush().is_empty());
        flush_only.push(t.elapsed());
        black_box(r.desired(IpVersion::V4));
        black_box(r.desired(IpVersion::V6));
        full.push(t.elapsed());
        renderer = Some(r);
    }
    let mut r = renderer.unwrap();
    if full_only {
        // For profiling the from-scratch path alone.
        return;
    }
    if let Some(scenario) = only {
        r.take_delta(IpVersion::V4);
        r.take_delta(IpVersion::V6);
        match scenario {
            "full" => {}
            "change" => {
                one_policy_change(&mut r);
            }
            "endpoint" => {
                new_endpoints(&mut r);
            }
            _ => panic!("RENDER_BENCH_ONLY={scenario}: expected full, change or endpoint"),
        }
        return;
    }
    let (c4, r4, b4) = rules_and_bytes(&r, IpVersion::V4);
    let (c6, r6, b6) = rules_and_bytes(&r, IpVersion::V6);
    println!(
        "full render ({ENDPOINTS} endpoints x {POLICIES} policies, {PER_ENDPOINT}/endpoint, 2 tiers): median {:?} over 3 runs",
        median(full.clone())
    );
    println!(
        "  of which apply+flush (render, hash, typed model + text): {:?}",
        median(flush_only)
    );
    // Floor: the unavoidable per-rule work of the format, i.e. SHA-224-chaining every rule's
    // text once (Felix's id algorithm) over the same number of rules and bytes.
    let mut floor = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for v in [IpVersion::V4, IpVersion::V6] {
            let d = r.desired(v);
            let t2 = Instant::now();
            for tbl in d.tables.values() {
                for (name, rs) in &tbl.chains {
                    black_box(iptables::render::hash::rule_hashes(
                        name,
                        rs.iter().map(|x| x.body()),
                    ));
                }
            }
            floor.push(t2.elapsed());
        }
        let _ = t;
    }
    let floor_total: Duration = median(floor.clone()) * 2;
    println!(
        "  floor (SHA-224 id chain over every rule body, both families): {floor_total:?}; full/floor = {:.1}x",
        median(full.clone()).as_secs_f64() / floor_total.as_secs_f64()
    );
    println!(
        "  v4: {c4} chains, {r4} rules, ~{} KiB restore text; v6: {c6} chains, {r6} rules, ~{} KiB",
        b4 / 1024,
        b6 / 1024
    );
    r.take_delta(IpVersion::V4);
    r.take_delta(IpVersion::V6);

    let (time, delta_chains, delta_rules, delta_bytes) = one_policy_change(&mut r);
    println!(
        "one-policy change (apply+flush+delta, both families): median {time:?} over 200; delta = {delta_chains} chains, {delta_rules} rules, ~{delta_bytes} bytes"
    );

    // The same change, then the full DesiredState of both families as the applier takes it
    // (`&DesiredState`): borrowed (maintained incrementally) and, for comparison, cloned.
    let mut borrowed = Vec::new();
    let mut cloned = Vec::new();
    for k in 0..200u16 {
        let t = Instant::now();
        r.apply(Output::PolicyUpdated(policy(9, k + 1))).unwrap();
        r.flush();
        black_box(r.desired_ref(IpVersion::V4));
        black_box(r.desired_ref(IpVersion::V6));
        borrowed.push(t.elapsed());
    }
    // Separately: freeing the clones makes glibc consolidate its heap on later allocations.
    for _ in 0..5 {
        let t = Instant::now();
        black_box(r.desired(IpVersion::V4));
        black_box(r.desired(IpVersion::V6));
        cloned.push(t.elapsed());
    }
    r.take_delta(IpVersion::V4);
    r.take_delta(IpVersion::V6);
    println!(
        "one-policy change + full state for the applier: desired_ref (borrow) median {:?} (200 runs); an owned desired() of both families instead costs {:?} (5 runs)",
        median(borrowed),
        median(cloned)
    );

    // A new endpoint (new pod): its chains + the dispatch chains.
    let (time, chains) = new_endpoints(&mut r);
    println!(
        "one new endpoint (apply+flush+delta): median {time:?} over 50; delta = {chains} chains"
    );
    drop(r);

    for n in [ENDPOINTS, 1000] {
        pod_churn(n);
    }
}

/// The two selector sets pod `e` joins.
fn pod_sets(e: usize) -> [IpSetId; 2] {
    [
        format!("s:set{:04}", e % SETS),
        format!("s:set{:04}", (e * 7 + 3) % SETS),
    ]
}

fn pod_members(e: usize) -> Vec<IpSetMember> {
    let ep = endpoint(e);
    (ep.ipv4_nets.into_iter().chain(ep.ipv6_nets))
        .map(IpSetMember::Net)
        .collect()
}

/// `n` endpoints, then 200 times: a new pod (its endpoint and its addresses in two sets) and the
/// oldest pod's removal, each apply + flush + both families' deltas; then the dispatch tree alone.
fn pod_churn(n: usize) {
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    assert!(r.apply_all(inputs_with(n)).is_empty());
    assert!(r.flush().is_empty());
    r.take_delta(IpVersion::V4);
    r.take_delta(IpVersion::V6);
    let (mut adds, mut deletes) = (Vec::new(), Vec::new());
    let mut add_chains = 0;
    let mut dispatch_chains_written = 0;
    for k in 0..200 {
        let e = n + k;
        let t = Instant::now();
        r.apply(Output::EndpointUpdated(endpoint(e))).unwrap();
        for id in pod_sets(e) {
            r.apply(Output::IpSetMembersAdded {
                id,
                members: pod_members(e),
            })
            .unwrap();
        }
        assert!(r.flush().is_empty());
        let d4 = r.take_delta(IpVersion::V4);
        let d6 = r.take_delta(IpVersion::V6);
        adds.push(t.elapsed());
        add_chains = d4.chains.len() + d6.chains.len();
        dispatch_chains_written = d4
            .chains
            .iter()
            .filter(|(_, name, _)| name.contains("-wl-dispatch"))
            .count();

        let t = Instant::now();
        r.apply(Output::EndpointRemoved(endpoint(k).id)).unwrap();
        for id in pod_sets(k) {
            r.apply(Output::IpSetMembersRemoved {
                id,
                members: pod_members(k),
            })
            .unwrap();
        }
        assert!(r.flush().is_empty());
        black_box(r.take_delta(IpVersion::V4));
        black_box(r.take_delta(IpVersion::V6));
        deletes.push(t.elapsed());
    }
    println!(
        "pod churn at {n} endpoints (apply+flush+delta, both families): add median {:?}, delete median {:?} over 200 each; an add's delta = {add_chains} chains ({dispatch_chains_written} of them dispatch, v4)",
        median(adds),
        median(deletes)
    );

    // The dispatch tree alone, per pod add: kept (`DispatchTree::update`) against from scratch.
    use iptables::render::dispatch::{DispatchTree, dispatch_chains};
    let names = |lo: usize, hi: usize| -> Vec<String> {
        let mut v: Vec<String> = (lo..hi).map(|e| endpoint(e).interface_name).collect();
        v.sort();
        v
    };
    let mut tree = DispatchTree::new(true);
    let first = names(0, n);
    tree.update(&first.iter().map(String::as_str).collect::<Vec<_>>());
    let (mut kept, mut scratch) = (Vec::new(), Vec::new());
    for k in 0..200 {
        let ifaces = names(k + 1, n + k + 1);
        let ifaces: Vec<&str> = ifaces.iter().map(String::as_str).collect();
        let t = Instant::now();
        black_box(tree.update(&ifaces));
        kept.push(t.elapsed());
        let t = Instant::now();
        black_box(dispatch_chains(&ifaces, true));
        scratch.push(t.elapsed());
    }
    println!(
        "  dispatch tree per churn step (one pod added, the oldest removed; one direction): kept {:?}, from scratch {:?} (medians over 200)",
        median(kept),
        median(scratch)
    );
}

/// One policy change, 200 times: apply + flush + both families' deltas. Returns the median and the
/// last delta's chains, rules and restore bytes.
fn one_policy_change(r: &mut Renderer) -> (Duration, usize, usize, usize) {
    let mut times = Vec::new();
    let mut delta_chains = 0;
    let mut delta_rules = 0;
    let mut delta_bytes = 0;
    for k in 0..200u16 {
        let t = Instant::now();
        r.apply(Output::PolicyUpdated(policy(7, k + 1))).unwrap();
        assert!(r.flush().is_empty());
        let d4 = r.take_delta(IpVersion::V4);
        let d6 = r.take_delta(IpVersion::V6);
        times.push(t.elapsed());
        delta_chains = d4.chains.len() + d6.chains.len();
        delta_rules = d4.rule_count() + d6.rule_count();
        delta_bytes = [d4, d6]
            .iter()
            .flat_map(|d| d.chains.iter())
            .flat_map(|(_, _, rs)| rs.iter().flatten())
            .map(|r| r.restore_spec().len() + 20)
            .sum::<usize>();
    }
    (median(times), delta_chains, delta_rules, delta_bytes)
}

/// 50 new endpoints (new pods), each: apply + flush + both families' deltas. Returns the median
/// and the last delta's chains.
fn new_endpoints(r: &mut Renderer) -> (Duration, usize) {
    let mut times = Vec::new();
    let mut chains = 0;
    for e in 0..50 {
        let t = Instant::now();
        let mut ep = endpoint(e);
        ep.id.name = format!("new-{e}");
        ep.interface_name = format!("calinew{e:08}");
        r.apply(Output::EndpointUpdated(ep)).unwrap();
        r.flush();
        let d4 = r.take_delta(IpVersion::V4);
        let d6 = r.take_delta(IpVersion::V6);
        times.push(t.elapsed());
        chains = d4.chains.len() + d6.chains.len();
    }
    (median(times), chains)
}
