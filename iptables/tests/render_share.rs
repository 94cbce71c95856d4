//! Shared endpoint policy chains (`cali-si-`/`cali-so-`) and the multi-level dispatch tree:
//! endpoints with the same tiers, policies and profiles share one chain; it exists exactly while
//! used; a relabel is a small delta; incremental rendering equals a from-scratch render; the
//! verdicts equal those of Felix's inlined layout; the dispatch tree stays shallow at 1,000
//! endpoints and an added pod rewrites only its branch.

mod render_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use calc_graph::proto::*;
use iptables::desired::{DesiredRule, IpSetSpec, TableName};
use iptables::model::{ChainName, Target};
use iptables::render::{RenderConfig, Renderer, dispatch, names, trace};
use proptest::prelude::*;
use render_support::*;

const F: TableName = TableName::Filter;
const POLICIES: usize = 8;
const COMBOS: usize = 6;

fn renderer(share_chains: bool) -> Renderer {
    Renderer::new(RenderConfig {
        share_chains,
        ..RenderConfig::default()
    })
    .unwrap()
}

fn pol_id(i: usize) -> PolicyId {
    mk_np("ns", &format!("p{i}"))
}

/// Policy `i`: allows TCP to port `1000 + i + variant` (both directions) from
/// `10.0.<i % 250>.0/24` (variant 0); from the /24s of `i` and its pair `i ^ 1` but not
/// `.1` of the lower one (variant 1: a positive list of two, the same in both policies of the
/// pair, beside one negated net); from its /24 but not its `.0/31` and `.2` (variant 2: a negated
/// list of two). In the shared layout variants 1 and 2 are `hash:net` set matches.
fn policy(i: usize, variant: u16) -> ActivePolicy {
    let low = (i & !1) % 250;
    let (src_nets, not_src_nets) = match variant {
        1 => (
            vec![
                net(&format!("10.0.{low}.0/24")),
                net(&format!("10.0.{}.0/24", low + 1)),
            ],
            vec![net(&format!("10.0.{low}.1/32"))],
        ),
        2 => (
            vec![net(&format!("10.0.{}.0/24", i % 250))],
            vec![
                net(&format!("10.0.{}.0/31", i % 250)),
                net(&format!("10.0.{}.2/32", i % 250)),
            ],
        ),
        _ => (vec![net(&format!("10.0.{}.0/24", i % 250))], vec![]),
    };
    let rule = ParsedRule {
        action: Some(Action::Allow),
        protocol: Some(Protocol::Tcp),
        src_nets,
        not_src_nets,
        dst_ports: vec![PortRange {
            first: 1000 + i as u16 + variant,
            last: 1000 + i as u16 + variant,
        }],
        ..Default::default()
    };
    mk_policy(pol_id(i), vec![rule.clone()], vec![rule])
}

/// Combination `c`: a Pass-default tier and a Deny-default tier drawn from the pool, and a
/// profile; different `c` give different tiers (and so different shared chains).
fn combo(c: usize) -> (Vec<TierInfo>, Vec<String>) {
    let p = |k: usize| pol_id(k % POLICIES);
    let sec = TierInfo {
        name: "security".into(),
        default_action: Action::Pass,
        ingress_policies: vec![p(c)],
        egress_policies: if c.is_multiple_of(3) {
            vec![]
        } else {
            vec![p(c + 1)]
        },
    };
    let def = TierInfo {
        name: "default".into(),
        default_action: Action::Deny,
        ingress_policies: vec![p(c * 3 + 2), p(c + 5)],
        egress_policies: if c.is_multiple_of(2) {
            vec![p(c + 3)]
        } else {
            vec![]
        },
    };
    (vec![sec, def], vec![format!("kns.ns{}", c % 2)])
}

fn iface(e: usize) -> String {
    format!("cali{e:04}")
}

fn endpoint(e: usize, c: usize) -> LocalEndpoint {
    let (tiers, profiles) = combo(c);
    let refs: Vec<&str> = profiles.iter().map(String::as_str).collect();
    mk_endpoint(
        "ns",
        &format!("pod{e}"),
        &iface(e),
        &[&format!("10.65.{}.{}/32", e / 250, e % 250)],
        tiers,
        &refs,
    )
}

