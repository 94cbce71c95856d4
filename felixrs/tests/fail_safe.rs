//! A field the agent does not enforce (or does not know) never widens a rule, judged by the trace
//! evaluator on the agent's own pipeline: etcd values -> strict decode -> calculation graph ->
//! renderer -> `iptables::render::trace`.
//!
//! * The table: every rule-level field of the Calico v3 Rule/EntityRule schema, typo'd, plus every
//!   known-but-unenforced field, on every action and both directions: the verdicts never allow a
//!   packet that the same policy without that rule denies; a typo'd NetworkPolicy
//!   (networking.k8s.io/v1) field makes the controller keep the last good version.
//! * The property: random unknown/unsupported fields injected into random rules of random
//!   policies never make a packet allowed that the policies without those rules deny.
//! * `destination.domains` is enforced in egress Allow rules (FQDN policy): with nothing learned
//!   from DNS such a rule opens nothing either, and is not reported; every other use fails safe.

use std::net::IpAddr;

use calc_graph::proto::IpVersion;
use felixrs::agent::kernel::GraphPipeline;
use felixrs::agent::state::Pipeline;
use iptables::desired::TableName;
use iptables::render::static_chains::FORWARD;
use iptables::render::trace::{self, Outcome, Packet, RendererRules};
use iptables::render::{RenderConfig, Renderer};
use proptest::prelude::*;
use serde_json::{Value, json};

const NODE: &str = "node-1";
const PREFIX: &str = "/calico/resources/v3/projectcalico.org";

/// `(name, interface or None when remote, address, labels)`.
type PodSpec = (
    &'static str,
    Option<&'static str>,
    &'static str,
    &'static [(&'static str, &'static str)],
);
const PODS: &[PodSpec] = &[
    (
        "a",
        Some("calia0000000001"),
        "10.0.0.1",
        &[("app", "a"), ("role", "x")],
    ),
    ("b", Some("calib0000000002"), "10.0.0.2", &[("app", "b")]),
    ("c", None, "10.0.1.3", &[("app", "c"), ("role", "x")]),
];
const EXTERNAL: &str = "192.0.2.9";

fn wep(name: &str, iface: Option<&str>, ip: &str, labels: &[(&str, &str)]) -> (String, Value) {
    let mut l = serde_json::Map::new();
    for (k, v) in labels {
        l.insert((*k).into(), json!(v));
    }
    l.insert("projectcalico.org/namespace".into(), json!("ns"));
    l.insert("projectcalico.org/orchestrator".into(), json!("k8s"));
    let wep_name = format!(
        "{}-k8s-{name}-eth0",
        if iface.is_some() { NODE } else { "node-2" }
    );
    (
        format!("{PREFIX}/workloadendpoints/ns/{wep_name}"),
        json!({
            "apiVersion": "projectcalico.org/v3", "kind": "WorkloadEndpoint",
            "metadata": {"name": wep_name, "namespace": "ns", "labels": l},
            "spec": {"orchestrator": "k8s", "node": if iface.is_some() { NODE } else { "node-2" },
                     "pod": name, "endpoint": "eth0", "workload": "",
                     "interfaceName": iface.unwrap_or("caliremote00003"),
                     "ipNetworks": [format!("{ip}/32")], "profiles": ["kns.ns"]}
        }),
    )
}

/// The pods, and a namespace profile that allows everything (as the controller writes it).
fn world() -> Vec<(String, Value)> {
    let mut kvs: Vec<(String, Value)> =
        PODS.iter().map(|(n, i, ip, l)| wep(n, *i, ip, l)).collect();
    kvs.push((
        format!("{PREFIX}/profiles/kns.ns"),
        json!({"apiVersion": "projectcalico.org/v3", "kind": "Profile",
               "metadata": {"name": "kns.ns"},
               "spec": {"ingress": [{"action": "Allow"}], "egress": [{"action": "Allow"}]}}),
    ));
    kvs
}

