//! CIDR lists as content-addressed `hash:net` sets (issue 13, shared layout): a rule's multi-net
//! `nets` or its `notNets` beside another net is one `-m set` match instead of a scratch-mark OR
//! block; equal lists share one set; the set is declared while a chain names it and goes with
//! the last; `share_chains: false` keeps Felix's blocks.

mod render_support;

use std::collections::BTreeSet;
use std::sync::Arc;

use calc_graph::proto::*;
use ipnet::IpNet;
use iptables::desired::{IpSetSpec, TableName};
use iptables::model::{Match, SetDir, Target};
use iptables::render::build::Rule;
use iptables::render::{RenderConfig, Renderer, names};
use render_support::*;

const F: TableName = TableName::Filter;

fn renderer(share_chains: bool) -> Renderer {
    Renderer::new(RenderConfig {
        share_chains,
        ..RenderConfig::default()
    })
    .unwrap()
}

/// The share bench's heavy policy, rules 1 and 2 (with an IPv6 list of two in rule 1 too, so
/// both families get a set): UDP 53 from a list; Deny from 10/8 except a list.
fn heavy_rules(i: usize) -> Vec<ParsedRule> {
    vec![
        ParsedRule {
            action: Some(Action::Allow),
            protocol: Some(Protocol::Udp),
            src_nets: vec![
                net(&format!("10.{i}.0.0/16")),
                net(&format!("172.16.{i}.0/24")),
                net("fd00::/64"),
                net(&format!("fd00:{i:x}::/64")),
            ],
            dst_ports: ports(&[(53, 53)]),
            ..Default::default()
        },
        ParsedRule {
            action: Some(Action::Deny),
            src_nets: vec![net("10.0.0.0/8"), net("fd00::/16")],
            not_src_nets: vec![
                net(&format!("10.{i}.0.0/16")),
                net("10.255.0.0/16"),
                net(&format!("fd00:{i:x}::/64")),
                net("fd00:ff::/64"),
            ],
            ..Default::default()
        },
    ]
}

/// The same rules with one net per list: what Felix renders without any OR block.
fn single_net_rules(i: usize) -> Vec<ParsedRule> {
    let mut r = heavy_rules(i);
    r[0].src_nets = vec![net(&format!("10.{i}.0.0/16")), net("fd00::/64")];
    r[1].not_src_nets.clear();
    r
}

fn policy(name: &str, rules: Vec<ParsedRule>) -> ActivePolicy {
    mk_policy(mk_np("ns", name), rules, vec![])
}

fn endpoint(name: &str, iface: &str, policies: &[&str]) -> LocalEndpoint {
    let ids = policies.iter().map(|p| mk_np("ns", p)).collect();
    let mut ep = mk_endpoint(
        "ns",
        name,
        iface,
        &["10.65.0.1/32"],
        vec![mk_tier("default", ids, vec![])],
        &[],
    );
    ep.ipv6_nets = vec![net("fd10::1/128")];
    ep
}

fn rendered(share_chains: bool, policies: Vec<ActivePolicy>, eps: Vec<LocalEndpoint>) -> Renderer {
    let mut r = renderer(share_chains);
    let outputs = (policies.into_iter().map(Output::PolicyUpdated))
        .chain(eps.into_iter().map(Output::EndpointUpdated));
    assert!(r.apply_all(outputs).is_empty());
    assert!(r.flush().is_empty());
    r
}

fn policy_chain<'a>(r: &'a Renderer, v: IpVersion, name: &str) -> &'a [Rule] {
    r.chain(v, F, &names::policy_chain_name(&mk_np("ns", name), true))
        .unwrap()
}

/// A rule's match on a net set: its name, side, the set's members and negation.
struct NetSetMatch<'a> {
    name: &'a String,
    side: SetDir,
    nets: &'a Arc<[IpNet]>,
    negated: bool,
}

fn net_sets(rule: &Rule) -> Vec<NetSetMatch<'_>> {
    (rule.net_sets().iter())
        .flat_map(|(name, nets)| {
            rule.matches.iter().filter_map(move |m| match m {
                Match::Set {
                    name: n,
                    dirs,
                    negated,
                } if n.as_str() == name => Some(NetSetMatch {
                    name,
                    side: dirs[0],
                    nets,
                    negated: *negated,
                }),
                _ => None,
            })
        })
        .collect()
}

