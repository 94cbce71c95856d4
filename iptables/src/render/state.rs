//! The incremental renderer: calc-graph outputs in, desired state (full or delta) out.
//!
//! Invariants:
//! * `families[v].chains` always equals what a from-scratch render of the current inputs would
//!   produce after [`Renderer::flush`]; only dirty objects are re-rendered.
//! * A policy/profile chain is present in a family iff some endpoint chain jumps to it (reference
//!   counts per (id, direction)); an IP set is present iff some present chain of that family names it.
//! * Set names in rules are only produced for ids the graph created (else the rule fails closed).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use calc_graph::proto::{
    ActivePolicy, ActiveProfile, DomainPattern, EndpointId, IpPool, IpSetId, IpSetKind,
    IpSetMember, IpVersion, LocalEndpoint, Output, PolicyId,
};

use super::domains::{DomainMembers, NothingLearned};
mod chains;
mod hosts;
mod sets;

use hosts::HostState;
use sets::{check_set, families_of};

use super::build::{Rule, Target};
pub use super::family::{Delta, SetChange};
use super::family::{Family, hash_hooks};
use super::marks::MarkBits;
use super::shared::{Inputs, SharedChains};
use super::{
    RenderConfig, RenderError, SourceSpoofing, dispatch, dns_hold, endpoint, names, static_chains,
};
use crate::desired::{Changes, DesiredState, TableName};

/// What an endpoint's chains reference, for reference counting.
struct EpRefs {
    iface: String,
    policies: Vec<(PolicyId, bool)>,
    profiles: Vec<(String, bool)>,
    /// The shared policy chains its chains go to, `(ingress, name)` (empty without sharing).
    shared: Vec<(bool, String)>,
}

/// Consumes calc-graph outputs and keeps the desired dataplane state for both families.
pub struct Renderer {
    cfg: RenderConfig,
    marks: MarkBits,
    log_prefix: String,
    ip_sets: HashMap<IpSetId, (IpSetKind, BTreeSet<IpSetMember>)>,
    /// Kernel set name -> id, for both families.
    set_ids: HashMap<String, IpSetId>,
    policies: HashMap<PolicyId, ActivePolicy>,
    profiles: HashMap<String, ActiveProfile>,
    endpoints: HashMap<EndpointId, LocalEndpoint>,
    iface_owner: BTreeMap<String, EndpointId>,
    ep_refs: HashMap<EndpointId, EpRefs>,
    policy_refs: HashMap<(PolicyId, bool), usize>,
    profile_refs: HashMap<(String, bool), usize>,
    shared: SharedChains,
    dirty_policies: HashSet<PolicyId>,
    dirty_profiles: HashSet<String>,
    dirty_endpoints: HashSet<EndpointId>,
    dispatch_dirty: bool,
    /// The dispatch trees (from workloads, to workloads), kept between renders.
    dispatch_trees: [dispatch::DispatchTree; 2],
    /// An endpoint with allowed spoofed source prefixes changed: `cali-rpf-skip` is re-rendered.
    rpf_skip_dirty: bool,
    waiting_policies: HashSet<PolicyId>,
    waiting_profiles: HashSet<String>,
    /// IP pools by name; `cali-nat-outgoing` and the pool sets are re-derived when they change.
    pools: BTreeMap<String, IpPool>,
    pools_dirty: bool,
    families: [Family; 2],
    in_sync: bool,
    /// The node's host endpoints and what their chains reference.
    hosts: HostState,
    /// What the DNS learner knows: fills a domain set when it is first created.
    domain_members: Arc<dyn DomainMembers>,
    /// The patterns of each domain set (also in `ip_sets`, as an empty [`IpSetKind::Domain`]).
    domain_patterns: HashMap<IpSetId, Arc<[DomainPattern]>>,
    /// Renders the staged view ([`Renderer::new_staged_view`]) instead of the enforced state.
    staged_view: bool,
}

fn valid_prefix(p: &str) -> bool {
    (1..=14).contains(&p.len()) && names::is_valid_interface_name(p)
}

fn sanitize_log_prefix(p: &str) -> String {
    let mut s: String = p
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || " _@+=:,./-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    s.truncate(27);
    s
}

