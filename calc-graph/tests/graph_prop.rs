//! Property test: after any sequence of updates, the dataplane state built from the graph's
//! flushed outputs equals a brute-force computation from scratch, and no flushed batch ever
//! references a set, policy or profile that does not exist at that point.

mod support;

use std::collections::BTreeMap;

use calc_graph::graph::{CalcGraph, Update};
use calc_graph::model::{
    Action, EntityRule, Kind, Port, Protocol, Resource, ResourceKey, Rule, Tier, TierSpec,
};
use proptest::prelude::*;
use support::naive::expected;
use support::*;

const NODE: &str = "node1";
const SELECTORS: &[&str] = &[
    "app == 'a'",
    "app in {'a', 'b'}",
    "has(tier)",
    "!has(tier)",
    "app == 'a' && tier == 'x'",
    "app == 'b' || tier == 'y'",
    "all()",
    "pcns.team == 't1'",
    "app != 'a'",
    // Several keys, so that a change of one key must re-evaluate them and a change of a key
    // they do not test must not change their result.
    "app == 'a' && !has(tier)",
    "tier in {'x'} || pcns.team == 't1'",
    "has(app) && app != 'b' && pcns.team != 't0'",
];
const NAMESPACES: &[&str] = &["ns0", "ns1"];

#[derive(Debug, Clone)]
enum Op {
    Pod {
        idx: u8,
        ns: u8,
        local: bool,
        app: u8,
        tier: u8,
        port: u8,
        v6: bool,
    },
    DelPod {
        idx: u8,
        ns: u8,
    },
    Ns {
        ns: u8,
        team: u8,
    },
    DelNs {
        ns: u8,
    },
    /// A staged policy shadowing `p<idx>` (of its namespace, or the global one): Set with a
    /// selector and a deny or allow ingress rule, Delete, or deleted (`action` 0, 1, 2).
    Staged {
        idx: u8,
        ns: Option<u8>,
        sel: u8,
        order: u8,
        deny: bool,
        action: u8,
    },
    Policy {
        idx: u8,
        ns: Option<u8>,
        sel: u8,
        order: u8,
        sec: bool,
        rules: Vec<(bool, Option<u8>, u8, u8)>,
        egress: bool,
        /// A global policy's host-endpoint flags: 1 applyOnForward, 2 doNotTrack, 3 preDNAT
        /// (ingress policies only; else applyOnForward).
        flags: u8,
    },
    /// A host endpoint: of this node or another, on `eth0`, `eth1`, all interfaces (`*`) or
    /// none (addresses only); its labels and expected addresses change with `app`.
    Hep {
        idx: u8,
        local: bool,
        app: u8,
        iface: u8,
        profile: bool,
    },
    DelHep {
        idx: u8,
    },
    DelPolicy {
        idx: u8,
        ns: Option<u8>,
        sec: bool,
    },
    NetSet {
        idx: u8,
        ns: Option<u8>,
        app: u8,
        net: u8,
    },
    DelNetSet {
        idx: u8,
        ns: Option<u8>,
    },
    SecTier {
        present: bool,
        pass: bool,
    },
    Pool {
        idx: u8,
        net: u8,
        nat: bool,
        disabled: bool,
    },
    DelPool {
        idx: u8,
    },
    Flush,
    InSync,
}

