//! Unit tests of the save parser: typed accuracy on kernel lines, errors with positions.

use pretty_assertions::assert_eq;

use super::*;
use crate::model::*;

fn mk_chain(s: &str) -> ChainName {
    ChainName::new(s).unwrap()
}

/// Parses one rule line inside a filter table that declares `cali-*` chains used below.
fn mk_rule(line: &str) -> Rule {
    let text = format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:cali-INPUT - [0:0]\n:cali-from-hep-forward - [0:0]\n:cali-wl-to-host - [0:0]\n{line}\nCOMMIT\n"
    );
    let rs = parse_save(&text).unwrap_or_else(|e| panic!("{line}: {e}"));
    assert_eq!(rs.render(), text, "round trip of {line}");
    rs.tables().next().unwrap().rules().next().unwrap().clone()
}

fn mk_err(text: &str) -> ParseError {
    parse_save(text).expect_err("expected a parse error")
}

#[test]
fn calico_lines_from_corpus_002_are_typed() {
    let r = mk_rule(
        "-A cali-INPUT -m comment --comment \"cali:ZfgmjuiLaA8Pg0kp\" -m mark --mark 0x0/0x10000 -j cali-from-hep-forward",
    );
    assert_eq!(r.chain.as_str(), "cali-INPUT");
    assert_eq!(
        r.matches,
        vec![
            Match::Comment(Text::new("cali:ZfgmjuiLaA8Pg0kp").unwrap()),
            Match::Mark {
                negated: false,
                value: 0,
                mask: 0x10000
            },
        ]
    );
    assert_eq!(
        r.target,
        Some(Target::Jump(mk_chain("cali-from-hep-forward")))
    );
    assert_eq!(r.cali_comment(), Some("cali:ZfgmjuiLaA8Pg0kp"));

    let r = mk_rule(
        "-A cali-INPUT -p udp -m comment --comment \"cali:EDCNTTxYfggApx8C\" -m comment --comment \"Drop IPv4 VXLAN packets from non-allowed hosts\" -m multiport --dports 4789 -m addrtype --dst-type LOCAL -j DROP",
    );
    assert_eq!(r.protocol, Some(Negatable::is(Protocol::Udp)));
    assert_eq!(
        r.comments().collect::<Vec<_>>(),
        [
            "cali:EDCNTTxYfggApx8C",
            "Drop IPv4 VXLAN packets from non-allowed hosts"
        ]
    );
    assert_eq!(
        r.matches[2],
        Match::Multiport {
            negated: false,
            kind: PortsKind::Destination,
            ports: vec![PortRange::single(4789)]
        }
    );
    assert_eq!(
        r.matches[3],
        Match::Addrtype {
            src: None,
            dst: Some(Negatable::is(vec![AddrType::Local])),
            limit_iface_in: false,
            limit_iface_out: false
        }
    );
    assert_eq!(r.target, Some(Target::Drop));

    let r = mk_rule(
        "-A cali-INPUT -i cali+ -m comment --comment \"cali:H03xYXARh4e8pwd4\" -g cali-wl-to-host",
    );
    assert!(r.in_iface.as_ref().unwrap().value.is_wildcard());
    assert_eq!(r.target, Some(Target::Goto(mk_chain("cali-wl-to-host"))));
}

#[test]
fn calico_set_conntrack_mark_lines_are_typed() {
    let r = mk_rule(
        "-A cali-INPUT -m comment --comment \"cali:vjrMJCRpqwy5oRoX\" -m mark --mark 0x0/0x10000 -m set ! --match-set cali40all-hosts-net src,dst -j MARK --set-xmark 0x10000/0x10000",
    );
    assert_eq!(
        r.matches[2],
        Match::Set {
            negated: true,
            name: SetName::new("cali40all-hosts-net").unwrap(),
            dirs: vec![SetDir::Src, SetDir::Dst]
        }
    );
    assert_eq!(r.target, Some(Target::or_mark(0x10000)));

    let r = mk_rule("-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT");
    assert_eq!(
        r.matches,
        vec![Match::Conntrack {
            negated: false,
            states: CtStates::of(&[CtState::Related, CtState::Established])
        }]
    );
    let r = mk_rule(
        "-A INPUT ! -s 10.0.0.0/8 -d fd00::/64 ! -i eth0 -p tcp -m tcp ! --sport 1024:65535 --dport 22 -j ACCEPT",
    );
    assert_eq!(
        r.src,
        Some(Negatable::not(Addr::Net("10.0.0.0/8".parse().unwrap())))
    );
    assert_eq!(
        r.dst,
        Some(Negatable::is(Addr::Net("fd00::/64".parse().unwrap())))
    );
    assert_eq!(
        r.matches,
        vec![Match::Tcp(Ports {
            sport: Some(Negatable::not(PortRange::range(1024, 65535))),
            dport: Some(Negatable::is(PortRange::single(22)))
        })]
    );
}

