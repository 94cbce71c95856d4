//! Graph tests of `destination.domains` (FQDN egress policy, issue 16): where it is enforced (a
//! domain set referenced by egress Allow rules), and every use that fails safe, with its reason.

mod support;

use calc_graph::graph::domain_set_id;
use calc_graph::model::{Action, DomainPattern, EntityRule, Kind, Protocol, Rule};
use calc_graph::proto::{IpSetKind, Output};
use support::*;

fn to_domains(action: Action, domains: &[&str]) -> Rule {
    Rule {
        protocol: Some(Protocol::Tcp),
        destination: EntityRule {
            domains: domains.iter().map(|d| d.to_string()).collect(),
            ..EntityRule::default()
        },
        ..Rule::new(action)
    }
}

fn egress_gnp(name: &str, egress: Vec<Rule>) -> calc_graph::graph::Update {
    let mut p = mk_gnp_res(name, "app == 'web'", None, vec![], egress);
    p.spec.types = vec![calc_graph::model::PolicyType::Egress];
    upd(p)
}

fn patterns(list: &[&str]) -> Vec<DomainPattern> {
    list.iter()
        .map(|p| DomainPattern::parse(p).unwrap())
        .collect()
}

fn web() -> calc_graph::graph::Update {
    mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")])
}

fn reports(g: &calc_graph::graph::CalcGraph) -> Vec<String> {
    g.failed_safe_rules()
        .map(|(k, r)| format!("{k} {r}"))
        .collect()
}

#[test]
fn egress_allow_domains_become_one_shared_domain_set() {
    let (mut g, mut dp) = synced(vec![
        web(),
        egress_gnp(
            "a",
            vec![to_domains(
                Action::Allow,
                &["*.example.com", "API.example.com.", "api.example.com"],
            )],
        ),
    ]);
    assert!(g.take_errors().is_empty());
    assert!(reports(&g).is_empty(), "{:?}", reports(&g));
    // Normalised, sorted, deduplicated: `*` sorts before letters.
    let pats = patterns(&["*.example.com", "api.example.com"]);
    let id = domain_set_id(&pats);
    assert!(id.starts_with("d:"), "{id}");
    assert_eq!(dp.sets[&id].0, IpSetKind::Domain);
    assert_eq!(dp.domains[&id], pats);
    let rule = &dp.policies.values().next().unwrap().outbound_rules[0];
    assert_eq!(rule.dst_domain_ip_set_ids, vec![id.clone()]);
    assert_eq!(rule.action(), Action::Allow);
    assert!(rule.dst_ip_set_ids.is_empty() && rule.dst_nets.is_empty());
    assert_eq!(rule.protocol, Some(Protocol::Tcp));

    // A second policy naming the same list (another order) shares the set: no new output for it.
    let out = run(
        &mut g,
        vec![egress_gnp(
            "b",
            vec![to_domains(
                Action::Allow,
                &["api.example.com", "*.Example.com"],
            )],
        )],
    );
    assert!(
        !out.iter()
            .any(|o| matches!(o, Output::DomainSetCreated { .. })),
        "{out:?}"
    );
    dp.apply(&out).unwrap();
    // The first goes: the set stays for the second.
    let out = run(&mut g, vec![del(Kind::GlobalNetworkPolicy, None, "a")]);
    assert!(
        !out.iter().any(|o| matches!(o, Output::IpSetRemoved(_))),
        "{out:?}"
    );
    dp.apply(&out).unwrap();
    // The last user goes: the set is removed after the policy (dp.apply checks the order).
    let out = run(&mut g, vec![del(Kind::GlobalNetworkPolicy, None, "b")]);
    let pos_policy = out
        .iter()
        .position(|o| matches!(o, Output::PolicyRemoved(_)))
        .expect("policy removed");
    let pos_set = out
        .iter()
        .position(|o| *o == Output::IpSetRemoved(id.clone()))
        .expect("set removed");
    assert!(pos_policy < pos_set, "{out:?}");
    dp.apply(&out).unwrap();
    assert!(dp.sets.is_empty() && dp.domains.is_empty());
}

#[test]
fn a_domain_set_is_created_before_the_policy_that_references_it() {
    let mut g = graph();
    let out = run(
        &mut g,
        vec![
            web(),
            egress_gnp("a", vec![to_domains(Action::Allow, &["example.com"])]),
            calc_graph::graph::Update::InSync,
        ],
    );
    let created = out
        .iter()
        .position(|o| matches!(o, Output::DomainSetCreated { .. }))
        .expect("domain set created");
    let policy = out
        .iter()
        .position(|o| matches!(o, Output::PolicyUpdated(_)))
        .expect("policy");
    assert!(created < policy, "{out:?}");
    // An inactive policy (selecting no local endpoint) needs no set.
    let mut g = graph();
    let out = run(
        &mut g,
        vec![
            egress_gnp("a", vec![to_domains(Action::Allow, &["example.com"])]),
            calc_graph::graph::Update::InSync,
        ],
    );
    assert!(
        !out.iter()
            .any(|o| matches!(o, Output::DomainSetCreated { .. })),
        "{out:?}"
    );
}