impl Renderer {
    /// A renderer with the static chains and hooks in place and no endpoints (every `cali`
    /// interface is dropped as unknown).
    pub fn new(cfg: RenderConfig) -> Result<Self, RenderError> {
        let marks = MarkBits::allocate(cfg.mark_mask)?;
        if let Some(p) = cfg.interface_prefixes.iter().find(|p| !valid_prefix(p)) {
            return Err(RenderError::InvalidInterfacePrefix { prefix: p.clone() });
        }
        let mut r = Renderer {
            log_prefix: sanitize_log_prefix(&cfg.log_prefix),
            cfg,
            marks,
            ip_sets: HashMap::new(),
            set_ids: HashMap::new(),
            policies: HashMap::new(),
            profiles: HashMap::new(),
            endpoints: HashMap::new(),
            iface_owner: BTreeMap::new(),
            ep_refs: HashMap::new(),
            policy_refs: HashMap::new(),
            profile_refs: HashMap::new(),
            shared: SharedChains::default(),
            dirty_policies: HashSet::new(),
            dirty_profiles: HashSet::new(),
            dirty_endpoints: HashSet::new(),
            dispatch_dirty: true,
            dispatch_trees: [
                dispatch::DispatchTree::new(true),
                dispatch::DispatchTree::new(false),
            ],
            rpf_skip_dirty: false,
            waiting_policies: HashSet::new(),
            waiting_profiles: HashSet::new(),
            pools: BTreeMap::new(),
            pools_dirty: false,
            families: [Family::new(IpVersion::V4), Family::new(IpVersion::V6)],
            in_sync: false,
            hosts: HostState::default(),
            domain_members: Arc::new(NothingLearned),
            staged_view: false,
            domain_patterns: HashMap::new(),
        };
        for fam in &mut r.families {
            for (name, rules) in static_chains::filter_chains(&r.cfg, &r.marks, fam.version, false)
            {
                fam.set_chain(TableName::Filter, name, rules);
            }
            for (name, rules) in static_chains::nat_chains() {
                fam.set_chain(TableName::Nat, name, rules);
            }
            for (name, rules) in static_chains::raw_chains(&r.cfg, &r.marks, false) {
                fam.set_chain(TableName::Raw, name, rules);
            }
            for (name, rules) in dns_hold::mangle_chains(&r.cfg, fam.version) {
                fam.set_chain(TableName::Mangle, name, rules);
            }
            let hooks = [
                (TableName::Filter, static_chains::filter_hooks(&r.marks)),
                (TableName::Nat, static_chains::nat_hooks()),
                (TableName::Raw, static_chains::raw_hooks()),
                (
                    TableName::Mangle,
                    dns_hold::mangle_hooks(&r.cfg, fam.version),
                ),
            ];
            for (table, list) in hooks {
                fam.add_hooks(hash_hooks(table, list));
            }
        }
        r.flush();
        Ok(r)
    }

    pub fn marks(&self) -> &MarkBits {
        &self.marks
    }

    /// The active policies the renderer holds (their chains exist while an endpoint uses them).
    pub fn policy_ids(&self) -> impl Iterator<Item = &PolicyId> {
        self.policies.keys()
    }

    /// The active profiles the renderer holds.
    pub fn profile_ids(&self) -> impl Iterator<Item = &str> {
        self.profiles.keys().map(String::as_str)
    }

    /// The local endpoints the renderer holds.
    pub fn local_endpoints(&self) -> impl Iterator<Item = &LocalEndpoint> {
        self.endpoints.values()
    }

    /// A renderer of the staged view (Calico's pending policies), never applied to a kernel:
    /// it takes the staged policies' `PolicyUpdated`s and renders each endpoint with its
    /// `staged_tiers` where it has them. The enforced renderer ([`Renderer::new`]) ignores both,
    /// so no staged policy is ever programmed.
    pub fn new_staged_view(cfg: RenderConfig) -> Result<Self, RenderError> {
        let mut r = Renderer::new(cfg)?;
        r.staged_view = true;
        Ok(r)
    }

    /// Whether this renders the staged view ([`Renderer::new_staged_view`]).
    pub fn is_staged_view(&self) -> bool {
        self.staged_view
    }

    /// Whether the graph has reported its initial snapshot complete (`Output::InSync`).
    pub fn in_sync(&self) -> bool {
        self.in_sync
    }

    fn family(&self, v: IpVersion) -> &Family {
        &self.families[usize::from(v == IpVersion::V6)]
    }

