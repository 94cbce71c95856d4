//! The shared layout's net sets on the real kernel (root; throwaway namespaces): a pod whose
//! policy has a positive CIDR list and a `notNets` list gets exactly the verdicts the lists say
//! through `hash:net` sets the applier created before the rules; a fresh applier (restart)
//! writes nothing, nor does the drift check, and cleanup would destroy them; when the lists go,
//! their sets are destroyed after the rules that named them.
//!
//! Topology: client `A` (10.99.0.1 to .4 on one link; the source of a probe is chosen with the
//! default route's `src`) — node `H` (10.99.0.254, routing) — pod `P` (10.98.0.2 on `cali11111`).

mod support;

use calc_graph::proto::*;
use felixrs_test_support::netns::{Netns, veth};
use iptables::apply::{Applier, ApplierConfig, Backend};
use iptables::desired::IpVersion as V;
use iptables::render::{RenderConfig, Renderer};
use support::check::{assert_in_sync, set_members, set_names};
use support::tcp;
use support::{kernel_netns, runner};

const POD: &str = "10.98.0.2";

fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

fn policy_id() -> PolicyId {
    PolicyId {
        kind: PolicyKind::NetworkPolicy,
        tier: "default".into(),
        namespace: Some("default".into()),
        name: "lists".into(),
    }
}

/// With `lists`: deny 10.99.0.0/24 except .1, .3 and .4 (a negated list beside a net); then
/// allow TCP 8080 from .1, .2 and .3 (a positive list). So .1 and .3 get in, .2 is denied and
/// .4 falls through to the tier's end (dropped). Without: allow TCP 8080 from .2 alone.
fn policy(lists: bool) -> Output {
    let rules = if lists {
        vec![
            ParsedRule {
                action: Some(Action::Deny),
                src_nets: vec![net("10.99.0.0/24")],
                not_src_nets: vec![
                    net("10.99.0.1/32"),
                    net("10.99.0.3/32"),
                    net("10.99.0.4/32"),
                ],
                ..Default::default()
            },
            ParsedRule {
                action: Some(Action::Allow),
                protocol: Some(Protocol::Tcp),
                // (.3 twice: a set holds it once, so the drift check's member counts agree.)
                src_nets: vec![
                    net("10.99.0.3/32"),
                    net("10.99.0.1/32"),
                    net("10.99.0.2/32"),
                    net("10.99.0.3/32"),
                ],
                dst_ports: vec![PortRange {
                    first: 8080,
                    last: 8080,
                }],
                ..Default::default()
            },
        ]
    } else {
        vec![ParsedRule {
            action: Some(Action::Allow),
            protocol: Some(Protocol::Tcp),
            src_nets: vec![net("10.99.0.2/32")],
            ..Default::default()
        }]
    };
    Output::PolicyUpdated(ActivePolicy {
        id: policy_id(),
        order: Some(1000.0),
        inbound_rules: rules,
        outbound_rules: vec![],
        untracked: false,
        pre_dnat: false,
        apply_on_forward: false,
    })
}

fn pod() -> Output {
    Output::EndpointUpdated(LocalEndpoint {
        id: EndpointId {
            namespace: "default".into(),
            name: "pod".into(),
        },
        interface_name: "cali11111".into(),
        ipv4_nets: vec![net(&format!("{POD}/32"))],
        ipv6_nets: vec![],
        tiers: vec![TierInfo {
            name: "default".into(),
            default_action: Action::Deny,
            ingress_policies: vec![policy_id()],
            egress_policies: vec![],
        }],
        profile_ids: vec![],
        allow_spoofed_source_prefixes: vec![],
        staged_tiers: None,
    })
}

