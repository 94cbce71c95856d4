//! Host endpoints of this node in the graph's output: which policies each gets, split as Felix
//! splits them (normal, applyOnForward, doNotTrack, preDNAT).

mod support;

use calc_graph::model::{Action, Rule};
use support::*;

/// A HostEndpoint of this node with an interface is a local endpoint whose policies are split as
/// Felix splits them; one of another node, or without an interface, only fills IP sets.
#[test]
fn host_endpoints_of_this_node_get_felix_s_policy_split() {
    use calc_graph::model::{HostEndpoint, HostEndpointSpec, Metadata, PolicyType};
    let hep = |name: &str, node: &str, iface: Option<&str>, ip: &str| {
        upd(HostEndpoint {
            metadata: Metadata {
                labels: labels(&[("role", "host")]),
                ..Metadata::named(name)
            },
            spec: HostEndpointSpec {
                node: Some(node.into()),
                interface_name: iface.map(str::to_string),
                expected_ips: vec![ip.parse().unwrap()],
                profiles: vec!["kns.default".into()],
                ..Default::default()
            },
        })
    };
    let gnp = |name: &str, order: f64, aof: bool, dnt: bool, pre: bool| {
        let mut p = mk_gnp_res(
            name,
            "role == 'host'",
            Some(order),
            vec![allow_from("role == 'host'")],
            if pre {
                vec![]
            } else {
                vec![Rule::new(Action::Allow)]
            },
        );
        p.spec.apply_on_forward = aof;
        p.spec.do_not_track = dnt;
        p.spec.pre_dnat = pre;
        if pre {
            p.spec.types = vec![PolicyType::Ingress];
        }
        upd(p)
    };
    let (g, dp) = synced(vec![
        hep("mine", NODE, Some("eth0"), "10.0.0.1"),
        hep("all", NODE, Some("*"), "10.0.0.2"),
        hep("other-node", "node9", Some("eth0"), "10.0.0.3"),
        hep("no-iface", NODE, None, "10.0.0.4"),
        gnp("normal", 1.0, false, false, false),
        gnp("forward", 2.0, true, false, false),
        gnp("untracked", 3.0, true, true, false),
        gnp("prednat", 4.0, true, false, true),
    ]);
    assert_eq!(
        dp.hosts.keys().map(String::as_str).collect::<Vec<_>>(),
        ["all", "mine", "no-iface"]
    );
    // Without interfaceName: local, resolved by the dataplane from its expectedIPs.
    assert_eq!(dp.hosts["no-iface"].interface_name, "");
    assert!(dp.hosts["no-iface"].is_by_expected_ips());
    assert_eq!(g.stats().local_host_endpoints, 3);
    assert_eq!(g.stats().local_endpoints, 0);
    let h = &dp.hosts["mine"];
    assert_eq!(h.interface_name, "eth0");
    assert_eq!(
        h.ipv4_addrs,
        ["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(h.profile_ids, ["kns.default"]);
    let names = |t: &[calc_graph::proto::TierInfo], ingress: bool| -> Vec<String> {
        t.iter()
            .flat_map(|t| {
                if ingress {
                    &t.ingress_policies
                } else {
                    &t.egress_policies
                }
            })
            .map(|p| p.name.clone())
            .collect()
    };
    assert_eq!(names(&h.tiers, true), ["normal", "forward"]);
    assert_eq!(names(&h.tiers, false), ["normal", "forward"]);
    assert_eq!(names(&h.forward_tiers, true), ["forward"]);
    assert_eq!(names(&h.untracked_tiers, true), ["untracked"]);
    assert_eq!(names(&h.untracked_tiers, false), ["untracked"]);
    assert_eq!(names(&h.pre_dnat_tiers, true), ["prednat"]);
    assert!(names(&h.pre_dnat_tiers, false).is_empty());
    // Every policy is active (the renderer decides where each goes); the selector set holds
    // every host endpoint's address, local or not.
    assert_eq!(dp.policies.len(), 4);
    assert_eq!(
        members(&dp, &sel_id("role == 'host'")),
        ["10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32", "10.0.0.4/32"]
    );
    assert!(dp.profiles.contains_key("kns.default"));
}