/// Rules that only set or clear the scratch bits: the OR-block scaffolding.
fn scratch_rules(r: &Renderer, rules: &[Rule]) -> usize {
    let scratch = r.marks().scratch0 | r.marks().scratch1;
    (rules.iter())
        .filter(|rule| match rule.target {
            Some(Target::Mark { mask, .. }) => mask & !scratch == 0,
            _ => false,
        })
        .count()
}

#[test]
fn heavy_rules_render_as_one_rule_each_with_a_set_in_both_families() {
    let r = rendered(
        true,
        vec![
            policy("heavy", heavy_rules(7)),
            policy("single", single_net_rules(7)),
        ],
        vec![endpoint("a", "cali0", &["heavy", "single"])],
    );
    for v in [IpVersion::V4, IpVersion::V6] {
        let chain = policy_chain(&r, v, "heavy");
        let single = policy_chain(&r, v, "single");
        // As many rules as Felix's rendering of one net per list: no block, only the actions.
        assert_eq!(chain.len(), single.len(), "{v:?}: {chain:#?}");
        assert_eq!(scratch_rules(&r, chain), 0, "{v:?}: {chain:#?}");
        let with_sets: Vec<&Rule> = chain.iter().filter(|x| !net_sets(x).is_empty()).collect();
        assert_eq!(with_sets.len(), 2, "{v:?}: one set rule per Calico rule");
        let d = r.desired_ref(v);
        let (fam, prefix) = match v {
            IpVersion::V4 => (["10.7.0.0/16", "172.16.7.0/24"], "cali40c:"),
            IpVersion::V6 => (["fd00::/64", "fd00:7::/64"], "cali60c:"),
        };
        let (neg_fam, single_net) = match v {
            IpVersion::V4 => (["10.7.0.0/16", "10.255.0.0/16"], "-s 10.0.0.0/8"),
            IpVersion::V6 => (["fd00:7::/64", "fd00:ff::/64"], "-s fd00::/16"),
        };
        for (rule, want, negated) in [(with_sets[0], fam, false), (with_sets[1], neg_fam, true)] {
            let [
                NetSetMatch {
                    name,
                    side,
                    nets,
                    negated: n,
                },
            ] = &net_sets(rule)[..]
            else {
                panic!("one set match: {rule:?}");
            };
            assert!(
                name.starts_with(prefix) && name.len() <= names::MAX_IPSET_NAME_LEN,
                "{name}"
            );
            assert_eq!((*side, *n), (SetDir::Src, negated));
            let want: BTreeSet<IpSetMember> =
                want.iter().map(|s| IpSetMember::Net(net(s))).collect();
            assert_eq!(
                nets.iter()
                    .map(|n| IpSetMember::Net(*n))
                    .collect::<BTreeSet<_>>(),
                want
            );
            // The kernel set holds exactly those nets, and the rule reads it as iptables-save prints.
            assert_eq!(d.ip_sets[*name], IpSetSpec::new(IpSetKind::Net, want));
            let body = (d.tables[&F].chains.values().flatten())
                .map(|x| x.body().to_string())
                .find(|b| b.contains(name.as_str()))
                .unwrap();
            let not = if negated { "! " } else { "" };
            assert!(
                body.contains(&format!("-m set {not}--match-set {name} src")),
                "{body}"
            );
            if negated {
                // Rule 2: `-s <the one positive net>` stays, and comes first.
                assert!(body.starts_with(single_net), "{body}");
            }
        }
        // Felix's text (the `cali:` hash input) is that of a plain set match (after the chain's
        // comment, which the first rule carries).
        let text = with_sets[0].felix_text();
        assert!(
            text.contains(&format!("\" -p udp -m set --match-set {prefix}")),
            "{text}"
        );
        assert_parses_back(&r, v);
    }
}

