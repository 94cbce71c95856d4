//! Unit tests of the calculation graph on hand-built clusters.

mod support;

use calc_graph::graph::{CalcGraph, Update};
use calc_graph::model::{Action, EntityRule, Kind, Rule, StagedNetworkPolicy};
use calc_graph::proto::{IpSetMember, Output, PolicyKind};
use support::*;

#[test]
fn nothing_before_in_sync_then_complete_state() {
    let mut g = graph();
    for u in [
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_np(
            "prod",
            "allow-api",
            "app == 'web'",
            vec![allow_from("app == 'api'")],
        ),
    ] {
        g.apply(u);
    }
    assert!(g.flush().is_empty(), "nothing before in-sync");
    assert!(g.flush().is_empty());
    g.apply(Update::InSync);
    let out = g.flush();
    let mut dp = Dataplane::default();
    dp.apply(&out).unwrap();
    assert!(matches!(out.last(), Some(Output::InSync)));
    assert!(matches!(out.first(), Some(Output::IpSetCreated { .. })));
    assert_eq!(dp.endpoints.len(), 1);
    assert_eq!(dp.policies.len(), 1);
    assert_eq!(dp.profiles.len(), 2, "kns.prod and the missing ksa profile");
    let ep = dp.endpoints.values().next().unwrap();
    assert_eq!(ep.interface_name, iface("prod", "web"));
    assert_eq!(ep.ipv4_nets, vec![net("10.0.0.1/32")]);
    assert_eq!(ep.tiers.len(), 1);
    assert_eq!(ep.tiers[0].name, "default");
    assert_eq!(ep.tiers[0].default_action, Action::Deny);
    assert_eq!(ep.tiers[0].ingress_policies[0].name, "allow-api");
    assert!(ep.tiers[0].egress_policies.is_empty());
    assert_eq!(ep.profile_ids, vec!["kns.prod", "ksa.prod.default"]);
    // Second flush: nothing new, and InSync only once.
    assert!(g.flush().is_empty());
    let s = g.stats();
    assert_eq!(
        (
            s.local_endpoints,
            s.active_policies,
            s.active_profiles,
            s.ip_sets
        ),
        (1, 1, 2, 1)
    );
}

#[test]
fn missing_profile_is_deny_all() {
    let (_, dp) = synced(vec![mk_wep("prod", "web", NODE, "10.0.0.1/32", &[])]);
    let p = &dp.profiles["kns.prod"];
    assert_eq!(p.inbound_rules.len(), 1);
    assert_eq!(p.inbound_rules[0].action(), Action::Deny);
    assert_eq!(p.outbound_rules[0].action(), Action::Deny);
}

/// `projectcalico-default-allow` is built in (allow all, as Calico's syncer provides it), a stored
/// profile of that name replaces it, and deleting that one brings the built-in back.
#[test]
fn the_default_allow_profile_is_built_in() {
    let name = calc_graph::model::DEFAULT_ALLOW_PROFILE;
    let mut w = mk_wep_res("prod", "web", NODE, &["10.0.0.1/32"], &[]);
    w.spec.profiles = vec![name.to_string()];
    let (mut g, mut dp) = synced(vec![upd(w)]);
    let p = &dp.profiles[name];
    assert_eq!(p.inbound_rules.len(), 1);
    assert_eq!(p.inbound_rules[0].action(), Action::Allow);
    assert_eq!(p.outbound_rules[0].action(), Action::Allow);
    dp.apply(&run(&mut g, vec![mk_profile(name, &[], false)]))
        .unwrap();
    assert!(
        dp.profiles[name].inbound_rules.is_empty(),
        "stored one wins"
    );
    let key = calc_graph::model::ResourceKey::global(calc_graph::model::Kind::Profile, name);
    dp.apply(&run(&mut g, vec![Update::Resource { key, value: None }]))
        .unwrap();
    assert_eq!(dp.profiles[name].inbound_rules[0].action(), Action::Allow);
}