fn policy(name: &str, selector: &str, ingress: Vec<Value>, egress: Vec<Value>) -> (String, Value) {
    (
        format!("{PREFIX}/globalnetworkpolicies/{name}"),
        json!({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
               "metadata": {"name": name},
               "spec": {"selector": selector, "types": ["Ingress", "Egress"], "order": 10,
                        "ingress": ingress, "egress": egress}}),
    )
}

/// Every packet of the judge: between the pods and an outside address, TCP 80/22 and UDP 53,
/// each through the node's FORWARD chain.
fn packets() -> Vec<Packet> {
    let ends: Vec<(IpAddr, String)> = PODS
        .iter()
        .map(|(_, i, ip, _)| (ip.parse().unwrap(), i.unwrap_or("eth0").to_string()))
        .chain([(EXTERNAL.parse().unwrap(), "eth0".to_string())])
        .collect();
    let mut out = Vec::new();
    for (src, in_iface) in &ends {
        for (dst, out_iface) in &ends {
            if src == dst || (in_iface == "eth0" && out_iface == "eth0") {
                continue;
            }
            for (proto, port) in [(6, 80), (6, 22), (17, 53)] {
                let mut p = Packet::new(*src, *dst, proto, 40000, port);
                p.in_iface = in_iface.clone();
                p.out_iface = out_iface.clone();
                out.push(p);
            }
        }
    }
    out
}

/// What the agent would do with these etcd values: the verdict (accepted?) of every packet, and
/// the failed-safe rules it reports.
fn verdicts(kvs: &[(String, Value)]) -> (Vec<bool>, Vec<String>) {
    let (v, reports, rejected) = verdicts_or_rejections(kvs);
    assert!(rejected.is_empty(), "{rejected:?}");
    (v, reports)
}

/// [`verdicts`], and the values the agent rejected (with why).
fn verdicts_or_rejections(kvs: &[(String, Value)]) -> (Vec<bool>, Vec<String>, Vec<String>) {
    let mut pipeline = GraphPipeline::new(NODE);
    let mut rejected = Vec::new();
    for (k, v) in kvs {
        if let Err(e) = pipeline.update(k, Some(&serde_json::to_vec(v).unwrap())) {
            rejected.push(e.to_string());
        }
    }
    pipeline.in_sync();
    let reports = pipeline
        .failed_safe_rules()
        .into_iter()
        .map(|r| format!("{} {} {:?}", r.resource, r.rule, r.unknown_fields))
        .collect();
    let mut renderer = Renderer::new(RenderConfig::default()).unwrap();
    let errors = renderer.apply_all(pipeline.flush());
    assert!(errors.is_empty(), "{errors:?}");
    assert!(renderer.flush().is_empty());
    let accept = renderer.marks().accept;
    let rules = RendererRules {
        renderer: &renderer,
        version: IpVersion::V4,
        table: TableName::Filter,
    };
    let v = packets()
        .iter()
        .map(|p| {
            let t = trace::trace(&rules, FORWARD, p).unwrap();
            match t.outcome {
                Outcome::Accept => true,
                Outcome::Drop => false,
                Outcome::Return => t.mark & accept != 0,
            }
        })
        .collect();
    (v, reports, rejected)
}

/// Panics, naming the packet, if `with` accepts a packet `without` drops.
fn assert_no_wider(with: &[bool], without: &[bool], what: &str) {
    for ((w, wo), p) in with.iter().zip(without).zip(packets()) {
        assert!(
            !*w || *wo,
            "{what}: {} -> {} proto {} port {} is allowed, but dropped without the rule",
            p.src,
            p.dst,
            p.proto,
            p.dport
        );
    }
}

/// Sets `path` (dot-separated, relative to the rule) to `value`.
fn set_path(rule: &mut Value, path: &str, value: Value) {
    let mut at = rule;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        if at.get(*p).is_none() {
            at[*p] = json!({});
        }
        at = &mut at[*p];
    }
    at[parts[parts.len() - 1]] = value;
}