fn op() -> impl Strategy<Value = Op> {
    let rule = (
        any::<bool>(),
        proptest::option::of(0..SELECTORS.len() as u8),
        0u8..3,
        0u8..4,
    );
    prop_oneof![
        6 => (0u8..6, 0u8..2, any::<bool>(), 0u8..3, 0u8..3, 0u8..3, any::<bool>())
            .prop_map(|(idx, ns, local, app, tier, port, v6)| Op::Pod { idx, ns, local, app, tier, port, v6 }),
        2 => (0u8..6, 0u8..2).prop_map(|(idx, ns)| Op::DelPod { idx, ns }),
        2 => (0u8..2, 0u8..2).prop_map(|(ns, team)| Op::Ns { ns, team }),
        1 => (0u8..2).prop_map(|ns| Op::DelNs { ns }),
        4 => (0u8..4, proptest::option::of(0u8..2), 0..SELECTORS.len() as u8, 0u8..3, any::<bool>(),
              proptest::collection::vec(rule, 0..3), any::<bool>(), 0u8..4)
            .prop_map(|(idx, ns, sel, order, sec, rules, egress, flags)| Op::Policy { idx, ns, sel, order, sec, rules, egress, flags }),
        3 => (0u8..4, proptest::option::of(0u8..2), 0..SELECTORS.len() as u8, 0u8..3, any::<bool>(), 0u8..3)
            .prop_map(|(idx, ns, sel, order, deny, action)| Op::Staged { idx, ns, sel, order, deny, action }),
        3 => (0u8..3, any::<bool>(), 0u8..3, 0u8..4, any::<bool>())
            .prop_map(|(idx, local, app, iface, profile)| Op::Hep { idx, local, app, iface, profile }),
        1 => (0u8..3).prop_map(|idx| Op::DelHep { idx }),
        2 => (0u8..4, proptest::option::of(0u8..2), any::<bool>()).prop_map(|(idx, ns, sec)| Op::DelPolicy { idx, ns, sec }),
        2 => (0u8..2, proptest::option::of(0u8..2), 0u8..3, 0u8..3)
            .prop_map(|(idx, ns, app, net)| Op::NetSet { idx, ns, app, net }),
        1 => (0u8..2, proptest::option::of(0u8..2)).prop_map(|(idx, ns)| Op::DelNetSet { idx, ns }),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(present, pass)| Op::SecTier { present, pass }),
        1 => (0u8..3, 0u8..3, any::<bool>(), any::<bool>())
            .prop_map(|(idx, net, nat, disabled)| Op::Pool { idx, net, nat, disabled }),
        1 => (0u8..3).prop_map(|idx| Op::DelPool { idx }),
        3 => Just(Op::Flush),
        1 => Just(Op::InSync),
    ]
}

/// `destination.domains` lists of generated rules (the empty one: no domains).
const DOMAIN_LISTS: &[&[&str]] = &[
    &[],
    &["example.com", "*.example.com"],
    &["*.Example.com.", "example.com"],
    &["bad..name"],
];

fn policy_name(idx: u8, sec: bool) -> String {
    if sec {
        format!("sec.p{idx}")
    } else {
        format!("p{idx}")
    }
}

