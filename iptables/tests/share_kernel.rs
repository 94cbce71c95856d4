//! Shared endpoint policy chains on the real kernel (root; throwaway namespaces): two pods with
//! different policies, a third with the first one's; a relabel that moves a pod to the other
//! combination is one small iptables-restore transaction that only rewrites the pod's goto
//! (and deletes a shared chain when its last user leaves), and packets follow at once.
//!
//! Topology: client `A` (10.99.0.1) — node `H`, routing between its uplink `fxh` and the pod
//! veths `cali11111`/`cali22222`/`cali33333` — pods `P0`/`P1`/`P2` (10.98.<i>.2, each on its
//! own /24 with the node at .1).

mod support;

use calc_graph::proto::*;
use felixrs_test_support::netns::{Netns, veth};
use iptables::apply::{Applier, ApplierConfig, Backend, IpVersion as V, TableName};
use iptables::render::{RenderConfig, Renderer};
use support::check::{assert_in_sync, rules_of, save};
use support::tcp;
use support::{kernel_netns, runner};

const PODS: [(&str, &str); 3] = [
    ("cali11111", "10.98.0.2"),
    ("cali22222", "10.98.1.2"),
    ("cali33333", "10.98.2.2"),
];

fn policy_id(port: u16) -> PolicyId {
    PolicyId {
        kind: PolicyKind::NetworkPolicy,
        tier: "default".into(),
        namespace: Some("default".into()),
        name: format!("allow-{port}"),
    }
}

/// Allows TCP to `port` from anywhere.
fn policy(port: u16) -> Output {
    Output::PolicyUpdated(ActivePolicy {
        id: policy_id(port),
        order: Some(1000.0),
        inbound_rules: vec![ParsedRule {
            action: Some(Action::Allow),
            protocol: Some(Protocol::Tcp),
            dst_ports: vec![PortRange {
                first: port,
                last: port,
            }],
            ..Default::default()
        }],
        outbound_rules: vec![],
        untracked: false,
        pre_dnat: false,
        apply_on_forward: false,
    })
}

/// Pod `i` whose ingress allows `port` only.
fn pod(i: usize, port: u16) -> Output {
    let (iface, addr) = PODS[i];
    Output::EndpointUpdated(LocalEndpoint {
        id: EndpointId {
            namespace: "default".into(),
            name: format!("pod{i}"),
        },
        interface_name: iface.into(),
        ipv4_nets: vec![format!("{addr}/32").parse().unwrap()],
        ipv6_nets: vec![],
        tiers: vec![TierInfo {
            name: "default".into(),
            default_action: Action::Deny,
            ingress_policies: vec![policy_id(port)],
            egress_policies: vec![],
        }],
        profile_ids: vec!["kns.default".into()],
        allow_spoofed_source_prefixes: vec![],
    })
}

