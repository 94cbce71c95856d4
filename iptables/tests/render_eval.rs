//! Property test: the packet evaluator over the rendered chains (`iptables::render::trace`: mark
//! bits, addresses, protocols, ports, set membership, jumps) agrees with a direct evaluation of the
//! `ParsedRule` semantics. This is what shows the scratch-mark OR blocks are correct for any
//! number of blocks (Felix's TB-not-cleared bug would fail here with three or more positive
//! blocks), and that the shared layout's `hash:net` set matches of multi-net `nets`/`notNets`
//! lists mean the same (each case draws the layout; the evaluator reads the sets' members from
//! the desired state, as the kernel would).

mod render_support;

use std::collections::BTreeMap;
use std::net::IpAddr;

use calc_graph::proto::*;
use ipnet::IpNet;
use iptables::desired::{IpSetSpec, TableName};
use iptables::model::{Match, Target};
use iptables::render::build::Rule;
use iptables::render::static_chains::{VERDICT_ACCEPT, VERDICT_DROP, VERDICT_PASS, verdict_chains};
use iptables::render::{MarkBits, RenderConfig, Renderer, trace};
use proptest::prelude::*;
use render_support::*;

#[derive(Debug, Clone, Copy)]
struct Packet {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    sport: u16,
    dport: u16,
    icmp_type: u8,
    icmp_code: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allow,
    Deny,
    Pass,
    NoMatch,
}

// === direct semantics ===

fn in_nets(a: IpAddr, nets: &[IpNet]) -> bool {
    nets.iter().any(|n| n.contains(&a))
}

fn in_ports(p: u16, ports: &[PortRange]) -> bool {
    ports.iter().any(|r| r.first <= p && p <= r.last)
}

fn in_set(
    sets: &BTreeMap<String, Vec<IpSetMember>>,
    id: &str,
    a: IpAddr,
    proto: u8,
    port: u16,
) -> bool {
    sets[id].iter().any(|m| match m {
        IpSetMember::Net(n) => n.contains(&a),
        IpSetMember::IpPort {
            addr,
            protocol,
            port: p,
        } => *addr == a && protocol.number() == proto && *p == port,
    })
}

fn icmp_matches(f: &IcmpFields, pkt: &Packet) -> bool {
    f.type_.is_none_or(|t| t == pkt.icmp_type) && f.code.is_none_or(|c| c == pkt.icmp_code)
}

fn direct_matches(
    r: &ParsedRule,
    pkt: &Packet,
    v: IpVersion,
    sets: &BTreeMap<String, Vec<IpSetMember>>,
) -> bool {
    if r.ip_version.is_some_and(|x| x != v) {
        return false;
    }
    if r.protocol.is_some_and(|p| p.number() != pkt.proto) {
        return false;
    }
    if r.not_protocol.is_some_and(|p| p.number() == pkt.proto) {
        return false;
    }
    let side_ok = |a: IpAddr,
                   port: u16,
                   nets: &[IpNet],
                   not_nets: &[IpNet],
                   ports: &[PortRange],
                   not_ports: &[PortRange],
                   named: &[String],
                   not_named: &[String],
                   ids: &[String],
                   not_ids: &[String]| {
        (nets.is_empty() || in_nets(a, nets))
            && !in_nets(a, not_nets)
            && ((ports.is_empty() && named.is_empty())
                || in_ports(port, ports)
                || named.iter().any(|id| in_set(sets, id, a, pkt.proto, port)))
            && !in_ports(port, not_ports)
            && !not_named
                .iter()
                .any(|id| in_set(sets, id, a, pkt.proto, port))
            && ids.iter().all(|id| in_set(sets, id, a, pkt.proto, port))
            && !not_ids
                .iter()
                .any(|id| in_set(sets, id, a, pkt.proto, port))
    };
    side_ok(
        pkt.src,
        pkt.sport,
        &r.src_nets,
        &r.not_src_nets,
        &r.src_ports,
        &r.not_src_ports,
        &r.src_named_port_ip_set_ids,
        &r.not_src_named_port_ip_set_ids,
        &r.src_ip_set_ids,
        &r.not_src_ip_set_ids,
    ) && side_ok(
        pkt.dst,
        pkt.dport,
        &r.dst_nets,
        &r.not_dst_nets,
        &r.dst_ports,
        &r.not_dst_ports,
        &r.dst_named_port_ip_set_ids,
        &r.not_dst_named_port_ip_set_ids,
        &r.dst_ip_set_ids,
        &r.not_dst_ip_set_ids,
    ) && r.icmp.is_none_or(|f| icmp_matches(&f, pkt))
        && r.not_icmp.is_none_or(|f| !icmp_matches(&f, pkt))
        // Domain sets (FQDN): the destination among the learned addresses.
        && (r.dst_domain_ip_set_ids.iter())
            .all(|id| in_set(sets, id, pkt.dst, pkt.proto, pkt.dport))
}

