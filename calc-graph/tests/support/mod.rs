//! Shared helpers of the graph tests and bench: `mk_*` update builders, a model of the
//! dataplane's state that applies outputs and checks referential integrity, and a naive
//! evaluate-everything implementation of the graph for a restricted feature set.
#![allow(dead_code)]

pub mod cluster;
pub mod naive;

use std::collections::{BTreeMap, BTreeSet};

use calc_graph::graph::{CalcGraph, Update};
use calc_graph::model::{
    Action, EndpointPort, EntityRule, GlobalNetworkPolicy, Kind, Metadata, NetworkPolicy,
    NetworkSet, NetworkSetSpec, PolicySpec, Profile, ProfileSpec, Protocol, Resource, ResourceKey,
    Rule, Tier, TierSpec, WorkloadEndpoint, WorkloadEndpointSpec,
};
use calc_graph::proto::{
    ActivePolicy, ActiveProfile, EndpointId, IpSetKind, IpSetMember, LocalEndpoint, Output,
    PolicyId,
};
use ipnet::IpNet;

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn upd(r: impl Into<Resource>) -> Update {
    let r: Resource = r.into();
    Update::Resource {
        key: r.key(),
        value: Some(r),
    }
}

pub fn del(kind: Kind, ns: Option<&str>, name: &str) -> Update {
    Update::Resource {
        key: ResourceKey {
            kind,
            namespace: ns.map(str::to_string),
            name: name.to_string(),
        },
        value: None,
    }
}

pub fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// A k8s-style workload endpoint: profiles `kns.<ns>` and `ksa.<ns>.default`, orchestrator k8s.
pub fn mk_wep_res(
    ns: &str,
    name: &str,
    node: &str,
    ips: &[&str],
    l: &[(&str, &str)],
) -> WorkloadEndpoint {
    WorkloadEndpoint {
        metadata: Metadata {
            labels: labels(l),
            ..Metadata::namespaced(ns, name)
        },
        spec: WorkloadEndpointSpec {
            orchestrator: Some("k8s".into()),
            node: Some(node.into()),
            pod: Some(name.into()),
            endpoint: Some("eth0".into()),
            service_account_name: Some("default".into()),
            ip_networks: ips.iter().map(|s| net(s)).collect(),
            profiles: vec![format!("kns.{ns}"), format!("ksa.{ns}.default")],
            interface_name: Some(iface(ns, name)),
            ..WorkloadEndpointSpec::default()
        },
    }
}

/// A stable, valid interface name for a pod.
pub fn iface(ns: &str, name: &str) -> String {
    let mut h: u64 = 1469598103934665603;
    for b in ns.bytes().chain(b".".iter().copied()).chain(name.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(1099511628211);
    }
    format!("cali{:011x}", h & 0xfff_ffff_ffff)
}

pub fn mk_wep(ns: &str, name: &str, node: &str, ip: &str, l: &[(&str, &str)]) -> Update {
    upd(mk_wep_res(ns, name, node, &[ip], l))
}

/// A workload endpoint with one named port.
pub fn mk_wep_port(
    ns: &str,
    name: &str,
    node: &str,
    ip: &str,
    l: &[(&str, &str)],
    port: (&str, Protocol, u16),
) -> Update {
    let mut w = mk_wep_res(ns, name, node, &[ip], l);
    w.spec.ports.push(EndpointPort {
        name: port.0.into(),
        protocol: port.1,
        port: port.2,
        host_port: None,
        host_ip: None,
    });
    upd(w)
}

pub fn allow_from(selector: &str) -> Rule {
    Rule {
        source: EntityRule {
            selector: Some(selector.into()),
            ..EntityRule::default()
        },
        ..Rule::new(Action::Allow)
    }
}

pub fn mk_np_res(ns: &str, name: &str, selector: &str, ingress: Vec<Rule>) -> NetworkPolicy {
    NetworkPolicy {
        metadata: Metadata::namespaced(ns, name),
        spec: PolicySpec {
            order: Some(1000.0),
            selector: Some(selector.into()),
            ingress,
            ..PolicySpec::default()
        },
    }
}

pub fn mk_np(ns: &str, name: &str, selector: &str, ingress: Vec<Rule>) -> Update {
    upd(mk_np_res(ns, name, selector, ingress))
}

pub fn mk_gnp_res(
    name: &str,
    selector: &str,
    order: Option<f64>,
    ingress: Vec<Rule>,
    egress: Vec<Rule>,
) -> GlobalNetworkPolicy {
    GlobalNetworkPolicy {
        metadata: Metadata::named(name),
        spec: PolicySpec {
            order,
            selector: Some(selector.into()),
            ingress,
            egress,
            ..PolicySpec::default()
        },
    }
}