#[test]
fn inlined_layout_keeps_felixs_or_blocks() {
    let r = rendered(
        false,
        vec![policy("heavy", heavy_rules(7))],
        vec![endpoint("a", "cali0", &["heavy"])],
    );
    let marks = *r.marks();
    let (ab, scratch) = (marks.scratch0, marks.scratch0 | marks.scratch1);
    let chain = policy_chain(&r, IpVersion::V4, "heavy");
    let text: Vec<&str> = chain.iter().map(Rule::felix_text).collect();
    let hex = |v: u32| format!("{v:#x}");
    // Rule 1's block (two nets) and rule 2's negated block, as Felix writes them.
    let rule1 = [
        format!("--jump MARK --set-mark 0x0/{}", hex(scratch)),
        format!(
            "--source 10.7.0.0/16 --jump MARK --set-mark {0}/{0}",
            hex(ab)
        ),
        format!(
            "--source 172.16.7.0/24 --jump MARK --set-mark {0}/{0}",
            hex(ab)
        ),
    ];
    // (The first rule also carries the chain's comment, first.)
    assert!(text[0].ends_with(&rule1[0]), "{text:#?}");
    assert_eq!(text[1..3], rule1[1..3], "{text:#?}");
    assert!(
        text[3].starts_with(&format!(
            "-p udp -m multiport --destination-ports 53 -m mark --mark {0}/{0}",
            hex(ab)
        )),
        "{text:#?}"
    );
    let start = (text.iter())
        .position(|t| {
            t.starts_with(&format!(
                "--jump MARK --set-mark {}/{}",
                hex(ab),
                hex(scratch)
            ))
        })
        .unwrap();
    assert_eq!(
        text[start + 1..start + 3],
        [
            format!("--source 10.7.0.0/16 --jump MARK --set-mark 0/{}", hex(ab)),
            format!(
                "--source 10.255.0.0/16 --jump MARK --set-mark 0/{}",
                hex(ab)
            ),
        ],
        "{text:#?}"
    );
    let main = format!("--source 10.0.0.0/8 -m mark --mark {0}/{0} ", hex(ab));
    assert!(text[start + 3].starts_with(&main), "{text:#?}");
    for v in [IpVersion::V4, IpVersion::V6] {
        assert!(chain_sets(&r, v).is_empty(), "no net sets without sharing");
        let d = r.desired_ref(v);
        assert!(
            d.ip_sets.keys().all(|n| !n.contains("c:")),
            "{:?}",
            d.ip_sets.keys()
        );
    }
}

/// The net sets the chains of family `v` name.
fn chain_sets(r: &Renderer, v: IpVersion) -> BTreeSet<String> {
    (r.chain_names(v, F).into_iter())
        .flat_map(|c| r.chain(v, F, c).unwrap())
        .flat_map(|rule| net_sets(rule).into_iter().map(|m| m.name.clone()))
        .collect()
}

