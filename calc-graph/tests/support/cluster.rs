//! The generated cluster of the graph bench and the agent's scale bench (fixed shapes, no
//! randomness): 100k workload endpoints over 1,000 nodes and 1,000 namespaces, 10k policies (9k
//! Kubernetes-converted NetworkPolicies with pod and namespace selectors and named ports, 1k
//! GlobalNetworkPolicies), 100 global network sets; the node `generate` is given holds 250 of the
//! endpoints (every pod `i` with `i % 400 == 7`).

use calc_graph::graph::Update;
use calc_graph::model::{
    Action, EndpointPort, EntityRule, GlobalNetworkSet, Metadata, NetworkSetSpec, PolicyType, Port,
    Protocol, Rule,
};

use super::*;

pub const NAMESPACES: usize = 1_000;
pub const PODS_PER_NS: usize = 100;
pub const PODS: usize = NAMESPACES * PODS_PER_NS;
pub const NODES: usize = 1_000;
pub const NPS_PER_NS: usize = 9;
pub const GNPS: usize = 1_000;

pub fn pod_labels(i: usize, app: usize, hash: usize) -> Vec<(String, String)> {
    let mut l = vec![
        ("app".to_string(), format!("a{app}")),
        ("tier".to_string(), ["web", "api", "db"][i % 3].to_string()),
        ("pod-template-hash".to_string(), format!("h{hash}")),
    ];
    if i.is_multiple_of(10) {
        l.push(("svc".to_string(), format!("s{}", (i / 10) % 980)));
    }
    l
}

pub fn pod_update(node: &str, i: usize, app: usize, hash: usize) -> Update {
    let ns = format!("ns{}", i / PODS_PER_NS);
    let node = if i % 400 == 7 {
        node.to_string()
    } else {
        format!("node{}", 1 + i % (NODES - 1))
    };
    let ip = format!("10.{}.{}.{}/32", i >> 16, (i >> 8) & 255, i & 255);
    let l = pod_labels(i, app, hash);
    let refs: Vec<(&str, &str)> = l.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut w = mk_wep_res(&ns, &format!("pod{i}"), &node, &[&ip], &refs);
    if i.is_multiple_of(3) {
        w.spec.ports.push(EndpointPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 8080,
            host_port: None,
            host_ip: None,
        });
    }
    upd(w)
}

pub fn k8s_sel(app: usize) -> String {
    format!("projectcalico.org/orchestrator == 'k8s' && app == 'a{app}'")
}

/// NetworkPolicy `j` of namespace `n` (selects app `(n + j) % 20`; allows TCP 8080 from app
/// `(n + j + 1) % 20` and the named port `http` from team `(n + j) % 10`'s namespaces), and the
/// selectors it uses, for the naive baseline.
pub fn network_policy(n: usize, j: usize) -> (Update, [String; 2]) {
    let ns = format!("ns{n}");
    let app = (n + j) % 20;
    let from_app = (n + j + 1) % 20;
    let r1 = Rule {
        protocol: Some(Protocol::Tcp),
        source: EntityRule {
            selector: Some(k8s_sel(from_app)),
            ..EntityRule::default()
        },
        destination: EntityRule {
            ports: vec![Port::Number(8080)],
            ..EntityRule::default()
        },
        ..Rule::new(Action::Allow)
    };
    let r2 = Rule {
        protocol: Some(Protocol::Tcp),
        source: EntityRule {
            selector: Some("projectcalico.org/orchestrator == 'k8s'".into()),
            namespace_selector: Some(format!("team == 't{}'", (n + j) % 10)),
            ..EntityRule::default()
        },
        destination: EntityRule {
            ports: vec![Port::Named("http".into())],
            ..EntityRule::default()
        },
        ..Rule::new(Action::Allow)
    };
    let mut p = mk_np_res(
        &ns,
        &format!("knp.default.np{j}"),
        &k8s_sel(app),
        vec![r1, r2],
    );
    if j.is_multiple_of(3) {
        p.spec.types = vec![PolicyType::Ingress, PolicyType::Egress];
        p.spec.egress = vec![Rule {
            protocol: Some(Protocol::Udp),
            destination: EntityRule {
                selector: Some("app == 'a0'".into()),
                ports: vec![Port::Number(53)],
                ..EntityRule::default()
            },
            ..Rule::new(Action::Allow)
        }];
    }
    let sels = [
        format!(
            "({}) && projectcalico.org/namespace == '{ns}'",
            k8s_sel(app)
        ),
        format!(
            "(projectcalico.org/namespace == '{ns}') && ({})",
            k8s_sel(from_app)
        ),
    ];
    (upd(p), sels)
}

pub fn generate(node: &str) -> (Vec<Update>, Vec<String>) {
    let mut ups = Vec::new();
    let mut selectors = Vec::new(); // every policy and rule selector, for the naive baseline
    for n in 0..NAMESPACES {
        let team = format!("t{}", n % 10);
        let env = if n % 2 == 0 { "prod" } else { "dev" };
        ups.push(mk_ns_profile(
            &format!("ns{n}"),
            &[("team", &team), ("env", env)],
        ));
    }
    for i in 0..PODS {
        ups.push(pod_update(node, i, i % 20, i % 97));
    }
    for n in 0..NAMESPACES {
        for j in 0..NPS_PER_NS {
            let (u, sels) = network_policy(n, j);
            selectors.extend(sels);
            ups.push(u);
        }
    }
    ups.push(mk_tier("security", Some(100.0), Action::Pass));
    for g in 0..GNPS {
        let (sel, from) = match g {
            0 => ("all()".to_string(), "role == 'monitoring'".to_string()),
            1..=9 => (
                format!("tier == '{}'", ["web", "api", "db"][g % 3]),
                "role == 'monitoring'".to_string(),
            ),
            10..=19 => (
                "has(app) && pcns.env == 'prod'".to_string(),
                format!("tier == 'api' && app == 'a{g}'"),
            ),
            _ => (
                format!("svc == 's{}'", g - 20),
                format!("svc == 's{}'", (g - 19) % 980),
            ),
        };
        let mut p = mk_gnp_res(
            &format!("security.g{g}"),
            &sel,
            Some((g % 50) as f64),
            vec![allow_from(&from), Rule::new(Action::Pass)],
            vec![],
        );
        p.spec.tier = Some("security".into());
        selectors.push(sel);
        selectors.push(from);
        ups.push(upd(p));
    }
    for s in 0..100 {
        ups.push(upd(GlobalNetworkSet {
            metadata: Metadata {
                labels: labels(&[("role", if s % 2 == 0 { "monitoring" } else { "external" })]),
                ..Metadata::named(format!("gset{s}"))
            },
            spec: NetworkSetSpec {
                nets: vec![
                    net(&format!("172.{}.0.0/16", 16 + s % 16)),
                    net(&format!("192.0.{}.0/24", s)),
                ],
            },
        }));
    }
    (ups, selectors)
}