fn to_update(op: &Op) -> Option<Update> {
    Some(match op.clone() {
        Op::Pod {
            idx,
            ns,
            local,
            app,
            tier,
            port,
            v6,
        } => {
            let ns = NAMESPACES[ns as usize];
            let mut l = Vec::new();
            if app > 0 {
                l.push(("app", ["", "a", "b"][app as usize]));
            }
            if tier > 0 {
                l.push(("tier", ["", "x", "y"][tier as usize]));
            }
            // Addresses are shared between pods on purpose (reference counting).
            let v4 = format!("10.0.0.{}/32", idx % 4 + 1);
            let v6a = format!("fd00::{}/128", idx % 3 + 1);
            let mut ips = vec![v4.as_str()];
            if v6 {
                ips.push(v6a.as_str());
            }
            let mut w = mk_wep_res(
                ns,
                &format!("pod{idx}"),
                if local { NODE } else { "node2" },
                &ips,
                &l,
            );
            // Allowed source prefixes come and go with the tier label (host bits set on purpose).
            if tier == 2 {
                w.spec.allow_spoofed_source_prefixes =
                    vec![format!("10.9.{idx}.5/24").parse().unwrap()];
            }
            if port > 0 {
                w.spec.ports.push(calc_graph::model::EndpointPort {
                    name: "http".into(),
                    protocol: if port == 1 {
                        Protocol::Tcp
                    } else {
                        Protocol::Udp
                    },
                    port: 8080,
                    host_port: None,
                    host_ip: None,
                });
            }
            upd(w)
        }
        Op::DelPod { idx, ns } => del(
            Kind::WorkloadEndpoint,
            Some(NAMESPACES[ns as usize]),
            &format!("pod{idx}"),
        ),
        Op::Ns { ns, team } => mk_ns_profile(
            NAMESPACES[ns as usize],
            &[("team", ["t1", "t2"][team as usize])],
        ),
        Op::DelNs { ns } => del(
            Kind::Profile,
            None,
            &format!("kns.{}", NAMESPACES[ns as usize]),
        ),
        Op::Policy {
            idx,
            ns,
            sel,
            order,
            sec,
            rules,
            egress,
            flags,
        } => {
            let rules: Vec<Rule> = rules
                .iter()
                .map(|&(allow, src, nssel, ports)| Rule {
                    protocol: (ports > 0).then_some(Protocol::Tcp),
                    source: EntityRule {
                        selector: src.map(|s| SELECTORS[s as usize].to_string()),
                        namespace_selector: match nssel {
                            1 => Some("team == 't1'".into()),
                            2 => Some("all()".into()),
                            _ => None,
                        },
                        ..EntityRule::default()
                    },
                    destination: EntityRule {
                        ports: match ports {
                            1 => vec![Port::Number(80)],
                            2 => vec![Port::Named("http".into())],
                            3 => vec![Port::Number(80), Port::Named("http".into())],
                            _ => vec![],
                        },
                        // Domain rules (FQDN policy): a rule with no source selector names one
                        // of a few lists (shared between rules and policies, some invalid, and
                        // in ingress or Deny rules failing safe), so domain sets come and go too.
                        domains: match (src, nssel) {
                            (None, 0) => DOMAIN_LISTS[ports as usize % DOMAIN_LISTS.len()]
                                .iter()
                                .map(|d| d.to_string())
                                .collect(),
                            _ => vec![],
                        },
                        ..EntityRule::default()
                    },
                    ..Rule::new(if allow { Action::Allow } else { Action::Deny })
                })
                .collect();
            let order = [None, Some(1.0), Some(2.0)][order as usize];
            let name = policy_name(idx, sec);
            let (ingress, egress_rules) = if egress {
                (vec![], rules)
            } else {
                (rules, vec![])
            };
            match ns {
                Some(ns) => {
                    let mut p = mk_np_res(
                        NAMESPACES[ns as usize],
                        &name,
                        SELECTORS[sel as usize],
                        ingress,
                    );
                    p.spec.egress = egress_rules;
                    p.spec.order = order;
                    p.spec.tier = sec.then(|| "sec".to_string());
                    upd(p)
                }
                None => {
                    let mut p =
                        mk_gnp_res(&name, SELECTORS[sel as usize], order, ingress, egress_rules);
                    p.spec.tier = sec.then(|| "sec".to_string());
                    p.spec.apply_on_forward = flags > 0;
                    p.spec.do_not_track = flags == 2;
                    p.spec.pre_dnat = flags == 3 && !egress;
                    if p.spec.pre_dnat {
                        p.spec.types = vec![calc_graph::model::PolicyType::Ingress];
                    }
                    upd(p)
                }
            }
        }
        Op::Staged {
            idx,
            ns,
            sel,
            order,
            deny,
            action,
        } => {
            use calc_graph::model::{
                StagedAction, StagedGlobalNetworkPolicy, StagedNetworkPolicy, StagedPolicySpec,
            };
            let name = policy_name(idx, false);
            let kind = match ns {
                Some(_) => Kind::StagedNetworkPolicy,
                None => Kind::StagedGlobalNetworkPolicy,
            };
            let ns = ns.map(|n| NAMESPACES[n as usize]);
            if action == 2 {
                return Some(del(kind, ns, &name));
            }
            let mut spec = StagedPolicySpec::default();
            if action == 0 {
                spec.staged_action = Some(StagedAction::Set);
                spec.policy.selector = Some(SELECTORS[sel as usize].to_string());
                spec.policy.order = Some(f64::from(order));
                spec.policy.types = vec![calc_graph::model::PolicyType::Ingress];
                spec.policy.ingress = vec![Rule::new(if deny {
                    calc_graph::model::Action::Deny
                } else {
                    calc_graph::model::Action::Allow
                })];
            } else {
                spec.staged_action = Some(StagedAction::Delete);
            }
            match ns {
                Some(ns) => upd(StagedNetworkPolicy {
                    metadata: calc_graph::model::Metadata::namespaced(ns, name),
                    spec,
                }),
                None => upd(StagedGlobalNetworkPolicy {
                    metadata: calc_graph::model::Metadata::named(name),
                    spec,
                }),
            }
        }
        Op::DelPolicy { idx, ns, sec } => match ns {
            Some(ns) => del(
                Kind::NetworkPolicy,
                Some(NAMESPACES[ns as usize]),
                &policy_name(idx, sec),
            ),
            None => del(Kind::GlobalNetworkPolicy, None, &policy_name(idx, sec)),
        },
        Op::NetSet { idx, ns, app, net } => {
            let nets = [["192.168.0.0/24"], ["0.0.0.0/0"], ["fd00:1::/64"]][net as usize];
            let l = [("app", ["a", "b", "c"][app as usize])];
            match ns {
                Some(ns) => mk_netset(NAMESPACES[ns as usize], &format!("set{idx}"), &nets, &l),
                None => upd(calc_graph::model::GlobalNetworkSet {
                    metadata: calc_graph::model::Metadata {
                        labels: labels(&l),
                        ..calc_graph::model::Metadata::named(format!("gset{idx}"))
                    },
                    spec: calc_graph::model::NetworkSetSpec {
                        nets: nets.iter().map(|n| net_of(n)).collect(),
                    },
                }),
            }
        }
        Op::DelNetSet { idx, ns } => match ns {
            Some(ns) => del(
                Kind::NetworkSet,
                Some(NAMESPACES[ns as usize]),
                &format!("set{idx}"),
            ),
            None => del(Kind::GlobalNetworkSet, None, &format!("gset{idx}")),
        },
        Op::Hep {
            idx,
            local,
            app,
            iface,
            profile,
        } => {
            let mut l = labels(&[("host", "yes")]);
            if app > 0 {
                l.insert("app".into(), ["", "a", "b"][app as usize].into());
            }
            let h = calc_graph::model::HostEndpoint {
                metadata: calc_graph::model::Metadata {
                    labels: l,
                    ..calc_graph::model::Metadata::named(format!("hep{idx}"))
                },
                spec: calc_graph::model::HostEndpointSpec {
                    node: Some(if local { NODE } else { "node2" }.into()),
                    interface_name: [Some("eth0"), Some("eth1"), Some("*"), None][iface as usize]
                        .map(str::to_string),
                    expected_ips: vec![format!("192.168.0.{}", app + 1).parse().unwrap()],
                    profiles: if profile {
                        vec![format!("kns.{}", NAMESPACES[0])]
                    } else {
                        vec![]
                    },
                    ..Default::default()
                },
            };
            upd(h)
        }
        Op::DelHep { idx } => del(Kind::HostEndpoint, None, &format!("hep{idx}")),
        Op::SecTier { present, pass } => {
            if present {
                upd(Tier {
                    metadata: calc_graph::model::Metadata::named("sec"),
                    spec: TierSpec {
                        order: Some(100.0),
                        default_action: Some(if pass { Action::Pass } else { Action::Deny }),
                    },
                })
            } else {
                del(Kind::Tier, None, "sec")
            }
        }
        Op::Pool {
            idx,
            net,
            nat,
            disabled,
        } => upd(calc_graph::model::IpPool {
            metadata: calc_graph::model::Metadata::named(format!("pool{idx}")),
            spec: calc_graph::model::IpPoolSpec {
                cidr: ["10.0.0.0/16", "10.1.0.0/16", "fd00::/64"][net as usize].into(),
                nat_outgoing: nat,
                disabled,
                ..Default::default()
            },
            status: None,
        }),
        Op::DelPool { idx } => del(Kind::IpPool, None, &format!("pool{idx}")),
        Op::Flush | Op::InSync => return None,
    })
}