/// Every rule-level field of the Calico v3 schema, with a valid value (the value its typo gets).
fn rule_level_fields() -> Vec<(&'static str, Value)> {
    let mut out = vec![
        ("ipVersion", json!(4)),
        ("protocol", json!("TCP")),
        ("notProtocol", json!("UDP")),
        ("icmp", json!({"type": 8})),
        ("icmp.type", json!(8)),
        ("icmp.code", json!(0)),
        ("notICMP", json!({"type": 8})),
        ("notICMP.type", json!(8)),
        ("notICMP.code", json!(0)),
        ("http", json!({"methods": ["GET"]})),
        ("http.methods", json!(["GET"])),
        ("http.paths", json!([{"exact": "/"}])),
        ("metadata", json!({"annotations": {"k": "v"}})),
        ("metadata.annotations", json!({"k": "v"})),
    ];
    for side in ["source", "destination"] {
        let fields: [(&str, Value); 12] = [
            ("", json!({})),
            ("nets", json!(["10.0.0.0/24"])),
            ("notNets", json!(["10.0.1.0/24"])),
            ("selector", json!("role == 'x'")),
            ("notSelector", json!("app == 'c'")),
            ("namespaceSelector", json!("all()")),
            ("ports", json!([80])),
            ("notPorts", json!([22])),
            ("serviceAccounts", json!({"names": ["sa"]})),
            ("serviceAccounts.names", json!(["sa"])),
            ("serviceAccounts.selector", json!("x == 'y'")),
            ("services", json!({"name": "svc"})),
        ];
        for (f, v) in fields {
            let path: &'static str = if f.is_empty() {
                side
            } else {
                Box::leak(format!("{side}.{f}").into_boxed_str())
            };
            out.push((path, v));
        }
        out.push((
            Box::leak(format!("{side}.services.name").into_boxed_str()),
            json!("svc"),
        ));
        out.push((
            Box::leak(format!("{side}.domains").into_boxed_str()),
            json!(["example.com"]),
        ));
    }
    out
}

/// The base rules a variant is added to: the same rule's known matches, per action.
fn base_rule(action: &str) -> Value {
    json!({"action": action, "protocol": "TCP", "destination": {"ports": [80]}})
}