fn direct_verdict(
    rules: &[ParsedRule],
    pkt: &Packet,
    v: IpVersion,
    sets: &BTreeMap<String, Vec<IpSetMember>>,
) -> Verdict {
    for r in rules {
        if direct_matches(r, pkt, v, sets) {
            match r.action() {
                Action::Allow => return Verdict::Allow,
                Action::Deny => return Verdict::Deny,
                Action::Pass => return Verdict::Pass,
                Action::Log => {}
            }
        }
    }
    Verdict::NoMatch
}

// === the evaluator of rendered chains: the library's `render::trace` ===

/// The chain under test and the kernel's view of the sets, for the library evaluator.
struct OneChain<'a> {
    rules: &'a [Rule],
    sets: &'a BTreeMap<String, IpSetSpec>,
    /// The shared layout's verdict chains, where the chain's rules may go.
    verdicts: Vec<(String, Vec<Rule>)>,
}

impl trace::Rules for OneChain<'_> {
    fn chain(&self, name: &str) -> Option<Vec<&iptables::model::Rule>> {
        let rules = if name == "under-test" {
            self.rules
        } else {
            (self.verdicts.iter())
                .find(|(n, _)| n == name)
                .map(|(_, r)| r.as_slice())?
        };
        Some(rules.iter().map(Rule::model).collect())
    }
    fn set_contains(&self, name: &str, addr: IpAddr, proto: u8, port: u16) -> Option<bool> {
        let spec = self.sets.get(name)?;
        Some(
            spec.members
                .iter()
                .any(|m| trace::member_holds(m, addr, proto, port))
                // A domain set as the applier creates it: full with the learned members.
                || spec.learned.contains_key(&addr),
        )
    }
}

/// The learner of the property test: every pattern resolves to the same addresses.
#[derive(Debug)]
struct Resolved(Vec<IpAddr>);

impl iptables::render::DomainMembers for Resolved {
    fn learned(&self, _patterns: &[DomainPattern]) -> Vec<iptables::render::LearnedAddr> {
        (self.0.iter())
            .map(|a| iptables::render::LearnedAddr {
                addr: *a,
                remaining_secs: 60,
            })
            .collect()
    }
}

/// The domain set of the property test's rules.
const DOMAIN_SET: &str = "d:example";

/// The packet as the evaluator takes it: conntrack NEW, from `eth0` out of the workload's `cali0`.
fn traced(pkt: &Packet, mark: u32) -> trace::Packet {
    let mut p = trace::Packet::new(pkt.src, pkt.dst, pkt.proto, pkt.sport, pkt.dport);
    p.icmp_type = pkt.icmp_type;
    p.icmp_code = pkt.icmp_code;
    p.in_iface = "eth0".into();
    p.out_iface = "cali0".into();
    p.mark = mark;
    p
}