#[test]
fn rule_selector_is_namespaced_and_membership_is_cluster_wide() {
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_wep("prod", "api-1", "node2", "10.0.1.1/32", &[("app", "api")]),
        mk_wep("prod", "api-2", "node3", "10.0.2.1/32", &[("app", "api")]),
        mk_wep("other", "api-3", "node3", "10.0.3.1/32", &[("app", "api")]),
        mk_np(
            "prod",
            "allow-api",
            "app == 'web'",
            vec![allow_from("app == 'api'")],
        ),
    ]);
    let id = ns_rule_sel("prod", "app == 'api'");
    assert_eq!(members(&dp, &id), ["10.0.1.1/32", "10.0.2.1/32"]);
    let pol = dp.policies.values().next().unwrap();
    assert_eq!(pol.inbound_rules[0].src_ip_set_ids, vec![id.clone()]);
    assert_eq!(pol.id.kind, PolicyKind::NetworkPolicy);
    assert_eq!(pol.id.namespace.as_deref(), Some("prod"));

    // A remote pod relabelled into the set: only a member delta.
    let out = run(
        &mut g,
        vec![mk_wep(
            "prod",
            "db",
            "node9",
            "10.0.9.9/32",
            &[("app", "api")],
        )],
    );
    assert_eq!(
        out,
        vec![Output::IpSetMembersAdded {
            id: id.clone(),
            members: vec![IpSetMember::Net(net("10.0.9.9/32"))]
        }]
    );
    dp.apply(&out).unwrap();
    let out = run(
        &mut g,
        vec![del(Kind::WorkloadEndpoint, Some("prod"), "api-1")],
    );
    assert_eq!(
        out,
        vec![Output::IpSetMembersRemoved {
            id,
            members: vec![IpSetMember::Net(net("10.0.1.1/32"))]
        }]
    );
}

#[test]
fn policy_for_remote_pods_only_is_inactive() {
    let (mut g, dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_np(
            "prod",
            "db-only",
            "app == 'db'",
            vec![allow_from("app == 'api'")],
        ),
        mk_np(
            "other",
            "web-other-ns",
            "app == 'web'",
            vec![allow_from("app == 'x'")],
        ),
    ]);
    assert!(
        dp.policies.is_empty(),
        "no local endpoint matches: {:?}",
        dp.policies.keys()
    );
    assert!(dp.sets.is_empty(), "inactive policies create no sets");
    // A local db pod activates it.
    let out = run(
        &mut g,
        vec![mk_wep("prod", "db", NODE, "10.0.0.2/32", &[("app", "db")])],
    );
    let mut dp = dp;
    dp.apply(&out).unwrap();
    assert_eq!(dp.policies.len(), 1);
    assert_eq!(dp.sets.len(), 1);
    // Deleting it deactivates the policy and removes the set, after the endpoint.
    let out = run(
        &mut g,
        vec![del(Kind::WorkloadEndpoint, Some("prod"), "db")],
    );
    dp.apply(&out).unwrap();
    assert!(dp.policies.is_empty() && dp.sets.is_empty());
    let kinds: Vec<u8> = out
        .iter()
        .map(|o| match o {
            Output::EndpointRemoved(_) => 0,
            Output::PolicyRemoved(_) => 1,
            Output::IpSetRemoved(_) => 2,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(kinds, [0, 1, 2]);
}

#[test]
fn namespace_labels_are_inherited_and_relabelling_the_namespace_updates_sets() {
    let ns_sel_rule = Rule {
        source: EntityRule {
            namespace_selector: Some("team == 'ops'".into()),
            ..EntityRule::default()
        },
        ..Rule::new(Action::Allow)
    };
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_ns_profile("ops", &[("team", "ops")]),
        mk_ns_profile("dev", &[("team", "dev")]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_wep("ops", "mon", "node2", "10.0.1.1/32", &[]),
        mk_wep("dev", "tool", "node2", "10.0.2.1/32", &[]),
        mk_np("prod", "from-ops", "app == 'web'", vec![ns_sel_rule]),
    ]);
    let id = sel_id("pcns.team == 'ops'");
    assert_eq!(members(&dp, &id), ["10.0.1.1/32"]);
    // The dev namespace becomes ops: its pods join the set.
    let out = run(&mut g, vec![mk_ns_profile("dev", &[("team", "ops")])]);
    dp.apply(&out).unwrap();
    assert_eq!(members(&dp, &id), ["10.0.1.1/32", "10.0.2.1/32"]);
    // A pod cannot claim a namespace label of its own.
    let out = run(
        &mut g,
        vec![mk_wep(
            "prod",
            "spoof",
            "node2",
            "10.0.3.1/32",
            &[("pcns.team", "ops")],
        )],
    );
    dp.apply(&out).unwrap();
    assert_eq!(members(&dp, &id).len(), 2);
}