#[test]
fn kube_and_log_targets_are_typed_or_generic() {
    let r = mk_rule("-A INPUT -j REJECT --reject-with icmp-port-unreachable");
    assert_eq!(
        r.target,
        Some(Target::Reject {
            with: Some(Word::new("icmp-port-unreachable").unwrap())
        })
    );
    let r = mk_rule("-A INPUT -j LOG --log-prefix \"[UFW BLOCK] \" --log-level 7");
    assert_eq!(
        r.target,
        Some(Target::Log {
            prefix: Some(Text::new("[UFW BLOCK] ").unwrap()),
            level: Some(7)
        })
    );
    let r = mk_rule("-A INPUT -j NFLOG --nflog-prefix probe --nflog-group 100 --nflog-threshold 1");
    assert_eq!(
        r.target,
        Some(Target::Nflog {
            prefix: Some(Text::new("probe").unwrap()),
            group: 100,
            len: None,
            threshold: Some(1)
        })
    );
    let r = mk_rule("-A INPUT -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1:8080");
    assert_eq!(r.target.as_ref().unwrap().name(), "DNAT");
    assert!(matches!(&r.target, Some(Target::Generic { args, .. }) if args.len() == 2));
    // A target name that is not a declared chain stays generic.
    let r = mk_rule("-A INPUT -j MASQUERADE");
    assert!(matches!(&r.target, Some(Target::Generic { args, .. }) if args.is_empty()));
    let r = mk_rule(
        "-A INPUT -m icmp6 --icmpv6-type 135 -m limit --limit 5/min --limit-burst 10 -j ACCEPT",
    );
    assert_eq!(
        r.matches[0],
        Match::Icmpv6 {
            negated: false,
            icmp_type: IcmpType::Type(135)
        }
    );
    assert_eq!(
        r.matches[1],
        Match::Limit {
            rate: Rate {
                count: 5,
                unit: RateUnit::Minute
            },
            burst: Some(10)
        }
    );
}

#[test]
fn non_canonical_spellings_stay_generic_and_verbatim() {
    for line in [
        "-A INPUT -m mark --mark 0x1/0xffffffff -j ACCEPT",
        "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        "-A INPUT -m tcp --dport ssh -j ACCEPT",
        "-A INPUT -m set --match-set s src --return-nomatch ! --update-counters -j DROP",
        "-A INPUT -m string --string \"GET /\" --algo bm -j DROP",
        "-A INPUT -j MARK --set-xmark 0X4000/0XFFFF",
    ] {
        let r = mk_rule(line);
        let generic = r.matches.iter().any(|m| matches!(m, Match::Generic { .. }))
            || matches!(r.target, Some(Target::Generic { .. }));
        assert!(generic, "{line} typed");
    }
    let r =
        mk_rule("-A INPUT -m set --match-set s src --return-nomatch ! --update-counters -j DROP");
    let Match::Generic { args, .. } = &r.matches[0] else {
        panic!()
    };
    assert_eq!(
        args.iter().map(|a| a.as_str()).collect::<Vec<_>>(),
        [
            "--match-set",
            "s",
            "src",
            "--return-nomatch",
            "!",
            "--update-counters"
        ]
    );
}

#[test]
fn restore_input_is_normalised_like_the_kernel() {
    let text = "*filter\n:INPUT ACCEPT\n  -A INPUT -j ACCEPT -s 10.0.0.0/8 -p tcp --dport 22  \n-I INPUT 2 -m comment --comment \"c1\" -c 5 7 -j DROP\n-I INPUT -j DROP\nCOMMIT";
    let rs = parse_save(text).unwrap();
    assert_eq!(
        rs.render(),
        "*filter\n:INPUT ACCEPT\n-A INPUT -s 10.0.0.0/8 -p tcp -m tcp --dport 22 -j ACCEPT\n[5:7] -I INPUT 2 -m comment --comment c1 -j DROP\n-I INPUT -j DROP\nCOMMIT"
    );
}

