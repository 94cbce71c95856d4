//! Kernel round trip: the rendered state is loaded with the real `iptables-restore` /
//! `ip6tables-restore` (and `ipset`) inside a network namespace this test creates, read back with
//! `iptables-save`, parsed with our parser, and must equal the typed rules we rendered, rule for
//! rule (hash comment first). Needs root and iproute2/iptables/ipset (CI has them); fails loudly
//! otherwise.

mod render_support;

use calc_graph::proto::*;
use felixrs_test_support::netns::Netns;
use iptables::desired::IpSetKind as Kind;
use iptables::desired::member_text;
use iptables::render::{LogAction, RenderConfig, Renderer, SourceSpoofing};
use render_support::*;

/// A fresh namespace (deleted on drop, also on panic) after checking root and the tools this test drives.
fn kernel_netns() -> Netns {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&[
        "ip",
        "ipset",
        "iptables-restore",
        "iptables-save",
        "ip6tables-restore",
        "ip6tables-save",
    ]);
    Netns::with_tag("render")
}

fn mk_state() -> Renderer {
    let cfg = RenderConfig {
        log_action: LogAction::Nflog { group: 3 },
        // Renders raw cali-rpf-skip from the endpoints' allowed source prefixes.
        workload_source_spoofing: SourceSpoofing::Any,
        ..Default::default()
    };
    let mut r = Renderer::new(cfg).unwrap();
    let web = mk_np("prod", "web");
    let deny = mk_gnp("deny-external");
    let logp = mk_np("prod", "log-\"all\"");
    let many: Vec<(u16, u16)> = (1..=20).map(|p| (p * 10, p * 10)).collect();
    let rules = vec![
        ParsedRule {
            protocol: Some(Protocol::Tcp),
            src_ip_set_ids: vec!["s:frontend".into()],
            dst_ports: ports(&many),
            dst_named_port_ip_set_ids: vec!["n:http".into()],
            src_nets: vec![net("10.0.0.0/8"), net("192.168.0.0/16"), net("fd00::/8")],
            not_src_nets: vec![net("10.9.0.0/16")],
            annotations: vec![("owner".into(), "team \"a\"".into())],
            ..mk_allow()
        },
        ParsedRule {
            protocol: Some(Protocol::Icmp),
            icmp: Some(IcmpFields {
                type_: Some(8),
                code: Some(0),
            }),
            ..mk_allow()
        },
        ParsedRule {
            protocol: Some(Protocol::IcmpV6),
            icmp: Some(IcmpFields {
                type_: Some(128),
                code: None,
            }),
            ..mk_allow()
        },
        // notICMP, ICMP codes, and protocols by number (issue 11), in both families.
        ParsedRule {
            protocol: Some(Protocol::Icmp),
            not_icmp: Some(IcmpFields {
                type_: Some(8),
                code: Some(3),
            }),
            ..mk_allow()
        },
        ParsedRule {
            protocol: Some(Protocol::IcmpV6),
            icmp: Some(IcmpFields {
                type_: Some(128),
                code: Some(0),
            }),
            ..mk_allow()
        },
        ParsedRule {
            action: Some(Action::Deny),
            protocol: Some(Protocol::Number(58)),
            not_icmp: Some(IcmpFields {
                type_: Some(1),
                code: None,
            }),
            ..Default::default()
        },
        ParsedRule {
            protocol: Some(Protocol::Number(253)),
            ..mk_allow()
        },
        ParsedRule {
            protocol: Some(Protocol::Number(99)),
            ..mk_allow()
        },
        ParsedRule {
            protocol: Some(Protocol::Number(132)),
            ..mk_allow()
        },
        ParsedRule {
            action: Some(Action::Deny),
            not_protocol: Some(Protocol::Icmp),
            ..Default::default()
        },
        ParsedRule {
            action: Some(Action::Pass),
            not_protocol: Some(Protocol::Udp),
            not_dst_ip_set_ids: vec!["s:frontend".into()],
            ..Default::default()
        },
    ];
    let deny_rules = vec![ParsedRule {
        action: Some(Action::Deny),
        protocol: Some(Protocol::Udp),
        not_src_ports: ports(&[(53, 53), (1000, 2000)]),
        dst_nets: vec![net("0.0.0.0/0")],
        ..Default::default()
    }];
    let log_rules = vec![ParsedRule {
        action: Some(Action::Log),
        ..Default::default()
    }];
    let errs = r.apply_all([
        Output::IpSetCreated {
            id: "s:frontend".into(),
            kind: IpSetKind::Net,
            members: vec![
                IpSetMember::Net(net("10.1.2.3/32")),
                IpSetMember::Net(net("fd00::3/128")),
            ]
            .into(),
        },
        Output::IpSetCreated {
            id: "n:http".into(),
            kind: IpSetKind::IpPort,
            members: vec![IpSetMember::IpPort {
                addr: "10.1.2.4".parse().unwrap(),
                protocol: Protocol::Tcp,
                port: 8080,
            }]
            .into(),
        },
        Output::PolicyUpdated(mk_policy(web.clone(), rules.clone(), rules)),
        Output::PolicyUpdated(mk_policy(deny.clone(), deny_rules.clone(), deny_rules)),
        Output::PolicyUpdated(mk_policy(logp.clone(), log_rules.clone(), log_rules)),
        Output::ProfileUpdated(mk_profile("kns.prod", vec![mk_allow()], vec![mk_allow()])),
        Output::EndpointUpdated({
            let mut ep = mk_endpoint(
                "prod",
                "web-0",
                "calic440f455693",
                &["10.65.0.5/32"],
                vec![
                    TierInfo {
                        name: "security".into(),
                        default_action: Action::Pass,
                        ingress_policies: vec![deny.clone()],
                        egress_policies: vec![deny],
                    },
                    mk_tier("default", vec![logp.clone(), web.clone()], vec![web, logp]),
                ],
                &["kns.prod", "ksa.prod.missing"],
            );
            ep.ipv6_nets = vec![net("fd00::5/128")];
            ep.allow_spoofed_source_prefixes =
                vec![net("10.9.0.7/24"), net("fd00:9::/64"), net("::/0")];
            ep
        }),
        Output::EndpointUpdated({
            let mut ep = mk_endpoint(
                "prod",
                "web-1",
                "calic440f455694",
                &["10.65.0.6/32"],
                vec![],
                &["kns.prod"],
            );
            ep.allow_spoofed_source_prefixes = vec![net("0.0.0.0/0")];
            ep
        }),
        Output::EndpointUpdated(mk_endpoint(
            "prod",
            "db-0",
            "cali0011223344a",
            &["10.65.0.7/32"],
            vec![],
            &["kns.prod"],
        )),
    ]);
    assert!(errs.is_empty(), "{errs:?}");
    assert!(r.flush().is_empty());
    r
}

