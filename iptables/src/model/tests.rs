//! Rendering tests of the typed model against lines the kernel printed (corpus 001/002, probes).

use std::num::NonZeroU32;

use super::*;

fn mk_chain(s: &str) -> ChainName {
    ChainName::new(s).unwrap()
}

fn mk_net(s: &str) -> Addr {
    Addr::Net(s.parse().unwrap())
}

#[test]
fn calico_rule_renders_like_iptables_save() {
    let r = Rule::new(mk_chain("cali-FORWARD"))
        .with_match(Match::comment("cali:vjrMJCRpqwy5oRoX").unwrap())
        .with_match(Match::Mark {
            negated: false,
            value: 0,
            mask: 0x10000,
        })
        .with_match(Match::Set {
            negated: false,
            name: SetName::new("cali40all-hosts-net").unwrap(),
            dirs: vec![SetDir::Src],
        })
        .with_target(Target::or_mark(0x10000));
    assert_eq!(
        r.render(),
        "-A cali-FORWARD -m comment --comment \"cali:vjrMJCRpqwy5oRoX\" -m mark --mark 0x0/0x10000 \
         -m set --match-set cali40all-hosts-net src -j MARK --set-xmark 0x10000/0x10000"
    );
}

#[test]
fn base_options_render_in_kernel_order() {
    let mut r = Rule::new(mk_chain("FORWARD"));
    r.protocol = Some(Negatable::is(Protocol::Tcp));
    r.fragment = Some(Negatable::not(()));
    r.out_iface = Some(Negatable::not(Iface::new("docker0").unwrap()));
    r.in_iface = Some(Negatable::is(Iface::new("cali+").unwrap()));
    r.dst = Some(Negatable::is(mk_net("10.0.0.2/32")));
    r.src = Some(Negatable::not(mk_net("10.0.0.0/8")));
    r.matches.push(Match::Tcp(Ports {
        sport: None,
        dport: Some(Negatable::not(PortRange::range(1, 1023))),
    }));
    r.target = Some(Target::Accept);
    assert_eq!(
        r.render_spec(),
        "! -s 10.0.0.0/8 -d 10.0.0.2/32 -i cali+ ! -o docker0 -p tcp ! -f -m tcp ! --dport 1:1023 -j ACCEPT"
    );
}

#[test]
fn typed_matches_and_targets_render_kernel_spelling() {
    let cases: Vec<(Match, &str)> = vec![
        (
            Match::Conntrack {
                negated: false,
                states: CtStates::of(&[CtState::Established, CtState::Related]),
            },
            "-m conntrack --ctstate RELATED,ESTABLISHED",
        ),
        (
            Match::State {
                negated: true,
                states: CtStates::of(&[CtState::New]),
            },
            "-m state ! --state NEW",
        ),
        (
            Match::Mark {
                negated: true,
                value: 0x4000,
                mask: 0x4000,
            },
            "-m mark ! --mark 0x4000/0x4000",
        ),
        (
            Match::Mark {
                negated: false,
                value: 1,
                mask: u32::MAX,
            },
            "-m mark --mark 0x1",
        ),
        (
            Match::Multiport {
                negated: false,
                kind: PortsKind::Destination,
                ports: vec![PortRange::single(80), PortRange::range(8000, 8080)],
            },
            "-m multiport --dports 80,8000:8080",
        ),
        (
            Match::Icmp {
                negated: false,
                icmp_type: IcmpType::TypeCode(3, 4),
            },
            "-m icmp --icmp-type 3/4",
        ),
        (
            Match::Icmpv6 {
                negated: false,
                icmp_type: IcmpType::Type(128),
            },
            "-m icmp6 --icmpv6-type 128",
        ),
        (
            Match::Addrtype {
                src: None,
                dst: Some(Negatable::not(vec![AddrType::Local])),
                limit_iface_in: true,
                limit_iface_out: false,
            },
            "-m addrtype ! --dst-type LOCAL --limit-iface-in",
        ),
        (
            Match::Limit {
                rate: Rate {
                    count: 5,
                    unit: RateUnit::Minute,
                },
                burst: Some(10),
            },
            "-m limit --limit 5/min --limit-burst 10",
        ),
        (
            Match::comment("it's").unwrap(),
            "-m comment --comment \"it\\'s\"",
        ),
    ];
    for (m, want) in cases {
        assert_eq!(m.to_string(), want);
    }
    let targets: Vec<(Target, &str)> = vec![
        (
            Target::and_mark(0xffff),
            "-j MARK --set-xmark 0x0/0xffff0000",
        ),
        (
            Target::Reject {
                with: Some(Word::new("icmp-port-unreachable").unwrap()),
            },
            "-j REJECT --reject-with icmp-port-unreachable",
        ),
        (Target::Goto(mk_chain("cali-pi-x")), "-g cali-pi-x"),
        (
            Target::Log {
                prefix: Some(Text::new("probe: ").unwrap()),
                level: Some(7),
            },
            "-j LOG --log-prefix \"probe: \" --log-level 7",
        ),
        (
            Target::Nflog {
                prefix: Some(Text::new("probe").unwrap()),
                group: 100,
                len: Some(NflogLen::Size(128)),
                threshold: Some(1),
            },
            "-j NFLOG --nflog-prefix probe --nflog-group 100 --nflog-size 128 --nflog-threshold 1",
        ),
    ];
    for (t, want) in targets {
        assert_eq!(t.to_string(), want);
    }
}