#[test]
fn own_labels_win_over_profile_labels() {
    let (_, dp) = synced(vec![
        mk_profile("p1", &[("role", "from-p1"), ("x", "1")], true),
        mk_profile("p2", &[("role", "from-p2"), ("y", "2")], true),
        upd({
            let mut w = mk_wep_res("prod", "a", "node2", &["10.0.0.5/32"], &[("role", "own")]);
            w.spec.profiles = vec!["p1".into(), "p2".into()];
            w
        }),
        upd({
            let mut w = mk_wep_res("prod", "b", "node2", &["10.0.0.6/32"], &[]);
            w.spec.profiles = vec!["p1".into(), "p2".into()];
            w
        }),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[]),
        mk_gnp(
            "g",
            "all()",
            Some(1.0),
            vec![
                allow_from("role == 'own'"),
                allow_from("role == 'from-p1'"),
                allow_from("role == 'from-p2'"),
                allow_from("x == '1' && y == '2'"),
            ],
            vec![],
        ),
    ]);
    assert_eq!(members(&dp, &sel_id("role == 'own'")), ["10.0.0.5/32"]);
    assert_eq!(members(&dp, &sel_id("role == 'from-p1'")), ["10.0.0.6/32"]);
    assert!(members(&dp, &sel_id("role == 'from-p2'")).is_empty());
    assert_eq!(members(&dp, &sel_id("x == '1' && y == '2'")).len(), 2);
}

#[test]
fn tiers_and_policy_order() {
    let (_, dp) = synced(vec![
        mk_tier("security", Some(100.0), Action::Pass),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_gnp(
            "b",
            "app == 'web'",
            Some(10.0),
            vec![Rule::new(Action::Allow)],
            vec![],
        ),
        mk_gnp(
            "a",
            "app == 'web'",
            Some(10.0),
            vec![Rule::new(Action::Allow)],
            vec![Rule::new(Action::Allow)],
        ),
        mk_gnp(
            "c",
            "app == 'web'",
            None,
            vec![],
            vec![Rule::new(Action::Deny)],
        ),
        upd({
            let mut p = mk_gnp_res(
                "security.s",
                "all()",
                Some(1.0),
                vec![Rule::new(Action::Pass)],
                vec![],
            );
            p.spec.tier = Some("security".into());
            p
        }),
    ]);
    let ep = dp.endpoints.values().next().unwrap();
    let names: Vec<&str> = ep.tiers.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["security", "default"]);
    assert_eq!(ep.tiers[0].default_action, Action::Pass);
    let ing: Vec<&str> = ep.tiers[1]
        .ingress_policies
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    let eg: Vec<&str> = ep.tiers[1]
        .egress_policies
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(
        ing,
        ["a", "b"],
        "c has only egress rules so its types default to Egress"
    );
    assert_eq!(eg, ["a", "c"]);
    assert!(ep.tiers[0].egress_policies.is_empty());
}

#[test]
fn shared_addresses_are_reference_counted_and_zero_prefix_is_split() {
    let (mut g, mut dp) = synced(vec![
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[]),
        mk_wep("prod", "a", "node2", "10.0.5.5/32", &[("role", "x")]),
        mk_wep("prod", "b", "node3", "10.0.5.5/32", &[("role", "x")]),
        mk_netset("prod", "world", &["0.0.0.0/0", "::/0"], &[("role", "x")]),
        mk_gnp("g", "all()", None, vec![allow_from("role == 'x'")], vec![]),
    ]);
    let id = sel_id("role == 'x'");
    assert_eq!(
        members(&dp, &id),
        [
            "0.0.0.0/1",
            "10.0.5.5/32",
            "128.0.0.0/1",
            "::/1",
            "8000::/1"
        ]
    );
    let out = run(&mut g, vec![del(Kind::WorkloadEndpoint, Some("prod"), "a")]);
    assert!(out.is_empty(), "the other pod still has 10.0.5.5: {out:?}");
    let out = run(&mut g, vec![del(Kind::WorkloadEndpoint, Some("prod"), "b")]);
    dp.apply(&out).unwrap();
    assert_eq!(members(&dp, &id).len(), 4);
}

