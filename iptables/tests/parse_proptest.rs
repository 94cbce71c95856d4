//! Property: for generated rulesets (typed rules and generic token lists, hostile strings included)
//! render∘parse∘render = render, and parsing the rendering gives back the same typed structure.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use iptables::model::*;
use iptables::parse::{
    parse_save, parse_save_lenient, roundtrip_save, roundtrip_save_lenient, roundtrip_save_parts,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

const USER_CHAINS: &[&str] = &[
    "cali-INPUT",
    "cali-fw-eth0",
    "KUBE-SERVICES",
    "a",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ12",
];

fn mk_chain(s: &str) -> ChainName {
    ChainName::new(s).unwrap()
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_-]{1,12}",
        "[^\n\r\u{0}]{0,30}",
        Just("x\" -j ACCEPT -m comment --comment \"".to_string()),
        Just("-s".to_string()),
        Just("\\".to_string()),
    ]
}

fn net() -> impl Strategy<Value = IpNet> {
    prop_oneof![
        (any::<u32>(), 0u8..=32)
            .prop_map(|(a, p)| IpNet::V4(Ipv4Net::new(Ipv4Addr::from(a), p).unwrap().trunc())),
        (any::<u128>(), 0u8..=128)
            .prop_map(|(a, p)| IpNet::V6(Ipv6Net::new(Ipv6Addr::from(a), p).unwrap().trunc())),
    ]
}

fn neg<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Negatable<T>> {
    (any::<bool>(), s).prop_map(|(negated, value)| Negatable { negated, value })
}

fn port_range() -> impl Strategy<Value = PortRange> {
    prop_oneof![
        any::<u16>().prop_map(PortRange::single),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| PortRange::range(a, b))
    ]
}

fn ct_states() -> impl Strategy<Value = CtStates> {
    vec(select(CtState::ALL.to_vec()), 1..4).prop_map(|v| CtStates::of(&v))
}

fn icmp_type() -> impl Strategy<Value = IcmpType> {
    prop_oneof![
        Just(IcmpType::Any),
        any::<u8>().prop_map(IcmpType::Type),
        (any::<u8>(), any::<u8>()).prop_map(|(t, c)| IcmpType::TypeCode(t, c))
    ]
}

fn generic_arg() -> impl Strategy<Value = Arg> {
    prop_oneof![
        "--[a-z][a-z-]{0,10}".prop_map(|s| Arg::bare(s).unwrap()),
        "[a-z0-9][a-zA-Z0-9:,./_'\\\\-]{0,12}".prop_map(|s| Arg::bare(s).unwrap()),
        Just(Arg::not()),
        "[^\n\r\u{0}]{0,16}".prop_map(|s| Arg::quoted(s).unwrap()),
    ]
}

