//! Graph tests of rule scanning: named ports, service accounts, notSelector folding.

mod support;

use calc_graph::graph::named_port_set_id;
use calc_graph::model::{Action, EntityRule, Port, Protocol, Rule, ServiceAccountMatch};
use calc_graph::proto::IpSetKind;
use calc_graph::selector::parse;
use support::*;

#[test]
fn named_ports_make_ip_port_sets() {
    let rule = Rule {
        protocol: Some(Protocol::Tcp),
        destination: EntityRule {
            selector: Some("app == 'db'".into()),
            ports: vec![Port::Named("sql".into())],
            ..EntityRule::default()
        },
        ..Rule::new(Action::Allow)
    };
    let (_, dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_wep_port(
            "prod",
            "db-1",
            "node2",
            "10.0.1.1/32",
            &[("app", "db")],
            ("sql", Protocol::Tcp, 5432),
        ),
        mk_wep_port(
            "prod",
            "db-2",
            "node2",
            "10.0.1.2/32",
            &[("app", "db")],
            ("sql", Protocol::Udp, 5432),
        ),
        mk_wep("prod", "db-3", "node2", "10.0.1.3/32", &[("app", "db")]),
        upd({
            let mut p = mk_np_res("prod", "to-db", "app == 'web'", vec![]);
            p.spec.egress = vec![rule];
            p.spec.types = vec![calc_graph::model::PolicyType::Egress];
            p
        }),
    ]);
    let sel = parse("(projectcalico.org/namespace == 'prod') && (app == 'db')").unwrap();
    let id = named_port_set_id(&sel, Protocol::Tcp, "sql");
    assert!(id.starts_with("n:"));
    assert_eq!(dp.sets[&id].0, IpSetKind::IpPort);
    assert_eq!(members(&dp, &id), ["10.0.1.1,TCP:5432"]);
    let pol = dp.policies.values().next().unwrap();
    let r = &pol.outbound_rules[0];
    assert_eq!(r.dst_named_port_ip_set_ids, vec![id]);
    assert!(
        r.dst_ip_set_ids.is_empty(),
        "the named-port set already applies the selector"
    );
    assert_eq!(dp.sets.len(), 1);
    let ep = dp.endpoints.values().next().unwrap();
    assert_eq!(ep.tiers[0].egress_policies.len(), 1);
    assert!(ep.tiers[0].ingress_policies.is_empty());
}

#[test]
fn named_port_set_id_matches_felix_formula() {
    use base64::Engine as _;
    use sha2::{Digest, Sha224};
    let sel = parse("app == 'db'").unwrap();
    let want = {
        let content = format!("n:{},tcp,sql", sel.unique_id());
        let d = Sha224::digest(content.as_bytes());
        format!(
            "n:{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(d)
        )
    };
    assert_eq!(named_port_set_id(&sel, Protocol::Tcp, "sql"), want);
    assert_eq!(want.len(), 2 + 38);
}

#[test]
fn service_account_rules_and_selectors() {
    let rule = Rule {
        source: EntityRule {
            service_accounts: Some(ServiceAccountMatch {
                names: vec!["api".into(), "web".into()],
                selector: None,
            }),
            ..EntityRule::default()
        },
        ..Rule::new(Action::Allow)
    };
    let mut api = mk_wep_res("prod", "api", "node2", &["10.0.1.1/32"], &[]);
    api.spec.service_account_name = Some("api".into());
    let (_, dp) = synced(vec![
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[]),
        upd(api),
        mk_np("prod", "sa", "all()", vec![rule]),
    ]);
    let id = sel_id(
        "(projectcalico.org/namespace == 'prod') && (projectcalico.org/serviceaccount in {'api', 'web'})",
    );
    assert_eq!(members(&dp, &id), ["10.0.1.1/32"]);
}

#[test]
fn not_selector_folds_into_positive_selector() {
    let rule = Rule {
        source: EntityRule {
            selector: Some("app == 'a'".into()),
            not_selector: Some("env == 'dev'".into()),
            ..EntityRule::default()
        },
        ..Rule::new(Action::Allow)
    };
    let only_not = Rule {
        source: EntityRule {
            not_selector: Some("env == 'dev'".into()),
            ..EntityRule::default()
        },
        ..Rule::new(Action::Deny)
    };
    let (_, dp) = synced(vec![
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[]),
        mk_gnp("g", "all()", None, vec![rule, only_not], vec![]),
    ]);
    let p = dp.policies.values().next().unwrap();
    assert_eq!(
        p.inbound_rules[0].src_ip_set_ids,
        vec![sel_id("(app == 'a') && (!(env == 'dev'))")]
    );
    assert!(p.inbound_rules[0].not_src_ip_set_ids.is_empty());
    assert_eq!(
        p.inbound_rules[1].not_src_ip_set_ids,
        vec![sel_id("env == 'dev'")]
    );
    assert!(p.inbound_rules[1].src_ip_set_ids.is_empty());
}

#[test]
fn global_policy_namespace_and_service_account_selectors_scope_the_policy() {
    use calc_graph::model::Kind;
    let mut ops_sa = mk_wep_res("ops", "mon", NODE, &["10.0.0.2/32"], &[]);
    ops_sa.spec.service_account_name = Some("monitor".into());
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("ops", &[("team", "ops")]),
        mk_ns_profile("dev", &[("team", "dev")]),
        mk_profile("ksa.ops.monitor", &[("pcsa.role", "scraper")], false),
        upd({
            let mut w = ops_sa;
            w.spec.profiles = vec!["kns.ops".into(), "ksa.ops.monitor".into()];
            w
        }),
        mk_wep("dev", "tool", NODE, "10.0.0.3/32", &[]),
        upd({
            let mut p = mk_gnp_res(
                "by-ns",
                "all()",
                None,
                vec![Rule::new(Action::Allow)],
                vec![],
            );
            p.spec.namespace_selector = Some("team == 'ops'".into());
            p
        }),
        upd({
            let mut p = mk_gnp_res("by-sa", "", None, vec![Rule::new(Action::Allow)], vec![]);
            p.spec.selector = None;
            p.spec.service_account_selector = Some("role == 'scraper'".into());
            p
        }),
    ]);
    let tiers_of = |dp: &Dataplane, ns: &str| -> Vec<String> {
        dp.endpoints
            .values()
            .find(|e| e.id.namespace == ns)
            .unwrap()
            .tiers
            .iter()
            .flat_map(|t| t.ingress_policies.iter().map(|p| p.name.clone()))
            .collect()
    };
    assert_eq!(tiers_of(&dp, "ops"), ["by-ns", "by-sa"]);
    assert!(tiers_of(&dp, "dev").is_empty());
    // The dev namespace is relabelled into the ops team: the policy now applies there too.
    let out = run(&mut g, vec![mk_ns_profile("dev", &[("team", "ops")])]);
    dp.apply(&out).unwrap();
    assert_eq!(tiers_of(&dp, "dev"), ["by-ns"]);
    let out = run(&mut g, vec![del(Kind::Profile, None, "ksa.ops.monitor")]);
    dp.apply(&out).unwrap();
    assert_eq!(
        tiers_of(&dp, "ops"),
        ["by-ns"],
        "SA labels come from the SA profile"
    );
    assert_eq!(
        dp.profiles["ksa.ops.monitor"].inbound_rules[0].action(),
        Action::Deny
    );
}