    /// Records one graph output. Invalid objects are rejected with an error naming them; an
    /// endpoint that fails validation is removed (its interface then hits "Unknown interface").
    pub fn apply(&mut self, output: Output) -> Result<(), RenderError> {
        match output {
            Output::IpSetCreated { id, kind, members } => {
                check_set(&id, kind, &members)?;
                for v in [IpVersion::V4, IpVersion::V6] {
                    self.set_ids.insert(names::ipset_name(v, &id), id.clone());
                }
                self.ip_sets
                    .insert(id.clone(), (kind, members.iter().cloned().collect()));
                self.mark_set_changed(&id);
                self.dirty_policies.extend(self.waiting_policies.drain());
                self.dirty_profiles.extend(self.waiting_profiles.drain());
            }
            Output::DomainSetCreated { id, patterns } => {
                check_set(&id, IpSetKind::Domain, &[])?;
                for v in [IpVersion::V4, IpVersion::V6] {
                    self.set_ids.insert(names::ipset_name(v, &id), id.clone());
                }
                self.ip_sets
                    .insert(id.clone(), (IpSetKind::Domain, BTreeSet::new()));
                self.domain_patterns.insert(id.clone(), patterns);
                self.mark_set_changed(&id);
                self.dirty_policies.extend(self.waiting_policies.drain());
                self.dirty_profiles.extend(self.waiting_profiles.drain());
            }
            Output::IpSetMembersAdded { id, members }
            | Output::IpSetMembersRemoved { id, members }
                if !self.ip_sets.contains_key(&id) =>
            {
                let _ = members;
                return Err(RenderError::UnknownIpSet { id });
            }
            Output::IpSetMembersAdded { id, members } => {
                let entry = self.ip_sets.get_mut(&id).expect("checked above");
                check_set(&id, entry.0, &members)?;
                let fams = families_of(&members);
                entry.1.extend(members);
                self.mark_set_changed_in(&id, fams);
            }
            Output::IpSetMembersRemoved { id, members } => {
                let entry = self.ip_sets.get_mut(&id).expect("checked above");
                for m in &members {
                    entry.1.remove(m);
                }
                self.mark_set_changed_in(&id, families_of(&members));
            }
            Output::IpSetRemoved(id) => {
                self.ip_sets.remove(&id);
                self.domain_patterns.remove(&id);
                self.mark_set_changed(&id);
            }
            Output::PolicyUpdated(p) if p.id.kind.is_staged() && !self.staged_view => {}
            Output::PolicyRemoved(id) if id.kind.is_staged() && !self.staged_view => {}
            Output::PolicyUpdated(p) => {
                self.dirty_policies.insert(p.id.clone());
                self.policies.insert(p.id.clone(), p);
            }
            Output::PolicyRemoved(id) => {
                self.policies.remove(&id);
                self.dirty_policies.insert(id);
            }
            Output::ProfileUpdated(p) => {
                self.dirty_profiles.insert(p.id.clone());
                self.profiles.insert(p.id.clone(), p);
            }
            Output::ProfileRemoved(id) => {
                self.profiles.remove(&id);
                self.dirty_profiles.insert(id);
            }
            Output::EndpointUpdated(mut ep) => {
                let staged = ep.staged_tiers.take();
                if let (true, Some(tiers)) = (self.staged_view, staged) {
                    ep.tiers = tiers;
                }
                return self.update_endpoint(ep);
            }
            Output::EndpointRemoved(id) => self.remove_endpoint(&id),
            Output::IpPoolUpdated(p) => {
                if self.pools.get(&p.name) != Some(&p) {
                    self.pools.insert(p.name.clone(), p);
                    self.pools_dirty = true;
                }
            }
            Output::IpPoolRemoved(name) => {
                self.pools_dirty |= self.pools.remove(&name).is_some();
            }
            Output::HostEndpointUpdated(h) => return self.update_host_endpoint(h),
            Output::HostEndpointRemoved(name) => self.remove_host_endpoint(&name),
            Output::InSync => self.in_sync = true,
        }
        Ok(())
    }

    /// Applies a batch, collecting the errors (one bad object never stops the others).
    pub fn apply_all(&mut self, outputs: impl IntoIterator<Item = Output>) -> Vec<RenderError> {
        outputs
            .into_iter()
            .filter_map(|o| self.apply(o).err())
            .collect()
    }

