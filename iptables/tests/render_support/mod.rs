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
        allow_spoofed_source_prefixes: vec![],
        staged_tiers: None,
    }
}

/// A host endpoint of the node on `iface` (`*`: all interfaces) with normal `tiers`,
/// `applyOnForward` tiers and profiles.
pub fn mk_host_endpoint(
    name: &str,
    iface: &str,
    tiers: Vec<TierInfo>,
    forward_tiers: Vec<TierInfo>,
    profiles: &[&str],
) -> LocalHostEndpoint {
    LocalHostEndpoint {
        name: name.into(),
        interface_name: iface.into(),
        ipv4_addrs: vec![],
        ipv6_addrs: vec![],
        tiers,
        forward_tiers,
        untracked_tiers: vec![],
        pre_dnat_tiers: vec![],
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

/// The desired state of one family as an `iptables-restore` payload (every table, our chains
/// declared, hook rules appended to the kernel chains), the way the applier writes rules.
pub fn restore_text(d: &iptables::desired::DesiredState) -> String {
    let mut out = String::new();
    for (table, t) in &d.tables {
        out.push_str(&format!("*{}\n", table.as_str()));
        for k in table.kernel_chains() {
            out.push_str(&format!(":{k} ACCEPT [0:0]\n"));
        }
        for name in t.chains.keys() {
            out.push_str(&format!(":{name} - [0:0]\n"));
        }
        for h in &t.hooks {
            out.push_str(&format!(
                "-A {} {}\n",
                h.kernel_chain,
                h.rule.restore_spec()
            ));
        }
        for (name, rules) in &t.chains {
            for r in rules {
                out.push_str(&format!("-A {name} {}\n", r.restore_spec()));
            }
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Parses `restore_text(d)` back and checks, chain by chain, that it holds exactly the rules the
/// renderer meant: same count, and each parsed rule equal to the typed model rule (hash comment
/// first). Returns the number of rules checked.
pub fn assert_parses_back(r: &iptables::render::Renderer, v: IpVersion) -> usize {
    use iptables::desired::TableName as ApplyTable;
    let d = r.desired(v);
    let text = restore_text(&d);
    let parsed = iptables::parse::parse_save(&text)
        .unwrap_or_else(|e| panic!("restore text does not parse: {e}\n{text}"));
    let mut checked = 0;
    for (table, t) in &d.tables {
        let mt: iptables::model::TableName = table.as_str().parse().unwrap();
        let pt = parsed.table(mt).unwrap();
        for (name, rules) in &t.chains {
            let ours = r.chain(v, *table, name).unwrap();
            let got: Vec<_> = pt.rules_of(name).cloned().collect();
            assert_eq!(got.len(), rules.len(), "rule count of {name}");
            for ((g, ours), want) in got.iter().zip(ours).zip(rules) {
                let expected = ours.hashed(name, &want.hash).unwrap();
                assert_eq!(g, &expected, "rule of {name}");
                assert_eq!(
                    g.cali_comment(),
                    Some(format!("cali:{}", want.hash).as_str())
                );
                assert_eq!(
                    g.first_comment(),
                    g.cali_comment(),
                    "hash comment comes first"
                );
                checked += 1;
            }
        }
        let _ = ApplyTable::Filter;
        for k in table.kernel_chains() {
            let hooks = t.hooks.iter().filter(|h| h.kernel_chain == *k).count();
            assert_eq!(pt.rules_of(k).count(), hooks, "only our hooks in {k}");
        }
    }
    checked
}

/// An endpoint chain's rules as if inlined: a final `--goto` to its shared policy chain
/// (`cali-si-`/`cali-so-`) is replaced by that chain's rules, so tests can read the tiers,
/// policies and profiles of an endpoint with or without sharing.
pub fn endpoint_rules(
    r: &iptables::render::Renderer,
    v: IpVersion,
    chain: &str,
) -> Option<Vec<iptables::render::build::Rule>> {
    use iptables::desired::TableName;
    use iptables::model::Target;
    let mut rules = r.chain(v, TableName::Filter, chain)?.to_vec();
    if let Some(Target::Goto(shared)) = rules.last().and_then(|l| l.target.clone())
        && iptables::render::names::is_shared_chain(shared.as_str())
    {
        rules.pop();
        rules.extend_from_slice(r.chain(v, TableName::Filter, shared.as_str())?);
    }
    Some(rules)
}