/// Host endpoint `h` on one of a few interfaces (`*` among them; several endpoints may name the
/// same one), with combination `c`'s tiers and profiles; odd combinations also as forward tiers.
fn host_endpoint(h: usize, iface: usize, c: usize) -> LocalHostEndpoint {
    let (tiers, profiles) = combo(c);
    let refs: Vec<&str> = profiles.iter().map(String::as_str).collect();
    let forward = if c % 2 == 1 { tiers.clone() } else { vec![] };
    mk_host_endpoint(
        &format!("hep{h}"),
        ["eth0", "eth1", "*"][iface],
        tiers,
        forward,
        &refs,
    )
}

fn ep_id(e: usize) -> EndpointId {
    EndpointId {
        namespace: "ns".into(),
        name: format!("pod{e}"),
    }
}

fn base_outputs(variants: &[u16]) -> Vec<Output> {
    let mut out: Vec<Output> = (0..POLICIES)
        .map(|i| Output::PolicyUpdated(policy(i, variants[i])))
        .collect();
    for ns in 0..2 {
        out.push(Output::ProfileUpdated(mk_profile(
            &format!("kns.ns{ns}"),
            vec![],
            vec![mk_allow()],
        )));
    }
    out
}

fn filter_rules(r: &Renderer, v: IpVersion) -> usize {
    r.chain_names(v, F)
        .iter()
        .map(|n| r.chain(v, F, n).unwrap().len())
        .sum()
}

fn changed(r: &mut Renderer, v: IpVersion) -> BTreeSet<String> {
    r.take_delta(v)
        .chains
        .into_iter()
        .map(|(_, n, _)| n)
        .collect()
}

/// Every jump or goto names a chain that exists, and every shared chain is gone to by at least
/// one endpoint chain (created before first use, deleted after last use), in both families.
fn check_references(r: &Renderer) -> Result<(), TestCaseError> {
    for v in [IpVersion::V4, IpVersion::V6] {
        let chains: BTreeSet<&str> = r.chain_names(v, F).into_iter().collect();
        let mut gone_to = BTreeSet::new();
        for name in &chains {
            for rule in r.chain(v, F, name).unwrap() {
                if let Some(Target::Jump(t) | Target::Goto(t)) = &rule.target {
                    prop_assert!(chains.contains(t.as_str()), "{name} -> missing {t}");
                    if names::is_shared_chain(t.as_str()) {
                        prop_assert!(
                            name.starts_with("cali-tw-") || name.starts_with("cali-fw-"),
                            "{name} -> {t}"
                        );
                        gone_to.insert(t.as_str().to_string());
                    }
                }
            }
        }
        let shared: BTreeSet<String> = chains
            .iter()
            .filter(|n| names::is_shared_chain(n))
            .map(|n| n.to_string())
            .collect();
        prop_assert_eq!(&shared, &gone_to, "unused or missing shared chains");
        prop_assert_eq!(shared.len(), r.shared_chain_count());
        for s in &shared {
            prop_assert!(s.len() <= names::MAX_CHAIN_NAME_LEN, "{}", s);
        }
        // The IP sets of the desired state are exactly those the chains name (the net sets of
        // the shared layout: declared with the first chain naming them, gone with the last).
        let named: BTreeSet<String> = (chains.iter())
            .flat_map(|c| r.chain(v, F, c).unwrap())
            .flat_map(|rule| rule.matches.iter().filter_map(|m| m.set_name()))
            .map(str::to_string)
            .collect();
        let declared: BTreeSet<String> = r.desired_ref(v).ip_sets.keys().cloned().collect();
        prop_assert_eq!(&named, &declared, "sets named by chains vs declared");
        for s in &named {
            prop_assert!(s.len() <= names::MAX_IPSET_NAME_LEN, "{}", s);
        }
    }
    Ok(())
}