pub fn mk_gnp(
    name: &str,
    selector: &str,
    order: Option<f64>,
    ingress: Vec<Rule>,
    egress: Vec<Rule>,
) -> Update {
    upd(mk_gnp_res(name, selector, order, ingress, egress))
}

pub fn mk_profile(name: &str, apply: &[(&str, &str)], allow: bool) -> Update {
    let rules = if allow {
        vec![Rule::new(Action::Allow)]
    } else {
        Vec::new()
    };
    upd(Profile {
        metadata: Metadata::named(name),
        spec: ProfileSpec {
            ingress: rules.clone(),
            egress: rules,
            labels_to_apply: labels(apply),
        },
    })
}

/// The `kns.<ns>` profile kube-controllers writes for a namespace.
pub fn mk_ns_profile(ns: &str, ns_labels: &[(&str, &str)]) -> Update {
    let mut apply: Vec<(String, String)> = ns_labels
        .iter()
        .map(|(k, v)| (format!("pcns.{k}"), v.to_string()))
        .collect();
    apply.push(("pcns.projectcalico.org/name".into(), ns.into()));
    let refs: Vec<(&str, &str)> = apply
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    mk_profile(&format!("kns.{ns}"), &refs, true)
}

pub fn mk_netset(ns: &str, name: &str, nets: &[&str], l: &[(&str, &str)]) -> Update {
    upd(NetworkSet {
        metadata: Metadata {
            labels: labels(l),
            ..Metadata::namespaced(ns, name)
        },
        spec: NetworkSetSpec {
            nets: nets.iter().map(|s| net(s)).collect(),
        },
    })
}

pub fn mk_tier(name: &str, order: Option<f64>, action: Action) -> Update {
    upd(Tier {
        metadata: Metadata::named(name),
        spec: TierSpec {
            order,
            default_action: Some(action),
        },
    })
}

// --- graph helpers for tests ---------------------------------------------------------

/// The node the unit tests run as.
pub const NODE: &str = "node1";

pub fn graph() -> CalcGraph {
    CalcGraph::new(NODE)
}

/// Applies updates and flushes.
pub fn run(g: &mut CalcGraph, ups: Vec<Update>) -> Vec<Output> {
    for u in ups {
        g.apply(u);
    }
    g.flush()
}

/// A graph that has applied `ups` and `InSync`, and the dataplane state of its first flush.
pub fn synced(ups: Vec<Update>) -> (CalcGraph, Dataplane) {
    let mut g = graph();
    let mut all = ups;
    all.push(Update::InSync);
    let out = run(&mut g, all);
    let mut dp = Dataplane::default();
    dp.apply(&out).unwrap();
    assert!(dp.in_sync);
    (g, dp)
}

/// IP set id of a selector.
pub fn sel_id(s: &str) -> String {
    calc_graph::selector::parse(s).unwrap().unique_id()
}

/// IP set id of a rule selector of a NetworkPolicy in `ns`.
pub fn ns_rule_sel(ns: &str, s: &str) -> String {
    sel_id(&format!("(projectcalico.org/namespace == '{ns}') && ({s})"))
}

/// Members of a set in the dataplane, as text.
pub fn members(dp: &Dataplane, id: &str) -> Vec<String> {
    dp.sets[id]
        .1
        .iter()
        .map(|m| match m {
            IpSetMember::Net(n) => n.to_string(),
            IpSetMember::IpPort {
                addr,
                protocol,
                port,
            } => format!("{addr},{protocol}:{port}"),
        })
        .collect()
}

// --- dataplane model ---------------------------------------------------------------------

/// What the dataplane holds after applying outputs in order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Dataplane {
    pub sets: BTreeMap<String, (IpSetKind, BTreeSet<IpSetMember>)>,
    /// The patterns of each domain set in `sets`.
    pub domains: BTreeMap<String, Vec<calc_graph::proto::DomainPattern>>,
    pub policies: BTreeMap<PolicyId, ActivePolicy>,
    pub profiles: BTreeMap<String, ActiveProfile>,
    pub endpoints: BTreeMap<EndpointId, LocalEndpoint>,
    /// Host endpoints of the node, by name.
    pub hosts: BTreeMap<String, calc_graph::proto::LocalHostEndpoint>,
    pub pools: BTreeMap<String, calc_graph::proto::IpPool>,
    pub in_sync: bool,
}