fn eval_chain(
    rules: &[Rule],
    pkt: &Packet,
    marks: &MarkBits,
    start_mark: u32,
    sets: &BTreeMap<String, IpSetSpec>,
) -> Verdict {
    for r in rules {
        // iptables refuses these combinations; the renderer must never produce them.
        let has_proto = r.protocol.as_ref().is_some_and(|p| !p.negated);
        if r.matches.iter().any(|m| {
            matches!(
                m,
                Match::Multiport { .. } | Match::Icmp { .. } | Match::Icmpv6 { .. }
            )
        }) {
            assert!(has_proto, "ports/icmp without -p: {r:?}");
        }
        let to_verdict = matches!(&r.target, Some(Target::Goto(c))
            if [VERDICT_ACCEPT, VERDICT_PASS, VERDICT_DROP].contains(&c.as_str()));
        assert!(
            to_verdict
                || !matches!(
                    r.target,
                    Some(Target::Accept | Target::Jump(_) | Target::Goto(_))
                ),
            "unexpected target in a policy chain: {r:?}"
        );
    }
    let t = trace::trace(
        &OneChain {
            rules,
            sets,
            verdicts: verdict_chains(marks),
        },
        "under-test",
        &traced(pkt, start_mark),
    )
    .expect("traceable");
    match t.outcome {
        trace::Outcome::Drop => Verdict::Deny,
        _ if t.mark & marks.accept != 0 => Verdict::Allow,
        _ if t.mark & marks.pass != 0 => Verdict::Pass,
        _ => Verdict::NoMatch,
    }
}

// === generators ===

const SETS: [&str; 3] = ["s:a", "s:b", "s:c"];
const NAMED: [&str; 2] = ["n:x", "n:y"];

fn addr(v6: bool, i: u8) -> IpAddr {
    if v6 {
        format!("fd00::{i}").parse().unwrap()
    } else {
        format!("10.0.0.{i}").parse().unwrap()
    }
}

fn arb_net() -> impl Strategy<Value = IpNet> {
    (
        any::<bool>(),
        0u8..8,
        prop::sample::select(vec![0u8, 29, 30, 31, 32]),
    )
        .prop_map(|(v6, i, len)| {
            if v6 {
                let len = if len == 0 { 0 } else { len + 96 };
                IpNet::new(addr(true, i), len).unwrap().trunc()
            } else {
                IpNet::new(addr(false, i), len).unwrap().trunc()
            }
        })
}

fn arb_ports() -> impl Strategy<Value = Vec<PortRange>> {
    prop::collection::vec((1u16..40, 0u16..3), 0..20).prop_map(|v| {
        v.into_iter()
            .map(|(first, w)| PortRange {
                first,
                last: first + if w == 2 { 3 } else { 0 },
            })
            .collect()
    })
}

fn arb_ids(pool: &'static [&'static str], max: usize) -> impl Strategy<Value = Vec<String>> {
    prop::sample::subsequence(pool.to_vec(), 0..=max)
        .prop_map(|v| v.into_iter().map(String::from).collect())
}