#[test]
fn no_unknown_or_unenforced_rule_field_widens_a_rule() {
    let (mut cases, mut invalid) = (0, 0);
    let unenforced: Vec<(String, Value)> = [
        ("http", json!({"methods": ["GET"]})),
        ("source.services", json!({"name": "svc", "namespace": "ns"})),
        (
            "destination.services",
            json!({"name": "svc", "namespace": "ns"}),
        ),
        ("source.domains", json!(["example.com"])),
        ("destination.domains", json!(["example.com"])),
    ]
    .into_iter()
    .map(|(f, v)| (f.to_string(), v))
    .collect();
    // The typo of each field: its last segment with a letter changed or appended.
    let typos: Vec<(String, Value)> = rule_level_fields()
        .into_iter()
        .map(|(path, v)| {
            let typo = match path.rsplit_once('.') {
                Some((parent, last)) => format!("{parent}.{last}x"),
                None => format!("{path}x"),
            };
            (typo, v)
        })
        .chain([
            ("source.selectr".to_string(), json!("role == 'x'")),
            ("destination.port".to_string(), json!([22])),
        ])
        .collect();
    for action in ["Allow", "Deny", "Pass", "Log"] {
        for dir in ["ingress", "egress"] {
            for (field, value) in typos.iter().chain(unenforced.iter()) {
                // `services` is only valid on one side per direction (validation rejects the
                // other, which the validation tests cover).
                if (dir == "ingress" && field == "destination.services")
                    || (dir == "egress" && field == "source.services")
                {
                    continue;
                }
                let mut variant = base_rule(action);
                set_path(&mut variant, field, value.clone());
                let mk = |rules: Vec<Value>| {
                    let (ing, eg) = if dir == "ingress" {
                        (rules, vec![])
                    } else {
                        (vec![], rules)
                    };
                    let mut kvs = world();
                    kvs.push(policy("p", "app in {'a', 'b'}", ing, eg));
                    kvs
                };
                // A Deny or Pass is followed by an Allow-all, which it must still cut into (a
                // dropped Pass would let the Allow take what the Pass sent on to a later tier);
                // any other rule stands alone, so that rendering it at all would open something.
                let rest: Vec<Value> = if action == "Deny" || action == "Pass" {
                    vec![json!({"action": "Allow"})]
                } else {
                    vec![]
                };
                let with_rules: Vec<Value> =
                    [variant.clone()].into_iter().chain(rest.clone()).collect();
                let (with, reports, rejected) = verdicts_or_rejections(&mk(with_rules));
                if !rejected.is_empty() {
                    // Invalid as a whole (e.g. `services: {namex: ..}` has no name, `icmp` on a
                    // TCP rule): rejected with the field named, and the previous version is kept.
                    assert!(
                        rejected.len() == 1 && rejected[0].contains(&format!("spec.{dir}[0]")),
                        "{action} {dir} {field}: {rejected:?}"
                    );
                    invalid += 1;
                    continue;
                }
                let (without, _) = verdicts(&mk(rest.clone()));
                let what = format!("{action} {dir} rule with {field}");
                assert_no_wider(&with, &without, &what);
                if field == "destination.domains" && dir == "egress" && action == "Allow" {
                    // Enforced (FQDN policy): matches the learned addresses of its names only;
                    // with nothing learned it opens nothing, and nothing is reported.
                    assert_eq!(reports, Vec::<String>::new(), "{what}");
                    assert_eq!(with, without, "{what}");
                    cases += 1;
                    continue;
                }
                assert_eq!(reports.len(), 1, "{what}: {reports:?}");
                assert!(
                    reports[0].contains(&format!("spec.{dir}[0]")),
                    "{what}: {reports:?}"
                );
                // Deny keeps its known matches: it denies at least TCP 80 as written; a Pass
                // denies exactly its known matches.
                if action == "Deny" || action == "Pass" {
                    let (known, _) =
                        verdicts(&mk(vec![base_rule("Deny"), json!({"action": "Allow"})]));
                    assert_no_wider(&with, &known, &format!("{what} (vs its known matches)"));
                    if action == "Pass" {
                        assert_eq!(with, known, "{what}: a Pass denies its known matches");
                    }
                }
                // Allow is not rendered: exactly the policy without the rule.
                if action == "Allow" {
                    assert_eq!(with, without, "{what}");
                }
                cases += 1;
            }
        }
    }
    println!("{cases} variants judged by trace, {invalid} rejected as invalid as a whole");
    assert!(
        cases > 200 && invalid < cases / 4,
        "{cases} judged, {invalid} invalid"
    );
}