fn topology() -> (Netns, Netns, Vec<Netns>) {
    let (client, node) = (kernel_netns(), kernel_netns());
    veth(&client, "fxa", &node, "fxh");
    client.ok("ip", &["addr", "add", "10.99.0.1/24", "dev", "fxa"]);
    client.ok("ip", &["route", "add", "default", "via", "10.99.0.254"]);
    node.ok("ip", &["addr", "add", "10.99.0.254/24", "dev", "fxh"]);
    node.ok("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    let mut pods = Vec::new();
    for (i, (iface, addr)) in PODS.into_iter().enumerate() {
        let p = kernel_netns();
        veth(&p, "eth0", &node, iface);
        p.ok("ip", &["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
        p.ok(
            "ip",
            &["route", "add", "default", "via", &format!("10.98.{i}.1")],
        );
        node.ok(
            "ip",
            &["addr", "add", &format!("10.98.{i}.1/24"), "dev", iface],
        );
        for port in [8080, 8081] {
            tcp::serve(&p, addr, port);
        }
        pods.push(p);
    }
    (client, node, pods)
}

#[test]
fn a_relabel_between_shared_chains_is_one_small_transaction_on_the_kernel() {
    let (client, node, _pods) = topology();
    for (_, addr) in PODS {
        assert!(
            tcp::connects_eventually(&client, addr, 8080),
            "no routing to {addr} before policy"
        );
    }
    let mut renderer = Renderer::new(RenderConfig::default()).unwrap();
    let allow_all = ParsedRule {
        action: Some(Action::Allow),
        ..Default::default()
    };
    let outputs = vec![
        policy(8080),
        policy(8081),
        Output::ProfileUpdated(ActiveProfile {
            id: "kns.default".into(),
            inbound_rules: vec![allow_all.clone()],
            outbound_rules: vec![allow_all],
        }),
        pod(0, 8080),
        pod(1, 8081),
        pod(2, 8080),
        Output::InSync,
    ];
    assert!(renderer.apply_all(outputs).is_empty());
    assert!(renderer.flush().is_empty());
    let mut applier = Applier::new(
        runner(&node),
        ApplierConfig {
            backend: Backend::Nft,
            ..ApplierConfig::default()
        },
    );
    let desired = renderer.desired(V::V4);
    applier.apply(&desired).unwrap();
    let mode = applier.mode().unwrap();
    assert_in_sync(&node, mode, &desired);

    // pod0 and pod2 share one ingress chain, pod1 has its own; the kernel holds both.
    let id = |i: usize| EndpointId {
        namespace: "default".into(),
        name: format!("pod{i}"),
    };
    let a = renderer.shared_chain(&id(0), true).unwrap().to_string();
    let b = renderer.shared_chain(&id(1), true).unwrap().to_string();
    assert_ne!(a, b);
    assert_eq!(renderer.shared_chain(&id(2), true), Some(a.as_str()));
    let filter = save(&node, mode, "filter");
    for (chain, to) in [
        ("cali-tw-cali11111", &a),
        ("cali-tw-cali33333", &a),
        ("cali-tw-cali22222", &b),
    ] {
        let rules = rules_of(&filter, chain);
        assert!(
            rules.len() == 1 && rules[0].ends_with(&format!("-g {to}")),
            "{chain}: {filter}"
        );
    }
    assert!(!rules_of(&filter, &a).is_empty() && !rules_of(&filter, &b).is_empty());
    let allowed = |addr: &str, port: u16| tcp::connects(&client, addr, port);
    assert!(tcp::connects_eventually(&client, PODS[0].1, 8080));
    assert!(!allowed(PODS[0].1, 8081), "pod0 allows only 8080");
    assert!(tcp::connects_eventually(&client, PODS[1].1, 8081));
    assert!(!allowed(PODS[1].1, 8080), "pod1 allows only 8080");

    // pod0 moves to pod1's combination: one transaction that replaces pod0's goto, and no
    // shared chain created or deleted (pod2 still uses the old one).
    renderer.apply(pod(0, 8081)).unwrap();
    assert!(renderer.flush().is_empty());
    let desired = renderer.desired(V::V4);
    let report = applier.apply(&desired).unwrap();
    let payload = &report.iptables[&TableName::Filter];
    let ops: Vec<&str> = payload.lines().filter(|l| l.starts_with('-')).collect();
    assert_eq!(ops.len(), 1, "{payload}");
    assert!(
        ops[0].starts_with("-R cali-tw-cali11111 1 ") && ops[0].ends_with(&format!("-g {b}")),
        "{payload}"
    );
    assert_eq!(report.iptables.len(), 1, "{report:?}");
    assert_in_sync(&node, mode, &desired);
    assert!(tcp::connects_eventually(&client, PODS[0].1, 8081));
    assert!(!allowed(PODS[0].1, 8080), "pod0 still allows 8080");
    assert!(tcp::connects_eventually(&client, PODS[2].1, 8080));

    // pod2, the last user of the old chain, moves too: the chain is deleted in the same
    // transaction, after the goto that used it was replaced.
    renderer.apply(pod(2, 8081)).unwrap();
    assert!(renderer.flush().is_empty());
    let desired = renderer.desired(V::V4);
    let report = applier.apply(&desired).unwrap();
    let payload = &report.iptables[&TableName::Filter];
    let replace = payload.find("-R cali-tw-cali33333 1 ").expect(payload);
    let flush = payload.find(&format!("-F {a}")).unwrap_or(replace);
    let delete = payload.find(&format!("-X {a}")).expect(payload);
    assert!(replace < delete && flush <= delete, "{payload}");
    assert_in_sync(&node, mode, &desired);
    assert!(!save(&node, mode, "filter").contains(&a));
    assert!(!allowed(PODS[2].1, 8080), "pod2 still allows 8080");
    assert!(tcp::connects_eventually(&client, PODS[2].1, 8081));
    assert!(applier.apply(&desired).unwrap().is_empty());
}