fn topology() -> (Netns, Netns, Netns) {
    let (client, node, p) = (kernel_netns(), kernel_netns(), kernel_netns());
    veth(&client, "fxa", &node, "fxh");
    for i in 1..=4 {
        client.ok(
            "ip",
            &["addr", "add", &format!("10.99.0.{i}/24"), "dev", "fxa"],
        );
    }
    client.ok("ip", &["route", "add", "default", "via", "10.99.0.254"]);
    node.ok("ip", &["addr", "add", "10.99.0.254/24", "dev", "fxh"]);
    node.ok("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    veth(&p, "eth0", &node, "cali11111");
    p.ok("ip", &["addr", "add", &format!("{POD}/24"), "dev", "eth0"]);
    p.ok("ip", &["route", "add", "default", "via", "10.98.0.1"]);
    node.ok("ip", &["addr", "add", "10.98.0.1/24", "dev", "cali11111"]);
    tcp::serve(&p, POD, 8080);
    (client, node, p)
}

/// Whether a probe from client address `10.99.0.<i>` reaches the pod (`eventually`: retried,
/// for the probes expected to pass).
fn connects_from(client: &Netns, i: u8, eventually: bool) -> bool {
    let src = format!("10.99.0.{i}");
    client.ok(
        "ip",
        &[
            "route",
            "replace",
            "default",
            "via",
            "10.99.0.254",
            "src",
            &src,
        ],
    );
    if eventually {
        tcp::connects_eventually(client, POD, 8080)
    } else {
        tcp::connects(client, POD, 8080)
    }
}

fn assert_verdicts(client: &Netns, allowed: &[u8]) {
    for i in 1..=4u8 {
        let want = allowed.contains(&i);
        assert_eq!(
            connects_from(client, i, want),
            want,
            "10.99.0.{i}: expected {}",
            if want { "allowed" } else { "dropped" }
        );
    }
}

fn applier(node: &Netns) -> Applier<iptables::apply::ExecRunner> {
    Applier::new(
        runner(node),
        ApplierConfig {
            backend: Backend::Nft,
            ..ApplierConfig::default()
        },
    )
}

fn net_sets(node: &Netns) -> Vec<String> {
    let mut s: Vec<String> = set_names(node)
        .into_iter()
        .filter(|n| n.starts_with("cali40c:"))
        .collect();
    s.sort();
    s
}

#[test]
fn net_sets_enforce_the_lists_and_leave_after_their_rules() {
    let (client, node, _pod) = topology();
    // Routing works before any policy, from every client address.
    for i in 1..=4 {
        assert!(connects_from(&client, i, true), "10.99.0.{i}: no routing");
    }
    let mut renderer = Renderer::new(RenderConfig::default()).unwrap();
    let outputs = [policy(true), pod(), Output::InSync];
    assert!(renderer.apply_all(outputs).is_empty());
    assert!(renderer.flush().is_empty());
    let desired = renderer.desired(V::V4);
    renderer.take_changes(V::V4);
    let mut a = applier(&node);
    let report = a.apply(&desired).unwrap();
    let mode = a.mode().unwrap();
    assert_in_sync(&node, mode, &desired);

    // Two sets, holding exactly the lists, created in the ipset phase of the same apply.
    let sets = net_sets(&node);
    assert_eq!(sets.len(), 2, "{sets:?}");
    let mut members: Vec<Vec<String>> = sets.iter().map(|s| set_members(&node, s)).collect();
    members.sort();
    assert_eq!(
        members,
        [
            vec!["10.99.0.1", "10.99.0.2", "10.99.0.3"],
            vec!["10.99.0.1", "10.99.0.3", "10.99.0.4"],
        ]
    );
    for s in &sets {
        let create = format!("create {s} hash:net family inet");
        assert!(
            report.ipset_updates.contains(&create),
            "{s}: {}",
            report.ipset_updates
        );
    }
    assert_verdicts(&client, &[1, 3]);
    // The fast drift check (chains and set member counts) finds nothing to repair.
    let (drift, repaired) = a.check_drift(&desired, None).unwrap();
    assert!(
        drift.drifted.is_empty() && drift.sets.is_empty(),
        "{drift:?}"
    );
    assert!(repaired.is_none());
    // `felixrs cleanup` counts them as ours (the `cali4` prefix).
    let plan = iptables::apply::cleanup::plan(&runner(&node)).unwrap();
    assert!(
        sets.iter().all(|s| plan.sets.contains(s)),
        "{:?}",
        plan.sets
    );

    // A restart adopts: a fresh applier on the programmed kernel writes nothing.
    let rep = applier(&node).apply(&desired).unwrap();
    assert!(rep.is_empty(), "restart wrote: {rep:?}");

    // The lists go: the policy's chain is rewritten and both sets destroyed after it, in one
    // apply of the change log.
    renderer.apply(policy(false)).unwrap();
    assert!(renderer.flush().is_empty());
    let changes = renderer.take_changes(V::V4);
    assert_eq!(changes.sets.iter().cloned().collect::<Vec<_>>(), sets);
    let desired = renderer.desired(V::V4);
    let rep = a.apply_changes(&desired, &changes).unwrap();
    for s in &sets {
        assert!(
            rep.ipset_deletions.contains(&format!("destroy {s}")),
            "{rep:?}"
        );
    }
    assert!(rep.undeletable_sets.is_empty(), "{rep:?}");
    assert!(net_sets(&node).is_empty(), "{:?}", set_names(&node));
    assert_in_sync(&node, mode, &desired);
    assert_verdicts(&client, &[2]);
}