fn rule_sets(r: &calc_graph::proto::ParsedRule) -> impl Iterator<Item = &String> {
    r.src_ip_set_ids
        .iter()
        .chain(&r.not_src_ip_set_ids)
        .chain(&r.dst_ip_set_ids)
        .chain(&r.not_dst_ip_set_ids)
        .chain(&r.src_named_port_ip_set_ids)
        .chain(&r.not_src_named_port_ip_set_ids)
        .chain(&r.dst_named_port_ip_set_ids)
        .chain(&r.not_dst_named_port_ip_set_ids)
        .chain(&r.dst_domain_ip_set_ids)
}

fn rank(o: &Output) -> u8 {
    match o {
        Output::IpSetCreated { .. } | Output::DomainSetCreated { .. } => 0,
        Output::IpSetMembersAdded { .. } | Output::IpSetMembersRemoved { .. } => 1,
        Output::PolicyUpdated(_) => 2,
        Output::ProfileUpdated(_) => 3,
        Output::EndpointUpdated(_) | Output::HostEndpointUpdated(_) => 4,
        Output::EndpointRemoved(_) | Output::HostEndpointRemoved(_) => 5,
        Output::ProfileRemoved(_) => 6,
        Output::PolicyRemoved(_) => 7,
        Output::IpSetRemoved(_) => 8,
        Output::IpPoolUpdated(_) => 9,
        Output::IpPoolRemoved(_) => 10,
        Output::InSync => 11,
    }
}

fn object(o: &Output) -> String {
    match o {
        Output::IpSetCreated { id, .. }
        | Output::DomainSetCreated { id, .. }
        | Output::IpSetRemoved(id) => format!("set {id}"),
        Output::IpSetMembersAdded { id, .. } => format!("set+ {id}"),
        Output::IpSetMembersRemoved { id, .. } => format!("set- {id}"),
        Output::PolicyUpdated(p) => format!("policy {}", p.id),
        Output::PolicyRemoved(id) => format!("policy {id}"),
        Output::ProfileUpdated(p) => format!("profile {}", p.id),
        Output::ProfileRemoved(id) => format!("profile {id}"),
        Output::EndpointUpdated(e) => format!("endpoint {}", e.id),
        Output::EndpointRemoved(id) => format!("endpoint {id}"),
        Output::HostEndpointUpdated(h) => format!("host endpoint {}", h.name),
        Output::HostEndpointRemoved(name) => format!("host endpoint {name}"),
        Output::IpPoolUpdated(p) => format!("pool {}", p.name),
        Output::IpPoolRemoved(name) => format!("pool {name}"),
        Output::InSync => "in-sync".into(),
    }
}

impl Dataplane {
    /// Applies one flushed batch, checking batch order, at-most-once per object and that
    /// nothing references a set, policy or profile that does not exist at that point.
    pub fn apply(&mut self, batch: &[Output]) -> Result<(), String> {
        let mut last = 0;
        let mut seen = BTreeSet::new();
        for o in batch {
            let r = rank(o);
            if r < last {
                return Err(format!("out of order: {o:?} after rank {last}"));
            }
            last = r;
            if !seen.insert(object(o)) {
                return Err(format!("object appears twice in one batch: {}", object(o)));
            }
            self.apply_one(o)?;
        }
        self.check_integrity()
    }

