//! FQDN egress policy in the renderer (issue 16): domain sets referenced by rules, created full
//! from what the learner knows, lazy per family; the mangle DNS hold; hostile names never reach a
//! payload; the trace evaluator matching domain sets and naming the deciding domain rule.

mod render_support;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use calc_graph::graph::{CalcGraph, Update};
use calc_graph::model::Resource;
use calc_graph::proto::*;
use iptables::desired::{IpSetKind as Kind, TableName};
use iptables::render::hash::rule_hashes;
use iptables::render::trace::{self, Outcome, Packet, RendererRules};
use iptables::render::{
    ActiveDomainSet, DomainMembers, LearnedAddr, RenderConfig, Renderer, names,
};
use render_support::*;

/// A learner with fixed answers: name → addresses (with seconds left).
#[derive(Debug, Default)]
struct Learned(Mutex<Vec<(String, LearnedAddr)>>);

impl Learned {
    fn with(entries: &[(&str, &str, u32)]) -> Arc<Self> {
        Arc::new(Learned(Mutex::new(
            entries
                .iter()
                .map(|(name, addr, secs)| {
                    (
                        name.to_string(),
                        LearnedAddr {
                            addr: addr.parse().unwrap(),
                            remaining_secs: *secs,
                        },
                    )
                })
                .collect(),
        )))
    }
}