#[test]
fn equal_lists_share_one_set_which_goes_with_the_last_policy() {
    // p1 and p2 have the same lists (in another order, with host bits); p3 another one.
    let mut reordered = heavy_rules(1);
    reordered[0].src_nets.reverse();
    reordered[0].src_nets[0] = net("fd00:1::5/64");
    let mut r = rendered(
        true,
        vec![
            policy("p1", heavy_rules(1)),
            policy("p2", reordered),
            policy("p3", heavy_rules(3)),
        ],
        vec![
            endpoint("a", "cali0", &["p1"]),
            endpoint("b", "cali1", &["p2"]),
            endpoint("c", "cali2", &["p3"]),
        ],
    );
    for v in [IpVersion::V4, IpVersion::V6] {
        r.take_changes(v);
    }
    let sets_of = |r: &Renderer, p: &str, v| -> BTreeSet<String> {
        (policy_chain(r, v, p).iter())
            .flat_map(net_sets)
            .map(|m| m.name.clone())
            .collect()
    };
    for v in [IpVersion::V4, IpVersion::V6] {
        let (s1, s2, s3) = (
            sets_of(&r, "p1", v),
            sets_of(&r, "p2", v),
            sets_of(&r, "p3", v),
        );
        assert_eq!(s1.len(), 2);
        assert_eq!(s1, s2, "equal lists, one set");
        assert!(s1.is_disjoint(&s3), "other lists, other sets");
        assert_eq!(chain_sets(&r, v).len(), 4);
    }
    let shared = [IpVersion::V4, IpVersion::V6].map(|v| sets_of(&r, "p1", v));
    let others = [IpVersion::V4, IpVersion::V6].map(|v| sets_of(&r, "p3", v));
    let gone = |name: &str| EndpointId {
        namespace: "ns".into(),
        name: name.into(),
    };
    // Pod b (p2) goes: p1 still names the sets, nothing about them changes.
    r.apply(Output::EndpointRemoved(gone("b"))).unwrap();
    assert!(r.flush().is_empty());
    for (i, v) in [IpVersion::V4, IpVersion::V6].into_iter().enumerate() {
        let changes = r.take_changes(v);
        assert!(changes.sets.is_empty(), "{:?}", changes.sets);
        let d = r.desired_ref(v);
        assert!(shared[i].iter().all(|s| d.ip_sets.contains_key(s)));
    }
    // Pod a (p1) goes: its sets go in the same change as the last chain naming them.
    r.apply(Output::EndpointRemoved(gone("a"))).unwrap();
    assert!(r.flush().is_empty());
    let p1_chain = names::policy_chain_name(&mk_np("ns", "p1"), true);
    for (i, v) in [IpVersion::V4, IpVersion::V6].into_iter().enumerate() {
        let changes = r.take_changes(v);
        assert!(changes.chains[&F].contains(&p1_chain), "{changes:?}");
        assert_eq!(changes.sets, shared[i]);
        assert_eq!(chain_sets(&r, v), others[i], "only p3's sets are named");
        let d = r.desired_ref(v);
        let in_state: BTreeSet<String> = (d.ip_sets.keys())
            .filter(|n| n.contains("c:"))
            .cloned()
            .collect();
        assert_eq!(in_state, others[i]);
    }
    // A new policy with the old list brings the same set back, created with its chain.
    r.apply(Output::PolicyUpdated(policy("p4", heavy_rules(1))))
        .unwrap();
    r.apply(Output::EndpointUpdated(endpoint("d", "cali3", &["p4"])))
        .unwrap();
    assert!(r.flush().is_empty());
    let changes = r.take_changes(IpVersion::V4);
    assert_eq!(sets_of(&r, "p4", IpVersion::V4), shared[0]);
    assert_eq!(changes.sets, shared[0]);
}

#[test]
fn single_nets_and_port_blocks_are_left_as_they_were() {
    let rules = vec![
        // One negated net alone: `! -s`.
        ParsedRule {
            action: Some(Action::Allow),
            not_src_nets: vec![net("10.9.0.0/16")],
            ..Default::default()
        },
        // Two positive nets and one negated: the positive set, and `! -s` for the negated one
        // (the main rule's `-s` slot is free).
        ParsedRule {
            action: Some(Action::Allow),
            dst_nets: vec![net("10.1.0.0/16"), net("10.2.0.0/16")],
            not_dst_nets: vec![net("10.1.1.0/24")],
            ..Default::default()
        },
        // More than 15 port slots: the scratch-mark block stays.
        ParsedRule {
            action: Some(Action::Allow),
            protocol: Some(Protocol::Tcp),
            dst_ports: (1..=20).map(|p| PortRange { first: p, last: p }).collect(),
            ..Default::default()
        },
    ];
    let r = rendered(
        true,
        vec![policy("p", rules)],
        vec![endpoint("a", "cali0", &["p"])],
    );
    let text: Vec<&str> = policy_chain(&r, IpVersion::V4, "p")
        .iter()
        .map(Rule::felix_text)
        .collect();
    assert!(text[0].contains("! --source 10.9.0.0/16 "), "{text:#?}");
    let set_rule = text.iter().find(|t| t.contains("--match-set")).unwrap();
    assert!(
        set_rule.starts_with("-m set --match-set cali40c:"),
        "{set_rule}"
    );
    assert!(
        set_rule.contains(" dst ! --destination 10.1.1.0/24 "),
        "{set_rule}"
    );
    assert_eq!(text.iter().filter(|t| t.contains("--match-set")).count(), 1);
    assert!(
        scratch_rules(&r, policy_chain(&r, IpVersion::V4, "p")) > 0,
        "port block kept"
    );
    // The v6 chain: every list was v4, so no set at all (rule 1 keeps no negated net; rule 2 has
    // no positive net of the family and is dropped).
    assert!(chain_sets(&r, IpVersion::V6).is_empty());
}
