//! Typed rules rendered by the model, loaded into the real kernel (a network namespace this test
//! creates and always deletes), come back from `iptables-save` / `iptables-legacy-save` with exactly
//! the same text, and parse back into the same typed rules. Needs root, `ip`, `ipset` and the
//! iptables tools (CI runs as root); fails loudly when they are missing.

use felixrs_test_support::netns::Netns;
use iptables::model::*;
use iptables::parse::parse_save;

/// A fresh namespace (deleted on drop, also on panic) after checking root and the tools this test drives.
fn kernel_netns() -> Netns {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&[
        "ip",
        "ipset",
        "iptables-restore",
        "iptables-save",
        "iptables-legacy-restore",
        "iptables-legacy-save",
    ]);
    Netns::with_tag("parse")
}

fn mk_chain(s: &str) -> ChainName {
    ChainName::new(s).unwrap()
}

/// Calico-style rules in the kernel's normal form, one per typed match/target variant.
fn mk_rules() -> Vec<Rule> {
    let c = || mk_chain("cali-fw-test");
    let set = SetName::new("cali40s-test").unwrap();
    let mut rules = vec![
        Rule::new(c())
            .with_match(Match::comment("cali:vjrMJCRpqwy5oRoX").unwrap())
            .with_match(Match::Mark {
                negated: false,
                value: 0,
                mask: 0x10000,
            })
            .with_match(Match::Set {
                negated: false,
                name: set.clone(),
                dirs: vec![SetDir::Src],
            })
            .with_target(Target::or_mark(0x10000)),
        Rule::new(c())
            .with_match(Match::Conntrack {
                negated: false,
                states: CtStates::of(&[CtState::Established, CtState::Related]),
            })
            .with_target(Target::Accept),
        Rule::new(c())
            .with_match(Match::Conntrack {
                negated: false,
                states: CtStates::of(&[CtState::Invalid]),
            })
            .with_target(Target::Drop),
        Rule::new(c())
            .with_match(Match::Mark {
                negated: true,
                value: 0x4000,
                mask: 0x4000,
            })
            .with_target(Target::Return),
        Rule::new(c())
            .with_match(Match::Set {
                negated: true,
                name: set,
                dirs: vec![SetDir::Dst, SetDir::Dst],
            })
            .with_target(Target::Reject {
                with: Some(Word::new("icmp-port-unreachable").unwrap()),
            }),
        Rule {
            protocol: Some(Negatable::is(Protocol::Udp)),
            ..Rule::new(c())
        }
        .with_match(Match::Multiport {
            negated: true,
            kind: PortsKind::Source,
            ports: vec![PortRange::single(53), PortRange::range(8000, 8080)],
        })
        .with_target(Target::Drop),
        Rule::new(c())
            .with_match(Match::Addrtype {
                src: Some(Negatable::not(vec![AddrType::Local])),
                dst: None,
                limit_iface_in: false,
                limit_iface_out: true,
            })
            .with_match(Match::Limit {
                rate: Rate {
                    count: 5,
                    unit: RateUnit::Minute,
                },
                burst: Some(10),
            })
            .with_target(Target::Log {
                prefix: Some(Text::new("calico-drop: \"x\" it's").unwrap()),
                level: Some(7),
            }),
        Rule::new(c())
            .with_match(Match::comment("hostile \" -j ACCEPT \\ 'x'").unwrap())
            .with_target(Target::Nflog {
                prefix: Some(Text::new("DPI|p").unwrap()),
                group: 1,
                len: Some(NflogLen::Size(80)),
                threshold: None,
            }),
        Rule::new(c()).with_target(Target::Goto(mk_chain("cali-pi-test"))),
        Rule::new(c()).with_target(Target::Jump(mk_chain("cali-pi-test"))),
        Rule::new(c()).with_target(Target::and_mark(0xfff0ffff)),
        Rule::new(c()).with_target(Target::set_mark(0x20000, 0x30000)),
    ];
    let mut r = Rule::new(c());
    r.src = Some(Negatable::not(Addr::Net("10.65.0.0/16".parse().unwrap())));
    r.dst = Some(Negatable::is(Addr::Net("10.65.1.2/32".parse().unwrap())));
    r.in_iface = Some(Negatable::is(Iface::new("cali+").unwrap()));
    r.out_iface = Some(Negatable::not(Iface::new("eth0").unwrap()));
    r.protocol = Some(Negatable::is(Protocol::Tcp));
    r.matches.push(Match::Tcp(Ports {
        sport: Some(Negatable::not(PortRange::range(1, 1023))),
        dport: Some(Negatable::is(PortRange::single(443))),
    }));
    r.target = Some(Target::Accept);
    rules.push(r);
    let mut r = Rule::new(c());
    r.protocol = Some(Negatable::is(Protocol::Icmp));
    r.matches.push(Match::Icmp {
        negated: false,
        icmp_type: IcmpType::TypeCode(3, 4),
    });
    r.target = Some(Target::Accept);
    rules.push(r);
    let mut r = Rule::new(c());
    r.protocol = Some(Negatable::is(Protocol::Udp));
    r.matches.push(Match::Udp(Ports {
        sport: None,
        dport: Some(Negatable::is(PortRange::single(4789))),
    }));
    r.matches.push(Match::comment("a.b").unwrap());
    r.target = Some(Target::Generic {
        name: Word::new("CT").unwrap(),
        args: vec![Arg::bare("--notrack").unwrap()],
    });
    // CT is a raw-table target; keep this rule for the raw table below.
    rules.push(r);
    rules
}