/// Every use of `destination.domains` outside an egress Allow rule fails the rule safe, with a
/// reason naming the field; nothing is widened, no domain set is made, and the other rules of
/// the policy are enforced.
#[test]
fn every_other_use_fails_safe_with_the_field_and_reason() {
    let mut with_nets = to_domains(Action::Allow, &["example.com"]);
    with_nets.destination.nets = vec![net("10.9.0.0/16")];
    with_nets.destination.selector = Some("app == 'x'".into());
    let mut source = to_domains(Action::Allow, &[]);
    source.source.domains = vec!["example.com".into()];
    let egress = vec![
        to_domains(Action::Allow, &["good.example.com", "a..b"]),
        to_domains(Action::Deny, &["example.com"]),
        to_domains(Action::Pass, &["example.com"]),
        with_nets,
        source,
        to_domains(Action::Allow, &["*.com", "x\n-j ACCEPT"]),
        to_domains(Action::Allow, &["ok.example.com"]),
    ];
    let ingress = vec![to_domains(Action::Allow, &["example.com"])];
    let mut p = mk_gnp_res("g", "app == 'web'", None, ingress, egress);
    p.spec.types = vec![
        calc_graph::model::PolicyType::Ingress,
        calc_graph::model::PolicyType::Egress,
    ];
    let (mut g, dp) = synced(vec![web(), upd(p)]);
    assert!(g.take_errors().is_empty(), "never an error for the policy");
    let r = "globalnetworkpolicies/g";
    assert_eq!(
        reports(&g),
        vec![
            format!(
                "{r} spec.ingress[0]: Allow rule not rendered: destination.domains: domains are enforced only in egress rules"
            ),
            format!(
                "{r} spec.egress[0]: Allow rule not rendered: destination.domains[1]: invalid domain name \"a..b\": empty label"
            ),
            format!(
                "{r} spec.egress[1]: Deny rule rendered with only its enforced matches: destination.domains: domains are enforced only in Allow rules, not Deny"
            ),
            format!(
                "{r} spec.egress[2]: Pass rule rendered as Deny with only its enforced matches: destination.domains: domains are enforced only in Allow rules, not Pass"
            ),
            format!(
                "{r} spec.egress[3]: Allow rule not rendered: destination.domains: domains cannot be combined with destination.nets, destination.selector"
            ),
            format!("{r} spec.egress[4]: Allow rule not rendered: unenforced field source.domains"),
            format!(
                "{r} spec.egress[5]: Allow rule not rendered: destination.domains[0]: invalid domain name \"*.com\": a wildcard needs at least two labels after \"*.\", destination.domains[1]: invalid domain name \"x\\n-j ACCEPT\": only letters, digits, '-' and '_' may appear in a label"
            ),
        ]
    );
    let (_, bad) = g.failed_safe_rules().nth(1).unwrap();
    assert_eq!(
        bad.fields().collect::<Vec<_>>(),
        ["spec.egress[0].destination.domains[1]"]
    );
    let pol = dp.policies.values().next().unwrap();
    assert!(pol.inbound_rules.is_empty());
    // Deny kept (without domains), Pass became Deny, the last Allow enforced.
    let actions: Vec<Action> = pol.outbound_rules.iter().map(|r| r.action()).collect();
    assert_eq!(actions, [Action::Deny, Action::Deny, Action::Allow]);
    assert!(
        pol.outbound_rules[..2]
            .iter()
            .all(|r| r.dst_domain_ip_set_ids.is_empty() && r.protocol == Some(Protocol::Tcp))
    );
    let only = domain_set_id(&patterns(&["ok.example.com"]));
    assert_eq!(
        pol.outbound_rules[2].dst_domain_ip_set_ids,
        vec![only.clone()]
    );
    assert_eq!(dp.domains.keys().collect::<Vec<_>>(), [&only]);
}

#[test]
fn profiles_enforce_egress_domains_too() {
    let mut prof = calc_graph::model::Profile {
        metadata: calc_graph::model::Metadata::named("kns.prod"),
        spec: Default::default(),
    };
    prof.spec.egress = vec![to_domains(Action::Allow, &["example.com"])];
    let (_, dp) = synced(vec![web(), upd(prof)]);
    let id = domain_set_id(&patterns(&["example.com"]));
    assert_eq!(dp.sets[&id].0, IpSetKind::Domain);
    let p = &dp.profiles["kns.prod"];
    assert_eq!(p.outbound_rules[0].dst_domain_ip_set_ids, vec![id]);
}
