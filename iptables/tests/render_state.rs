//! Renderer state behaviour: incremental (dirty-set) re-rendering, lazy programming, IP set
//! family split, dual-stack endpoints, dispatch trees, fail-closed errors.

mod render_support;

use calc_graph::proto::*;
use iptables::desired::{IpSetKind as SetKind, TableName};
use iptables::model::{ChainName, Target, Text};
use iptables::render::{LogAction, RenderConfig, RenderError, Renderer};
use render_support::*;

const F: TableName = TableName::Filter;

fn mk_renderer(outputs: Vec<Output>) -> Renderer {
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    let errs = r.apply_all(outputs);
    assert!(errs.is_empty(), "{errs:?}");
    assert!(r.flush().is_empty());
    r
}

fn changed_chains(r: &mut Renderer, v: IpVersion) -> Vec<String> {
    r.take_delta(v)
        .chains
        .into_iter()
        .map(|(_, n, _)| n)
        .collect()
}

fn base() -> Vec<Output> {
    let a = mk_np("prod", "a");
    let b = mk_np("prod", "b");
    vec![
        Output::PolicyUpdated(mk_policy(a.clone(), vec![mk_allow()], vec![mk_allow()])),
        Output::PolicyUpdated(mk_policy(b.clone(), vec![mk_allow()], vec![])),
        Output::ProfileUpdated(mk_profile("kns.prod", vec![mk_allow()], vec![mk_allow()])),
        Output::EndpointUpdated(mk_endpoint(
            "prod",
            "web",
            "cali1111",
            &["10.0.0.1/32"],
            vec![mk_tier("default", vec![a.clone(), b], vec![a])],
            &["kns.prod"],
        )),
    ]
}

#[test]
fn one_policy_change_rerenders_only_that_policys_chains() {
    let mut r = mk_renderer(base());
    for v in [IpVersion::V4, IpVersion::V6] {
        assert!(!r.take_delta(v).is_empty());
    }
    let deny = ParsedRule {
        action: Some(Action::Deny),
        protocol: Some(Protocol::Tcp),
        ..Default::default()
    };
    r.apply(Output::PolicyUpdated(mk_policy(
        mk_np("prod", "a"),
        vec![deny],
        vec![mk_allow()],
    )))
    .unwrap();
    assert!(r.flush().is_empty());
    for v in [IpVersion::V4, IpVersion::V6] {
        // Egress rules are unchanged, so only the ingress chain differs.
        assert_eq!(changed_chains(&mut r, v), ["cali-pi-np/prod/a"]);
    }
    // The same update again changes nothing.
    r.apply(Output::PolicyUpdated(mk_policy(
        mk_np("prod", "a"),
        vec![ParsedRule {
            action: Some(Action::Deny),
            protocol: Some(Protocol::Tcp),
            ..Default::default()
        }],
        vec![mk_allow()],
    )))
    .unwrap();
    r.flush();
    assert!(r.take_delta(IpVersion::V4).is_empty());
}

