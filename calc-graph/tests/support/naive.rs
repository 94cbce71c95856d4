//! A naive, from-scratch implementation of the graph for the feature set the property test and
//! the bench generate: every selector is evaluated against every endpoint, nothing is indexed or
//! incremental. Supported: workload endpoints (labels, profiles, node, addresses, named ports,
//! service account), namespaced and global network sets, profiles (labels, allow-all or no
//! rules), tiers, NetworkPolicies and GlobalNetworkPolicies whose rules use `action`,
//! `protocol`, `source.selector`, `source.namespaceSelector` and `destination.ports`.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use calc_graph::graph::named_port_set_id;
use calc_graph::model::{
    Action, Kind, PolicyType, Port, Protocol, Resource, ResourceKey, Rule, StagedAction,
};
use calc_graph::proto::{
    ActivePolicy, ActiveProfile, EndpointId, IpSetKind, IpSetMember, LocalEndpoint,
    LocalHostEndpoint, ParsedRule, PolicyId, PolicyKind, PortRange, TierInfo,
};
use calc_graph::selector::{Selector, parse};
use ipnet::IpNet;

use super::Dataplane;

pub struct NaiveItem {
    pub labels: BTreeMap<String, String>,
    pub nets: Vec<IpNet>,
    pub ports: Vec<(String, Protocol, u16)>,
}

fn split(n: IpNet) -> Vec<IpNet> {
    let n = n.trunc();
    if n.prefix_len() != 0 {
        return vec![n];
    }
    match n {
        IpNet::V4(_) => vec!["0.0.0.0/1".parse().unwrap(), "128.0.0.0/1".parse().unwrap()],
        IpNet::V6(_) => vec!["::/1".parse().unwrap(), "8000::/1".parse().unwrap()],
    }
}