    fn update_endpoint(&mut self, ep: LocalEndpoint) -> Result<(), RenderError> {
        let iface = ep.interface_name.clone();
        let err = if !names::is_valid_interface_name(&iface) {
            Some(RenderError::InvalidInterface {
                endpoint: Box::new(ep.id.clone()),
                iface,
            })
        } else {
            match self.iface_owner.get(&iface) {
                Some(other) if *other != ep.id => Some(RenderError::DuplicateInterface {
                    endpoint: Box::new(ep.id.clone()),
                    iface,
                    other: Box::new(other.clone()),
                }),
                _ => None,
            }
        };
        if let Some(e) = err {
            self.remove_endpoint(&ep.id);
            return Err(e);
        }
        let old = self.endpoints.get(&ep.id);
        // `cali-rpf-skip` only holds endpoints with prefixes (re-rendering an unchanged chain is
        // free: the family skips identical rules).
        self.rpf_skip_dirty |= !ep.allow_spoofed_source_prefixes.is_empty()
            || old.is_some_and(|o| !o.allow_spoofed_source_prefixes.is_empty());
        if let Some(old) = old
            && old.interface_name != ep.interface_name
        {
            self.iface_owner.remove(&old.interface_name);
            self.dispatch_dirty = true;
        }
        if self
            .iface_owner
            .insert(ep.interface_name.clone(), ep.id.clone())
            .is_none()
        {
            self.dispatch_dirty = true;
        }
        self.dirty_endpoints.insert(ep.id.clone());
        self.endpoints.insert(ep.id.clone(), ep);
        Ok(())
    }

    fn remove_endpoint(&mut self, id: &EndpointId) {
        if let Some(old) = self.endpoints.remove(id) {
            self.rpf_skip_dirty |= !old.allow_spoofed_source_prefixes.is_empty();
            self.iface_owner.remove(&old.interface_name);
            self.dispatch_dirty = true;
            self.dirty_endpoints.insert(id.clone());
        }
    }