#[test]
fn chains_exist_only_while_referenced() {
    let mut r = mk_renderer(base());
    let names = r.chain_names(IpVersion::V4, F);
    for n in [
        "cali-pi-np/prod/a",
        "cali-po-np/prod/a",
        "cali-pi-np/prod/b",
        "cali-pri-kns.prod",
        "cali-pro-kns.prod",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    // b has no egress rules for this endpoint's egress tier: nothing jumps to cali-po-np/prod/b.
    assert!(!names.contains(&"cali-po-np/prod/b"));
    // A policy nobody references is never programmed.
    r.apply(Output::PolicyUpdated(mk_policy(
        mk_gnp("unused"),
        vec![mk_allow()],
        vec![],
    )))
    .unwrap();
    r.flush();
    assert!(r.chain(IpVersion::V4, F, "cali-pi-gnp/unused").is_none());
    r.take_delta(IpVersion::V4);
    // Removing the endpoint removes its chains and every chain only it referenced (its shared
    // policy chains too: it was their only user).
    let web = EndpointId {
        namespace: "prod".into(),
        name: "web".into(),
    };
    let shared: Vec<String> = [true, false]
        .map(|i| r.shared_chain(&web, i).unwrap().to_string())
        .into();
    assert!(shared.iter().all(|s| r.shared_chain_users(s) == 1));
    r.apply(Output::EndpointRemoved(web)).unwrap();
    r.flush();
    let mut removed: Vec<String> = r
        .take_delta(IpVersion::V4)
        .chains
        .into_iter()
        .filter(|(_, _, rules)| rules.is_none())
        .map(|(_, n, _)| n)
        .collect();
    removed.sort();
    let mut want: Vec<String> = [
        "cali-fw-cali1111",
        "cali-pi-np/prod/a",
        "cali-pi-np/prod/b",
        "cali-po-np/prod/a",
        "cali-pri-kns.prod",
        "cali-pro-kns.prod",
        "cali-tw-cali1111",
    ]
    .map(String::from)
    .into();
    want.extend(shared);
    want.sort();
    assert_eq!(removed, want);
    assert_eq!(r.shared_chain_count(), 0);
    let d = r.desired(IpVersion::V4);
    assert_eq!(
        d.tables[&F].chains["cali-to-wl-dispatch"].len(),
        1,
        "only the Unknown interface drop"
    );
}

#[test]
fn ip_sets_are_split_by_family_and_emitted_only_where_referenced() {
    let v4_only = ParsedRule {
        ip_version: Some(IpVersion::V4),
        src_ip_set_ids: vec!["s:v4only".into()],
        ..mk_allow()
    };
    let both = ParsedRule {
        src_ip_set_ids: vec!["s:both".into()],
        ..mk_allow()
    };
    let p = mk_np("ns", "p");
    let mut outputs = vec![
        Output::IpSetCreated {
            id: "s:both".into(),
            kind: IpSetKind::Net,
            members: vec![
                IpSetMember::Net(net("10.0.0.1/32")),
                IpSetMember::Net(net("fd00::1/128")),
                IpSetMember::Net(net("::/0")),
            ]
            .into(),
        },
        Output::IpSetCreated {
            id: "s:v4only".into(),
            kind: IpSetKind::Net,
            members: vec![].into(),
        },
        Output::IpSetCreated {
            id: "s:unused".into(),
            kind: IpSetKind::Net,
            members: vec![].into(),
        },
        Output::PolicyUpdated(mk_policy(p.clone(), vec![v4_only, both], vec![])),
    ];
    let mut ep = mk_endpoint(
        "ns",
        "e",
        "cali2",
        &["10.0.0.2/32"],
        vec![mk_tier("t", vec![p], vec![])],
        &[],
    );
    ep.ipv6_nets = vec![net("fd00::2/128")];
    outputs.push(Output::EndpointUpdated(ep));
    let mut r = mk_renderer(outputs);
    let d4 = r.desired(IpVersion::V4);
    let d6 = r.desired(IpVersion::V6);
    d4.validate().unwrap();
    d6.validate().unwrap();
    assert_eq!(
        d4.ip_sets.keys().collect::<Vec<_>>(),
        ["cali40s:both", "cali40s:v4only"]
    );
    assert_eq!(d6.ip_sets.keys().collect::<Vec<_>>(), ["cali60s:both"]);
    let m4: Vec<_> = d4.ip_sets["cali40s:both"].members.iter().collect();
    assert_eq!(
        d6.ip_sets["cali60s:both"]
            .members
            .iter()
            .collect::<Vec<_>>(),
        [
            &IpSetMember::Net(net("::/1")),
            &IpSetMember::Net(net("8000::/1")),
            &IpSetMember::Net(net("fd00::1/128"))
        ],
        "a /0 member is stored as two /1 halves"
    );
    assert_eq!(m4, [&IpSetMember::Net(net("10.0.0.1/32"))]);
    assert_eq!(d6.ip_sets["cali60s:both"].kind, SetKind::Net);
    // The dual-stack endpoint is protected in both families.
    for v in [IpVersion::V4, IpVersion::V6] {
        let tw = endpoint_rules(&r, v, "cali-tw-cali2").unwrap();
        assert!(
            tw.iter()
                .any(|x| x.target == Some(Target::Jump(ChainName::new("cali-pi-np/ns/p").unwrap())))
        );
        assert_eq!(tw.last().unwrap().target, Some(Target::Drop));
    }
    // Member deltas reach only the family they belong to.
    r.take_delta(IpVersion::V4);
    r.take_delta(IpVersion::V6);
    r.apply(Output::IpSetMembersAdded {
        id: "s:both".into(),
        members: vec![IpSetMember::Net(net("fd00::9/128"))],
    })
    .unwrap();
    r.flush();
    assert!(r.take_delta(IpVersion::V4).is_empty());
    let d = r.take_delta(IpVersion::V6);
    assert_eq!(d.ip_sets.len(), 1);
    assert_eq!(d.ip_sets[0].1.as_ref().unwrap().members.len(), 4);
    assert!(matches!(
        r.apply(Output::IpSetMembersAdded {
            id: "s:nope".into(),
            members: vec![]
        }),
        Err(RenderError::UnknownIpSet { .. })
    ));
}

#[test]
fn v6_workloads_may_send_ndp_to_the_host() {
    let r = mk_renderer(vec![]);
    let rules = r.chain(IpVersion::V6, F, "cali-wl-to-host").unwrap();
    let texts: Vec<String> = rules.iter().map(|r| r.felix_text().to_string()).collect();
    for t in [130, 131, 132, 133, 135, 136] {
        assert!(
            texts.contains(&format!("-p 58 -m icmp6 --icmpv6-type {t} --jump ACCEPT")),
            "{texts:?}"
        );
    }
    assert!(!texts.iter().any(|t| t.contains("icmpv6-type 134")));
    let v4: Vec<&str> = r
        .chain(IpVersion::V4, F, "cali-wl-to-host")
        .unwrap()
        .iter()
        .map(|r| r.felix_text())
        .collect();
    assert!(!v4.iter().any(|t| t.contains("icmp")));
}

#[test]
fn dispatch_tree_reaches_every_interface_and_drops_the_rest() {
    let mut outputs = Vec::new();
    let mut ifaces = Vec::new();
    for i in 0..300u32 {
        let iface = format!(
            "cali{:011x}",
            (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20
        );
        ifaces.push(iface.clone());
        outputs.push(Output::EndpointUpdated(mk_endpoint(
            "ns",
            &format!("p{i}"),
            &iface,
            &[],
            vec![],
            &[],
        )));
    }
    let r = mk_renderer(outputs);
    let d = r.desired(IpVersion::V4);
    let chains = &d.tables[&F].chains;
    let mut reached = std::collections::BTreeSet::new();
    for (name, _) in chains
        .iter()
        .filter(|(n, _)| n.starts_with("cali-from-wl-dispatch"))
    {
        assert!(name.len() <= 28);
        let rules = r.chain(IpVersion::V4, F, name).unwrap();
        assert_eq!(
            rules.last().unwrap().target,
            Some(Target::Drop),
            "{name} must end with the unknown-interface drop"
        );
        for rule in rules {
            if let Some(Target::Goto(t)) = &rule.target
                && let Some(iface) = t.as_str().strip_prefix("cali-fw-")
            {
                reached.insert(iface.to_string());
            }
        }
    }
    assert_eq!(reached.len(), 300);
    let root = r.chain(IpVersion::V4, F, "cali-from-wl-dispatch").unwrap();
    assert!(
        root.len() <= 17,
        "one level, binned by one hex digit: {}",
        root.len()
    );
}

#[test]
fn unrenderable_policies_fail_closed_with_an_error_naming_them() {
    let bad = ParsedRule {
        dst_ports: ports(&[(80, 80)]),
        ..mk_allow()
    };
    let p = mk_np("ns", "bad");
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    r.apply_all([
        Output::PolicyUpdated(mk_policy(p.clone(), vec![bad], vec![])),
        Output::EndpointUpdated(mk_endpoint(
            "ns",
            "e",
            "cali3",
            &[],
            vec![mk_tier("default", vec![p.clone()], vec![])],
            &["kns.ns"],
        )),
    ]);
    let errs = r.flush();
    // One error per family.
    assert_eq!(errs.len(), 2, "{errs:?}");
    let msg = errs[0].to_string();
    assert!(
        msg.contains("NetworkPolicy ns/bad ingress") && msg.contains("destination ports"),
        "{msg}"
    );
    let chain = r.chain(IpVersion::V4, F, "cali-pi-np/ns/bad").unwrap();
    assert_eq!(chain.len(), 1);
    assert_eq!(chain[0].target, Some(Target::Drop));
    // The profile the graph never sent is a DROP chain too (no dangling jump).
    let prof = r.chain(IpVersion::V4, F, "cali-pri-kns.ns").unwrap();
    assert_eq!(prof[0].target, Some(Target::Drop));

    // An unknown IP set fails closed, then renders once the set exists.
    let q = mk_np("ns", "later");
    let rule = ParsedRule {
        src_ip_set_ids: vec!["s:late".into()],
        ..mk_allow()
    };
    r.apply(Output::PolicyUpdated(mk_policy(
        q.clone(),
        vec![rule],
        vec![],
    )))
    .unwrap();
    r.apply(Output::EndpointUpdated(mk_endpoint(
        "ns",
        "f",
        "cali4",
        &[],
        vec![mk_tier("default", vec![q], vec![])],
        &[],
    )))
    .unwrap();
    assert!(r.flush().iter().any(|e| e.to_string().contains("s:late")));
    assert_eq!(
        r.chain(IpVersion::V4, F, "cali-pi-np/ns/later").unwrap()[0].target,
        Some(Target::Drop)
    );
    r.apply(Output::IpSetCreated {
        id: "s:late".into(),
        kind: IpSetKind::Net,
        members: vec![].into(),
    })
    .unwrap();
    assert!(r.flush().is_empty());
    let chain = r.chain(IpVersion::V4, F, "cali-pi-np/ns/later").unwrap();
    assert!(
        chain[0]
            .felix_text()
            .contains("--match-set cali40s:late src"),
        "{:?}",
        chain[0]
    );
}

#[test]
fn endpoint_errors_and_interface_changes() {
    let mut r = mk_renderer(vec![Output::EndpointUpdated(mk_endpoint(
        "ns",
        "a",
        "cali5",
        &[],
        vec![],
        &[],
    ))]);
    let err = r
        .apply(Output::EndpointUpdated(mk_endpoint(
            "ns",
            "b",
            "cali5",
            &[],
            vec![],
            &[],
        )))
        .unwrap_err();
    assert!(
        err.to_string().contains("ns/b") && err.to_string().contains("ns/a"),
        "{err}"
    );
    r.flush();
    r.take_delta(IpVersion::V4);
    r.apply(Output::EndpointUpdated(mk_endpoint(
        "ns",
        "a",
        "cali6",
        &[],
        vec![],
        &[],
    )))
    .unwrap();
    r.flush();
    let mut names = changed_chains(&mut r, IpVersion::V4);
    names.sort();
    assert_eq!(
        names,
        [
            "cali-from-wl-dispatch",
            "cali-fw-cali5",
            "cali-fw-cali6",
            "cali-to-wl-dispatch",
            "cali-tw-cali5",
            "cali-tw-cali6"
        ]
    );
    assert!(r.chain(IpVersion::V4, F, "cali-tw-cali5").is_none());
}

#[test]
fn nflog_log_action_names_the_policy() {
    let cfg = RenderConfig {
        log_action: LogAction::Nflog { group: 7 },
        ..Default::default()
    };
    let mut r = Renderer::new(cfg).unwrap();
    let short = mk_np("prod", "web");
    let long = mk_np("prod", &"x".repeat(200));
    let log = ParsedRule {
        action: Some(Action::Log),
        ..Default::default()
    };
    r.apply_all([
        Output::PolicyUpdated(mk_policy(short.clone(), vec![log.clone()], vec![])),
        Output::PolicyUpdated(mk_policy(long.clone(), vec![mk_allow(), log], vec![])),
        Output::EndpointUpdated(mk_endpoint(
            "prod",
            "w",
            "cali7",
            &[],
            vec![mk_tier("default", vec![short, long.clone()], vec![])],
            &[],
        )),
    ]);
    assert!(r.flush().is_empty());
    let rules = r.chain(IpVersion::V4, F, "cali-pi-np/prod/web").unwrap();
    assert_eq!(
        rules[0].target,
        Some(Target::Nflog {
            prefix: Some(Text::new("LPI0|np/prod/web").unwrap()),
            group: 7,
            len: None,
            threshold: None,
        })
    );
    let name = iptables::render::names::policy_chain_name(&long, true);
    let rules = r.chain(IpVersion::V4, F, &name).unwrap();
    let Some(Target::Nflog {
        prefix: Some(prefix),
        ..
    }) = &rules.last().unwrap().target
    else {
        panic!("{rules:?}")
    };
    let prefix = prefix.as_str();
    assert!(
        prefix.starts_with("LPI1|_") && prefix.len() <= 63,
        "{prefix}"
    );
    assert_parses_back(&r, IpVersion::V4);
}

#[test]
fn mark_mask_decides_the_bits() {
    assert!(matches!(
        Renderer::new(RenderConfig {
            mark_mask: 0xf0,
            ..Default::default()
        }),
        Err(RenderError::MarkMaskTooSmall { mask: 0xf0 })
    ));
    assert!(
        Renderer::new(RenderConfig {
            interface_prefixes: vec!["ca li".into()],
            ..Default::default()
        })
        .is_err()
    );
    let r = Renderer::new(RenderConfig {
        mark_mask: 0x1f00,
        ..Default::default()
    })
    .unwrap();
    let m = r.marks();
    assert_eq!(
        (m.accept, m.pass, m.drop, m.scratch0, m.scratch1),
        (0x100, 0x200, 0x400, 0x800, 0x1000)
    );
    let d = r.desired(IpVersion::V4);
    let fwd = d.tables[&F].chains["cali-FORWARD"][0].body();
    assert_eq!(fwd, "-j MARK --set-xmark 0x0/0x1a00");
}

#[test]
fn multiple_interface_prefixes_are_hooked() {
    let cfg = RenderConfig {
        interface_prefixes: vec!["cali".into(), "tap".into()],
        ..Default::default()
    };
    let r = Renderer::new(cfg).unwrap();
    let d = r.desired(IpVersion::V4);
    let bodies: Vec<&str> = d.tables[&F].chains["cali-FORWARD"]
        .iter()
        .map(|r| r.body())
        .collect();
    assert!(
        bodies.contains(&"-i tap+ -j cali-from-wl-dispatch")
            && bodies.contains(&"-o cali+ -j cali-to-wl-dispatch"),
        "{bodies:?}"
    );
    assert_parses_back(&r, IpVersion::V4);
}

fn raw_bodies(r: &Renderer, v: IpVersion, chain: &str) -> Option<Vec<String>> {
    let d = r.desired(v);
    d.tables[&TableName::Raw]
        .chains
        .get(chain)
        .map(|rules| rules.iter().map(|r| r.body().to_string()).collect())
}

fn spoofing_endpoint(iface: &str, prefixes: &[&str]) -> Output {
    let mut ep = mk_endpoint("prod", iface, iface, &["10.0.0.1/32"], vec![], &[]);
    ep.allow_spoofed_source_prefixes = prefixes.iter().map(|p| net(p)).collect();
    Output::EndpointUpdated(ep)
}

#[test]
fn allowed_source_prefixes_skip_the_rpf_check_only_when_spoofing_is_enabled() {
    use iptables::render::SourceSpoofing;
    let any = RenderConfig {
        workload_source_spoofing: SourceSpoofing::Any,
        ..Default::default()
    };
    let mut r = Renderer::new(any.clone()).unwrap();
    let outputs = vec![
        spoofing_endpoint("cali2", &["10.9.0.7/24", "fd00:9::/64", "10.9.0.0/24"]),
        spoofing_endpoint("cali1", &["10.8.0.0/16"]),
        spoofing_endpoint("cali3", &[]),
    ];
    assert!(r.apply_all(outputs.clone()).is_empty());
    assert!(r.flush().is_empty());
    // The skip chain is visited before the RPF drop.
    assert_eq!(
        raw_bodies(&r, IpVersion::V4, "cali-PREROUTING").unwrap(),
        [
            "-i cali+ -m comment --comment \"Accept the allowed spoofed source prefixes of workloads\" -j cali-rpf-skip",
            "-i cali+ -m comment --comment \"Drop workload packets with a spoofed source address\" -m rpfilter --invert -j DROP",
        ]
    );
    // Per family, endpoints by interface, host bits cleared, duplicates once.
    assert_eq!(
        raw_bodies(&r, IpVersion::V4, "cali-rpf-skip").unwrap(),
        [
            "-s 10.8.0.0/16 -i cali1 -j ACCEPT",
            "-s 10.9.0.0/24 -i cali2 -j ACCEPT"
        ]
    );
    assert_eq!(
        raw_bodies(&r, IpVersion::V6, "cali-rpf-skip").unwrap(),
        ["-s fd00:9::/64 -i cali2 -j ACCEPT"]
    );
    assert_parses_back(&r, IpVersion::V4);
    assert_parses_back(&r, IpVersion::V6);

    // Incrementally: a prefix change and a removal re-render the chain; the result equals a
    // from-scratch render of the same endpoints.
    let _ = r.take_delta(IpVersion::V4);
    r.apply_all([
        spoofing_endpoint("cali2", &["10.7.0.0/16"]),
        Output::EndpointRemoved(EndpointId {
            namespace: "prod".into(),
            name: "cali1".into(),
        }),
    ]);
    assert!(r.flush().is_empty());
    assert!(changed_chains(&mut r, IpVersion::V4).contains(&"cali-rpf-skip".to_string()));
    assert_eq!(
        raw_bodies(&r, IpVersion::V4, "cali-rpf-skip").unwrap(),
        ["-s 10.7.0.0/16 -i cali2 -j ACCEPT"]
    );
    let mut scratch = Renderer::new(any).unwrap();
    scratch.apply_all([
        spoofing_endpoint("cali2", &["10.7.0.0/16"]),
        spoofing_endpoint("cali3", &[]),
    ]);
    assert!(scratch.flush().is_empty());
    for v in [IpVersion::V4, IpVersion::V6] {
        assert_eq!(r.desired(v), scratch.desired(v), "{v:?}");
    }

    // Disabled (the default): the prefixes are ignored, there is no skip chain and no jump to it.
    let mut off = Renderer::new(RenderConfig::default()).unwrap();
    off.apply_all(outputs);
    assert!(off.flush().is_empty());
    assert_eq!(raw_bodies(&off, IpVersion::V4, "cali-rpf-skip"), None);
    assert!(
        raw_bodies(&off, IpVersion::V4, "cali-PREROUTING")
            .unwrap()
            .iter()
            .all(|b| !b.contains("cali-rpf-skip"))
    );
}