#[test]
fn hostile_comment_cannot_inject() {
    let hostile = "x\" -j ACCEPT -m comment --comment \"y \\ '";
    let r = Rule::new(mk_chain("cali-x"))
        .with_match(Match::comment(hostile).unwrap())
        .with_target(Target::Drop);
    assert_eq!(
        r.render_spec(),
        "-m comment --comment \"x\\\" -j ACCEPT -m comment --comment \\\"y \\\\ \\'\" -j DROP"
    );
    assert!(Match::comment("a\nCOMMIT").is_err());
    assert!(Match::comment("x".repeat(256)).is_err());
    assert!(Match::comment("x".repeat(255)).is_ok());
}

#[test]
fn restore_writer_builds_noflush_payload() {
    let c = mk_chain("cali-fw-eth0");
    let rule = Rule::new(c.clone()).with_target(Target::Drop);
    let one = NonZeroU32::new(1).unwrap();
    let mut w = RestoreWriter::new();
    w.begin_table(TableName::Filter)
        .declare_chain(&Chain::user(c.clone()))
        .new_chain(&mk_chain("cali-new"))
        .append(&rule)
        .insert(one, &rule)
        .replace(NonZeroU32::new(2).unwrap(), &rule)
        .delete_at(&c, one)
        .delete_rule(&rule)
        .flush_chain(&c)
        .delete_chain(&c)
        .commit();
    assert_eq!(
        w.finish(),
        "*filter\n:cali-fw-eth0 - [0:0]\n-N cali-new\n-A cali-fw-eth0 -j DROP\n-I cali-fw-eth0 1 -j DROP\n\
         -R cali-fw-eth0 2 -j DROP\n-D cali-fw-eth0 1\n-D cali-fw-eth0 -j DROP\n-F cali-fw-eth0\n-X cali-fw-eth0\nCOMMIT\n"
    );
}

#[test]
fn table_and_ruleset_render() {
    let mut t = Table::new(TableName::Raw);
    t.push_chain(Chain::builtin(mk_chain("PREROUTING"), Policy::Accept));
    t.push_chain(Chain {
        name: mk_chain("OUTPUT"),
        policy: Some(Policy::Drop),
        counters: Some(Counters {
            packets: 5,
            bytes: 300,
        }),
    });
    let mut r = Rule::new(mk_chain("OUTPUT")).with_target(Target::Accept);
    r.counters = Some(Counters {
        packets: 3189808227,
        bytes: 4080024509783,
    });
    t.push_rule(r);
    let rs = Ruleset {
        items: vec![
            Item::Comment(CommentLine::new("# Generated by test").unwrap()),
            Item::Table(t),
            Item::Blank,
        ],
        missing_final_newline: false,
    };
    assert_eq!(
        rs.render(),
        "# Generated by test\n*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT DROP [5:300]\n[3189808227:4080024509783] -A OUTPUT -j ACCEPT\nCOMMIT\n\n"
    );
    assert!(CommentLine::new("no hash").is_err());
    assert_eq!("nat".parse::<TableName>().unwrap(), TableName::Nat);
    assert!("NAT".parse::<TableName>().is_err());
}

