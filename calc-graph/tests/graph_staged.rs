//! Staged policies in the graph: active under their own staged kinds, never in an endpoint's
//! enforced tiers, and each endpoint's staged view (`staged_tiers`): a Set replacing the
//! enforced policy of its name, a Delete removing it, `None` where nothing staged applies.

mod support;

use calc_graph::model::{
    Action, Kind, Rule, StagedAction, StagedGlobalNetworkPolicy, StagedKubernetesNetworkPolicy,
    StagedNetworkPolicy, StagedPolicySpec,
};
use calc_graph::proto::{PolicyKind, TierInfo};
use support::*;

fn staged_np(
    ns: &str,
    name: &str,
    action: StagedAction,
    selector: &str,
    order: f64,
) -> StagedNetworkPolicy {
    let mut spec = StagedPolicySpec {
        staged_action: Some(action),
        ..Default::default()
    };
    if action == StagedAction::Set {
        spec.policy.selector = Some(selector.into());
        spec.policy.order = Some(order);
        spec.policy.types = vec![calc_graph::model::PolicyType::Ingress];
        spec.policy.ingress = vec![Rule::new(Action::Deny)];
    }
    StagedNetworkPolicy {
        metadata: calc_graph::model::Metadata::namespaced(ns, name),
        spec,
    }
}

fn names(tiers: &[TierInfo]) -> Vec<String> {
    tiers
        .iter()
        .flat_map(|t| &t.ingress_policies)
        .map(|p| p.to_string())
        .collect()
}

#[test]
fn a_staged_set_replaces_the_enforced_policy_of_its_name_in_the_staged_view_only() {
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_wep("prod", "db", NODE, "10.0.0.2/32", &[("app", "db")]),
        mk_np("prod", "web", "app == 'web'", vec![allow_from("all()")]),
        mk_np("prod", "other", "all()", vec![allow_from("all()")]),
    ]);
    assert!(dp.endpoints.values().all(|e| e.staged_tiers.is_none()));
    // The staged web selects db (not web): web loses the enforced web, db gains the staged one.
    let out = run(
        &mut g,
        vec![upd(staged_np(
            "prod",
            "web",
            StagedAction::Set,
            "app == 'db'",
            5.0,
        ))],
    );
    dp.apply(&out).unwrap();
    let staged_id = dp
        .policies
        .keys()
        .find(|id| id.kind == PolicyKind::StagedNetworkPolicy)
        .expect("the staged policy is active")
        .clone();
    assert_eq!(staged_id.to_string(), "StagedNetworkPolicy prod/web");
    let ep = |dp: &Dataplane, n: &str| {
        dp.endpoints
            .values()
            .find(|e| e.id.name.contains(n))
            .unwrap()
            .clone()
    };
    let web = ep(&dp, "web");
    assert_eq!(
        names(&web.tiers),
        ["NetworkPolicy prod/other", "NetworkPolicy prod/web"]
    );
    assert_eq!(
        names(web.staged_tiers.as_ref().unwrap()),
        ["NetworkPolicy prod/other"]
    );
    let db = ep(&dp, "db");
    assert_eq!(names(&db.tiers), ["NetworkPolicy prod/other"]);
    assert_eq!(
        names(db.staged_tiers.as_ref().unwrap()),
        ["StagedNetworkPolicy prod/web", "NetworkPolicy prod/other"]
    );
    // Delete instead: web's view loses web, db's view is its enforced one again (None).
    let out = run(
        &mut g,
        vec![upd(staged_np("prod", "web", StagedAction::Delete, "", 0.0))],
    );
    dp.apply(&out).unwrap();
    assert!(!dp.policies.contains_key(&staged_id));
    assert_eq!(
        names(ep(&dp, "web").staged_tiers.as_ref().unwrap()),
        ["NetworkPolicy prod/other"]
    );
    assert_eq!(ep(&dp, "db").staged_tiers, None);
    // The enforced policy goes away: nothing left to shadow, the views are None.
    let out = run(&mut g, vec![del(Kind::NetworkPolicy, Some("prod"), "web")]);
    dp.apply(&out).unwrap();
    assert!(dp.endpoints.values().all(|e| e.staged_tiers.is_none()));
    // Learn/Ignore stage nothing; deleting the staged policy leaves no trace.
    let out = run(
        &mut g,
        vec![del(Kind::StagedNetworkPolicy, Some("prod"), "web")],
    );
    dp.apply(&out).unwrap();
    dp.check_integrity().unwrap();
    assert!(g.take_errors().is_empty());
}

#[test]
fn a_staged_global_policy_never_joins_enforced_tiers() {
    let deny_all = StagedGlobalNetworkPolicy {
        metadata: calc_graph::model::Metadata::named("deny-all"),
        spec: StagedPolicySpec {
            staged_action: None,
            policy: calc_graph::model::PolicySpec {
                selector: Some("all()".into()),
                ingress: vec![Rule::new(Action::Deny)],
                ..Default::default()
            },
        },
    };
    let (_, dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_np("prod", "web", "app == 'web'", vec![allow_from("all()")]),
        upd(deny_all),
    ]);
    let web = dp.endpoints.values().next().unwrap();
    assert_eq!(names(&web.tiers), ["NetworkPolicy prod/web"]);
    assert_eq!(
        names(web.staged_tiers.as_ref().unwrap()),
        [
            "NetworkPolicy prod/web",
            "StagedGlobalNetworkPolicy deny-all"
        ]
    );
}

#[test]
fn a_staged_kubernetes_policy_needs_the_converter_for_set_but_not_for_delete() {
    let sknp = |action: &str| -> StagedKubernetesNetworkPolicy {
        let spec = match action {
            "Delete" => serde_json::json!({"stagedAction": action}),
            _ => serde_json::json!({"stagedAction": action, "podSelector": {}}),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "prod"},
            "spec": spec
        }))
        .unwrap()
    };
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_np(
            "prod",
            "knp.default.web",
            "all()",
            vec![allow_from("all()")],
        ),
    ]);
    let out = run(&mut g, vec![upd(sknp("Set"))]);
    dp.apply(&out).unwrap();
    let errors = g.take_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].1.to_string().contains("no Kubernetes converter"),
        "{errors:?}"
    );
    assert_eq!(dp.endpoints.values().next().unwrap().staged_tiers, None);
    let out = run(&mut g, vec![upd(sknp("Delete"))]);
    dp.apply(&out).unwrap();
    let web = dp.endpoints.values().next().unwrap();
    assert_eq!(
        names(web.staged_tiers.as_ref().unwrap()),
        Vec::<String>::new()
    );
    assert_eq!(names(&web.tiers), ["NetworkPolicy prod/knp.default.web"]);
}
