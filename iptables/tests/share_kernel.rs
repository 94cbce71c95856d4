//! Shared endpoint policy chains on the real kernel (root; throwaway namespaces): two pods with
//! different policies, a third with the first one's; a relabel that moves a pod to the other
//! combination is one small iptables-restore transaction that only rewrites the pod's goto
//! (and deletes a shared chain when its last user leaves), and packets follow at once; a restart
//! that switches layouts (upgrade, or `--share-chains false`) is one transaction and keeps every
//! verdict.
//!
//! Topology: client `A` (10.99.0.1) — node `H`, routing between its uplink `fxh` and the pod
//! veths `cali11111`/`cali22222`/`cali33333` — pods `P0`/`P1`/`P2` (10.98.<i>.2, each on its
//! own /24 with the node at .1).

mod support;

use calc_graph::proto::*;
use felixrs_test_support::netns::{Netns, veth};
use iptables::apply::{Applier, ApplierConfig, Backend};
use iptables::desired::{IpVersion as V, TableName};
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
        staged_tiers: None,
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

/// Policies, profile and pods 0..3 allowing 8080, 8081, 8080, rendered in one layout.
fn rendered(share_chains: bool) -> Renderer {
    let mut renderer = Renderer::new(RenderConfig {
        share_chains,
        ..RenderConfig::default()
    })
    .unwrap();
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
    renderer
}

/// A fresh applier (as after an agent restart: it reads the kernel first).
fn nft_applier(node: &Netns) -> Applier<iptables::apply::ExecRunner> {
    Applier::new(
        runner(node),
        ApplierConfig {
            backend: Backend::Nft,
            ..ApplierConfig::default()
        },
    )
}

/// Every pod accepts exactly its policy's port.
fn assert_verdicts(client: &Netns, ports: [u16; 3]) {
    for (i, want) in ports.into_iter().enumerate() {
        let addr = PODS[i].1;
        let other = if want == 8080 { 8081 } else { 8080 };
        assert!(
            tcp::connects_eventually(client, addr, want),
            "pod{i} {want} dropped"
        );
        assert!(!tcp::connects(client, addr, other), "pod{i} {other} open");
    }
}

/// An agent upgraded to shared chains (or back) over a kernel the other layout programmed: one
/// transaction per family switches every pod, nothing else is written, and the verdicts are
/// the same before and after, so a restart across the change opens nothing.
#[test]
fn switching_layouts_on_restart_is_one_transaction_with_the_same_verdicts() {
    let (client, node, _pods) = topology();
    for (_, addr) in PODS {
        assert!(tcp::connects_eventually(&client, addr, 8081));
    }
    let mut steps = Vec::new();
    for share in [false, true, false] {
        let renderer = rendered(share);
        let desired = renderer.desired(V::V4);
        let mut applier = nft_applier(&node);
        let report = applier.apply(&desired).unwrap();
        let mode = applier.mode().unwrap();
        assert_in_sync(&node, mode, &desired);
        assert_verdicts(&client, [8080, 8081, 8080]);
        let filter = save(&node, mode, "filter");
        assert_eq!(filter.contains(":cali-si-"), share, "{filter}");
        steps.push(report);
    }
    // The switches: only the filter table, no set written or destroyed; to shared the two
    // ingress chains and the one egress chain (no pod has egress policy) are declared and every pod chain is rewritten in
    // that one payload (and the policies' rules go to the verdict chains), back the shared and
    // verdict chains are deleted at its end.
    for (report, share) in steps[1..].iter().zip([true, false]) {
        assert_eq!(
            report.iptables.keys().collect::<Vec<_>>(),
            [&TableName::Filter],
            "{report:?}"
        );
        assert!(report.ipset_updates.is_empty() && report.ipset_deletions.is_empty());
        let payload = &report.iptables[&TableName::Filter];
        let declared = payload
            .lines()
            .filter(|l| l.starts_with(":cali-si-") || l.starts_with(":cali-so-"))
            .count();
        let deleted = payload
            .lines()
            .filter(|l| l.starts_with("-X cali-si-") || l.starts_with("-X cali-so-"))
            .count();
        if share {
            assert_eq!((declared, deleted), (3, 0), "{payload}");
        } else {
            assert_eq!(deleted, 3, "{payload}");
            // The verdict chains go too, after the policy chains that went to them.
            let verdicts = payload
                .lines()
                .filter(|l| l.starts_with("-X cali-verdict-"))
                .count();
            assert_eq!(verdicts, 3, "{payload}");
            let last = payload.lines().rev().nth(1).unwrap_or_default();
            assert!(
                last.starts_with("-X cali-s") || last.starts_with("-X cali-verdict-"),
                "deletes come last: {payload}"
            );
        }
        for (iface, _) in PODS {
            assert!(
                payload.contains(&format!("cali-tw-{iface}")),
                "{iface} not switched: {payload}"
            );
        }
    }
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
    let mut renderer = rendered(true);
    let mut applier = nft_applier(&node);
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