impl DomainMembers for Learned {
    fn learned(&self, patterns: &[DomainPattern]) -> Vec<LearnedAddr> {
        let mut out: Vec<LearnedAddr> = (self.0.lock().unwrap().iter())
            .filter(|(name, _)| patterns.iter().any(|p| p.matches(name)))
            .map(|(_, a)| *a)
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

fn pats(list: &[&str]) -> Arc<[DomainPattern]> {
    let mut v: Vec<DomainPattern> = list
        .iter()
        .map(|p| DomainPattern::parse(p).unwrap())
        .collect();
    v.sort();
    v.into()
}

const SET: &str = "d:domain-set-of-example";

fn domain_rule(ip_version: Option<IpVersion>) -> ParsedRule {
    ParsedRule {
        protocol: Some(Protocol::Tcp),
        ip_version,
        dst_ports: ports(&[(443, 443)]),
        dst_domain_ip_set_ids: vec![SET.into()],
        ..mk_allow()
    }
}

fn outputs(rule: ParsedRule) -> Vec<Output> {
    let pol = mk_np("prod", "egress-dns");
    let mut ep = mk_endpoint(
        "prod",
        "web",
        "calia1",
        &["10.0.0.1/32"],
        vec![mk_tier("default", vec![], vec![pol.clone()])],
        &["kns.prod"],
    );
    ep.ipv6_nets = vec![net("fd00::1/128")];
    vec![
        Output::DomainSetCreated {
            id: SET.into(),
            patterns: pats(&["example.com", "*.example.com"]),
        },
        Output::PolicyUpdated(mk_policy(pol, vec![], vec![rule])),
        Output::ProfileUpdated(mk_profile("kns.prod", vec![mk_allow()], vec![mk_allow()])),
        Output::EndpointUpdated(ep),
        Output::InSync,
    ]
}

fn renderer(learned: Arc<Learned>, rule: ParsedRule) -> Renderer {
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    r.set_domain_members(learned);
    assert_eq!(r.apply_all(outputs(rule)), vec![]);
    assert_eq!(r.flush(), vec![]);
    r
}

fn learned() -> Arc<Learned> {
    Learned::with(&[
        ("www.example.com", "93.184.216.34", 60),
        ("example.com", "2606:2800:220:1::1", 30),
        ("other.org", "1.2.3.4", 60),
    ])
}

#[test]
fn a_domain_rule_matches_its_set_as_felix_matches_a_destination_ip_set() {
    let r = renderer(learned(), domain_rule(None));
    let chain = names::policy_chain_name(&mk_np("prod", "egress-dns"), false);
    for (v, set) in [
        (IpVersion::V4, "cali40d:domain-set-of-example"),
        (IpVersion::V6, "cali60d:domain-set-of-example"),
    ] {
        let d = r.desired(v);
        let rules = &d.tables[&TableName::Filter].chains[&chain];
        // Felix's text of the rule (its hash input) and the kernel body, as for a `dst` set match.
        let felix = format!(
            "-m comment --comment \"NetworkPolicy prod/egress-dns egress\" -p tcp -m set --match-set {set} dst -m multiport --destination-ports 443 \
             --goto cali-verdict-accept"
        );
        let ir = r.chain(v, TableName::Filter, &chain).unwrap();
        assert_eq!(ir[0].felix_text(), felix);
        let want = rule_hashes(&chain, ir.iter().map(|x| x.felix_text()));
        assert_eq!(rules[0].hash, want[0]);
        assert_eq!(
            rules[0].body(),
            format!(
                "-p tcp -m comment --comment \"NetworkPolicy prod/egress-dns egress\" -m set --match-set {set} dst -m multiport --dports 443 \
                 -g cali-verdict-accept"
            )
        );
        // The set: hash:ip with timeouts, created with the learner's addresses of its family.
        let spec = &d.ip_sets[set];
        assert_eq!(spec.kind, Kind::Domain);
        assert!(spec.members.is_empty());
        let learned: Vec<(String, u32)> = spec
            .learned
            .iter()
            .map(|(a, t)| (a.to_string(), *t))
            .collect();
        match v {
            IpVersion::V4 => assert_eq!(learned, [("93.184.216.34".to_string(), 60)]),
            IpVersion::V6 => assert_eq!(learned, [("2606:2800:220:1::1".to_string(), 30)]),
        }
        assert_parses_back(&r, v);
    }
    assert_eq!(
        r.active_domain_sets(),
        vec![ActiveDomainSet {
            patterns: pats(&["*.example.com", "example.com"]).to_vec(),
            v4_set: Some("cali40d:domain-set-of-example".into()),
            v6_set: Some("cali60d:domain-set-of-example".into()),
        }]
    );
    assert_eq!(
        r.domain_set_patterns("cali40d:domain-set-of-example")
            .map(<[_]>::to_vec),
        Some(pats(&["*.example.com", "example.com"]).to_vec())
    );
}

#[test]
fn domain_sets_are_lazy_per_family_and_go_with_their_last_rule() {
    // An IPv4-only rule: only the v4 set exists.
    let mut r = renderer(learned(), domain_rule(Some(IpVersion::V4)));
    assert!(
        r.desired(IpVersion::V4)
            .ip_sets
            .contains_key("cali40d:domain-set-of-example")
    );
    assert!(r.desired(IpVersion::V6).ip_sets.is_empty());
    assert_eq!(
        r.active_domain_sets()[0].v6_set,
        None,
        "no v6 set for the learner"
    );
    // The graph's order: the policy loses the rule, then the set goes.
    let pol = mk_np("prod", "egress-dns");
    r.apply(Output::PolicyUpdated(mk_policy(
        pol,
        vec![],
        vec![mk_allow()],
    )))
    .unwrap();
    r.apply(Output::IpSetRemoved(SET.into())).unwrap();
    assert_eq!(r.flush(), vec![]);
    assert!(r.desired(IpVersion::V4).ip_sets.is_empty());
    assert!(r.active_domain_sets().is_empty());
    // Members for a domain set are refused (the learner owns them).
    r.apply(Output::DomainSetCreated {
        id: SET.into(),
        patterns: pats(&["example.com"]),
    })
    .unwrap();
    assert!(
        r.apply(Output::IpSetMembersAdded {
            id: SET.into(),
            members: vec![IpSetMember::Net(net("10.9.9.9/32"))],
        })
        .is_err()
    );
}

#[test]
fn the_trace_matches_learned_addresses_and_names_the_domain_rule() {
    let r = renderer(learned(), domain_rule(None));
    let probe = |dst: &str, dport: u16| {
        let dst: IpAddr = dst.parse().unwrap();
        let src: IpAddr = if dst.is_ipv6() {
            "fd00::1".parse().unwrap()
        } else {
            "10.0.0.1".parse().unwrap()
        };
        let mut p = Packet::new(src, dst, 6, 40000, dport);
        p.in_iface = "calia1".into();
        p.out_iface = "eth0".into();
        let rules = RendererRules {
            renderer: &r,
            version: p.version(),
            table: TableName::Filter,
        };
        trace::trace(&rules, "cali-FORWARD", &p).unwrap()
    };
    let accept = r.marks().accept;
    // cali-FORWARD returns with the accept bit: FORWARD's appended rule accepts.
    let allowed = |t: &trace::Trace| t.outcome == Outcome::Return && t.mark & accept != 0;
    let t = probe("93.184.216.34", 443);
    assert!(allowed(&t), "{t:?}");
    let hit = t
        .deciding_domain_hit(accept)
        .expect("allowed by the domain rule");
    assert_eq!(hit.set, "cali40d:domain-set-of-example");
    assert_eq!(
        hit.patterns,
        pats(&["*.example.com", "example.com"]).to_vec()
    );
    assert_eq!(hit.remaining_secs, Some(60));
    assert_eq!(
        hit.to_string(),
        "domain rule *.example.com, example.com (93.184.216.34 in cali40d:domain-set-of-example, 60 s left)"
    );
    let t = probe("2606:2800:220:1::1", 443);
    assert!(allowed(&t), "{t:?}");
    assert_eq!(
        t.deciding_domain_hit(accept).unwrap().remaining_secs,
        Some(30)
    );
    // Learned for another name, never in an answer for these patterns, or another port: denied.
    for (dst, port) in [
        ("1.2.3.4", 443),
        ("93.184.216.35", 443),
        ("93.184.216.34", 80),
    ] {
        let t = probe(dst, port);
        assert_eq!(t.outcome, Outcome::Drop, "{dst}:{port} {t:?}");
        assert!(t.deciding_domain_hit(accept).is_none());
    }
}

#[test]
fn the_dns_hold_queues_trusted_servers_replies_to_workloads_only() {
    let cfg = RenderConfig {
        dns_trusted_servers: vec![
            "10.96.0.10:53".parse().unwrap(),
            "[fd00:96::a]:5353".parse().unwrap(),
        ],
        dns_queue_num: 7,
        interface_prefixes: vec!["cali".into(), "tap".into()],
        ..RenderConfig::default()
    };
    let r = Renderer::new(cfg).unwrap();
    let v4 = r.desired(IpVersion::V4);
    let mangle = &v4.tables[&TableName::Mangle];
    let bodies: Vec<&str> = mangle.chains["cali-POSTROUTING"]
        .iter()
        .map(|r| r.body())
        .collect();
    let rule = |iface: &str, p: &str| {
        format!(
            "-s 10.96.0.10/32 -o {iface}+ -p {p} -m comment --comment \"DNS response from trusted server\" \
             -m {p} --sport 53 -m conntrack --ctdir REPLY -j NFQUEUE --queue-num 7"
        )
    };
    assert_eq!(
        bodies,
        [
            rule("cali", "udp"),
            rule("cali", "tcp"),
            rule("tap", "udp"),
            rule("tap", "tcp")
        ]
    );
    assert!(
        bodies.iter().all(|b| !b.contains("bypass")),
        "no --queue-bypass: without a learner the response is dropped"
    );
    assert_eq!(mangle.hooks.len(), 1);
    assert_eq!(mangle.hooks[0].kernel_chain, "POSTROUTING");
    assert_eq!(mangle.hooks[0].rule.body(), "-j cali-POSTROUTING");
    assert_eq!(
        mangle.hooks[0].position,
        iptables::desired::HookPosition::Top
    );
    let v6 = r.desired(IpVersion::V6);
    let v6_rules = &v6.tables[&TableName::Mangle].chains["cali-POSTROUTING"];
    assert_eq!(v6_rules.len(), 4);
    assert!(
        v6_rules[0]
            .body()
            .starts_with("-s fd00:96::a/128 -o cali+ -p udp"),
        "{}",
        v6_rules[0].body()
    );
    assert!(v6_rules[0].body().contains("--sport 5353"));
    assert_parses_back(&r, IpVersion::V4);
    assert_parses_back(&r, IpVersion::V6);

    // Only the families with servers get the hold; without servers, no mangle at all.
    let only_v4 = Renderer::new(RenderConfig {
        dns_trusted_servers: vec!["10.96.0.10:53".parse().unwrap()],
        ..RenderConfig::default()
    })
    .unwrap();
    assert!(
        !only_v4
            .desired(IpVersion::V6)
            .tables
            .contains_key(&TableName::Mangle)
    );
    let none = Renderer::new(RenderConfig::default()).unwrap();
    assert!(
        !none
            .desired(IpVersion::V4)
            .tables
            .contains_key(&TableName::Mangle)
    );
}

/// Hostile `domains` entries come in through the real graph (as from etcd) and never reach a
/// payload: the rule fails safe, no domain set is made, and no rendered byte holds the text.
#[test]
fn hostile_names_never_reach_a_payload() {
    let hostile = [
        "x\" -j ACCEPT",
        "a.com\n-A cali-FORWARD -j ACCEPT",
        "$(reboot).example.com",
        "evil.com;destroy",
        "*.*.example.com",
        "exa mple.com",
        "ex\u{0}ample.com",
        "éxample.com",
    ];
    let mut g = CalcGraph::new("node1");
    let policy = serde_json::json!({
        "apiVersion": "projectcalico.org/v3",
        "kind": "GlobalNetworkPolicy",
        "metadata": {"name": "hostile"},
        "spec": {
            "selector": "all()",
            "types": ["Egress"],
            "egress": hostile
                .iter()
                .map(|h| serde_json::json!({"action": "Allow", "destination": {"domains": [h, "ok.example.com"]}}))
                .chain(std::iter::once(serde_json::json!({"action": "Allow", "destination": {"domains": ["ok.example.com"]}})))
                .collect::<Vec<_>>(),
        }
    });
    let wep = serde_json::json!({
        "apiVersion": "projectcalico.org/v3",
        "kind": "WorkloadEndpoint",
        "metadata": {"name": "node1-k8s-web-eth0", "namespace": "prod", "labels": {"projectcalico.org/namespace": "prod", "projectcalico.org/orchestrator": "k8s"}},
        "spec": {"node": "node1", "orchestrator": "k8s", "workload": "web", "endpoint": "eth0",
                 "interfaceName": "calia1", "ipNetworks": ["10.0.0.1/32"], "profiles": ["kns.prod"]}
    });
    for doc in [policy, wep] {
        let r = Resource::from_value(doc).unwrap();
        g.apply(Update::Resource {
            key: r.key(),
            value: Some(r),
        });
    }
    g.apply(Update::InSync);
    let out = g.flush();
    assert!(g.take_errors().is_empty());
    assert_eq!(
        g.failed_safe_rules().count(),
        hostile.len(),
        "each hostile rule fails safe"
    );
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    r.set_domain_members(Learned::with(&[("ok.example.com", "10.9.0.1", 60)]));
    assert_eq!(r.apply_all(out), vec![]);
    assert_eq!(r.flush(), vec![]);
    let sets = r.active_domain_sets();
    assert_eq!(sets.len(), 1, "only the valid list makes a set: {sets:?}");
    assert_eq!(sets[0].patterns, pats(&["ok.example.com"]).to_vec());
    for v in [IpVersion::V4, IpVersion::V6] {
        let d = r.desired(v);
        let text = format!("{}{:?}", restore_text(&d), d.ip_sets);
        for h in hostile {
            assert!(!text.contains(h), "{h:?} reached a payload");
        }
        for frag in ["reboot", "destroy", "example.com", "mple"] {
            assert!(!text.contains(frag), "{frag:?} reached a payload");
        }
        assert_parses_back(&r, v);
    }
}

/// Incremental = from scratch: a domain set arriving in its own batch, before the policy that
/// references it, gives the same desired state as one batch.
#[test]
fn incremental_rendering_of_domain_sets_equals_a_single_batch() {
    let all = outputs(domain_rule(None));
    let whole = renderer(learned(), domain_rule(None));
    let mut inc = Renderer::new(RenderConfig::default()).unwrap();
    inc.set_domain_members(learned());
    for o in all {
        assert_eq!(inc.apply_all([o]), vec![]);
        assert_eq!(inc.flush(), vec![]);
    }
    for v in [IpVersion::V4, IpVersion::V6] {
        assert_eq!(inc.desired(v), whole.desired(v));
    }
    assert_eq!(inc.active_domain_sets(), whole.active_domain_sets());
}