#[test]
fn a_typod_kubernetes_network_policy_keeps_the_last_good_version() {
    use k8s_convert::ConvertOptions;
    use k8s_convert::manifests::convert_value;
    let base = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"podSelector": {"matchLabels": {"app": "b"}}, "policyTypes": ["Ingress", "Egress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "x"}},
                                        "namespaceSelector": {"matchExpressions":
                                            [{"key": "k", "operator": "Exists"}]}},
                                       {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                              "ports": [{"protocol": "TCP", "port": 80, "endPort": 90}]}],
                 "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                             "ports": [{"protocol": "UDP", "port": 53}]}]}
    });
    let opts = ConvertOptions::default();
    let good = convert_value(&base, &opts);
    assert!(good.resource.is_some() && good.skips.is_empty(), "{good:?}");
    let key = good.resource.as_ref().unwrap().etcd_key().unwrap();
    let fields = [
        "spec.podSelector.matchLabels",
        "spec.ingress.0.from",
        "spec.ingress.0.ports",
        "spec.ingress.0.from.0.podSelector",
        "spec.ingress.0.from.0.podSelector.matchLabels",
        "spec.ingress.0.from.0.namespaceSelector",
        "spec.ingress.0.from.0.namespaceSelector.matchExpressions",
        "spec.ingress.0.from.0.namespaceSelector.matchExpressions.0.key",
        "spec.ingress.0.from.0.namespaceSelector.matchExpressions.0.operator",
        "spec.ingress.0.from.1.ipBlock",
        "spec.ingress.0.from.1.ipBlock.cidr",
        "spec.ingress.0.from.1.ipBlock.except",
        "spec.ingress.0.ports.0.protocol",
        "spec.ingress.0.ports.0.port",
        "spec.ingress.0.ports.0.endPort",
        "spec.egress.0.to",
        "spec.egress.0.ports",
        "spec.egress.0.to.0.ipBlock",
        "spec.policyTypes",
    ];
    for f in fields {
        let mut v = base.clone();
        let (parent, last) = f.rsplit_once('.').unwrap();
        let mut at = &mut v;
        for p in parent.split('.') {
            at = match p.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[p],
            };
        }
        let moved = at.as_object_mut().unwrap().remove(last).unwrap();
        at[format!("{last}x")] = moved;
        let c = convert_value(&v, &opts);
        assert!(c.resource.is_none(), "{f}: {c:?}");
        assert_eq!(c.retain_key.as_deref(), Some(key.as_str()), "{f}");
        let want = format!("{}x", f.replace(".0", "[0]").replace(".1", "[1]"));
        assert!(
            c.skips.iter().any(|s| s.field == want),
            "{f}: want {want} in {:?}",
            c.skips
        );
    }
}

/// A rule of the property test: an action and a few known matches.
fn arb_rule() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["Allow", "Deny", "Pass", "Log"]),
        prop::option::of(prop::sample::select(vec!["TCP", "UDP"])),
        prop::option::of(prop::sample::select(vec![
            "role == 'x'",
            "app == 'a'",
            "app == 'b'",
            "all()",
        ])),
        prop::option::of(prop::sample::select(vec!["10.0.0.0/24", "192.0.2.0/24"])),
    )
        .prop_map(|(action, proto, sel, net)| {
            let mut r = json!({"action": action});
            let side = if sel.is_some() && net.is_some() {
                "destination"
            } else {
                "source"
            };
            if let Some(p) = proto {
                r["protocol"] = json!(p);
                if p == "TCP" {
                    r["destination"] = json!({"ports": [80]});
                }
            }
            if let Some(s) = sel {
                set_path(&mut r, "source.selector", json!(s));
            }
            if let Some(n) = net {
                set_path(&mut r, &format!("{side}.nets"), json!([n]));
            }
            r
        })
}

/// Whether injecting `path` into rule `r` makes an enforced domain rule (FQDN policy: an egress
/// Allow whose destination has no other address match), which is not reported.
fn enforced_domains(r: &Value, path: &str, ingress: bool) -> bool {
    let other = [
        "nets",
        "notNets",
        "selector",
        "notSelector",
        "namespaceSelector",
    ];
    path == "destination.domains"
        && !ingress
        && r["action"] == json!("Allow")
        && other.iter().all(|f| r["destination"].get(f).is_none())
}

/// The number of injections that fail their rule safe (and so are reported).
fn reported_injections(pols: &[Pol]) -> usize {
    let mut n = 0;
    for p in pols {
        for (rules, ingress) in [(&p.ingress, true), (&p.egress, false)] {
            for (r, inj) in rules {
                if let Some((path, _)) = inj {
                    let path = effective_path(r, path, ingress);
                    if !enforced_domains(r, path, ingress) {
                        n += 1;
                    }
                }
            }
        }
    }
    n
}