#[test]
fn validate_catches_silent_kernel_limits() {
    let base = Rule::new(mk_chain("cali-x"));
    assert!(
        base.clone()
            .with_match(Match::comment("x".repeat(255)).unwrap())
            .validate()
            .is_ok()
    );
    let long = Rule {
        matches: vec![Match::Comment(Text::new("x".repeat(256)).unwrap())],
        ..base.clone()
    };
    assert!(
        long.validate()
            .unwrap_err()
            .to_string()
            .contains("longer than 255")
    );
    let empty = base.clone().with_match(Match::Conntrack {
        negated: false,
        states: CtStates::default(),
    });
    assert_eq!(
        empty.validate().unwrap_err().to_string(),
        "rule in chain \"cali-x\" has an empty conntrack state list"
    );
    let many = base.clone().with_match(Match::Multiport {
        negated: false,
        kind: PortsKind::Destination,
        ports: (1..=8).map(|p| PortRange::range(p, p + 1)).collect(),
    });
    assert!(
        many.validate()
            .unwrap_err()
            .to_string()
            .contains("16 multiport ports")
    );
    let rev = base.clone().with_match(Match::Tcp(Ports {
        sport: None,
        dport: Some(Negatable::is(PortRange::range(9, 1))),
    }));
    assert!(
        rev.validate()
            .unwrap_err()
            .to_string()
            .contains("reversed port range 9:1")
    );
    let log = base.clone().with_target(Target::Log {
        prefix: Some(Text::new("p".repeat(30)).unwrap()),
        level: None,
    });
    assert!(
        log.validate()
            .unwrap_err()
            .to_string()
            .starts_with("LOG prefix")
    );
    let nflog = base.with_target(Target::Nflog {
        prefix: Some(Text::new("p".repeat(63)).unwrap()),
        group: 1,
        len: None,
        threshold: None,
    });
    assert!(nflog.validate().is_ok());
}

#[test]
fn addresses_are_typed_only_in_kernel_spelling() {
    for ok in [
        "10.0.0.0/8",
        "0.0.0.0/0",
        "10.1.2.3/32",
        "fd00::/64",
        "::ffff:10.0.0.1/128",
        "2001:db8::1/128",
    ] {
        assert!(
            matches!(Addr::from_token(ok).unwrap(), Addr::Net(_)),
            "{ok}"
        );
        assert_eq!(Addr::from_token(ok).unwrap().to_string(), ok);
    }
    for other in [
        "10.0.0.1",
        "010.0.0.0/8",
        "10.0.0.0/08",
        "2001:0db8::1/128",
        "10.0.2.0/255.0.255.0",
        "localhost",
    ] {
        assert!(
            matches!(Addr::from_token(other).unwrap(), Addr::Other(_)),
            "{other}"
        );
        assert_eq!(Addr::from_token(other).unwrap().to_string(), other);
    }
}

proptest::proptest! {
    /// The allocation-free IPv6 spelling check agrees with `IpNet`'s Display on addresses rich in
    /// zero runs and IPv4-mapped forms.
    #[test]
    fn v6_spelling_matches_display(
        groups in proptest::collection::vec(
            proptest::prop_oneof![
                3 => proptest::strategy::Just(0u16),
                1 => proptest::strategy::Just(0xffffu16),
                2 => proptest::num::u16::ANY,
                1 => 0u16..16,
            ],
            8,
        ),
        len in 0u8..=128,
        mapped in proptest::bool::ANY,
    ) {
        let mut g: [u16; 8] = groups.try_into().unwrap();
        if mapped {
            g[..5].fill(0);
            g[5] = 0xffff;
        }
        let net = ipnet::Ipv6Net::new(std::net::Ipv6Addr::from(g), len).unwrap();
        let shown = net.to_string();
        proptest::prop_assert!(super::rule::v6_spelled_as(&net, &shown), "{}", shown);
        let upper = shown.to_uppercase();
        proptest::prop_assert_eq!(super::rule::v6_spelled_as(&net, &upper), upper == shown);
        let longer = format!("{shown}0");
        proptest::prop_assert!(!super::rule::v6_spelled_as(&net, &longer));
    }
}

proptest::proptest! {
    /// `Addr::from_token` types a token as `Net` exactly when `IpNet` parses it and displays it
    /// back identically (the fast paths must not change which tokens are typed).
    #[test]
    fn addr_from_token_agrees_with_ipnet(s in "[0-9a-fA-F:./]{1,24}|[0-9]{1,3}(\\.[0-9]{1,3}){3}/[0-9]{1,2}|[0-9a-f:]{2,30}/[0-9]{1,3}") {
        let want_net = s
            .parse::<ipnet::IpNet>()
            .ok()
            .filter(|n| n.to_string() == s);
        match Addr::from_token(&s).unwrap() {
            Addr::Net(n) => proptest::prop_assert_eq!(Some(n), want_net),
            Addr::Other(_) => proptest::prop_assert_eq!(None, want_net),
        }
    }
}