#[test]
fn endpoints_with_the_same_policies_share_one_chain_per_direction() {
    // 250 endpoints in 25 combinations of 20 policies each out of 2,000 (the node).
    let pols = |c: usize| -> Vec<PolicyId> { (0..20).map(|k| pol_id(c * 80 + k)).collect() };
    let mut outputs: Vec<Output> = (0..2000)
        .map(|i| Output::PolicyUpdated(policy(i, 0)))
        .collect();
    outputs.push(Output::ProfileUpdated(mk_profile(
        "kns.ns0",
        vec![],
        vec![mk_allow()],
    )));
    for e in 0..250 {
        let c = e % 25;
        let tiers = vec![mk_tier("default", pols(c), pols(c))];
        let mut ep = mk_endpoint(
            "ns",
            &format!("pod{e}"),
            &iface(e),
            &[],
            tiers,
            &["kns.ns0"],
        );
        ep.ipv4_nets = vec![net(&format!("10.65.{}.{}/32", e / 250, e % 250))];
        outputs.push(Output::EndpointUpdated(ep));
    }
    let mut shared = renderer(true);
    let mut inlined = renderer(false);
    for r in [&mut shared, &mut inlined] {
        assert!(r.apply_all(outputs.clone()).is_empty());
        assert!(r.flush().is_empty());
    }
    assert_eq!(
        shared.shared_chain_count(),
        50,
        "25 combinations x 2 directions"
    );
    for e in 0..250 {
        for ingress in [true, false] {
            let name = shared.shared_chain(&ep_id(e), ingress).unwrap();
            assert_eq!(shared.shared_chain_users(name), 10);
            // Its own chain: the goto.
            let own = names::endpoint_chain_name(&iface(e), ingress);
            let rules = shared.chain(IpVersion::V4, F, &own).unwrap();
            assert_eq!(rules.len(), 1);
            assert_eq!(
                rules.last().unwrap().target,
                Some(Target::Goto(ChainName::new(name).unwrap()))
            );
        }
    }
    // The same endpoints and policies, five times fewer rules or better in the kernel.
    let (s, i) = (
        filter_rules(&shared, IpVersion::V4),
        filter_rules(&inlined, IpVersion::V4),
    );
    assert!(s * 5 <= i, "shared {s} rules vs inlined {i}");
}