#[test]
fn save_file_structure_is_kept() {
    let text = "# Generated by iptables-save v1.8.9 (nf_tables) on Sun Nov 22 04:28:09 2026\n*mangle\n:PREROUTING ACCEPT [5:300]\nCOMMIT\n# Completed on Sun Nov 22 04:28:09 2026\n\n*raw\n:OUTPUT DROP [3189808227:4080024509783]\n[1:2] -A OUTPUT -j ACCEPT\nCOMMIT\n# Warning: iptables-legacy tables present, use iptables-legacy-save to see them\n";
    let rs = parse_save(text).unwrap();
    assert_eq!(rs.render(), text);
    assert_eq!(rs.items.len(), 6);
    let raw = rs.table(TableName::Raw).unwrap();
    assert_eq!(
        raw.chain("OUTPUT").unwrap().counters,
        Some(Counters {
            packets: 3189808227,
            bytes: 4080024509783
        })
    );
    assert_eq!(
        raw.rules_of("OUTPUT").next().unwrap().counters,
        Some(Counters {
            packets: 1,
            bytes: 2
        })
    );
    assert!(parse_save("").unwrap().items.is_empty());
}

#[test]
fn hostile_strings_round_trip_without_injection() {
    for s in [
        "-j",
        "--comment",
        "-A",
        "a b",
        "x\" -j ACCEPT",
        "back\\slash",
        "it's",
        "",
        "tab\there",
        "#hash",
        "-s",
        "!",
        "ü ✓",
    ] {
        let rule = Rule::new(mk_chain("INPUT"))
            .with_match(Match::comment(s).unwrap())
            .with_target(Target::Drop);
        let mut t = Table::new(TableName::Filter);
        t.push_chain(Chain::builtin(mk_chain("INPUT"), Policy::Accept));
        t.push_rule(rule.clone());
        let text = t.render();
        let back = parse_save(&text).unwrap_or_else(|e| panic!("{s:?}: {e}\n{text}"));
        let got = back.tables().next().unwrap().rules().next().unwrap();
        assert_eq!(got, &rule, "{s:?} via {text}");
        // The same through LOG/NFLOG prefixes.
        let mut log = Rule::new(mk_chain("INPUT"));
        log.target = Some(Target::Log {
            prefix: Some(Text::new(s).unwrap()),
            level: None,
        });
        let line = format!("*filter\n{}\nCOMMIT\n", log.render());
        let back = parse_save(&line).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        assert_eq!(
            back.tables().next().unwrap().rules().next().unwrap(),
            &log,
            "{line}"
        );
    }
}