#[test]
fn batch_coalesces_and_create_then_delete_emits_nothing() {
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
    ]);
    // Created and deleted in one batch: nothing.
    let out = run(
        &mut g,
        vec![
            mk_np(
                "prod",
                "tmp",
                "app == 'web'",
                vec![allow_from("app == 'api'")],
            ),
            mk_wep("prod", "api", "node2", "10.0.1.1/32", &[("app", "api")]),
            del(Kind::NetworkPolicy, Some("prod"), "tmp"),
            del(Kind::WorkloadEndpoint, Some("prod"), "api"),
        ],
    );
    assert!(out.is_empty(), "{out:?}");
    // Three relabels in one batch: the endpoint appears once with the last state.
    let out = run(
        &mut g,
        vec![
            mk_np("prod", "p", "app == 'v3'", vec![]),
            mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "v1")]),
            mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "v2")]),
            mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "v3")]),
        ],
    );
    dp.apply(&out).unwrap();
    let eps = out
        .iter()
        .filter(|o| matches!(o, Output::EndpointUpdated(_)))
        .count();
    assert_eq!(eps, 1);
    assert_eq!(dp.endpoints.values().next().unwrap().tiers.len(), 1);
    // Unchanged re-send: nothing.
    let out = run(
        &mut g,
        vec![mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "v3")])],
    );
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn invalid_resources_are_deleted_and_reported_without_stopping_others() {
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_np(
            "prod",
            "good",
            "app == 'web'",
            vec![allow_from("app == 'api'")],
        ),
        mk_np(
            "prod",
            "bad",
            "app == 'web'",
            vec![allow_from("app == 'api'")],
        ),
    ]);
    assert_eq!(dp.policies.len(), 2);
    let out = run(&mut g, vec![mk_np("prod", "bad", "app === broken", vec![])]);
    dp.apply(&out).unwrap();
    assert_eq!(dp.policies.len(), 1, "the bad policy is treated as deleted");
    assert_eq!(dp.policies.keys().next().unwrap().name, "good");
    let errors = g.take_errors();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].0.name, "bad");
    assert!(
        errors[0].1.to_string().contains("selector"),
        "{}",
        errors[0].1
    );
    assert!(g.take_errors().is_empty());
    // A body that does not match its key is rejected too.
    let mut u = mk_np("prod", "other", "all()", vec![]);
    if let Update::Resource { key, .. } = &mut u {
        key.name = "mismatch".into();
    }
    run(&mut g, vec![u]);
    let errors = g.take_errors();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].1.to_string().contains("does not match")
            || errors[0].1.to_string().contains("but the update key"),
        "{}",
        errors[0].1
    );
}

#[test]
fn staged_policies_and_host_endpoints_do_not_program_anything() {
    let staged = StagedNetworkPolicy {
        metadata: calc_graph::model::Metadata::namespaced("prod", "staged"),
        spec: Default::default(),
    };
    let hep = calc_graph::model::HostEndpoint {
        metadata: calc_graph::model::Metadata {
            labels: labels(&[("role", "x")]),
            ..calc_graph::model::Metadata::named("node1-eth0")
        },
        spec: calc_graph::model::HostEndpointSpec {
            node: Some(NODE.into()),
            interface_name: Some("eth0".into()),
            expected_ips: vec!["192.168.0.1".parse().unwrap()],
            ..Default::default()
        },
    };
    let (mut g, dp) = synced(vec![
        upd(staged),
        upd(hep),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[]),
        mk_gnp("g", "all()", None, vec![allow_from("role == 'x'")], vec![]),
    ]);
    assert_eq!(
        dp.endpoints.len(),
        1,
        "host endpoints are not local endpoints"
    );
    assert_eq!(members(&dp, &sel_id("role == 'x'")), ["192.168.0.1/32"]);
    run(&mut g, vec![del(Kind::HostEndpoint, None, "node1-eth0")]);
    assert!(g.take_errors().is_empty());
}

