//! Hostile names, labels and comments cannot change the meaning of the restore payload: every
//! rendered table parses back (with our parser) to exactly the rules and targets we intended.

mod render_support;

use calc_graph::proto::*;
use iptables::desired::TableName;
use iptables::model;
use iptables::render::{RenderConfig, RenderError, Renderer};
use render_support::*;

const HOSTILE: &[&str] = &[
    "a\"b",
    "x' -j ACCEPT",
    "with space",
    "new\nline -A INPUT -j ACCEPT",
    "\" -j ACCEPT #",
    "back\\slash",
    "-j ACCEPT",
    "COMMIT",
    "é✓",
    "tab\there",
];

fn long() -> String {
    "n".repeat(400)
}

#[test]
fn hostile_policy_profile_tier_and_annotation_values_stay_in_their_tokens() {
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    let mut outputs = vec![Output::IpSetCreated {
        id: "s:abc".into(),
        kind: IpSetKind::Net,
        members: vec![IpSetMember::Net(net("10.0.0.1/32"))].into(),
    }];
    let mut names: Vec<String> = HOSTILE.iter().map(|s| s.to_string()).collect();
    names.push(long());
    let mut tiers = Vec::new();
    let mut profiles = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let id = PolicyId {
            kind: if i % 2 == 0 {
                PolicyKind::NetworkPolicy
            } else {
                PolicyKind::GlobalNetworkPolicy
            },
            tier: n.clone(),
            namespace: (i % 2 == 0).then(|| n.clone()),
            name: n.clone(),
        };
        let rule = ParsedRule {
            action: Some(if i % 3 == 0 {
                Action::Deny
            } else {
                Action::Allow
            }),
            src_ip_set_ids: vec!["s:abc".into()],
            annotations: vec![(n.clone(), n.clone())],
            ..Default::default()
        };
        outputs.push(Output::PolicyUpdated(mk_policy(
            id.clone(),
            vec![rule.clone()],
            vec![rule],
        )));
        tiers.push(TierInfo {
            name: n.clone(),
            default_action: Action::Deny,
            ingress_policies: vec![id.clone()],
            egress_policies: vec![id],
        });
        outputs.push(Output::ProfileUpdated(mk_profile(
            n,
            vec![mk_allow()],
            vec![],
        )));
        profiles.push(n.as_str());
    }
    outputs.push(Output::EndpointUpdated(mk_endpoint(
        "ns",
        "pod",
        "cali12345",
        &["10.0.0.9/32"],
        tiers,
        &profiles,
    )));
    let errs = r.apply_all(outputs);
    assert!(errs.is_empty(), "{errs:?}");
    assert!(r.flush().is_empty());

    for v in [IpVersion::V4, IpVersion::V6] {
        let checked = assert_parses_back(&r, v);
        assert!(checked > 100, "{checked}");
        let d = r.desired(v);
        d.validate().unwrap();
        let filter = &d.tables[&TableName::Filter];
        for name in filter.chains.keys() {
            assert!(name.len() <= 28 && name.starts_with("cali-"), "{name}");
        }
        // Every policy chain: the policy's comment on the first rule; deny/allow targets intact.
        let pol_chains: Vec<_> = filter
            .chains
            .keys()
            .filter(|n| n.starts_with("cali-p") || n.starts_with("cali-s"))
            .collect();
        // 4 per name (policy and profile, in and out) + the shared in and out chains.
        assert_eq!(pol_chains.len(), names.len() * 4 + 2, "{pol_chains:?}");
        for name in pol_chains {
            let rules = r.chain(v, TableName::Filter, name).unwrap();
            let targets: Vec<_> = rules.iter().map(|r| r.target.clone()).collect();
            assert!(!targets.is_empty());
            for c in rules.iter().flat_map(|r| r.comments()) {
                assert!(c.len() <= 255);
                assert!(!c.contains(['"', '\'', '\\', '\n', '\t']), "{c:?}");
            }
        }
    }
    // The endpoint's chain has one jump per tier policy and one per profile, nothing more.
    let tw = endpoint_rules(&r, IpVersion::V4, "cali-tw-cali12345").unwrap();
    let jumps = tw
        .iter()
        .filter(|r| matches!(r.target, Some(model::Target::Jump(_))))
        .count();
    assert_eq!(jumps, names.len() * 2);
}

#[test]
fn hostile_interface_names_and_set_ids_are_rejected_with_errors_naming_them() {
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    for iface in [
        "cali x",
        "cali+",
        "cali\"1",
        "calic440f4556931x",
        "",
        "cali\n-j",
    ] {
        let err = r
            .apply(Output::EndpointUpdated(mk_endpoint(
                "ns",
                "p",
                iface,
                &[],
                vec![],
                &[],
            )))
            .unwrap_err();
        assert!(matches!(err, RenderError::InvalidInterface { .. }), "{err}");
        assert!(err.to_string().contains("ns/p"), "{err}");
    }
    let err = r
        .apply(Output::IpSetCreated {
            id: "s:a b".into(),
            kind: IpSetKind::Net,
            members: vec![].into(),
        })
        .unwrap_err();
    assert!(err.to_string().contains("s:a b"), "{err}");
    // Nothing of the rejected objects made it into the state: dispatch still only drops.
    r.flush();
    let d = r.desired(IpVersion::V4);
    let rules = &d.tables[&TableName::Filter].chains["cali-from-wl-dispatch"];
    assert_eq!(rules.len(), 1);
    assert!(rules[0].body().ends_with("-j DROP"));
    assert!(d.ip_sets.is_empty());
    assert_parses_back(&r, IpVersion::V4);
}

#[test]
fn hostile_log_prefix_config_is_sanitised() {
    let cfg = RenderConfig {
        log_prefix: "x\" -j ACCEPT\n%n very long prefix indeed".into(),
        ..Default::default()
    };
    let mut r = Renderer::new(cfg).unwrap();
    let id = mk_np("ns", "p");
    let log = ParsedRule {
        action: Some(Action::Log),
        ..Default::default()
    };
    r.apply_all([
        Output::PolicyUpdated(mk_policy(id.clone(), vec![log], vec![])),
        Output::EndpointUpdated(mk_endpoint(
            "ns",
            "a",
            "calia",
            &[],
            vec![mk_tier("default", vec![id], vec![])],
            &[],
        )),
    ]);
    r.flush();
    let rules = r
        .chain(IpVersion::V4, TableName::Filter, "cali-pi-np/ns/p")
        .unwrap();
    match &rules[0].target {
        Some(model::Target::Log {
            prefix: Some(p),
            level: Some(5),
        }) => {
            assert!(p.as_str().len() <= 29, "{p:?}");
            assert!(!p.as_str().contains(['"', '\n']));
        }
        other => panic!("{other:?}"),
    }
    assert_parses_back(&r, IpVersion::V4);
}