/// `http` is injected only where validation allows it (ingress Allow rules, TCP or no
/// protocol, as Calico's); elsewhere `destination.domains` stands in.
fn effective_path<'a>(r: &Value, path: &'a str, ingress: bool) -> &'a str {
    let http_ok = r["action"] == json!("Allow")
        && ingress
        && matches!(r.get("protocol"), None | Some(Value::String(_)))
        && r.get("protocol") != Some(&json!("UDP"));
    if path == "http" && !http_ok {
        "destination.domains"
    } else {
        path
    }
}

/// An unknown or unsupported field to inject (path relative to the rule, value).
fn arb_injection() -> impl Strategy<Value = (String, Value)> {
    prop_oneof![
        Just(("http".to_string(), json!({"methods": ["GET"]}))),
        Just(("destination.domains".to_string(), json!(["example.com"]))),
        Just(("source.domains".to_string(), json!(["example.com"]))),
        (
            "[a-z]{1,8}",
            prop::sample::select(vec!["", "source.", "destination."])
        )
            .prop_filter("not a known field", |(name, _)| !KNOWN
                .contains(&name.as_str()))
            .prop_map(|(name, at)| (format!("{at}{name}"), json!("x"))),
    ]
}

/// Known names an injected random one must not collide with.
const KNOWN: &[&str] = &[
    "action",
    "http",
    "icmp",
    "metadata",
    "protocol",
    "source",
    "destination",
    "nets",
    "ports",
    "selector",
    "services",
    "domains",
];

#[derive(Debug, Clone)]
struct Pol {
    selector: &'static str,
    ingress: Vec<(Value, Option<(String, Value)>)>,
    egress: Vec<(Value, Option<(String, Value)>)>,
}

fn arb_policy() -> impl Strategy<Value = Pol> {
    let rules = || prop::collection::vec((arb_rule(), prop::option::of(arb_injection())), 0..4);
    (
        prop::sample::select(vec!["app == 'a'", "app == 'b'", "all()"]),
        rules(),
        rules(),
    )
        .prop_map(|(selector, ingress, egress)| Pol {
            selector,
            ingress,
            egress,
        })
}

fn build(pols: &[Pol], injected: bool) -> Vec<(String, Value)> {
    let mut kvs = world();
    for (i, p) in pols.iter().enumerate() {
        let rules = |rs: &[(Value, Option<(String, Value)>)], ingress: bool| -> Vec<Value> {
            rs.iter()
                .filter_map(|(r, inj)| match (inj, injected) {
                    (Some(_), false) => None,
                    (Some((path, v)), true) => {
                        let mut r = r.clone();
                        let at = effective_path(&r, path, ingress);
                        let v = if at == path {
                            v.clone()
                        } else {
                            json!(["example.com"])
                        };
                        set_path(&mut r, at, v);
                        Some(r)
                    }
                    (None, _) => Some(r.clone()),
                })
                .collect()
        };
        let mut kv = policy(
            &format!("p{i}"),
            p.selector,
            rules(&p.ingress, true),
            rules(&p.egress, false),
        );
        kv.1["spec"]["order"] = json!(i);
        kvs.push(kv);
    }
    kvs
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn injected_fields_never_allow_what_the_policies_without_those_rules_deny(
        pols in prop::collection::vec(arb_policy(), 1..4)
    ) {
        let (with, reports) = verdicts(&build(&pols, true));
        let (without, _) = verdicts(&build(&pols, false));
        prop_assert_eq!(reports.len(), reported_injections(&pols));
        for ((w, wo), p) in with.iter().zip(&without).zip(packets()) {
            prop_assert!(
                !*w || *wo,
                "{} -> {} proto {} port {} allowed only with the injected rules",
                p.src, p.dst, p.proto, p.dport
            );
        }
    }
}
