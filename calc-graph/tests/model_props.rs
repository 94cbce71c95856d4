//! Property tests for the resource model:
//! * generated resources survive encode -> decode and etcd key -> `from_etcd` unchanged;
//! * hostile input (random bytes, mutated fixtures, random names) never panics: it decodes and
//!   validates, or it is rejected with an error naming the resource;
//! * strict decoding: a key added anywhere in a valid fixture is reported at exactly its path (on
//!   its rule, which fails safe, or as the resource's error), unless it is data (labels, ...).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use calc_graph::model::{
    Action, EntityRule, GlobalNetworkPolicy, IcmpFields, IpVersion, Metadata, NetworkPolicy,
    NetworkSet, NetworkSetSpec, PolicySpec, PolicyType, Port, Protocol, Resource, ResourceKey,
    Rule, WorkloadEndpoint, WorkloadEndpointSpec, validate_name,
};
use ipnet::IpNet;
use proptest::prelude::*;
use serde_json::Value;

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9]([-a-z0-9.]{0,30}[a-z0-9])?".prop_filter("dns subdomain", |s| validate_name(s).is_ok())
}

/// A policy name Calico accepts: a DNS label, optionally `tier.`-prefixed.
fn policy_name() -> impl Strategy<Value = String> {
    "([a-z]([-a-z0-9]{0,10}[a-z0-9])?\\.)?[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?"
}

fn namespace() -> impl Strategy<Value = String> {
    "[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?"
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        "([a-z]{1,8}\\.io/)?[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,10}[a-zA-Z0-9])?",
        "([a-zA-Z0-9]([a-zA-Z0-9_.-]{0,10}[a-zA-Z0-9])?)?",
        0..4,
    )
}

fn net(v6: bool) -> impl Strategy<Value = IpNet> {
    if v6 {
        (any::<u128>(), 0u8..=128)
            .prop_map(|(a, l)| IpNet::new(std::net::Ipv6Addr::from(a).into(), l).unwrap())
            .boxed()
    } else {
        (any::<u32>(), 0u8..=32)
            .prop_map(|(a, l)| IpNet::new(std::net::Ipv4Addr::from(a).into(), l).unwrap())
            .boxed()
    }
}

/// An endpoint address: a /32 or /128.
fn host(v6: bool) -> impl Strategy<Value = IpNet> {
    net(v6).prop_map(|n| IpNet::from(n.addr()))
}

fn port() -> impl Strategy<Value = Port> {
    prop_oneof![
        (1u16..).prop_map(Port::Number),
        (1u16.., 1u16..).prop_map(|(a, b)| Port::Range(a.min(b), a.max(b))),
        "[a-z]([a-z0-9]{0,8}[a-z0-9])?".prop_map(Port::Named),
    ]
}

fn selector() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop::sample::select(vec![
        "all()".to_string(),
        "app == 'web'".to_string(),
        "has(role) && tier in {'a', 'b'}".to_string(),
        "!has(x) || y != \"z\"".to_string(),
    ]))
}

/// A rule that validates: ports only with TCP/UDP, ICMP only with ICMP, nets in the rule's family.
fn rule() -> impl Strategy<Value = Rule> {
    let action = prop::sample::select(vec![Action::Allow, Action::Deny, Action::Pass, Action::Log]);
    let l4 = prop_oneof![
        Just(None),
        Just(Some(Protocol::Tcp)),
        Just(Some(Protocol::Udp)),
        Just(Some(Protocol::Icmp)),
        (0u8..=255)
            .prop_filter("0 is invalid; ICMPv6 needs v6 nets", |n| *n != 0
                && *n != 58)
            .prop_map(|n| Some(Protocol::Number(n))),
    ];
    (
        action,
        l4,
        any::<bool>(),
        prop::collection::vec(net(false), 0..3),
        prop::collection::vec(port(), 0..3),
        selector(),
        selector(),
        prop::option::of((0u8..=254, prop::option::of(any::<u8>()))),
    )
        .prop_map(|(action, protocol, v4, nets, ports, sel, nsel, icmp)| {
            let mut r = Rule::new(action);
            r.protocol = protocol;
            if v4 {
                r.ip_version = Some(IpVersion::V4);
            }
            let has_ports = protocol.is_some_and(Protocol::supports_ports);
            r.source = EntityRule {
                nets,
                selector: sel,
                namespace_selector: nsel,
                ..EntityRule::default()
            };
            if has_ports {
                r.destination.ports = ports;
            }
            if protocol == Some(Protocol::Icmp) {
                r.icmp = icmp.map(|(t, c)| IcmpFields {
                    type_: Some(t),
                    code: c,
                });
            }
            r
        })
}