#[test]
fn kernel_resaves_exactly_the_rules_we_render() {
    let r = mk_state();
    for v in [IpVersion::V4, IpVersion::V6] {
        let ns = kernel_netns();
        let d = r.desired(v);
        d.validate().unwrap();
        let family = if v == IpVersion::V4 { "inet" } else { "inet6" };
        let mut sets = String::new();
        for (name, spec) in &d.ip_sets {
            let kind = if spec.kind == Kind::Net {
                "hash:net"
            } else {
                "hash:ip,port"
            };
            sets.push_str(&format!(
                "create {name} {kind} family {family} maxelem {}\n",
                spec.maxelem
            ));
            for m in &spec.members {
                sets.push_str(&format!("add {name} {}\n", member_text(m)));
            }
        }
        assert!(!d.ip_sets.is_empty());
        ns.feed("ipset", &["restore"], &sets);
        let (restore, save) = if v == IpVersion::V4 {
            ("iptables-restore", "iptables-save")
        } else {
            ("ip6tables-restore", "ip6tables-save")
        };
        ns.feed(restore, &["--noflush"], &restore_text(&d));
        let saved = ns.ok(save, &[]);
        let parsed = iptables::parse::parse_save(&saved)
            .unwrap_or_else(|e| panic!("kernel output does not parse: {e}\n{saved}"));
        let mut checked = 0;
        for (table, t) in &d.tables {
            let pt = parsed
                .table(table.as_str().parse().unwrap())
                .unwrap_or_else(|| panic!("no table {table}"));
            for (name, rules) in &t.chains {
                let ours = r.chain(v, *table, name).unwrap();
                let got: Vec<_> = pt.rules_of(name).collect();
                assert_eq!(got.len(), rules.len(), "{v:?} {name}: rule count\n{saved}");
                for ((g, ours), want) in got.iter().zip(ours).zip(rules) {
                    let expected = ours.hashed(name, &want.hash).unwrap();
                    assert_eq!(
                        **g, expected,
                        "{v:?} {name}: kernel re-saved a different rule"
                    );
                    checked += 1;
                }
            }
            for h in &t.hooks {
                assert!(
                    pt.rules_of(&h.kernel_chain)
                        .any(|g| g.cali_comment() == Some(&format!("cali:{}", h.rule.hash))),
                    "hook {} missing",
                    h.rule.hash
                );
            }
        }
        assert!(checked > 60, "{checked}");
        if std::env::var_os("RENDER_KERNEL_DUMP").is_some() {
            println!("{saved}");
        }
    }
}