fn net_of(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

fn run_ops(ops: &[Op], linger: (usize, usize), reoptimize: u64) -> Result<(), TestCaseError> {
    let mut g = CalcGraph::new(NODE);
    g.set_ip_set_lingering(linger.0, linger.1);
    g.set_reoptimize_min_changes(reoptimize);
    let mut dp = Dataplane::default();
    let mut state: BTreeMap<ResourceKey, Resource> = BTreeMap::new();
    let mut in_sync = false;
    let step =
        |g: &mut CalcGraph, dp: &mut Dataplane, in_sync: bool| -> Result<(), TestCaseError> {
            let out = g.flush();
            if !in_sync {
                prop_assert!(out.is_empty(), "output before in-sync: {out:?}");
            }
            dp.apply(&out).map_err(TestCaseError::fail)?;
            Ok(())
        };
    for op in ops {
        match op {
            Op::Flush => step(&mut g, &mut dp, in_sync)?,
            Op::InSync => {
                in_sync = true;
                g.apply(Update::InSync);
            }
            other => {
                let u = to_update(other).expect("resource op");
                if let Update::Resource { key, value } = &u {
                    match value {
                        Some(r) => state.insert(key.clone(), r.clone()),
                        None => state.remove(key),
                    };
                }
                g.apply(u);
            }
        }
    }
    g.apply(Update::InSync);
    step(&mut g, &mut dp, true)?;
    let errors = g.take_errors();
    prop_assert!(errors.is_empty(), "unexpected errors: {errors:?}");
    let want = expected(&state, NODE);
    prop_assert_eq!(&dp.sets, &want.sets);
    prop_assert_eq!(&dp.domains, &want.domains);
    prop_assert_eq!(&dp.policies, &want.policies);
    prop_assert_eq!(&dp.profiles, &want.profiles);
    prop_assert_eq!(&dp.endpoints, &want.endpoints);
    prop_assert_eq!(&dp.hosts, &want.hosts);
    // Every pool in the datastore, disabled or not, reaches the dataplane as it is now.
    let want_pools: BTreeMap<String, calc_graph::proto::IpPool> = state
        .values()
        .filter_map(|r| match r {
            Resource::IpPool(p) => Some((
                p.metadata.name.clone(),
                calc_graph::proto::IpPool {
                    name: p.metadata.name.clone(),
                    cidr: p.spec.cidr()?,
                    masquerade: p.spec.nat_outgoing,
                    load_balancer_only: false,
                },
            )),
            _ => None,
        })
        .collect();
    prop_assert_eq!(&dp.pools, &want_pools);
    let s = g.stats();
    prop_assert_eq!(s.ip_sets, want.sets.len());
    prop_assert_eq!(
        s.ip_set_members,
        want.sets.values().map(|(_, m)| m.len()).sum::<usize>()
    );
    prop_assert_eq!(s.active_policies, want.policies.len());
    prop_assert_eq!(s.local_endpoints, want.endpoints.len());
    prop_assert_eq!(s.local_host_endpoints, want.hosts.len());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn incremental_state_equals_brute_force(
        ops in proptest::collection::vec(op(), 1..60),
        linger in prop_oneof![Just((0usize, 0usize)), Just((1, 2)), Just((64, 100_000))],
        // Covers re-chosen almost every flush, or (default) never within a short run: matches
        // must not depend on them.
        reoptimize in prop_oneof![Just(1u64), Just(3), Just(1024)],
    ) {
        run_ops(&ops, linger, reoptimize)?;
    }
}

/// Deleting everything returns the dataplane to empty (every set/policy/profile is removed).
#[test]
fn tearing_down_everything_empties_the_dataplane() {
    let mut ops = Vec::new();
    for idx in 0..6 {
        ops.push(Op::Pod {
            idx,
            ns: idx % 2,
            local: idx % 3 == 0,
            app: idx % 3,
            tier: 1,
            port: 1,
            v6: true,
        });
    }
    ops.push(Op::Ns { ns: 0, team: 0 });
    for (i, sel) in [0u8, 2, 6].into_iter().enumerate() {
        ops.push(Op::Policy {
            idx: i as u8,
            ns: Some(0),
            sel,
            order: 1,
            sec: false,
            rules: vec![(true, Some(1), 1, 3)],
            egress: false,
            flags: 0,
        });
    }
    ops.push(Op::InSync);
    ops.push(Op::Flush);
    for idx in 0..6 {
        ops.push(Op::DelPod { idx, ns: idx % 2 });
    }
    ops.push(Op::Flush);
    for linger in [(0, 0), (1, 1), (64, 100_000)] {
        run_ops(&ops, linger, 1).unwrap();
    }
}