#[test]
fn typed_rules_survive_the_kernel_byte_for_byte() {
    for r in mk_rules() {
        r.validate().unwrap();
    }
    let ns = kernel_netns();
    ns.ok("ipset", &["create", "cali40s-test", "hash:ip,port"]);
    let rules = mk_rules();
    let (raw_rules, filter_rules): (Vec<Rule>, Vec<Rule>) = rules
        .into_iter()
        .partition(|r| r.target.as_ref().is_some_and(|t| t.name() == "CT"));
    let mut filter = Table::new(TableName::Filter);
    for b in ["INPUT", "FORWARD", "OUTPUT"] {
        filter.push_chain(Chain::builtin(mk_chain(b), Policy::Accept));
    }
    for u in ["cali-fw-test", "cali-pi-test"] {
        filter.push_chain(Chain::user(mk_chain(u)));
    }
    filter_rules
        .iter()
        .cloned()
        .for_each(|r| filter.push_rule(r));
    let mut raw = Table::new(TableName::Raw);
    for b in ["PREROUTING", "OUTPUT"] {
        raw.push_chain(Chain::builtin(mk_chain(b), Policy::Accept));
    }
    raw.push_chain(Chain::user(mk_chain("cali-fw-test")));
    raw_rules.iter().cloned().for_each(|r| raw.push_rule(r));
    let payload = format!("{}{}", filter.render(), raw.render());

    for (restore, save) in [
        ("iptables-restore", "iptables-save"),
        ("iptables-legacy-restore", "iptables-legacy-save"),
    ] {
        ns.feed(restore, &[], &payload);
        for (table, want) in [(&filter, &filter_rules), (&raw, &raw_rules)] {
            let text = ns.ok(save, &["-t", table.name.as_str()]);
            let rs = parse_save(&text)
                .unwrap_or_else(|e| panic!("{save} output does not parse: {e}\n{text}"));
            assert_eq!(rs.render(), text, "{save} output must round-trip");
            let t = rs.table(table.name).expect("table in save output");
            let got: Vec<&Rule> = t.rules_of("cali-fw-test").collect();
            assert_eq!(got.len(), want.len(), "{save}: {text}");
            for (g, w) in got.iter().zip(want.iter()) {
                assert_eq!(
                    g.render_spec(),
                    w.render_spec(),
                    "{save} re-saved the rule differently"
                );
                assert_eq!(*g, w, "{save}: parsed rule differs from the typed one");
            }
        }
        // Leave the tables empty before the other backend loads.
        ns.feed(restore, &[], "*filter\nCOMMIT\n*raw\nCOMMIT\n");
    }
}