fn a_match() -> impl Strategy<Value = Match> {
    prop_oneof![
        text()
            .prop_filter("comment length", |s| s.len() <= 255)
            .prop_map(|s| Match::comment(s).unwrap()),
        (any::<bool>(), ct_states())
            .prop_map(|(negated, states)| Match::Conntrack { negated, states }),
        (any::<bool>(), ct_states()).prop_map(|(negated, states)| Match::State { negated, states }),
        (any::<bool>(), any::<u32>(), any::<u32>()).prop_map(|(negated, value, mask)| {
            Match::Mark {
                negated,
                value,
                mask,
            }
        }),
        (
            any::<bool>(),
            "[a-z0-9-]{1,31}",
            vec(select(vec![SetDir::Src, SetDir::Dst]), 1..4)
        )
            .prop_map(|(negated, n, dirs)| Match::Set {
                negated,
                name: SetName::new(n).unwrap(),
                dirs
            }),
        (
            any::<bool>(),
            select(vec![
                PortsKind::Source,
                PortsKind::Destination,
                PortsKind::Either
            ]),
            vec(port_range(), 1..15)
        )
            .prop_map(|(negated, kind, ports)| Match::Multiport {
                negated,
                kind,
                ports
            }),
        (
            proptest::option::of(neg(port_range())),
            proptest::option::of(neg(port_range()))
        )
            .prop_map(|(sport, dport)| Match::Tcp(Ports { sport, dport })),
        (
            proptest::option::of(neg(port_range())),
            proptest::option::of(neg(port_range()))
        )
            .prop_map(|(sport, dport)| Match::Udp(Ports { sport, dport })),
        (any::<bool>(), icmp_type())
            .prop_map(|(negated, icmp_type)| Match::Icmp { negated, icmp_type }),
        (any::<bool>(), icmp_type())
            .prop_map(|(negated, icmp_type)| Match::Icmpv6 { negated, icmp_type }),
        (
            proptest::option::of(neg(vec(select(AddrType::ALL.to_vec()), 1..3))),
            proptest::option::of(neg(vec(select(AddrType::ALL.to_vec()), 1..3))),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(
                |(src, dst, limit_iface_in, limit_iface_out)| Match::Addrtype {
                    src,
                    dst,
                    limit_iface_in,
                    limit_iface_out
                }
            ),
        (
            any::<u32>(),
            select(vec![
                RateUnit::Second,
                RateUnit::Minute,
                RateUnit::Hour,
                RateUnit::Day
            ]),
            proptest::option::of(any::<u32>())
        )
            .prop_map(|(count, unit, burst)| Match::Limit {
                rate: Rate { count, unit },
                burst
            }),
        (
            select(vec![
                "hashlimit",
                "recent",
                "string",
                "owner",
                "physdev",
                "x-y_z"
            ]),
            vec(generic_arg(), 0..6)
        )
            .prop_map(|(m, args)| Match::Generic {
                module: Word::new(m).unwrap(),
                args
            }),
    ]
}

fn a_target() -> impl Strategy<Value = Target> {
    prop_oneof![
        Just(Target::Accept),
        Just(Target::Drop),
        Just(Target::Return),
        proptest::option::of("[a-z0-9-]{1,24}").prop_map(|w| Target::Reject {
            with: w.map(|w| Word::new(w).unwrap())
        }),
        select(USER_CHAINS.to_vec()).prop_map(|c| Target::Jump(mk_chain(c))),
        select(USER_CHAINS.to_vec()).prop_map(|c| Target::Goto(mk_chain(c))),
        (any::<u32>(), any::<u32>()).prop_map(|(value, mask)| Target::Mark { value, mask }),
        (
            proptest::option::of(text()),
            proptest::option::of(any::<u8>())
        )
            .prop_map(|(p, level)| Target::Log {
                prefix: p.map(|p| Text::new(p).unwrap()),
                level
            }),
        (
            proptest::option::of(text()),
            any::<u16>(),
            proptest::option::of(prop_oneof![
                any::<u32>().prop_map(NflogLen::Size),
                any::<u32>().prop_map(NflogLen::Range)
            ]),
            proptest::option::of(any::<u16>())
        )
            .prop_map(|(p, group, len, threshold)| Target::Nflog {
                prefix: p.map(|p| Text::new(p).unwrap()),
                group,
                len,
                threshold
            }),
        (
            select(vec!["DNAT", "MASQUERADE", "CT", "TPROXY"]),
            vec(generic_arg(), 0..5)
        )
            .prop_map(|(n, args)| Target::Generic {
                name: Word::new(n).unwrap(),
                args
            }),
    ]
}

fn iface() -> impl Strategy<Value = Iface> {
    "[a-z][a-z0-9.]{0,12}\\+?".prop_map(|s| Iface::new(s).unwrap())
}

fn protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![
        Just(Protocol::Tcp),
        Just(Protocol::Udp),
        Just(Protocol::Sctp),
        Just(Protocol::Icmp),
        Just(Protocol::Icmpv6),
        Just(Protocol::Other(Word::new("gre").unwrap()))
    ]
}

fn counters() -> impl Strategy<Value = Counters> {
    (any::<u64>(), any::<u64>()).prop_map(|(packets, bytes)| Counters { packets, bytes })
}

prop_compose! {
    fn a_rule(chains: Vec<&'static str>)(
        chain in select(chains),
        counters in proptest::option::of(counters()),
        src in proptest::option::of(neg(net().prop_map(Addr::Net))),
        dst in proptest::option::of(neg(net().prop_map(Addr::Net))),
        in_iface in proptest::option::of(neg(iface())),
        out_iface in proptest::option::of(neg(iface())),
        protocol in proptest::option::of(neg(protocol())),
        fragment in proptest::option::of(neg(Just(()))),
        matches in vec(a_match(), 0..5),
        target in proptest::option::of(a_target()),
    ) -> Rule {
        Rule { chain: mk_chain(chain), counters, src, dst, in_iface, out_iface, protocol, fragment, matches, target }
    }
}

fn a_table() -> impl Strategy<Value = Table> {
    (
        select(TableName::ALL.to_vec()),
        vec(a_rule(USER_CHAINS.to_vec()), 0..8),
        proptest::option::of(counters()),
    )
        .prop_map(|(name, rules, c)| {
            let mut t = Table::new(name);
            for b in name.builtin_chains() {
                t.push_chain(Chain {
                    name: mk_chain(b),
                    policy: Some(Policy::Accept),
                    counters: c,
                });
            }
            for u in USER_CHAINS {
                t.push_chain(Chain::user(mk_chain(u)));
            }
            for r in rules {
                t.push_rule(r);
            }
            t
        })
}

