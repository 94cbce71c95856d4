//! Shared builders for the render tests (`mk_*`).
#![allow(dead_code)]

use calc_graph::proto::*;

pub fn mk_np(ns: &str, name: &str) -> PolicyId {
    PolicyId {
        kind: PolicyKind::NetworkPolicy,
        tier: "default".into(),
        namespace: Some(ns.into()),
        name: name.into(),
    }
}

pub fn mk_gnp(name: &str) -> PolicyId {
    PolicyId {
        kind: PolicyKind::GlobalNetworkPolicy,
        tier: "default".into(),
        namespace: None,
        name: name.into(),
    }
}

pub fn mk_policy(
    id: PolicyId,
    inbound: Vec<ParsedRule>,
    outbound: Vec<ParsedRule>,
) -> ActivePolicy {
    ActivePolicy {
        id,
        order: Some(1000.0),
        inbound_rules: inbound,
        outbound_rules: outbound,
        untracked: false,
        pre_dnat: false,
        apply_on_forward: false,
    }
}

pub fn mk_profile(id: &str, inbound: Vec<ParsedRule>, outbound: Vec<ParsedRule>) -> ActiveProfile {
    ActiveProfile {
        id: id.into(),
        inbound_rules: inbound,
        outbound_rules: outbound,
    }
}

pub fn mk_allow() -> ParsedRule {
    ParsedRule {
        action: Some(Action::Allow),
        ..Default::default()
    }
}

pub fn mk_tier(name: &str, ingress: Vec<PolicyId>, egress: Vec<PolicyId>) -> TierInfo {
    TierInfo {
        name: name.into(),
        default_action: Action::Deny,
        ingress_policies: ingress,
        egress_policies: egress,
    }
}

pub fn mk_endpoint(
    ns: &str,
    name: &str,
    iface: &str,
    v4: &[&str],
    tiers: Vec<TierInfo>,
    profiles: &[&str],
) -> LocalEndpoint {
    LocalEndpoint {
        id: EndpointId {
            namespace: ns.into(),
            name: name.into(),
        },
        interface_name: iface.into(),
        ipv4_nets: v4.iter().map(|s| s.parse().unwrap()).collect(),
        ipv6_nets: vec![],
        tiers,
        profile_ids: profiles.iter().map(|s| s.to_string()).collect(),
    }
}

pub fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

pub fn ports(list: &[(u16, u16)]) -> Vec<PortRange> {
    list.iter()
        .map(|&(first, last)| PortRange { first, last })
        .collect()
}