fn inherit(
    own: BTreeMap<String, String>,
    parents: &[String],
    res: &BTreeMap<ResourceKey, Resource>,
) -> BTreeMap<String, String> {
    let mut out = own;
    for p in parents {
        if let Some(Resource::Profile(pr)) = res.get(&ResourceKey::global(Kind::Profile, p.clone()))
        {
            for (k, v) in &pr.spec.labels_to_apply {
                out.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    out
}

/// Every labelled item with its effective labels.
pub fn items(res: &BTreeMap<ResourceKey, Resource>) -> Vec<NaiveItem> {
    let mut out = Vec::new();
    for (key, r) in res {
        match r {
            Resource::WorkloadEndpoint(w) if !w.spec.ip_networks.is_empty() => {
                let ns = key.namespace.clone().unwrap();
                let mut own: BTreeMap<String, String> = w
                    .metadata
                    .labels
                    .iter()
                    .filter(|(k, _)| !k.starts_with("pcns.") && !k.starts_with("pcsa."))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                own.insert("projectcalico.org/namespace".into(), ns);
                if let Some(o) = &w.spec.orchestrator {
                    own.insert("projectcalico.org/orchestrator".into(), o.clone());
                }
                if let Some(sa) = &w.spec.service_account_name {
                    own.insert("projectcalico.org/serviceaccount".into(), sa.clone());
                }
                out.push(NaiveItem {
                    labels: inherit(own, &w.spec.profiles, res),
                    nets: w.spec.ip_networks.iter().map(|n| n.trunc()).collect(),
                    ports: w
                        .spec
                        .ports
                        .iter()
                        .filter(|p| !p.name.is_empty())
                        .map(|p| (p.name.clone(), p.protocol, p.port))
                        .collect(),
                });
            }
            Resource::NetworkSet(s) => {
                let ns = key.namespace.clone().unwrap();
                let mut own = s.metadata.labels.clone();
                own.insert("projectcalico.org/namespace".into(), ns.clone());
                out.push(NaiveItem {
                    labels: inherit(own, &[format!("kns.{ns}")], res),
                    nets: s.spec.nets.iter().flat_map(|n| split(*n)).collect(),
                    ports: Vec::new(),
                });
            }
            Resource::HostEndpoint(h) => out.push(NaiveItem {
                labels: inherit(h.metadata.labels.clone(), &h.spec.profiles, res),
                nets: h
                    .spec
                    .expected_ips
                    .iter()
                    .map(|ip| IpNet::from(*ip))
                    .collect(),
                ports: h
                    .spec
                    .ports
                    .iter()
                    .filter(|p| !p.name.is_empty())
                    .map(|p| (p.name.clone(), p.protocol, p.port))
                    .collect(),
            }),
            Resource::GlobalNetworkSet(s) => out.push(NaiveItem {
                labels: s.metadata.labels.clone(),
                nets: s.spec.nets.iter().flat_map(|n| split(*n)).collect(),
                ports: Vec::new(),
            }),
            _ => {}
        }
    }
    out
}

struct NaivePolicy {
    id: PolicyId,
    selector: Selector,
    order: Option<f64>,
    types: Vec<PolicyType>,
    apply_on_forward: bool,
    untracked: bool,
    pre_dnat: bool,
    ns: Option<String>,
    ingress: Vec<Rule>,
    egress: Vec<Rule>,
}

fn policies(res: &BTreeMap<ResourceKey, Resource>) -> Vec<NaivePolicy> {
    let mut out = Vec::new();
    for (key, r) in res {
        match r {
            Resource::NetworkPolicy(p) => {
                let ns = key.namespace.clone().unwrap();
                let sel = p.spec.selector.clone().unwrap_or_else(|| "all()".into());
                out.push(NaivePolicy {
                    id: PolicyId {
                        kind: PolicyKind::NetworkPolicy,
                        tier: p.spec.tier_name().to_string(),
                        namespace: Some(ns.clone()),
                        name: key.name.clone(),
                    },
                    selector: parse(&format!("({sel}) && projectcalico.org/namespace == '{ns}'"))
                        .unwrap(),
                    order: p.spec.order,
                    types: p.spec.effective_types(),
                    apply_on_forward: true,
                    untracked: false,
                    pre_dnat: false,
                    ns: Some(ns),
                    ingress: p.spec.ingress.clone(),
                    egress: p.spec.egress.clone(),
                });
            }
            Resource::StagedNetworkPolicy(p)
                if p.spec.staged_action.unwrap_or(StagedAction::Set) == StagedAction::Set =>
            {
                let ns = key.namespace.clone().unwrap();
                let spec = &p.spec.policy;
                let sel = spec.selector.clone().unwrap_or_else(|| "all()".into());
                out.push(NaivePolicy {
                    id: PolicyId {
                        kind: PolicyKind::StagedNetworkPolicy,
                        tier: spec.tier_name().to_string(),
                        namespace: Some(ns.clone()),
                        name: key.name.clone(),
                    },
                    selector: parse(&format!("({sel}) && projectcalico.org/namespace == '{ns}'"))
                        .unwrap(),
                    order: spec.order,
                    types: spec.effective_types(),
                    apply_on_forward: true,
                    untracked: false,
                    pre_dnat: false,
                    ns: Some(ns),
                    ingress: spec.ingress.clone(),
                    egress: spec.egress.clone(),
                });
            }
            Resource::StagedGlobalNetworkPolicy(p)
                if p.spec.staged_action.unwrap_or(StagedAction::Set) == StagedAction::Set =>
            {
                let spec = &p.spec.policy;
                out.push(NaivePolicy {
                    id: PolicyId {
                        kind: PolicyKind::StagedGlobalNetworkPolicy,
                        tier: spec.tier_name().to_string(),
                        namespace: None,
                        name: key.name.clone(),
                    },
                    selector: parse(spec.selector.as_deref().unwrap_or("all()")).unwrap(),
                    order: spec.order,
                    types: spec.effective_types(),
                    apply_on_forward: spec.apply_on_forward,
                    untracked: spec.do_not_track,
                    pre_dnat: spec.pre_dnat,
                    ns: None,
                    ingress: spec.ingress.clone(),
                    egress: spec.egress.clone(),
                });
            }
            Resource::GlobalNetworkPolicy(p) => out.push(NaivePolicy {
                id: PolicyId {
                    kind: PolicyKind::GlobalNetworkPolicy,
                    tier: p.spec.tier_name().to_string(),
                    namespace: None,
                    name: key.name.clone(),
                },
                selector: parse(p.spec.selector.as_deref().unwrap_or("all()")).unwrap(),
                order: p.spec.order,
                types: p.spec.effective_types(),
                apply_on_forward: p.spec.apply_on_forward,
                untracked: p.spec.do_not_track,
                pre_dnat: p.spec.pre_dnat,
                ns: None,
                ingress: p.spec.ingress.clone(),
                egress: p.spec.egress.clone(),
            }),
            _ => {}
        }
    }
    out
}

/// The enforced policies (kind, namespace, name) a staged Set or Delete policy shadows.
fn shadowed(
    res: &BTreeMap<ResourceKey, Resource>,
) -> BTreeSet<(PolicyKind, Option<String>, String)> {
    let mut out = BTreeSet::new();
    for (key, r) in res {
        let action = match r {
            Resource::StagedNetworkPolicy(p) => p.spec.staged_action,
            Resource::StagedGlobalNetworkPolicy(p) => p.spec.staged_action,
            _ => continue,
        };
        if !matches!(
            action.unwrap_or(StagedAction::Set),
            StagedAction::Set | StagedAction::Delete
        ) {
            continue;
        }
        let kind = match key.kind {
            Kind::StagedNetworkPolicy => PolicyKind::NetworkPolicy,
            _ => PolicyKind::GlobalNetworkPolicy,
        };
        out.insert((kind, key.namespace.clone(), key.name.clone()));
    }
    out
}

/// (selector, named port) of each set a rule uses, keyed by id.
type SetDefs = BTreeMap<String, (Selector, Option<(Protocol, String)>)>;

/// Patterns of each domain set a rule uses, keyed by id.
type DomainDefs = BTreeMap<String, Vec<calc_graph::model::DomainPattern>>;

/// A rule as the dataplane gets it; `None` when it fails safe by being dropped. Domains
/// (`destination.domains`, all names valid) are enforced in egress Allow rules only; elsewhere a
/// Deny keeps its other matches and an Allow is dropped.
fn parse_rule(
    r: &Rule,
    ns: Option<&str>,
    egress: bool,
    defs: &mut SetDefs,
    domains: &mut DomainDefs,
) -> Option<ParsedRule> {
    let mut domain_set = None;
    if !r.destination.domains.is_empty() {
        let parsed: Result<Vec<_>, _> = (r.destination.domains.iter())
            .map(|d| calc_graph::model::DomainPattern::parse(d))
            .collect();
        match parsed {
            Ok(mut pats) if egress && r.action == Action::Allow => {
                pats.sort();
                pats.dedup();
                let text: Vec<&str> = pats.iter().map(|p| p.as_str()).collect();
                let id = calc_graph::selector::make_unique_id("d", &text.join(","));
                domains.insert(id.clone(), pats);
                domain_set = Some(id);
            }
            _ if r.action == Action::Allow => return None,
            _ => {}
        }
    }
    let mut out = parse_rule_sets(r, ns, defs);
    out.dst_domain_ip_set_ids.extend(domain_set);
    Some(out)
}

fn parse_rule_sets(r: &Rule, ns: Option<&str>, defs: &mut SetDefs) -> ParsedRule {
    let src = &r.source;
    let ns_part = match (&src.namespace_selector, ns) {
        (Some(s), _) => Some(parse(s).unwrap().rewrite_namespace_selector().canonical()),
        (None, Some(ns)) => Some(format!("projectcalico.org/namespace == '{ns}'")),
        (None, None) => None,
    };
    let src_sel = match (&src.selector, ns_part) {
        (Some(s), Some(n)) => Some(format!("({n}) && ({s})")),
        (Some(s), None) => Some(s.clone()),
        (None, Some(n)) if src.namespace_selector.is_some() => Some(n),
        _ => None,
    };
    let mut out = ParsedRule {
        action: Some(r.action),
        protocol: r.protocol,
        ..ParsedRule::default()
    };
    if let Some(s) = src_sel {
        let sel = parse(&s).unwrap();
        let id = sel.unique_id();
        defs.insert(id.clone(), (sel, None));
        out.src_ip_set_ids.push(id);
    }
    let proto = match r.protocol {
        Some(Protocol::Udp) => Protocol::Udp,
        Some(Protocol::Sctp) => Protocol::Sctp,
        _ => Protocol::Tcp,
    };
    for p in &r.destination.ports {
        match p {
            Port::Number(n) => out.dst_ports.push(PortRange {
                first: *n,
                last: *n,
            }),
            Port::Range(a, b) => out.dst_ports.push(PortRange {
                first: *a,
                last: *b,
            }),
            Port::Named(name) => {
                let sel = Selector::all();
                let id = named_port_set_id(&sel, proto, name);
                defs.insert(id.clone(), (sel, Some((proto, name.clone()))));
                out.dst_named_port_ip_set_ids.push(id);
            }
        }
    }
    out
}

fn tier_of(res: &BTreeMap<ResourceKey, Resource>, name: &str) -> (Option<f64>, Action) {
    if let Some(Resource::Tier(t)) = res.get(&ResourceKey::global(Kind::Tier, name)) {
        return (t.spec.order, t.spec.default_action());
    }
    match name {
        "default" => (Some(1_000_000.0), Action::Deny),
        "kube-admin" => (Some(1_000.0), Action::Pass),
        "kube-baseline" => (Some(10_000_000.0), Action::Pass),
        _ => (None, Action::Deny),
    }
}

fn order_key(o: Option<f64>) -> (bool, f64) {
    (o.is_none(), o.unwrap_or(0.0))
}

/// The dataplane state the graph must produce for `res` on `node`.
pub fn expected(res: &BTreeMap<ResourceKey, Resource>, node: &str) -> Dataplane {
    let all_items = items(res);
    let pols = policies(res);
    let mut dp = Dataplane {
        in_sync: true,
        ..Dataplane::default()
    };
    let mut defs = SetDefs::new();
    let mut domains = DomainDefs::new();

    // Local endpoints and the policies matching each.
    let mut locals = Vec::new();
    let mut host_locals = Vec::new();
    for (key, r) in res {
        let is_local_hep = matches!(r, Resource::HostEndpoint(h)
            if h.spec.node.as_deref() == Some(node));
        if is_local_hep {
            let item = items(
                &std::iter::once((key.clone(), r.clone()))
                    .chain(
                        res.iter()
                            .filter(|(k, _)| k.kind == Kind::Profile)
                            .map(|(k, v)| (k.clone(), v.clone())),
                    )
                    .collect(),
            );
            let Resource::HostEndpoint(h) = r else {
                unreachable!()
            };
            host_locals.push((key.clone(), h.clone(), item.into_iter().next().unwrap()));
        }
        if let Resource::WorkloadEndpoint(w) = r
            && !w.spec.ip_networks.is_empty()
            && w.spec.node.as_deref() == Some(node)
        {
            let item = items(
                &std::iter::once((key.clone(), r.clone()))
                    .chain(
                        res.iter()
                            .filter(|(k, _)| k.kind == Kind::Profile)
                            .map(|(k, v)| (k.clone(), v.clone())),
                    )
                    .collect(),
            );
            locals.push((key.clone(), w.clone(), item.into_iter().next().unwrap()));
        }
    }
    let mut active = BTreeSet::new();
    for (i, p) in pols.iter().enumerate() {
        if locals
            .iter()
            .map(|(_, _, it)| it)
            .chain(host_locals.iter().map(|(_, _, it)| it))
            .any(|it| p.selector.matches(&it.labels))
        {
            active.insert(i);
            let ns = p.ns.as_deref();
            let pol = ActivePolicy {
                id: p.id.clone(),
                order: p.order,
                inbound_rules: p
                    .ingress
                    .iter()
                    .filter_map(|r| parse_rule(r, ns, false, &mut defs, &mut domains))
                    .collect(),
                outbound_rules: p
                    .egress
                    .iter()
                    .filter_map(|r| parse_rule(r, ns, true, &mut defs, &mut domains))
                    .collect(),
                untracked: p.untracked,
                pre_dnat: p.pre_dnat,
                apply_on_forward: p.apply_on_forward,
            };
            dp.policies.insert(p.id.clone(), pol);
        }
    }
    let all_profiles: Vec<&String> = locals
        .iter()
        .flat_map(|(_, w, _)| &w.spec.profiles)
        .chain(host_locals.iter().flat_map(|(_, h, _)| &h.spec.profiles))
        .collect();
    for prof in all_profiles {
        {
            let rules = match res.get(&ResourceKey::global(Kind::Profile, prof.clone())) {
                Some(Resource::Profile(p)) => (
                    p.spec
                        .ingress
                        .iter()
                        .filter_map(|r| parse_rule(r, None, false, &mut defs, &mut domains))
                        .collect(),
                    p.spec
                        .egress
                        .iter()
                        .filter_map(|r| parse_rule(r, None, true, &mut defs, &mut domains))
                        .collect(),
                ),
                _ => {
                    let deny = ParsedRule {
                        action: Some(Action::Deny),
                        ..ParsedRule::default()
                    };
                    (vec![deny.clone()], vec![deny])
                }
            };
            dp.profiles.insert(
                prof.clone(),
                ActiveProfile {
                    id: prof.clone(),
                    inbound_rules: rules.0,
                    outbound_rules: rules.1,
                },
            );
        }
    }
    let shadows = shadowed(res);
    let is_shadowed = |p: &NaivePolicy| {
        !p.id.kind.is_staged()
            && shadows.contains(&(p.id.kind, p.id.namespace.clone(), p.id.name.clone()))
    };
    for (key, w, it) in &locals {
        let tiers = naive_tiers(
            res,
            &pols,
            &it.labels,
            |p| !p.untracked && !p.pre_dnat && !p.id.kind.is_staged(),
            false,
        );
        let staged_differs = pols.iter().any(|p| {
            !p.untracked
                && !p.pre_dnat
                && (p.id.kind.is_staged() || is_shadowed(p))
                && p.selector.matches(&it.labels)
        });
        let staged_tiers = staged_differs.then(|| {
            naive_tiers(
                res,
                &pols,
                &it.labels,
                |p| !p.untracked && !p.pre_dnat && !is_shadowed(p),
                false,
            )
        });
        let nets: Vec<IpNet> = w.spec.ip_networks.iter().map(|n| n.trunc()).collect();
        let id = EndpointId {
            namespace: key.namespace.clone().unwrap(),
            name: key.name.clone(),
        };
        dp.endpoints.insert(
            id.clone(),
            LocalEndpoint {
                id,
                interface_name: w.spec.interface_name.clone().unwrap_or_default(),
                ipv4_nets: nets
                    .iter()
                    .filter(|n| matches!(n, IpNet::V4(_)))
                    .copied()
                    .collect(),
                ipv6_nets: nets
                    .iter()
                    .filter(|n| matches!(n, IpNet::V6(_)))
                    .copied()
                    .collect(),
                tiers,
                profile_ids: w.spec.profiles.clone(),
                allow_spoofed_source_prefixes: w
                    .spec
                    .allow_spoofed_source_prefixes
                    .iter()
                    .map(|n| n.trunc())
                    .collect(),
                staged_tiers,
            },
        );
    }

    for (key, h, it) in &host_locals {
        let l = &it.labels;
        let addrs = |v6: bool| {
            h.spec
                .expected_ips
                .iter()
                .filter(|a| a.is_ipv6() == v6)
                .copied()
                .collect()
        };
        dp.hosts.insert(
            key.name.clone(),
            LocalHostEndpoint {
                name: key.name.clone(),
                interface_name: h.spec.interface_name.clone().unwrap_or_default(),
                ipv4_addrs: addrs(false),
                ipv6_addrs: addrs(true),
                tiers: naive_tiers(
                    res,
                    &pols,
                    l,
                    |p| !p.id.kind.is_staged() && !p.untracked && !p.pre_dnat,
                    false,
                ),
                forward_tiers: naive_tiers(
                    res,
                    &pols,
                    l,
                    |p| !p.id.kind.is_staged() && !p.untracked && !p.pre_dnat && p.apply_on_forward,
                    false,
                ),
                untracked_tiers: naive_tiers(
                    res,
                    &pols,
                    l,
                    |p| !p.id.kind.is_staged() && p.untracked,
                    false,
                ),
                pre_dnat_tiers: naive_tiers(
                    res,
                    &pols,
                    l,
                    |p| !p.id.kind.is_staged() && p.pre_dnat,
                    true,
                ),
                profile_ids: h.spec.profiles.clone(),
            },
        );
    }

    for (id, pats) in domains {
        dp.sets
            .insert(id.clone(), (IpSetKind::Domain, BTreeSet::new()));
        dp.domains.insert(id, pats);
    }
    // Set membership by brute force.
    for (id, (sel, np)) in defs {
        let mut members = BTreeSet::new();
        for it in &all_items {
            if !sel.matches(&it.labels) {
                continue;
            }
            match &np {
                None => members.extend(it.nets.iter().map(|n| IpSetMember::Net(*n))),
                Some((proto, name)) => {
                    for (pn, pp, port) in &it.ports {
                        let pp = match pp {
                            Protocol::Number(6) => Protocol::Tcp,
                            Protocol::Number(17) => Protocol::Udp,
                            Protocol::Number(132) => Protocol::Sctp,
                            other => *other,
                        };
                        if pn == name && pp == *proto {
                            for n in &it.nets {
                                members.insert(IpSetMember::IpPort {
                                    addr: n.addr(),
                                    protocol: *proto,
                                    port: *port,
                                });
                            }
                        }
                    }
                }
            }
        }
        let kind = if np.is_some() {
            IpSetKind::IpPort
        } else {
            IpSetKind::Net
        };
        dp.sets.insert(id, (kind, members));
    }
    dp
}

/// Brute-force membership of one selector over precomputed items (the bench's baseline).
pub fn brute_force_members(sel: &Selector, items: &[NaiveItem]) -> BTreeSet<IpNet> {
    items
        .iter()
        .filter(|it| sel.matches(&it.labels))
        .flat_map(|it| it.nets.iter().copied())
        .collect()
}

/// The ordered tiers of the policies `keep` selects among those matching `labels`
/// (`ingress_only`: pre-DNAT lists, which hold ingress only).
fn naive_tiers(
    res: &BTreeMap<ResourceKey, Resource>,
    pols: &[NaivePolicy],
    labels: &BTreeMap<String, String>,
    keep: impl Fn(&NaivePolicy) -> bool,
    ingress_only: bool,
) -> Vec<TierInfo> {
    let mut matching: Vec<&NaivePolicy> = pols
        .iter()
        .filter(|p| keep(p) && p.selector.matches(labels))
        .collect();
    matching.sort_by(|a, b| {
        order_key(a.order)
            .partial_cmp(&order_key(b.order))
            .unwrap()
            .then_with(|| a.id.name.cmp(&b.id.name))
            .then_with(|| a.id.namespace.cmp(&b.id.namespace))
            .then_with(|| a.id.kind.cmp(&b.id.kind))
    });
    let mut tiers: Vec<TierInfo> = Vec::new();
    for p in matching {
        let ing = p.types.contains(&PolicyType::Ingress);
        let eg = p.types.contains(&PolicyType::Egress) && !ingress_only;
        if !ing && !eg {
            continue;
        }
        let t = match tiers.iter_mut().position(|t| t.name == p.id.tier) {
            Some(i) => &mut tiers[i],
            None => {
                tiers.push(TierInfo {
                    name: p.id.tier.clone(),
                    default_action: tier_of(res, &p.id.tier).1,
                    ingress_policies: Vec::new(),
                    egress_policies: Vec::new(),
                });
                tiers.last_mut().unwrap()
            }
        };
        if ing {
            t.ingress_policies.push(p.id.clone());
        }
        if eg {
            t.egress_policies.push(p.id.clone());
        }
    }
    tiers.sort_by(|a, b| {
        order_key(tier_of(res, &a.name).0)
            .partial_cmp(&order_key(tier_of(res, &b.name).0))
            .unwrap()
            .then_with(|| a.name.cmp(&b.name))
    });
    tiers
}