    /// Re-renders everything that changed since the last flush. Returns the objects that could
    /// not be rendered safely (they were rendered fail-closed).
    pub fn flush(&mut self) -> Vec<RenderError> {
        let mut errors = Vec::new();
        let mut touched_policies: HashSet<PolicyId> = std::mem::take(&mut self.dirty_policies);
        let mut touched_profiles: HashSet<String> = std::mem::take(&mut self.dirty_profiles);
        let dirty_policies = touched_policies.clone();
        let dirty_profiles = touched_profiles.clone();

        for id in std::mem::take(&mut self.dirty_endpoints) {
            let old = self.ep_refs.remove(&id);
            let mut new = self.endpoints.get(&id).map(|ep| EpRefs {
                iface: ep.interface_name.clone(),
                policies: ep
                    .tiers
                    .iter()
                    .flat_map(|t| {
                        let i = t.ingress_policies.iter().map(|p| (p.clone(), true));
                        i.chain(t.egress_policies.iter().map(|p| (p.clone(), false)))
                    })
                    .collect(),
                profiles: ep
                    .profile_ids
                    .iter()
                    .flat_map(|p| [(p.clone(), true), (p.clone(), false)])
                    .collect(),
                shared: Vec::new(),
            });
            if let Some(new) = &mut new {
                for k in &new.policies {
                    *self.policy_refs.entry(k.clone()).or_default() += 1;
                    touched_policies.insert(k.0.clone());
                }
                for k in &new.profiles {
                    *self.profile_refs.entry(k.clone()).or_default() += 1;
                    touched_profiles.insert(k.0.clone());
                }
                let ep = &self.endpoints[&id];
                for ingress in [true, false] {
                    let encap = self.cfg.allow_encap_from_workloads;
                    let (name, rules) = if self.cfg.share_chains {
                        // Endpoints with the same policy lists go to one chain, rendered once.
                        let inputs = Inputs::of(ep, ingress);
                        let shared = match self.shared.rendered(&inputs) {
                            Some(name) => name.to_string(),
                            None => {
                                let (name, rules) = endpoint::shared_endpoint_chain(
                                    ep,
                                    ingress,
                                    &self.marks,
                                    encap,
                                    self.cfg.verdict_log(),
                                );
                                // First user (other inputs may render the same rules): the
                                // chain is created in the same flush (and so the same
                                // transaction) as the endpoint chain that goes to it.
                                if self.shared.users(&name) == 0 {
                                    for fam in &mut self.families {
                                        fam.set_chain(
                                            TableName::Filter,
                                            name.clone(),
                                            rules.clone(),
                                        );
                                    }
                                }
                                name
                            }
                        };
                        self.shared.acquire(&shared, inputs);
                        let own = endpoint::goto_shared_chain(ep, ingress, &shared);
                        new.shared.push((ingress, shared));
                        own
                    } else {
                        endpoint::endpoint_chain(
                            ep,
                            ingress,
                            &self.marks,
                            encap,
                            self.cfg.verdict_log(),
                        )
                    };
                    for fam in &mut self.families {
                        fam.set_chain(TableName::Filter, name.clone(), rules.clone());
                    }
                }
            }
            if let Some(old) = old {
                for k in &old.policies {
                    decrement(&mut self.policy_refs, k);
                    touched_policies.insert(k.0.clone());
                }
                for k in &old.profiles {
                    decrement(&mut self.profile_refs, k);
                    touched_profiles.insert(k.0.clone());
                }
                // After the new references were taken: a chain still in use stays untouched.
                for (_, name) in &old.shared {
                    if self.shared.release(name) {
                        for fam in &mut self.families {
                            fam.remove_chain(TableName::Filter, name);
                        }
                    }
                }
                if new.as_ref().is_none_or(|n| n.iface != old.iface) {
                    for fam in &mut self.families {
                        for ingress in [true, false] {
                            fam.remove_chain(
                                TableName::Filter,
                                &names::endpoint_chain_name(&old.iface, ingress),
                            );
                        }
                    }
                }
            }
            if let Some(new) = new {
                self.ep_refs.insert(id, new);
            }
        }

        self.flush_hosts(
            &dirty_policies,
            &dirty_profiles,
            &mut touched_policies,
            &mut touched_profiles,
            &mut errors,
        );

        if std::mem::take(&mut self.dispatch_dirty) {
            let ifaces: Vec<&str> = self.iface_owner.keys().map(String::as_str).collect();
            // The tree is the same in both families: updated once, and only the root and the
            // bins whose interfaces changed are re-rendered.
            let mut update = dispatch::DispatchUpdate::default();
            for tree in &mut self.dispatch_trees {
                let u = tree.update(&ifaces);
                update.set.extend(u.set);
                update.removed.extend(u.removed);
            }
            for fam in &mut self.families {
                for name in &update.removed {
                    fam.remove_chain(TableName::Filter, name);
                }
                for (name, rules) in &update.set {
                    fam.set_chain_if_changed(TableName::Filter, name, rules);
                }
            }
        }

        if std::mem::take(&mut self.rpf_skip_dirty)
            && self.cfg.workload_source_spoofing == SourceSpoofing::Any
        {
            for fam in &mut self.families {
                let rules = static_chains::rpf_skip_rules(self.endpoints.values(), fam.version);
                fam.set_chain(TableName::Raw, static_chains::RPF_SKIP.into(), rules);
            }
        }

        for id in touched_policies {
            for ingress in [true, false] {
                let wanted = self
                    .policy_refs
                    .get(&(id.clone(), ingress))
                    .is_some_and(|n| *n > 0);
                let name = names::policy_chain_name(&id, ingress);
                for fi in 0..2 {
                    let present = self.families[fi].has(TableName::Filter, &name);
                    if wanted && (!present || dirty_policies.contains(&id)) {
                        let v = self.families[fi].version;
                        let rules =
                            self.render_policy(&id, ingress, v, &mut errors, self.cfg.share_chains);
                        self.families[fi].set_chain(TableName::Filter, name.clone(), rules);
                    } else if !wanted && present {
                        self.families[fi].remove_chain(TableName::Filter, &name);
                    }
                }
            }
        }
        for id in touched_profiles {
            for ingress in [true, false] {
                let wanted = self
                    .profile_refs
                    .get(&(id.clone(), ingress))
                    .is_some_and(|n| *n > 0);
                let name = names::profile_chain_name(&id, ingress);
                for fi in 0..2 {
                    let present = self.families[fi].has(TableName::Filter, &name);
                    if wanted && (!present || dirty_profiles.contains(&id)) {
                        let v = self.families[fi].version;
                        let rules = self.render_profile(
                            &id,
                            ingress,
                            v,
                            &mut errors,
                            self.cfg.share_chains,
                        );
                        self.families[fi].set_chain(TableName::Filter, name.clone(), rules);
                    } else if !wanted && present {
                        self.families[fi].remove_chain(TableName::Filter, &name);
                    }
                }
            }
        }
        if std::mem::take(&mut self.pools_dirty) {
            self.render_pools();
        }
        for fi in 0..2 {
            let v = self.families[fi].version;
            for name in std::mem::take(&mut self.families[fi].sets_dirty) {
                if self.families[fi].set_refs.contains_key(&name) {
                    let spec = self.set_spec(v, &name);
                    self.families[fi].state.ip_sets.insert(name, spec);
                } else {
                    self.families[fi].state.ip_sets.remove(&name);
                }
            }
        }
        errors
    }