#[test]
fn set_deactivated_and_reactivated_in_one_batch_emits_only_deltas() {
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_wep("prod", "api-a", "node2", "10.0.1.1/32", &[("app", "api")]),
        mk_wep("prod", "api-b", "node2", "10.0.1.2/32", &[("app", "api")]),
        mk_np(
            "prod",
            "p",
            "app == 'web'",
            vec![allow_from("app == 'api'")],
        ),
    ]);
    let id = ns_rule_sel("prod", "app == 'api'");
    let out = run(
        &mut g,
        vec![
            // The only local match goes away: policy and set deactivate...
            mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "other")]),
            mk_wep("prod", "api-c", "node2", "10.0.1.3/32", &[("app", "api")]),
            del(Kind::WorkloadEndpoint, Some("prod"), "api-a"),
            // ...and come back before the flush.
            mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        ],
    );
    assert_eq!(
        out,
        vec![
            Output::IpSetMembersAdded {
                id: id.clone(),
                members: vec![IpSetMember::Net(net("10.0.1.3/32"))]
            },
            Output::IpSetMembersRemoved {
                id: id.clone(),
                members: vec![IpSetMember::Net(net("10.0.1.1/32"))]
            },
        ]
    );
    dp.apply(&out).unwrap();
    assert_eq!(members(&dp, &id), ["10.0.1.2/32", "10.0.1.3/32"]);
}

#[test]
fn tier_change_reorders_endpoint_tiers() {
    let (mut g, mut dp) = synced(vec![
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[]),
        mk_gnp("g", "all()", None, vec![Rule::new(Action::Allow)], vec![]),
        upd({
            let mut p = mk_gnp_res(
                "late.x",
                "all()",
                None,
                vec![Rule::new(Action::Allow)],
                vec![],
            );
            p.spec.tier = Some("late".into());
            p
        }),
    ]);
    let names = |dp: &Dataplane| -> Vec<String> {
        dp.endpoints
            .values()
            .next()
            .unwrap()
            .tiers
            .iter()
            .map(|t| t.name.clone())
            .collect()
    };
    assert_eq!(
        names(&dp),
        ["default", "late"],
        "a tier without a resource sorts last"
    );
    let out = run(&mut g, vec![mk_tier("late", Some(10.0), Action::Pass)]);
    dp.apply(&out).unwrap();
    assert_eq!(names(&dp), ["late", "default"]);
    assert_eq!(
        dp.endpoints.values().next().unwrap().tiers[0].default_action,
        Action::Pass
    );
}

#[test]
fn graph_can_move_to_another_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<CalcGraph>();
    let mut g = graph();
    g.apply(mk_wep("prod", "web", NODE, "10.0.0.1/32", &[]));
    let handle = std::thread::spawn(move || {
        g.apply(Update::InSync);
        g.flush().len()
    });
    assert!(handle.join().unwrap() > 1);
}

#[test]
fn unused_sets_linger_and_come_back_with_current_members() {
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_wep("prod", "api-a", "node2", "10.0.1.1/32", &[("app", "api")]),
        mk_np(
            "prod",
            "p",
            "app == 'web'",
            vec![allow_from("app == 'api'")],
        ),
    ]);
    let id = ns_rule_sel("prod", "app == 'api'");
    let out = run(
        &mut g,
        vec![mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "x")])],
    );
    dp.apply(&out).unwrap();
    assert!(out.contains(&Output::IpSetRemoved(id.clone())));
    assert_eq!((g.stats().ip_sets, g.stats().lingering_ip_sets), (0, 1));
    // Membership changes of a lingering set are tracked silently.
    let out = run(
        &mut g,
        vec![mk_wep(
            "prod",
            "api-b",
            "node2",
            "10.0.1.2/32",
            &[("app", "api")],
        )],
    );
    assert!(out.is_empty(), "{out:?}");
    let out = run(
        &mut g,
        vec![mk_wep(
            "prod",
            "web",
            NODE,
            "10.0.0.1/32",
            &[("app", "web")],
        )],
    );
    assert!(matches!(&out[0], Output::IpSetCreated { id: i, .. } if *i == id));
    dp.apply(&out).unwrap();
    assert_eq!(members(&dp, &id), ["10.0.1.1/32", "10.0.1.2/32"]);
    assert_eq!((g.stats().ip_sets, g.stats().lingering_ip_sets), (1, 0));

    // With lingering disabled the set is torn down at once.
    g.set_ip_set_lingering(0, 0);
    let out = run(
        &mut g,
        vec![mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "x")])],
    );
    dp.apply(&out).unwrap();
    assert_eq!((g.stats().ip_sets, g.stats().lingering_ip_sets), (0, 0));
}