fn arb_rule() -> impl Strategy<Value = ParsedRule> {
    let nets = || prop::collection::vec(arb_net(), 0..4);
    let proto = prop::sample::select(vec![
        None,
        Some(Protocol::Tcp),
        Some(Protocol::Udp),
        Some(Protocol::Icmp),
        Some(Protocol::IcmpV6),
    ]);
    let action = prop::sample::select(vec![Action::Allow, Action::Deny, Action::Pass, Action::Log]);
    (
        (proto, action, nets(), nets(), nets(), nets()),
        (arb_ports(), arb_ports(), arb_ports(), arb_ports()),
        (
            arb_ids(&NAMED, 2),
            arb_ids(&NAMED, 1),
            arb_ids(&NAMED, 2),
            arb_ids(&NAMED, 1),
        ),
        (
            arb_ids(&SETS, 1),
            arb_ids(&SETS, 2),
            arb_ids(&SETS, 1),
            arb_ids(&SETS, 2),
        ),
        (
            prop::option::of((0u8..3, prop::option::of(0u8..2))),
            prop::option::of(0u8..3),
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (protocol, action, sn, nsn, dn, ndn),
                (sp, nsp, dp, ndp),
                (snp, nsnp, dnp, ndnp),
                (ss, nss, ds, nds),
                (icmp, not_icmp, ver, dom),
            )| {
                // A domain rule never has another destination address match (the graph's
                // scanner fails such a rule safe).
                let dom = dom && dn.is_empty() && ndn.is_empty() && ds.is_empty() && nds.is_empty();
                let port_proto = matches!(protocol, Some(Protocol::Tcp | Protocol::Udp));
                let icmp_proto = matches!(protocol, Some(Protocol::Icmp | Protocol::IcmpV6));
                let keep = |p: Vec<PortRange>| if port_proto { p } else { Vec::new() };
                ParsedRule {
                    action: Some(action),
                    ip_version: if ver { None } else { Some(IpVersion::V4) },
                    protocol,
                    icmp: icmp.filter(|_| icmp_proto).map(|(t, c)| IcmpFields {
                        type_: Some(t),
                        code: c,
                    }),
                    not_icmp: not_icmp.filter(|_| icmp_proto).map(|t| IcmpFields {
                        type_: Some(t),
                        code: None,
                    }),
                    src_nets: sn,
                    not_src_nets: nsn,
                    dst_nets: dn,
                    not_dst_nets: ndn,
                    src_ports: keep(sp),
                    not_src_ports: keep(nsp),
                    dst_ports: keep(dp),
                    not_dst_ports: keep(ndp),
                    src_named_port_ip_set_ids: snp,
                    not_src_named_port_ip_set_ids: nsnp,
                    dst_named_port_ip_set_ids: dnp,
                    not_dst_named_port_ip_set_ids: ndnp,
                    src_ip_set_ids: ss,
                    not_src_ip_set_ids: nss,
                    dst_ip_set_ids: ds,
                    not_dst_ip_set_ids: nds,
                    dst_domain_ip_set_ids: if dom {
                        vec![DOMAIN_SET.to_string()]
                    } else {
                        vec![]
                    },
                    annotations: vec![],
                    ..Default::default()
                }
            },
        )
}

fn arb_members(named: bool) -> impl Strategy<Value = Vec<IpSetMember>> {
    prop::collection::vec(
        (any::<bool>(), 0u8..8, any::<bool>(), 1u16..40, arb_net()),
        0..6,
    )
    .prop_map(move |v| {
        v.into_iter()
            .map(|(v6, i, tcp, port, n)| {
                if named {
                    let protocol = if tcp { Protocol::Tcp } else { Protocol::Udp };
                    IpSetMember::IpPort {
                        addr: addr(v6, i),
                        protocol,
                        port,
                    }
                } else {
                    IpSetMember::Net(n)
                }
            })
            .collect()
    })
}