#[test]
fn a_relabel_into_an_existing_combination_rewrites_only_the_pods_chains() {
    let mut r = renderer(true);
    let mut outputs = base_outputs(&[0; POLICIES]);
    for e in 0..12 {
        outputs.push(Output::EndpointUpdated(endpoint(e, e % 4)));
    }
    assert!(r.apply_all(outputs).is_empty());
    assert!(r.flush().is_empty());
    r.take_delta(IpVersion::V4);
    r.take_delta(IpVersion::V6);
    let before = r.shared_chain_count();
    // pod0 moves from combination 0 to 1, which pods 1, 5 and 9 already use.
    r.apply(Output::EndpointUpdated(endpoint(0, 1))).unwrap();
    assert!(r.flush().is_empty());
    for v in [IpVersion::V4, IpVersion::V6] {
        let d = r.take_delta(v);
        let names: BTreeSet<&str> = d.chains.iter().map(|(_, n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            BTreeSet::from(["cali-fw-cali0000", "cali-tw-cali0000"])
        );
        assert!(d.chains.iter().all(|(_, _, rules)| rules.is_some()));
        assert_eq!(d.rule_count(), 2, "one goto per direction");
        assert!(d.ip_sets.is_empty());
    }
    assert_eq!(r.shared_chain_count(), before);
    assert_eq!(
        r.shared_chain(&ep_id(0), true),
        r.shared_chain(&ep_id(1), true)
    );
    check_references(&r).unwrap();
}

#[test]
fn a_new_combination_creates_its_chain_in_the_same_delta_and_the_last_user_deletes_it() {
    let mut r = renderer(true);
    let mut outputs = base_outputs(&[0; POLICIES]);
    outputs.push(Output::EndpointUpdated(endpoint(0, 0)));
    outputs.push(Output::EndpointUpdated(endpoint(1, 0)));
    assert!(r.apply_all(outputs).is_empty());
    assert!(r.flush().is_empty());
    r.take_delta(IpVersion::V4);
    let old = [true, false].map(|i| r.shared_chain(&ep_id(0), i).unwrap().to_string());
    // pod0 alone takes combination 5: its chains appear with pod0's new chains.
    r.apply(Output::EndpointUpdated(endpoint(0, 5))).unwrap();
    assert!(r.flush().is_empty());
    let new = [true, false].map(|i| r.shared_chain(&ep_id(0), i).unwrap().to_string());
    let d = changed(&mut r, IpVersion::V4);
    for n in &new {
        assert!(d.contains(n), "{n} not created with its first user: {d:?}");
        assert_eq!(r.shared_chain_users(n), 1);
    }
    // pod1 still uses the old ones: they stay, untouched.
    for n in &old {
        assert!(!d.contains(n), "{n} rewritten: {d:?}");
        assert_eq!(r.shared_chain_users(n), 1);
    }
    // pod1 leaves: the old chains go in the same delta as its own chains.
    r.apply(Output::EndpointRemoved(ep_id(1))).unwrap();
    assert!(r.flush().is_empty());
    let d = r.take_delta(IpVersion::V4);
    for n in &old {
        assert!(
            d.chains
                .iter()
                .any(|(_, c, rules)| c == n && rules.is_none())
        );
        assert!(r.chain(IpVersion::V4, F, n).is_none());
    }
    check_references(&r).unwrap();
}

#[test]
fn shared_chain_comments_name_the_policies_and_profiles() {
    let mut r = renderer(true);
    let mut outputs = base_outputs(&[0; POLICIES]);
    outputs.push(Output::EndpointUpdated(endpoint(0, 2)));
    assert!(r.apply_all(outputs).is_empty());
    assert!(r.flush().is_empty());
    let name = r.shared_chain(&ep_id(0), true).unwrap();
    let comments: Vec<&str> = r
        .chain(IpVersion::V4, F, name)
        .unwrap()
        .iter()
        .flat_map(|rule| rule.comments())
        .collect();
    // combination 2, ingress: security p2; default p0 (2*3+2 = 8) and p7; profile kns.ns0.
    for want in [
        "Start of tier security",
        "NetworkPolicy ns/p2",
        "NetworkPolicy ns/p0",
        "NetworkPolicy ns/p7",
        "Profile kns.ns0",
    ] {
        assert!(comments.contains(&want), "{want}: {comments:?}");
    }
}

fn verdict(r: &Renderer, e: usize, src: IpAddr, dport: u16) -> (trace::Outcome, bool) {
    let dst: IpAddr = format!("10.65.0.{e}").parse().unwrap();
    let mut p = trace::Packet::new(src, dst, 6, 40000, dport);
    p.in_iface = "eth0".into();
    p.out_iface = iface(e);
    let rules = trace::RendererRules {
        renderer: r,
        version: IpVersion::V4,
        table: F,
    };
    let t = trace::trace(&rules, dispatch::TO_WL_DISPATCH, &p).expect("traceable");
    (t.outcome, t.mark & r.marks().accept != 0)
}

#[derive(Debug, Clone)]
enum Op {
    Upsert {
        ep: usize,
        combo: usize,
    },
    Remove {
        ep: usize,
    },
    Host {
        h: usize,
        iface: usize,
        combo: usize,
    },
    RemoveHost {
        h: usize,
    },
    Policy {
        p: usize,
        variant: u16,
    },
    Flush,
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..8usize, 0..COMBOS).prop_map(|(ep, combo)| Op::Upsert { ep, combo }),
        1 => (0..8usize).prop_map(|ep| Op::Remove { ep }),
        1 => (0..3usize, 0..3usize, 0..COMBOS).prop_map(|(h, iface, combo)| Op::Host { h, iface, combo }),
        1 => (0..3usize).prop_map(|h| Op::RemoveHost { h }),
        1 => (0..POLICIES, 0..3u16).prop_map(|(p, variant)| Op::Policy { p, variant }),
        2 => Just(Op::Flush),
    ]
}

type Chains = BTreeMap<(TableName, String), Vec<DesiredRule>>;
type Sets = BTreeMap<String, IpSetSpec>;