fn policy_types() -> impl Strategy<Value = Vec<PolicyType>> {
    prop::sample::select(vec![
        vec![],
        vec![PolicyType::Ingress],
        vec![PolicyType::Egress],
        vec![PolicyType::Ingress, PolicyType::Egress],
    ])
}

fn resource() -> impl Strategy<Value = Resource> {
    let np = (
        namespace(),
        policy_name(),
        labels(),
        prop::option::of(-1e6f64..1e6),
        selector(),
        policy_types(),
        prop::collection::vec(rule(), 0..4),
        prop::collection::vec(rule(), 0..4),
    )
        .prop_map(|(ns, n, labels, order, sel, types, ingress, egress)| {
            Resource::NetworkPolicy(NetworkPolicy {
                metadata: Metadata {
                    labels,
                    ..Metadata::namespaced(ns, n)
                },
                spec: PolicySpec {
                    order,
                    selector: sel,
                    types,
                    ingress,
                    egress,
                    ..PolicySpec::default()
                },
            })
        });
    let gnp = (
        policy_name(),
        any::<bool>(),
        prop::collection::vec(rule(), 0..3),
    )
        .prop_map(|(n, flags, ingress)| {
            Resource::GlobalNetworkPolicy(GlobalNetworkPolicy {
                metadata: Metadata::named(n),
                spec: PolicySpec {
                    tier: Some("security".into()),
                    ingress,
                    do_not_track: flags,
                    apply_on_forward: flags,
                    ..PolicySpec::default()
                },
            })
        });
    let wep = (
        namespace(),
        name(),
        labels(),
        prop::collection::vec(host(false), 0..2),
        prop::collection::vec(host(true), 0..2),
        "cali[0-9a-f]{11}",
    )
        .prop_map(|(ns, n, labels, v4, v6, iface)| {
            Resource::WorkloadEndpoint(WorkloadEndpoint {
                metadata: Metadata {
                    labels,
                    ..Metadata::namespaced(ns.clone(), n)
                },
                spec: WorkloadEndpointSpec {
                    node: Some("node-1".into()),
                    ip_networks: v4.into_iter().chain(v6).collect(),
                    interface_name: Some(iface),
                    profiles: vec![format!("kns.{ns}")],
                    ..WorkloadEndpointSpec::default()
                },
            })
        });
    let ns =
        (namespace(), name(), prop::collection::vec(net(false), 0..4)).prop_map(|(ns, n, nets)| {
            Resource::NetworkSet(NetworkSet {
                metadata: Metadata::namespaced(ns, n),
                spec: NetworkSetSpec { nets },
            })
        });
    prop_oneof![np, gnp, wep, ns]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn generated_resources_validate_and_round_trip(r in resource()) {
        prop_assert_eq!(r.validate(), Ok(()));
        let json = r.to_json();
        let back = Resource::from_json(json.as_bytes()).unwrap();
        prop_assert_eq!(&back, &r);
        let key = r.key();
        let (k2, r2) = Resource::from_etcd(&key.etcd_key(), json.as_bytes()).unwrap();
        prop_assert_eq!(k2, key);
        prop_assert_eq!(r2, r);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(r) = Resource::from_json(&bytes) {
            let _ = r.validate();
            let _ = r.to_json();
        }
        let _ = Resource::from_etcd(
            "/calico/resources/v3/projectcalico.org/tiers/x", &bytes);
        let _ = ResourceKey::parse_etcd_key(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn any_name_is_either_valid_or_rejected_without_panic(n in "(\\PC|[\\n\\t\\x01\\x7f/ ]){0,40}|[a-z./ -]{0,10}") {
        let doc = serde_json::json!({"kind": "GlobalNetworkSet", "metadata": {"name": n}});
        let r = Resource::from_json(doc.to_string().as_bytes()).unwrap();
        match r.validate() {
            Ok(()) => {
                // A valid name always yields a key that parses back to the same identity.
                prop_assert_eq!(ResourceKey::parse_etcd_key(&r.key().etcd_key()).unwrap(), r.key());
                prop_assert!(!n.contains('/') && !n.chars().any(char::is_whitespace));
            }
            Err(errs) => {
                prop_assert!(errs.iter().all(|e| e.path == "metadata.name"), "{:?}", errs);
                // Errors end up in logs: a hostile name must not break the line.
                for e in &errs {
                    prop_assert!(!e.to_string().chars().any(char::is_control), "{}", e);
                }
            }
        }
    }

    #[test]
    fn mutated_fixtures_never_panic(
        idx in any::<prop::sample::Index>(),
        path_idx in any::<prop::sample::Index>(),
        replacement in prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::from),
            Just(serde_json::json!([])),
            Just(serde_json::json!({})),
            Just(serde_json::json!(["10.0.0.1", 80, "a:b"])),
        ],
    ) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/valid");
        let mut files: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        let mut doc: Value = serde_json::from_slice(&fs::read(idx.get(&files)).unwrap()).unwrap();
        let mut pointers = Vec::new();
        collect_pointers(&doc, String::new(), &mut pointers);
        let ptr = path_idx.get(&pointers).clone();
        if let Some(slot) = doc.pointer_mut(&ptr) {
            *slot = replacement;
        }
        match Resource::from_json(doc.to_string().as_bytes()) {
            Ok(r) => {
                let _ = r.validate();
                let again = Resource::from_json(r.to_json().as_bytes()).unwrap();
                prop_assert_eq!(again, r);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

/// `/spec/ingress/0/source` -> `spec.ingress[0].source`.
fn dotted(pointer: &str) -> String {
    let mut out = String::new();
    for seg in pointer.split('/').skip(1) {
        if seg.parse::<usize>().is_ok() {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(seg);
        }
    }
    out
}

/// Objects whose keys are data, not fields: a key added there is not unknown.
fn is_free_form(pointer: &str) -> bool {
    [
        "labels",
        "annotations",
        "labelsToApply",
        "matchLabels",
        "managedFields",
        "ownerReferences",
        "status",
    ]
    .iter()
    .any(|f| pointer.split('/').any(|seg| seg == *f))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A key added to any object of a valid fixture is reported at exactly its path: on the rule
    /// it sits in (which then fails safe), or as the resource's error; keys added to free-form
    /// maps (labels, annotations, ...) are data.
    #[test]
    fn an_added_key_is_reported_at_its_path(
        idx in any::<prop::sample::Index>(),
        obj_idx in any::<prop::sample::Index>(),
        key in "[a-z][a-zA-Z]{0,8}X",
    ) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/valid");
        let mut files: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        let mut doc: Value = serde_json::from_slice(&fs::read(idx.get(&files)).unwrap()).unwrap();
        let mut pointers = Vec::new();
        collect_pointers(&doc, String::new(), &mut pointers);
        let objects: Vec<String> = pointers
            .into_iter()
            .filter(|p| doc.pointer(p).is_some_and(Value::is_object))
            .collect();
        let at = obj_idx.get(&objects).clone();
        let obj = doc.pointer_mut(&at).unwrap().as_object_mut().unwrap();
        obj.insert(key.clone(), Value::from("v"));
        let path = dotted(&format!("{at}/{key}"));
        let rule_prefix = |r: &str| path.strip_prefix(r).and_then(|rest| rest.strip_prefix('.'));
        match Resource::from_json(doc.to_string().as_bytes()) {
            Err(calc_graph::model::ModelError::UnknownFields { paths, .. }) => {
                prop_assert!(!is_free_form(&at), "{at}");
                prop_assert_eq!(paths, vec![path]);
            }
            Err(e) => prop_assert!(false, "{path}: {e}"),
            Ok(r) => {
                let rules: Vec<(String, Rule)> = match &r {
                    Resource::NetworkPolicy(p) => rules_of(&p.spec.ingress, &p.spec.egress),
                    Resource::GlobalNetworkPolicy(p) => rules_of(&p.spec.ingress, &p.spec.egress),
                    Resource::Profile(p) => rules_of(&p.spec.ingress, &p.spec.egress),
                    _ => Vec::new(),
                };
                let holder = rules.iter().find(|(rp, _)| rule_prefix(rp).is_some());
                match holder {
                    Some((rp, rule)) if !is_free_form(&at) => {
                        prop_assert_eq!(&rule.unknown_fields, &vec![rule_prefix(rp).unwrap().to_string()]);
                        prop_assert!(rule.fails_safe());
                    }
                    _ => {
                        prop_assert!(is_free_form(&at), "{path} accepted silently");
                        prop_assert!(rules.iter().all(|(_, r)| r.unknown_fields.is_empty()));
                    }
                }
            }
        }
    }
}

fn rules_of(ingress: &[Rule], egress: &[Rule]) -> Vec<(String, Rule)> {
    let ing = ingress
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("spec.ingress[{i}]"), r.clone()));
    let eg = egress
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("spec.egress[{i}]"), r.clone()));
    ing.chain(eg).collect()
}

fn collect_pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let k = k.replace('~', "~0").replace('/', "~1");
                collect_pointers(child, format!("{at}/{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                collect_pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}