fn arb_packet(v6: bool) -> impl Strategy<Value = Packet> {
    (
        0u8..8,
        0u8..8,
        prop::sample::select(vec![6u8, 17, 1, 58]),
        1u16..40,
        1u16..40,
        0u8..3,
        0u8..2,
    )
        .prop_map(
            move |(s, d, proto, sport, dport, icmp_type, icmp_code)| Packet {
                src: addr(v6, s),
                dst: addr(v6, d),
                proto,
                sport,
                dport,
                icmp_type,
                icmp_code,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn rendered_chains_agree_with_rule_semantics(
        rules in prop::collection::vec(arb_rule(), 1..4),
        members in prop::collection::vec(arb_members(false), 3),
        named_members in prop::collection::vec(arb_members(true), 2),
        resolved in prop::collection::vec((any::<bool>(), 0u8..8), 0..5),
        v6 in any::<bool>(),
        packets in prop::collection::vec(arb_packet(false), 48),
        junk in any::<u32>(),
        share_chains in any::<bool>(),
    ) {
        let v = if v6 { IpVersion::V6 } else { IpVersion::V4 };
        // Both layouts: Felix's verdict pairs and OR blocks, and the shared layout's verdict gotos
        // and `hash:net` set matches of multi-net lists.
        let mut r = Renderer::new(RenderConfig { share_chains, ..RenderConfig::default() }).unwrap();
        let resolved: Vec<IpAddr> = resolved.iter().map(|(v6, i)| addr(*v6, *i)).collect();
        r.set_domain_members(std::sync::Arc::new(Resolved(resolved.clone())));
        let mut sets: BTreeMap<String, Vec<IpSetMember>> = BTreeMap::new();
        sets.insert(
            DOMAIN_SET.to_string(),
            resolved.iter().map(|a| IpSetMember::Net(IpNet::from(*a))).collect(),
        );
        let mut outputs = vec![Output::DomainSetCreated {
            id: DOMAIN_SET.into(),
            patterns: vec![DomainPattern::parse("example.com").unwrap()].into(),
        }];
        for (id, m) in SETS.iter().zip(&members) {
            sets.insert(id.to_string(), m.clone());
            outputs.push(Output::IpSetCreated { id: id.to_string(), kind: IpSetKind::Net, members: m.clone().into() });
        }
        for (id, m) in NAMED.iter().zip(&named_members) {
            sets.insert(id.to_string(), m.clone());
            outputs.push(Output::IpSetCreated { id: id.to_string(), kind: IpSetKind::IpPort, members: m.clone().into() });
        }
        let pid = mk_np("ns", "prop");
        outputs.push(Output::PolicyUpdated(mk_policy(pid.clone(), rules.clone(), vec![])));
        outputs.push(Output::EndpointUpdated(mk_endpoint("ns", "ep", "cali0", &[], vec![mk_tier("default", vec![pid], vec![])], &[])));
        prop_assert!(r.apply_all(outputs).is_empty());
        prop_assert!(r.flush().is_empty());

        let d = r.desired(v);
        for name in d.tables[&TableName::Filter].chains.keys() {
            prop_assert!(name.len() <= 28);
        }
        assert_parses_back(&r, v);
        let chain = r.chain(v, TableName::Filter, "cali-pi-np/ns/prop").unwrap().to_vec();
        let kernel_sets: BTreeMap<String, IpSetSpec> = d.ip_sets.clone();
        let marks = *r.marks();
        // Entry state as the endpoint chain leaves it: accept and pass clear, drop clear, every
        // other bit (scratch bits included) arbitrary.
        let start = junk & !(marks.accept | marks.pass | marks.drop);
        for p in &packets {
            let mut pkt = *p;
            if v6 && pkt.proto == 1 {
                pkt.proto = 58;
            } else if !v6 && pkt.proto == 58 {
                pkt.proto = 1;
            }
            if v6 {
                pkt.src = addr(true, match p.src { IpAddr::V4(a) => a.octets()[3], _ => 0 });
                pkt.dst = addr(true, match p.dst { IpAddr::V4(a) => a.octets()[3], _ => 0 });
            }
            let want = direct_verdict(&rules, &pkt, v, &sets);
            let got = eval_chain(&chain, &pkt, &marks, start, &kernel_sets);
            prop_assert_eq!(got, want, "packet {:?}\nchain {:#?}", pkt, chain.iter().map(|r| r.felix_text()).collect::<Vec<_>>());
        }
    }
}

fn arb_block_heavy_rule() -> impl Strategy<Value = ParsedRule> {
    let small_ports = || {
        prop::collection::vec(
            (1u16..8).prop_map(|p| PortRange { first: p, last: p }),
            1..3,
        )
    };
    let nets = || {
        prop::collection::vec(
            arb_net().prop_filter("v4", |n| matches!(n, IpNet::V4(_))),
            2..4,
        )
    };
    (
        small_ports(),
        small_ports(),
        nets(),
        nets(),
        prop::sample::select(vec![Action::Allow, Action::Deny]),
        any::<bool>(),
    )
        .prop_map(|(sp, dp, sn, dn, action, named_src)| ParsedRule {
            action: Some(action),
            protocol: Some(Protocol::Tcp),
            src_ports: sp,
            dst_ports: dp,
            src_named_port_ip_set_ids: if named_src {
                vec!["n:x".into()]
            } else {
                vec![]
            },
            dst_named_port_ip_set_ids: vec!["n:y".into()],
            src_nets: sn,
            dst_nets: dn,
            ..Default::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    /// Three or four positive blocks in every rule (ports OR named ports on both sides, several
    /// CIDRs on both sides), packets drawn from the same small space so every block both hits and
    /// misses. Felix's rendering (no TB clear) fails this property.
    #[test]
    fn many_positive_blocks_are_correct(
        rule in arb_block_heavy_rule(),
        named_members in prop::collection::vec(
            prop::collection::vec((0u8..8, 1u16..8).prop_map(|(i, port)| IpSetMember::IpPort { addr: addr(false, i), protocol: Protocol::Tcp, port }), 0..12),
            2,
        ),
        packets in prop::collection::vec((0u8..8, 0u8..8, 1u16..8, 1u16..8), 64),
        shared in any::<bool>(),
    ) {
        // Shared: the nets are set matches and only the port blocks remain.
        let mut r = Renderer::new(RenderConfig { share_chains: shared, ..RenderConfig::default() }).unwrap();
        let mut sets = BTreeMap::new();
        let mut outputs = Vec::new();
        for (id, m) in NAMED.iter().zip(&named_members) {
            sets.insert(id.to_string(), m.clone());
            outputs.push(Output::IpSetCreated { id: id.to_string(), kind: IpSetKind::IpPort, members: m.clone().into() });
        }
        let pid = mk_np("ns", "blocks");
        outputs.push(Output::PolicyUpdated(mk_policy(pid.clone(), vec![rule.clone()], vec![])));
        outputs.push(Output::EndpointUpdated(mk_endpoint("ns", "ep", "cali0", &[], vec![mk_tier("default", vec![pid], vec![])], &[])));
        prop_assert!(r.apply_all(outputs).is_empty());
        prop_assert!(r.flush().is_empty());
        let d = r.desired(IpVersion::V4);
        let chain = r.chain(IpVersion::V4, TableName::Filter, "cali-pi-np/ns/blocks").unwrap().to_vec();
        let marks = *r.marks();
        for (s, dd, sport, dport) in packets {
            let pkt = Packet { src: addr(false, s), dst: addr(false, dd), proto: 6, sport, dport, icmp_type: 0, icmp_code: 0 };
            let want = direct_verdict(std::slice::from_ref(&rule), &pkt, IpVersion::V4, &sets);
            let got = eval_chain(&chain, &pkt, &marks, marks.scratch1, &d.ip_sets);
            prop_assert_eq!(got, want, "packet {:?}", pkt);
        }
    }
}

/// A rule constrained by address lists only (any family mix, `/0` included), so that most
/// packets of the small address space decide on the lists alone.
fn arb_nets_rule() -> impl Strategy<Value = ParsedRule> {
    let nets = || prop::collection::vec(arb_net(), 0..4);
    (
        prop::sample::select(vec![Action::Allow, Action::Deny, Action::Pass]),
        (nets(), nets(), nets(), nets()),
    )
        .prop_map(|(action, (sn, nsn, dn, ndn))| ParsedRule {
            action: Some(action),
            src_nets: sn,
            not_src_nets: nsn,
            dst_nets: dn,
            not_dst_nets: ndn,
            ..Default::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// The shared layout's `hash:net` set matches (several positive nets; negated nets beside
    /// another net) decide every packet as Felix's scratch-mark blocks of the inlined layout do,
    /// and as the rules' semantics say, in both families.
    #[test]
    fn net_sets_decide_as_or_blocks(
        rules in prop::collection::vec(arb_nets_rule(), 1..4),
        v6 in any::<bool>(),
        packets in prop::collection::vec((0u8..8, 0u8..8), 48),
        junk in any::<u32>(),
    ) {
        let v = if v6 { IpVersion::V6 } else { IpVersion::V4 };
        let pid = mk_np("ns", "nets");
        let chains = [true, false].map(|shared| {
            let mut r = Renderer::new(RenderConfig { share_chains: shared, ..RenderConfig::default() }).unwrap();
            let outputs = vec![
                Output::PolicyUpdated(mk_policy(pid.clone(), rules.clone(), vec![])),
                Output::EndpointUpdated(mk_endpoint("ns", "ep", "cali0", &[], vec![mk_tier("default", vec![pid.clone()], vec![])], &[])),
            ];
            assert!(r.apply_all(outputs).is_empty());
            assert!(r.flush().is_empty());
            assert_parses_back(&r, v);
            let chain = r.chain(v, TableName::Filter, "cali-pi-np/ns/nets").unwrap().to_vec();
            (r, chain)
        });
        let [(shared, shared_chain), (inlined, inlined_chain)] = &chains;
        let sets = BTreeMap::new();
        let marks = *shared.marks();
        prop_assert_eq!(marks, *inlined.marks());
        let start = junk & !(marks.accept | marks.pass | marks.drop);
        for (s, d) in packets {
            let pkt = Packet { src: addr(v6, s), dst: addr(v6, d), proto: 6, sport: 1, dport: 1, icmp_type: 0, icmp_code: 0 };
            let want = direct_verdict(&rules, &pkt, v, &sets);
            let got_shared = eval_chain(shared_chain, &pkt, &marks, start, &shared.desired(v).ip_sets);
            let got_inlined = eval_chain(inlined_chain, &pkt, &marks, start, &inlined.desired(v).ip_sets);
            prop_assert_eq!(got_shared, want, "shared, packet {:?}\nchain {:#?}", pkt, shared_chain.iter().map(|r| r.felix_text()).collect::<Vec<_>>());
            prop_assert_eq!(got_inlined, want, "inlined, packet {:?}", pkt);
        }
    }
}

// === whole endpoint chains: tiers, pass, profiles ===

fn arb_simple_rule() -> impl Strategy<Value = ParsedRule> {
    (
        prop::sample::select(vec![
            Action::Allow,
            Action::Deny,
            Action::Pass,
            Action::Pass,
            Action::Log,
        ]),
        prop::option::of(prop::sample::select(vec![Protocol::Tcp, Protocol::Udp])),
        prop::collection::vec(
            arb_net().prop_filter("v4", |n| matches!(n, IpNet::V4(_))),
            0..2,
        ),
        prop::collection::vec(
            (1u16..6).prop_map(|p| PortRange { first: p, last: p }),
            0..3,
        ),
    )
        .prop_map(|(action, protocol, src_nets, ports)| ParsedRule {
            action: Some(action),
            protocol,
            src_nets,
            dst_ports: if protocol.is_some() { ports } else { vec![] },
            ..Default::default()
        })
}

#[derive(Debug, Clone)]
struct TierSpec {
    pass_default: bool,
    policies: Vec<Vec<ParsedRule>>,
}

fn arb_tiers() -> impl Strategy<Value = Vec<TierSpec>> {
    prop::collection::vec(
        (
            any::<bool>(),
            prop::collection::vec(prop::collection::vec(arb_simple_rule(), 0..3), 0..5),
        )
            .prop_map(|(pass_default, policies)| TierSpec {
                pass_default,
                policies,
            }),
        1..4,
    )
}

fn direct_endpoint(tiers: &[TierSpec], profiles: &[Vec<ParsedRule>], pkt: &Packet) -> Verdict {
    let no_sets = BTreeMap::new();
    'tiers: for t in tiers.iter().filter(|t| !t.policies.is_empty()) {
        for p in &t.policies {
            match direct_verdict(p, pkt, IpVersion::V4, &no_sets) {
                Verdict::Allow => return Verdict::Allow,
                Verdict::Deny => return Verdict::Deny,
                Verdict::Pass => continue 'tiers,
                Verdict::NoMatch => {}
            }
        }
        if !t.pass_default {
            return Verdict::Deny;
        }
    }
    for p in profiles {
        match direct_verdict(p, pkt, IpVersion::V4, &no_sets) {
            Verdict::Allow => return Verdict::Allow,
            Verdict::Deny => return Verdict::Deny,
            Verdict::Pass | Verdict::NoMatch => {}
        }
    }
    Verdict::Deny
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// The whole ingress path (`cali-tw-` chain, tiers with Deny or Pass defaults, pass-bit
    /// guards, policy and profile chains) gives the verdict of Calico's tier semantics.
    #[test]
    fn endpoint_chains_implement_tier_semantics(
        tiers in arb_tiers(),
        profiles in prop::collection::vec(prop::collection::vec(arb_simple_rule(), 0..3), 0..3),
        packets in prop::collection::vec(arb_packet(false), 32),
        junk in any::<u32>(),
    ) {
        let mut r = Renderer::new(RenderConfig::default()).unwrap();
        let mut outputs = Vec::new();
        let mut tier_infos = Vec::new();
        for (ti, t) in tiers.iter().enumerate() {
            let mut ids = Vec::new();
            for (pi, rules) in t.policies.iter().enumerate() {
                let id = mk_np("ns", &format!("t{ti}p{pi}"));
                outputs.push(Output::PolicyUpdated(mk_policy(id.clone(), rules.clone(), vec![])));
                ids.push(id);
            }
            tier_infos.push(TierInfo {
                name: format!("tier{ti}"),
                default_action: if t.pass_default { Action::Pass } else { Action::Deny },
                ingress_policies: ids,
                egress_policies: vec![],
            });
        }
        let mut profile_ids = Vec::new();
        for (i, rules) in profiles.iter().enumerate() {
            outputs.push(Output::ProfileUpdated(mk_profile(&format!("prof{i}"), rules.clone(), vec![])));
            profile_ids.push(format!("prof{i}"));
        }
        let refs: Vec<&str> = profile_ids.iter().map(String::as_str).collect();
        outputs.push(Output::EndpointUpdated(mk_endpoint("ns", "ep", "cali0", &[], tier_infos, &refs)));
        prop_assert!(r.apply_all(outputs).is_empty());
        prop_assert!(r.flush().is_empty());
        let marks = *r.marks();
        for p in &packets {
            let mut pkt = *p;
            if pkt.proto == 58 {
                pkt.proto = 1;
            }
            // As cali-FORWARD leaves it: pass and scratch bits clear, accept arbitrary.
            let mark = junk & !(marks.pass | marks.scratch0 | marks.scratch1 | marks.drop);
            let rules = trace::RendererRules { renderer: &r, version: IpVersion::V4, table: TableName::Filter };
            let t = trace::trace(&rules, "cali-to-wl-dispatch", &traced(&pkt, mark)).expect("traceable");
            let got = match t.outcome {
                trace::Outcome::Drop => Verdict::Deny,
                trace::Outcome::Accept => Verdict::Allow,
                trace::Outcome::Return if t.mark & marks.accept != 0 => Verdict::Allow,
                trace::Outcome::Return => Verdict::Deny,
            };
            let want = direct_endpoint(&tiers, &profiles, &pkt);
            prop_assert_eq!(got, want, "packet {:?}", pkt);
        }
    }
}