fn replay(model: &mut (Chains, Sets), r: &mut Renderer, v: IpVersion) {
    let delta = r.take_delta(v);
    for (t, n, rules) in delta.chains {
        match rules {
            Some(rules) => model.0.insert((t, n), rules),
            None => model.0.remove(&(t, n)),
        };
    }
    for (name, spec) in delta.ip_sets {
        match spec {
            Some(spec) => model.1.insert(name, spec),
            None => model.1.remove(&name),
        };
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any sequence of endpoint moves, removals, host endpoint changes and policy changes,
    /// flushed at any points:
    /// shared chains are created before and deleted after their users at every flush; the
    /// incremental state equals a from-scratch render of the final inputs, and so does the sum
    /// of the deltas; and every endpoint gets the same verdicts as with Felix's inlined chains.
    #[test]
    fn incremental_sharing_equals_from_scratch_and_inlined_verdicts(
        ops in prop::collection::vec(arb_op(), 1..40),
        packets in prop::collection::vec((0..POLICIES as u8, 0..4u8, 1000..1012u16), 12),
    ) {
        let mut variants = [0u16; POLICIES];
        let mut eps: BTreeMap<usize, usize> = BTreeMap::new();
        let mut hosts: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
        let mut r = renderer(true);
        let mut models: [(Chains, Sets); 2] = Default::default();
        prop_assert!(r.apply_all(base_outputs(&variants)).is_empty());
        for op in ops.iter().chain([&Op::Flush]) {
            match *op {
                Op::Upsert { ep, combo } => {
                    eps.insert(ep, combo);
                    r.apply(Output::EndpointUpdated(endpoint(ep, combo))).unwrap();
                }
                Op::Remove { ep } => {
                    eps.remove(&ep);
                    r.apply(Output::EndpointRemoved(ep_id(ep))).unwrap();
                }
                Op::Host { h, iface, combo } => {
                    hosts.insert(h, (iface, combo));
                    r.apply(Output::HostEndpointUpdated(host_endpoint(h, iface, combo))).unwrap();
                }
                Op::RemoveHost { h } => {
                    hosts.remove(&h);
                    r.apply(Output::HostEndpointRemoved(format!("hep{h}"))).unwrap();
                }
                Op::Policy { p, variant } => {
                    variants[p] = variant;
                    r.apply(Output::PolicyUpdated(policy(p, variant))).unwrap();
                }
                Op::Flush => {
                    prop_assert!(r.flush().is_empty());
                    check_references(&r)?;
                    for (i, v) in [IpVersion::V4, IpVersion::V6].into_iter().enumerate() {
                        replay(&mut models[i], &mut r, v);
                    }
                }
            }
        }
        let state: Vec<Output> = base_outputs(&variants)
            .into_iter()
            .chain(eps.iter().map(|(&e, &c)| Output::EndpointUpdated(endpoint(e, c))))
            .chain(
                hosts
                    .iter()
                    .map(|(&h, &(i, c))| Output::HostEndpointUpdated(host_endpoint(h, i, c))),
            )
            .collect();
        let mut scratch = renderer(true);
        let mut inlined = renderer(false);
        for s in [&mut scratch, &mut inlined] {
            prop_assert!(s.apply_all(state.clone()).is_empty());
            prop_assert!(s.flush().is_empty());
        }
        for (i, v) in [IpVersion::V4, IpVersion::V6].into_iter().enumerate() {
            prop_assert_eq!(r.desired(v), scratch.desired(v));
            let from_deltas: Chains = r
                .desired(v)
                .tables
                .iter()
                .flat_map(|(t, tb)| tb.chains.iter().map(|(n, c)| ((*t, n.clone()), c.clone())))
                .collect();
            prop_assert_eq!(&models[i].0, &from_deltas);
            prop_assert_eq!(&models[i].1, &r.desired(v).ip_sets);
        }
        for &e in eps.keys() {
            for &(net, host, port) in &packets {
                let src: IpAddr = format!("10.0.{net}.{host}").parse().unwrap();
                prop_assert_eq!(
                    verdict(&r, e, src, port),
                    verdict(&inlined, e, src, port),
                    "pod{} from {} port {}", e, src, port
                );
            }
        }
    }
}

/// The dispatch chain names of both directions with their rules.
fn dispatch_chains(r: &Renderer) -> BTreeMap<String, usize> {
    r.chain_names(IpVersion::V4, F)
        .into_iter()
        .filter(|n| {
            n.starts_with(dispatch::FROM_WL_DISPATCH) || n.starts_with(dispatch::TO_WL_DISPATCH)
        })
        .map(|n| (n.to_string(), r.chain(IpVersion::V4, F, n).unwrap().len()))
        .collect()
}

#[test]
fn the_dispatch_tree_stays_shallow_at_1000_endpoints_and_an_add_rewrites_one_branch() {
    // Felix-like veth names: `cali` + 11 hex digits.
    let veth = |e: u64| format!("cali{:011x}", e.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20);
    let mut r = renderer(true);
    let mut outputs = base_outputs(&[0; POLICIES]);
    for e in 0..1000u64 {
        let mut ep = endpoint(e as usize, e as usize % COMBOS);
        ep.interface_name = veth(e);
        outputs.push(Output::EndpointUpdated(ep));
    }
    assert!(r.apply_all(outputs).is_empty());
    assert!(r.flush().is_empty());
    let tree = dispatch_chains(&r);
    // No chain of the tree holds more than one rule per character of the alphabet or
    // MAX_LEAF gotos, plus the drop.
    for (name, len) in &tree {
        assert!(
            *len <= dispatch::MAX_LEAF.max(16) + 1,
            "{name}: {len} rules: {:?}",
            r.chain(IpVersion::V4, F, name)
        );
        assert!(name.len() <= names::MAX_CHAIN_NAME_LEN, "{name}");
    }
    // Every interface is reached, through at most 3 dispatch chains, and an unknown one with
    // the same prefix is dropped.
    let mut deepest = 0;
    for e in (0..1000u64).step_by(7) {
        let mut p = trace::Packet::new(
            "10.0.0.1".parse().unwrap(),
            "10.65.0.1".parse().unwrap(),
            6,
            40000,
            80,
        );
        p.in_iface = "eth0".into();
        p.out_iface = veth(e);
        let rules = trace::RendererRules {
            renderer: &r,
            version: IpVersion::V4,
            table: F,
        };
        let t = trace::trace(&rules, dispatch::TO_WL_DISPATCH, &p).unwrap();
        let via: Vec<&str> = t
            .steps
            .iter()
            .map(|s| s.chain.as_str())
            .filter(|c| c.starts_with(dispatch::TO_WL_DISPATCH))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        assert!(
            t.steps
                .iter()
                .any(|s| s.chain == names::endpoint_chain_name(&veth(e), true)),
            "{} never reached its chain",
            veth(e)
        );
        deepest = deepest.max(via.len());
        p.out_iface = format!("{}z", &veth(e)[..14]);
        let t = trace::trace(&rules, dispatch::TO_WL_DISPATCH, &p).unwrap();
        assert_eq!(t.outcome, trace::Outcome::Drop, "unknown {}", p.out_iface);
    }
    assert!((2..=3).contains(&deepest), "depth {deepest}");
    // One more pod: only the chains on its path change, a few dozen rules, not a thousand.
    r.take_delta(IpVersion::V4);
    let mut ep = endpoint(1000, 0);
    ep.interface_name = veth(1000);
    r.apply(Output::EndpointUpdated(ep)).unwrap();
    assert!(r.flush().is_empty());
    let d = r.take_delta(IpVersion::V4);
    let dispatch_changes: Vec<_> = d
        .chains
        .iter()
        .filter(|(_, n, _)| n.contains("-wl-dispatch"))
        .collect();
    assert!(
        (2..=6).contains(&dispatch_changes.len()),
        "{:?}",
        dispatch_changes.iter().map(|c| &c.1).collect::<Vec<_>>()
    );
    let rules: usize = dispatch_changes
        .iter()
        .filter_map(|(_, _, r)| r.as_ref().map(Vec::len))
        .sum();
    assert!(rules <= 6 * 17, "{rules} dispatch rules rewritten");
}