#[test]
fn errors_have_line_and_column() {
    let e = mk_err("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -s ! 10.0.0.1 -j DROP\nCOMMIT\n");
    assert_eq!((e.line, e.column), (3, 13));
    assert!(e.message.contains("old negation"), "{e}");
    assert_eq!(e.to_string(), format!("3:13: {}", e.message));

    let cases: &[(&str, usize, usize, &str)] = &[
        ("*filter\r\nCOMMIT\n", 1, 8, "carriage return"),
        ("*filter\n \nCOMMIT\n", 2, 1, "whitespace-only"),
        (
            "*filter\n-A INPUT -j DROP\n",
            2,
            17,
            "COMMIT expected for table filter started at line 1",
        ),
        ("-A INPUT -j DROP\n", 1, 1, "outside a table"),
        ("*bogus\nCOMMIT\n", 1, 2, "table name \"bogus\""),
        (
            "*filter\n-A INPUT -m comment --comment \"open\nCOMMIT\n",
            2,
            31,
            "unterminated double quote",
        ),
        (
            "*filter\n:INPUT MAYBE [0:0]\nCOMMIT\n",
            2,
            8,
            "invalid policy",
        ),
        (
            "*filter\n:INPUT ACCEPT [0:x]\nCOMMIT\n",
            2,
            15,
            "invalid counters",
        ),
        (
            "*filter\n-A ABCDEFGHIJKLMNOPQRSTUVWXYZ123 -j DROP\nCOMMIT\n",
            2,
            4,
            "longer than 28",
        ),
        (
            "*filter\n-A INPUT -i abcdefghijklmnop -j DROP\nCOMMIT\n",
            2,
            13,
            "interface name",
        ),
        (
            "*filter\n-A INPUT -p tcp --dport ! 22 -j DROP\nCOMMIT\n",
            2,
            25,
            "old negation syntax `--dport ! X`",
        ),
        (
            "*filter\n-A INPUT -m set --match-set ! src -j DROP\nCOMMIT\n",
            2,
            29,
            "old negation syntax `--match-set ! X`",
        ),
        (
            "*filter\n-A INPUT -m comment --comment ! -j DROP\nCOMMIT\n",
            2,
            31,
            "old negation syntax `--comment ! X`",
        ),
        (
            "*filter\n-A INPUT -m tcp --bogus 1 -j DROP\nCOMMIT\n",
            2,
            17,
            "unknown option \"--bogus\" for match tcp",
        ),
        (
            "*filter\n-A INPUT -s 1.2.3.4 -s 5.6.7.8\nCOMMIT\n",
            2,
            21,
            "multiple -s",
        ),
        (
            "*filter\n-A INPUT -j DROP -j ACCEPT\nCOMMIT\n",
            2,
            18,
            "multiple targets",
        ),
        (
            "*filter\n-A INPUT bogus\nCOMMIT\n",
            2,
            10,
            "unexpected argument",
        ),
        ("*filter\n-N cali-x\nCOMMIT\n", 2, 1, "unsupported command"),
        (
            "*filter\n-A INPUT -m\nCOMMIT\n",
            2,
            10,
            "needs a module name",
        ),
        (
            "*filter\n-A INPUT -m comment --comment \"a\0\"\nCOMMIT\n",
            2,
            33,
            "NUL",
        ),
        ("*filter\n*nat\nCOMMIT\n", 2, 1, "not committed"),
        ("COMMIT\n", 1, 1, "COMMIT outside"),
        (
            "*filter\n-A INPUT -j ACCEPT --bogus\nCOMMIT\n",
            2,
            20,
            "unknown option \"--bogus\" for target ACCEPT",
        ),
        (
            "*filter\n-A INPUT -j LOG --log-prefix\nCOMMIT\n",
            2,
            17,
            "option --log-prefix of target LOG needs a value",
        ),
    ];
    for (text, line, col, msg) in cases {
        let e = mk_err(text);
        assert!(
            (e.line, e.column) == (*line, *col) && e.message.contains(msg),
            "{text:?}: got {e}, want {line}:{col}: …{msg}…"
        );
    }
}

proptest::proptest! {
    #[test]
    fn count_newlines_counts_every_newline(bytes in proptest::collection::vec(
        proptest::prop_oneof![
            1 => proptest::strategy::Just(b'\n'),
            1 => proptest::strategy::Just(b'\r'),
            1 => proptest::strategy::Just(0u8),
            8 => proptest::num::u8::ANY,
        ],
        0..100,
    )) {
        let naive = bytes.iter().filter(|&&b| b == b'\n').count();
        proptest::prop_assert_eq!(count_newlines(&bytes), naive);
        let cr_nul = bytes.iter().any(|&b| b == b'\r' || b == 0);
        proptest::prop_assert_eq!(has_cr_or_nul(&bytes), cr_nul);
        // The word-at-a-time scans stop where a byte loop does, from every start.
        for start in 0..=bytes.len() {
            let b = &bytes[start..];
            let want = b.iter().position(|c| matches!(c, b'\n' | b'\r' | 0)).unwrap_or(b.len());
            proptest::prop_assert_eq!(find_byte_of(b, [b'\n', b'\r', 0]), want);
            let want = b.iter().position(|&c| c == b'\n').unwrap_or(b.len());
            proptest::prop_assert_eq!(find_byte_of(b, [b'\n']), want);
        }
        let text = String::from_utf8_lossy(&bytes);
        let split: Vec<&str> = SplitLines { rest: Some(&text) }.collect();
        proptest::prop_assert_eq!(split, text.split('\n').collect::<Vec<_>>());
        // Quoting escapes exactly `"`, `\` and `'`, as a per-character loop does.
        let quoted = format!("x\"'\\{text}\\'\"y");
        let mut naive = String::from("\"");
        for c in quoted.chars() {
            if matches!(c, '"' | '\\' | '\'') {
                naive.push('\\');
            }
            naive.push(c);
        }
        naive.push('"');
        let mut out = String::new();
        text::push_quoted(&mut out, &quoted);
        proptest::prop_assert_eq!(out, naive);
    }
}