fn a_ruleset() -> impl Strategy<Value = Ruleset> {
    (
        vec(
            prop_oneof![
                "#[^\n\r\u{0}]{0,30}".prop_map(|s| Item::Comment(CommentLine::new(s).unwrap())),
                Just(Item::Blank),
                a_table().prop_map(Item::Table),
            ],
            0..6,
        ),
        any::<bool>(),
    )
        .prop_map(|(items, missing)| {
            // A missing final newline is only representable after a non-blank line.
            let missing_final_newline =
                missing && items.last().is_some_and(|i| !matches!(i, Item::Blank));
            Ruleset {
                items,
                missing_final_newline,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn render_parse_render_is_render(rs in a_ruleset()) {
        let text = rs.render();
        let parsed = parse_save(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&parsed.render(), &text);
        prop_assert_eq!(parsed, rs);
    }

    #[test]
    fn rule_text_has_one_line_and_parses_back(rule in a_rule(vec!["INPUT"])) {
        let line = rule.render();
        prop_assert!(!line.contains('\n'));
        let text = format!("*filter\n:INPUT ACCEPT [0:0]\n{line}\nCOMMIT\n");
        let rs = parse_save(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let back = rs.tables().next().unwrap().rules().next().unwrap().clone();
        // Jumps to undeclared chains come back as generic targets with the same text.
        prop_assert_eq!(back.render(), line);
    }

    /// The streaming roundtrip equals render∘parse, errors included, on soups of good and bad lines.
    #[test]
    fn streaming_roundtrip_is_render_of_parse(
        rs in a_ruleset(),
        junk in vec((any::<prop::sample::Index>(), select(JUNK_LINES)), 0..4),
        final_newline in any::<bool>(),
    ) {
        let mut lines: Vec<String> = rs.render().split('\n').map(str::to_string).collect();
        for (at, line) in junk {
            let i = at.index(lines.len() + 1);
            lines.insert(i, line.to_string());
        }
        let mut text = lines.join("\n");
        if !final_newline && text.ends_with('\n') {
            text.pop();
        }
        let mut out = String::new();
        let streamed = roundtrip_save(&text, &mut out).map(|()| out);
        prop_assert_eq!(streamed, parse_save(&text).map(|rs| rs.render()), "{:?}", text);
        let mut out = String::new();
        let streamed = roundtrip_save_lenient(&text, &mut out).map(|w| (out, w));
        prop_assert_eq!(
            streamed,
            parse_save_lenient(&text).map(|(rs, w)| (rs.render(), w)),
            "{:?}", text
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The parallel roundtrip (a dump cut into chunks parsed on threads) gives the sequential
    /// path's output, or its first error, for dumps of several rendered rulesets with good and
    /// bad lines inserted anywhere, cut into any number of chunks.
    #[test]
    fn parallel_roundtrip_is_the_sequential_one(
        rss in vec(a_ruleset(), 1..4),
        junk in vec((any::<prop::sample::Index>(), select(JUNK_LINES)), 0..3),
        final_newline in any::<bool>(),
        threads in 2usize..9,
    ) {
        let mut lines: Vec<String> = Vec::new();
        for rs in &rss {
            let text = rs.render();
            lines.extend(text.strip_suffix('\n').unwrap_or(&text).split('\n').map(str::to_string));
        }
        for (at, line) in junk {
            let i = at.index(lines.len() + 1);
            lines.insert(i, line.to_string());
        }
        let mut text = lines.join("\n");
        if final_newline {
            text.push('\n');
        }
        let sequential = roundtrip_save_parts(&text, 1).map(|p| p.concat());
        prop_assert_eq!(&sequential, &parse_save(&text).map(|rs| rs.render()), "{:?}", text);
        let parallel = roundtrip_save_parts(&text, threads).map(|p| p.concat());
        prop_assert_eq!(parallel, sequential, "{} threads: {:?}", threads, text);
    }
}

/// Lines inserted anywhere into a rendered ruleset: structure, rules good and bad, quotes left open.
const JUNK_LINES: &[&str] = &[
    "",
    "# a comment",
    "*filter",
    "*nat",
    "COMMIT",
    ":INPUT ACCEPT [0:0]",
    ":cali-x - [0:0]",
    ":bad POLICY",
    "-A INPUT -j ACCEPT",
    "-A INPUT -j cali-x",
    "-I INPUT 2 -p tcp --dport 22 -j DROP",
    "[1:2] -A INPUT -s 10.0.0.0/8 -j RETURN",
    "-A INPUT -m comment --comment \"open",
    "quote\" -j ACCEPT",
    "-A INPUT -m tcp --bogus 1 -j ACCEPT",
    "-N chain",
    "   ",
    "-A INPUT -d ! 10.0.0.1 -j DROP",
    "-A INPUT\r",
];