    /// The full desired state of one family, maintained incrementally: borrowing it costs
    /// nothing (call [`flush`](Self::flush) first).
    pub fn desired_ref(&self, v: IpVersion) -> &DesiredState {
        &self.family(v).state
    }

    /// An owned copy of [`desired_ref`](Self::desired_ref).
    pub fn desired(&self, v: IpVersion) -> DesiredState {
        self.family(v).state.clone()
    }

    /// The names of the chains and sets of family `v` that changed since the previous
    /// `take_changes` or [`take_delta`](Self::take_delta) (the two drain the same log; call
    /// [`flush`](Self::flush) first): what [`Applier::apply_changes`](crate::apply::Applier::apply_changes)
    /// needs to plan only the change.
    pub fn take_changes(&mut self, v: IpVersion) -> Changes {
        let fi = usize::from(v == IpVersion::V6);
        let mut changes = Changes::default();
        for (t, n) in std::mem::take(&mut self.families[fi].changed) {
            changes.chain(t, n);
        }
        changes.sets = std::mem::take(&mut self.families[fi].changed_sets);
        changes
    }

    /// What changed in family `v` since the previous call (or [`take_changes`](Self::take_changes);
    /// call [`flush`](Self::flush) first), with the new content.
    pub fn take_delta(&mut self, v: IpVersion) -> Delta {
        let changes = self.take_changes(v);
        let state = &self.family(v).state;
        let chains = changes
            .chains
            .into_iter()
            .flat_map(|(t, names)| names.into_iter().map(move |n| (t, n)))
            .map(|(t, n)| {
                let rules = state
                    .tables
                    .get(&t)
                    .and_then(|tb| tb.chains.get(&n))
                    .cloned();
                (t, n, rules)
            })
            .collect();
        let ip_sets = changes
            .sets
            .into_iter()
            .map(|name| {
                let spec = state.ip_sets.get(&name).cloned();
                (name, spec)
            })
            .collect();
        Delta {
            family: v,
            chains,
            ip_sets,
        }
    }

    /// The renderer's rules of one chain (for inspection, tests and the evaluator).
    pub fn chain(&self, v: IpVersion, table: TableName, name: &str) -> Option<&[Rule]> {
        self.family(v)
            .chains
            .get(&(table, name.to_string()))
            .map(Vec::as_slice)
    }

    /// Names of all chains of a family and table.
    pub fn chain_names(&self, v: IpVersion, table: TableName) -> Vec<&str> {
        self.family(v)
            .chains
            .keys()
            .filter(|(t, _)| *t == table)
            .map(|(_, n)| n.as_str())
            .collect()
    }

    /// The shared policy chain an endpoint's ingress (`cali-tw-`) or egress (`cali-fw-`) chain
    /// goes to; `None` without sharing or for an unknown endpoint.
    pub fn shared_chain(&self, ep: &EndpointId, ingress: bool) -> Option<&str> {
        let refs = self.ep_refs.get(ep)?;
        refs.shared
            .iter()
            .find(|(i, _)| *i == ingress)
            .map(|(_, n)| n.as_str())
    }

    /// How many endpoint chains go to the shared chain `name` (0 if it does not exist).
    pub fn shared_chain_users(&self, name: &str) -> usize {
        self.shared.users(name)
    }

    /// How many shared policy chains exist (each is in both families).
    pub fn shared_chain_count(&self) -> usize {
        self.shared.len()
    }
}

fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, k: &K) {
    if let Some(n) = map.get_mut(k) {
        *n -= 1;
        if *n == 0 {
            map.remove(k);
        }
    }
}

fn fail_closed(comment: &str, why: &str) -> Vec<Rule> {
    vec![
        Rule::new(vec![], Target::Drop)
            .with_comment(comment)
            .with_comment(why),
    ]
}
