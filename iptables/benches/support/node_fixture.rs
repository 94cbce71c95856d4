//! The node of the applier and counter benchmarks: 250 endpoints x 2,000 policies (16 per endpoint
//! and direction), 200 sets of 50 members, 10 namespace profiles, as calc-graph outputs.
#![allow(dead_code)]

use calc_graph::proto::*;
use iptables::apply::Backend;

pub const ENDPOINTS: usize = 250;
pub const POLICIES: usize = 2000;
pub const SETS: usize = 200;
pub const MEMBERS: usize = 50;

/// The benches' arguments: `rounds=N` (at least 1; `default` without it) and the backends named
/// (`legacy`, `nft`; both when neither is).
pub fn args(default: usize) -> (usize, Vec<Backend>) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds = args
        .iter()
        .find_map(|a| a.strip_prefix("rounds=").and_then(|n| n.parse().ok()))
        .unwrap_or(default)
        .max(1);
    let mut backends: Vec<Backend> = [("legacy", Backend::Legacy), ("nft", Backend::Nft)]
        .into_iter()
        .filter(|(name, _)| args.iter().any(|a| a == name))
        .map(|(_, b)| b)
        .collect();
    if backends.is_empty() {
        backends = vec![Backend::Legacy, Backend::Nft];
    }
    (rounds, backends)
}

pub fn policy_id(p: usize) -> PolicyId {
    PolicyId {
        kind: PolicyKind::NetworkPolicy,
        tier: "default".into(),
        namespace: Some(format!("ns{}", p % 10)),
        name: format!("policy-{p}"),
    }
}

pub fn policy(p: usize, port_shift: u16) -> ActivePolicy {
    let tcp = |port: u16, set: usize| ParsedRule {
        action: Some(Action::Allow),
        protocol: Some(Protocol::Tcp),
        dst_ports: vec![PortRange {
            first: port,
            last: port,
        }],
        src_ip_set_ids: vec![format!("s:set{set}")],
        ..Default::default()
    };
    ActivePolicy {
        id: policy_id(p),
        order: Some(1000.0),
        inbound_rules: vec![
            tcp(8000 + (p % 100) as u16 + port_shift, p % SETS),
            ParsedRule {
                action: Some(Action::Allow),
                protocol: Some(Protocol::Udp),
                dst_ports: vec![PortRange {
                    first: 53,
                    last: 53,
                }],
                src_nets: vec!["10.0.0.0/8".parse().unwrap()],
                ..Default::default()
            },
        ],
        outbound_rules: vec![ParsedRule {
            action: Some(Action::Allow),
            dst_ip_set_ids: vec![format!("s:set{}", (p + 1) % SETS)],
            ..Default::default()
        }],
        untracked: false,
        pre_dnat: false,
        apply_on_forward: false,
    }
}

pub fn outputs() -> Vec<Output> {
    let mut out = Vec::new();
    for s in 0..SETS {
        out.push(Output::IpSetCreated {
            id: format!("s:set{s}"),
            kind: IpSetKind::Net,
            members: (0..MEMBERS)
                .map(|m| {
                    IpSetMember::Net(
                        format!("10.{}.{}.{}/32", 100 + s / 250, s % 250, m + 1)
                            .parse()
                            .unwrap(),
                    )
                })
                .collect(),
        });
    }
    for p in 0..POLICIES {
        out.push(Output::PolicyUpdated(policy(p, 0)));
    }
    let allow = ParsedRule {
        action: Some(Action::Allow),
        ..Default::default()
    };
    for n in 0..10 {
        out.push(Output::ProfileUpdated(ActiveProfile {
            id: format!("kns.ns{n}"),
            inbound_rules: vec![allow.clone()],
            outbound_rules: vec![allow.clone()],
        }));
    }
    for e in 0..ENDPOINTS {
        // Each policy selects two endpoints, so each endpoint has 16 policies.
        let pols: Vec<PolicyId> = (0..POLICIES)
            .filter(|p| p % ENDPOINTS == e || (p * 7 + 3) % ENDPOINTS == e)
            .map(policy_id)
            .collect();
        out.push(Output::EndpointUpdated(LocalEndpoint {
            id: EndpointId {
                namespace: format!("ns{}", e % 10),
                name: format!("pod-{e}"),
            },
            interface_name: format!("cali{e:011x}"),
            ipv4_nets: vec![
                format!("10.200.{}.{}/32", e / 250, e % 250 + 1)
                    .parse()
                    .unwrap(),
            ],
            ipv6_nets: vec![],
            tiers: vec![TierInfo {
                name: "default".into(),
                default_action: Action::Deny,
                ingress_policies: pols.clone(),
                egress_policies: pols,
            }],
            profile_ids: vec![format!("kns.ns{}", e % 10)],
            allow_spoofed_source_prefixes: vec![],
            staged_tiers: None,
        }));
    }
    out.push(Output::InSync);
    out
}