    fn apply_one(&mut self, o: &Output) -> Result<(), String> {
        match o {
            Output::IpSetCreated { id, kind, members } => {
                if self.sets.contains_key(id) {
                    return Err(format!("set {id} created twice"));
                }
                self.sets
                    .insert(id.clone(), (*kind, members.iter().cloned().collect()));
            }
            Output::DomainSetCreated { id, patterns } => {
                if self.sets.contains_key(id) {
                    return Err(format!("set {id} created twice"));
                }
                if !id.starts_with("d:") || patterns.is_empty() {
                    return Err(format!("domain set {id} with patterns {patterns:?}"));
                }
                if !patterns.windows(2).all(|w| w[0] < w[1]) {
                    return Err(format!("domain set {id}: patterns not sorted/unique"));
                }
                self.sets
                    .insert(id.clone(), (IpSetKind::Domain, BTreeSet::new()));
                self.domains.insert(id.clone(), patterns.to_vec());
            }
            Output::IpSetMembersAdded { id, members } => {
                if self.domains.contains_key(id) {
                    return Err(format!("members sent for domain set {id}"));
                }
                let set = self
                    .sets
                    .get_mut(id)
                    .ok_or(format!("add to unknown set {id}"))?;
                for m in members {
                    if !set.1.insert(m.clone()) {
                        return Err(format!("set {id}: member {m:?} added twice"));
                    }
                }
            }
            Output::IpSetMembersRemoved { id, members } => {
                let set = self
                    .sets
                    .get_mut(id)
                    .ok_or(format!("remove from unknown set {id}"))?;
                for m in members {
                    if !set.1.remove(m) {
                        return Err(format!("set {id}: removed absent member {m:?}"));
                    }
                }
            }
            Output::IpSetRemoved(id) => {
                if self.sets.remove(id).is_none() {
                    return Err(format!("removed unknown set {id}"));
                }
                self.domains.remove(id);
                for p in self.policies.values() {
                    if p.inbound_rules
                        .iter()
                        .chain(&p.outbound_rules)
                        .flat_map(rule_sets)
                        .any(|s| s == id)
                    {
                        return Err(format!("set {id} removed while {} uses it", p.id));
                    }
                }
            }
            Output::PolicyUpdated(p) => {
                for s in p
                    .inbound_rules
                    .iter()
                    .chain(&p.outbound_rules)
                    .flat_map(rule_sets)
                {
                    if !self.sets.contains_key(s) {
                        return Err(format!("{} references missing set {s}", p.id));
                    }
                }
                self.policies.insert(p.id.clone(), p.clone());
            }
            Output::PolicyRemoved(id) => {
                if self.policies.remove(id).is_none() {
                    return Err(format!("removed unknown policy {id}"));
                }
            }
            Output::ProfileUpdated(p) => {
                for s in p
                    .inbound_rules
                    .iter()
                    .chain(&p.outbound_rules)
                    .flat_map(rule_sets)
                {
                    if !self.sets.contains_key(s) {
                        return Err(format!("profile {} references missing set {s}", p.id));
                    }
                }
                self.profiles.insert(p.id.clone(), p.clone());
            }
            Output::ProfileRemoved(id) => {
                if self.profiles.remove(id).is_none() {
                    return Err(format!("removed unknown profile {id}"));
                }
            }
            Output::EndpointUpdated(e) => {
                for t in &e.tiers {
                    for p in t.ingress_policies.iter().chain(&t.egress_policies) {
                        if !self.policies.contains_key(p) {
                            return Err(format!("endpoint {} references missing {p}", e.id));
                        }
                    }
                }
                for p in &e.profile_ids {
                    if !self.profiles.contains_key(p) {
                        return Err(format!("endpoint {} references missing profile {p}", e.id));
                    }
                }
                self.endpoints.insert(e.id.clone(), e.clone());
            }
            Output::EndpointRemoved(id) => {
                if self.endpoints.remove(id).is_none() {
                    return Err(format!("removed unknown endpoint {id}"));
                }
            }
            Output::HostEndpointUpdated(h) => {
                self.check_host(h)?;
                self.hosts.insert(h.name.clone(), h.clone());
            }
            Output::HostEndpointRemoved(name) => {
                if self.hosts.remove(name).is_none() {
                    return Err(format!("removed unknown host endpoint {name}"));
                }
            }
            Output::IpPoolUpdated(p) => {
                self.pools.insert(p.name.clone(), p.clone());
            }
            Output::IpPoolRemoved(name) => {
                if self.pools.remove(name).is_none() {
                    return Err(format!("removed unknown pool {name}"));
                }
            }
            Output::InSync => {
                if self.in_sync {
                    return Err("InSync sent twice".into());
                }
                self.in_sync = true;
            }
        }
        Ok(())
    }

    /// A host endpoint's policies and profiles exist.
    fn check_host(&self, h: &calc_graph::proto::LocalHostEndpoint) -> Result<(), String> {
        for p in h.policy_ids() {
            if !self.policies.contains_key(p) {
                return Err(format!("host endpoint {} references missing {p}", h.name));
            }
        }
        for p in &h.profile_ids {
            if !self.profiles.contains_key(p) {
                return Err(format!(
                    "host endpoint {} references missing profile {p}",
                    h.name
                ));
            }
        }
        Ok(())
    }

    /// Whole-state integrity: every reference resolves.
    pub fn check_integrity(&self) -> Result<(), String> {
        for h in self.hosts.values() {
            self.check_host(h)?;
        }
        for e in self.endpoints.values() {
            for t in &e.tiers {
                for p in t.ingress_policies.iter().chain(&t.egress_policies) {
                    if !self.policies.contains_key(p) {
                        return Err(format!("endpoint {} references removed {p}", e.id));
                    }
                }
            }
            for p in &e.profile_ids {
                if !self.profiles.contains_key(p) {
                    return Err(format!("endpoint {} references removed profile {p}", e.id));
                }
            }
        }
        for p in self.policies.values() {
            for s in p
                .inbound_rules
                .iter()
                .chain(&p.outbound_rules)
                .flat_map(rule_sets)
            {
                if !self.sets.contains_key(s) {
                    return Err(format!("{} references removed set {s}", p.id));
                }
            }
        }
        Ok(())
    }
}