#[test]
fn allowed_source_prefixes_reach_the_local_endpoint_and_changes_update_it() {
    let with_prefixes = |prefixes: &[&str]| {
        let mut w = mk_wep_res("prod", "vm", NODE, &["10.0.0.1/32"], &[]);
        w.spec.allow_spoofed_source_prefixes = prefixes.iter().map(|p| net(p)).collect();
        upd(w)
    };
    let (mut g, mut dp) = synced(vec![with_prefixes(&["10.9.0.7/24", "fd00:9::/64"])]);
    let ep = dp.endpoints.values().next().unwrap();
    // Host bits are cleared; the order is the resource's.
    assert_eq!(
        ep.allow_spoofed_source_prefixes,
        [net("10.9.0.0/24"), net("fd00:9::/64")]
    );
    // A change of prefixes alone re-sends the endpoint.
    let out = run(&mut g, vec![with_prefixes(&["10.8.0.0/16"])]);
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::EndpointUpdated(e) if e.allow_spoofed_source_prefixes == [net("10.8.0.0/16")])),
        "{out:?}"
    );
    dp.apply(&out).unwrap();
    // The same prefixes again: nothing.
    let out = run(&mut g, vec![with_prefixes(&["10.8.0.0/16"])]);
    assert!(out.is_empty(), "{out:?}");
    // A remote endpoint's prefixes are not this node's business.
    let mut remote = mk_wep_res("prod", "far", "node2", &["10.0.5.1/32"], &[]);
    remote.spec.allow_spoofed_source_prefixes = vec![net("10.7.0.0/16")];
    let out = run(&mut g, vec![upd(remote)]);
    assert!(
        !out.iter().any(|o| matches!(o, Output::EndpointUpdated(_))),
        "{out:?}"
    );
}

/// Issue 18 in the pure core: rules with an unknown or unenforced field fail safe, are kept as
/// the policy's `FailedSafeRule`s while it stands, and are not errors.
#[test]
fn rules_with_unknown_or_unenforced_fields_fail_safe_and_are_tracked() {
    let typo = Rule {
        unknown_fields: vec!["source.selectr".into()],
        ..Rule::new(Action::Allow)
    };
    let deny_domains = Rule {
        protocol: Some(calc_graph::model::Protocol::Tcp),
        destination: EntityRule {
            domains: vec!["example.com".into()],
            ..EntityRule::default()
        },
        ..Rule::new(Action::Deny)
    };
    let (mut g, dp) = synced(vec![
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_gnp(
            "g",
            "app == 'web'",
            None,
            vec![typo, allow_from("role == 'x'"), deny_domains],
            vec![],
        ),
    ]);
    assert!(g.take_errors().is_empty());
    let p = dp.policies.values().next().expect("the policy is active");
    let actions: Vec<_> = p.inbound_rules.iter().map(|r| r.action()).collect();
    assert_eq!(
        actions,
        vec![Action::Allow, Action::Deny],
        "the typo'd Allow is gone, the Deny kept"
    );
    assert!(p.inbound_rules[1].dst_nets.is_empty() && p.inbound_rules[1].protocol.is_some());
    let reports: Vec<String> = g
        .failed_safe_rules()
        .map(|(k, r)| format!("{k} {r}"))
        .collect();
    assert_eq!(
        reports,
        vec![
            "globalnetworkpolicies/g spec.ingress[0]: Allow rule not rendered: unknown field source.selectr",
            "globalnetworkpolicies/g spec.ingress[2]: Deny rule rendered with only its enforced matches: destination.domains: domains are enforced only in egress rules",
        ]
    );
    // Fixed: the reports go; deleted: nothing is left either.
    run(
        &mut g,
        vec![mk_gnp(
            "g",
            "app == 'web'",
            None,
            vec![allow_from("role == 'x'")],
            vec![],
        )],
    );
    assert_eq!(g.failed_safe_rules().count(), 0);
    run(
        &mut g,
        vec![mk_gnp(
            "g",
            "app == 'web'",
            None,
            vec![Rule {
                http: Some(Default::default()),
                ..Rule::new(Action::Allow)
            }],
            vec![],
        )],
    );
    assert_eq!(g.failed_safe_rules().count(), 1);
    assert!(g.take_errors().is_empty());
    run(&mut g, vec![del(Kind::GlobalNetworkPolicy, None, "g")]);
    assert_eq!(g.failed_safe_rules().count(), 0);
}
