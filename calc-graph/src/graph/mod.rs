//! The calculation graph: datastore updates in, ordered dataplane updates out.
//!
//! The agent feeds every resource of the cluster ([`Update::Resource`], then [`Update::InSync`]
//! once the initial snapshot is loaded) and calls [`CalcGraph::flush`] to get the batched,
//! ordered [`Output`]s for its own node. Pure and synchronous: no I/O, no threads.
//!
//! What it computes (Felix's `felix/calc`, felix-reference §8):
//! * validation: a resource arrives validated once upstream (`Update::Valid`, carrying a
//!   [`Validated`](crate::model::Validated), as the agent and `felixrs render` send it); through
//!   `Update::Resource` (tests, deletions) it is still checked here: one
//!   whose `validate()` fails, or whose body does not match its key, is treated as deleted and the
//!   error is kept for [`CalcGraph::take_errors`];
//! * label inheritance ([`labels`]): endpoints and network sets inherit their profiles'
//!   `labelsToApply` (own labels win, then the first profile); workload endpoints lose any
//!   `pcns.`/`pcsa.` labels of their own and get `projectcalico.org/namespace`,
//!   `projectcalico.org/orchestrator` and `projectcalico.org/serviceaccount` from their spec;
//! * active rules: a policy is active iff its (namespace-scoped) selector matches a local
//!   endpoint (`spec.node` == this node; workload or host endpoint); a profile is active iff a
//!   local endpoint names it; a missing profile is active as deny-all (fail closed), except
//!   Calico's built-in `projectcalico-default-allow` (allow-all, unless a stored profile of that
//!   name replaces it);
//! * rule scanning ([`rules`]) of active policies and profiles into IP set ids;
//! * IP sets ([`ipsets`]): one per selector / named port used by an active rule, with members
//!   from every endpoint and network set in the cluster; a set no rule needs any more lingers
//!   (bounded, [`CalcGraph::set_ip_set_lingering`]) so that a flapping policy is cheap; one
//!   domain set (`d:<hash>`, FQDN policy) per distinct `destination.domains` list of an active
//!   egress Allow rule, with its patterns and no members (the agent learns those from DNS),
//!   referenced while a policy's rules need it ([`policies`]);
//! * per local endpoint, the ordered tiers and policies per direction ([`resolver`]);
//! * IP pools (every valid pool, disabled ones included, as Felix's `IPAMPoolUpdate`s: the
//!   dataplane's nat-outgoing needs every pool on every node);
//! * output sequencing and coalescing ([`sequencer`]), asking the graph's current state
//!   ([`desired`]).
//!
//! Everything is incremental: selectors are indexed by label posting lists ([`index`]), so a pod
//! change evaluates only the selectors that mention one of its labels (plus the few that cannot
//! be indexed, such as `all()` or `!has(x)`). The cost of a change is proportional to what it
//! changes: a relabel that only moves a pod between IP sets costs microseconds; one that makes
//! a policy active whose rules need a new IP set costs that set's size.
//!
//! Invariants (checked by `tests/graph_prop.rs` against a brute-force model): after any update
//! sequence, the state obtained by applying every flushed batch equals the state computed from
//! scratch; no batch references an IP set, policy or profile before its creation or after its
//! removal; every active policy's sets are active and every local endpoint's policies and
//! profiles are active.
//!
//! Scope decisions:
//! * Workload endpoints without addresses are ignored (Felix's update processor filters them).
//! * Host endpoints contribute their `expectedIPs` to IP sets matched by their labels. Those of
//!   this node (`spec.node`) with an `interfaceName` (a name, or `*` for all interfaces) are also
//!   local endpoints ([`crate::proto::LocalHostEndpoint`], emitted in the endpoint group of a
//!   batch): the policies selecting them are active, and their tiers are split as Felix splits
//!   them: normal policies (`tiers`), the normal ones with `applyOnForward` again
//!   (`forward_tiers`), `doNotTrack` ones (`untracked_tiers`) and `preDNAT` ones, ingress only
//!   (`pre_dnat_tiers`). The iptables renderer programs the filter table from the first two;
//!   the untracked and pre-DNAT lists are recorded for the raw/mangle step and not rendered yet.
//!   A host endpoint of this node without `interfaceName` is local too, with the interface
//!   [`crate::proto::BY_EXPECTED_IPS`]: the renderer resolves it by `expectedIPs` against the
//!   host's interfaces (data the agent passes in), as Felix's endpoint manager does. `doNotTrack` and `preDNAT` policies never appear in a
//!   workload endpoint's tiers.
//! * Staged policies ([`staged`]) are active policies of their own staged kinds that only the
//!   endpoints' staged view (`staged_tiers`) names; the enforced tiers never do. Other kinds are
//!   ignored.
//! * A field the agent does not enforce never widens a rule: a rule with a field of
//!   [`crate::model::UNENFORCED_RULE_FIELDS`] (`http`, `services`, `source.domains`), a
//!   `destination.domains` outside an egress Allow rule or with a bad name
//!   ([`crate::model::Rule::rejected_domain_fields`]), or an unknown field fails safe: an Allow
//!   rule is not rendered (nothing is opened), a Deny/Log rule is rendered with only its
//!   enforced matches (it denies more), a Pass rule becomes a Deny of them. Each is kept as a
//!   [`FailedSafeRule`] for [`CalcGraph::failed_safe_rules`] while the policy stands.
//! * Before `InSync`, `flush` returns nothing (as Felix's PolicyResolver); the first flush after
//!   it returns the complete state followed by `Output::InSync`.

mod convert;
mod desired;
mod error;
mod index;
mod intern;
mod ipsets;
mod labels;
mod policies;
mod remote;
mod resolver;
mod rules;
mod sequencer;
mod staged;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::{DEFAULT_ALLOW_PROFILE, Kind, Profile, Resource, ResourceKey, Validated};
use crate::proto::{
    ActivePolicy, ActiveProfile, IpPool, IpSetKind, IpSetMember, LocalEndpoint, Output, PolicyId,
};

use convert::{
    LocalEp, LocalId, build_policy, check, hep_item, net_set_item, str_pairs, wep_item, wep_labels,
};
use index::{MatchEvent, SelId, SelectorIndex};
use intern::{FxMap, FxSet, Interner};
use ipsets::IpSets;
use labels::{ItemData, ItemId, LabelStore};
use resolver::{PolicyRef, Tiers};
use rules::ScannedRules;
use sequencer::{Desired, Sequencer};

pub use error::{GraphError, SelectorFieldError};
pub use remote::LABEL_CLUSTER;
pub use rules::{FailedSafeRule, domain_set_id, named_port_set_id};
pub use staged::{StagedK8sConverter, StagedK8sError};

/// One input of the graph.
// The agent's API is fixed (`value: Option<Resource>`); `InSync` is rare, so its size is moot.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Update {
    /// A resource was created or changed (`Some`), or deleted (`None`).
    Resource {
        key: ResourceKey,
        value: Option<Resource>,
    },
    /// A resource of the remote cluster `cluster` (federation, see [`remote`]): workload endpoints,
    /// profiles and network sets join IP set membership under the cluster's name and are never
    /// local; other kinds are ignored.
    Remote {
        cluster: String,
        key: ResourceKey,
        value: Option<Resource>,
    },
    /// A resource created or changed, validated once on its way in ([`Validated`]): taken
    /// without checking it again.
    Valid(Validated),
    /// A remote cluster's resource (as [`Update::Remote`]), validated once on its way in.
    RemoteValid { cluster: String, value: Validated },
    /// The initial snapshot is complete.
    InSync,
}

/// Counters of the graph's current state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Workload endpoints on this node.
    pub local_endpoints: usize,
    /// Host endpoints of this node with an interface (named or `*`).
    pub local_host_endpoints: usize,
    /// Policies matching at least one local endpoint.
    pub active_policies: usize,
    /// Profiles named by at least one local endpoint (including missing ones).
    pub active_profiles: usize,
    /// Active IP sets.
    pub ip_sets: usize,
    /// Members over all active IP sets.
    pub ip_set_members: usize,
    /// Inactive IP sets kept up to date in case a policy needs them again.
    pub lingering_ip_sets: usize,
    /// Labelled items in the cluster (endpoints and network sets).
    pub items: usize,
    /// Valid policies known (active or not).
    pub policies: usize,
    /// Selectors that cannot be indexed and are evaluated on every item change (policy index,
    /// IP set index).
    pub unindexed_selectors: (usize, usize),
    /// Selector evaluations performed so far (a cost counter).
    pub selector_evaluations: u64,
    /// Times the selector indices re-chose their covers (once at in-sync, then as labels drift).
    pub index_reoptimizations: u64,
}

struct PolicyState {
    id: PolicyId,
    sel: SelId,
    order: Option<f64>,
    ingress: bool,
    egress: bool,
    untracked: bool,
    pre_dnat: bool,
    apply_on_forward: bool,
    rules: Arc<ScannedRules>,
}

/// See the module docs.
pub struct CalcGraph {
    node: String,
    interner: Interner,
    store: LabelStore,
    /// IP-set selectors against every item.
    global: SelectorIndex,
    /// Policy selectors against local endpoints.
    local: SelectorIndex,
    local_eps: FxMap<ItemId, LocalEp>,
    ep_items: FxMap<LocalId, ItemId>,
    policies: FxMap<ResourceKey, PolicyState>,
    policies_by_sel: FxMap<SelId, Vec<ResourceKey>>,
    policy_keys: FxMap<PolicyId, ResourceKey>,
    active_policies: FxSet<ResourceKey>,
    profiles: FxMap<String, Arc<ScannedRules>>,
    profile_users: FxMap<String, u32>,
    /// Rules whose IP sets are referenced on behalf of each active profile.
    active_profiles: FxMap<String, Arc<ScannedRules>>,
    deny_all: Arc<ScannedRules>,
    /// Calico's built-in `projectcalico-default-allow` (allow all both ways), which the datastore
    /// never holds: Calico's syncer always provides it, for automatic host endpoints.
    default_allow: Arc<ScannedRules>,
    tiers: Tiers,
    ipsets: IpSets,
    /// Valid IP pools by name (every pool, enabled or not: Felix masquerades from disabled ones).
    pools: BTreeMap<String, IpPool>,
    seq: Sequencer,
    errors: Vec<(ResourceKey, GraphError)>,
    /// Rules that failed safe, per policy/profile (current state, not events).
    failed_safe: BTreeMap<ResourceKey, Vec<FailedSafeRule>>,
    /// Item changes (both indices) when covers were last re-chosen, and how often that happened.
    changes_at_reoptimize: u64,
    reoptimizations: u64,
    reoptimize_min_changes: u64,
    /// Staged policies (Set or Delete) by key, with the enforced policy each shadows.
    staged: FxMap<ResourceKey, ResourceKey>,
    /// Enforced policies shadowed by at least one staged policy, with how many.
    shadows: FxMap<ResourceKey, u32>,
    staged_k8s: Option<StagedK8sConverter>,
}

impl CalcGraph {
    /// A graph for the node called `node_name` (compared with endpoints' `spec.node`).
    pub fn new(node_name: impl Into<String>) -> Self {
        CalcGraph {
            node: node_name.into(),
            interner: Interner::default(),
            store: LabelStore::default(),
            global: SelectorIndex::default(),
            local: SelectorIndex::default(),
            local_eps: FxMap::default(),
            ep_items: FxMap::default(),
            policies: FxMap::default(),
            policies_by_sel: FxMap::default(),
            policy_keys: FxMap::default(),
            active_policies: FxSet::default(),
            profiles: FxMap::default(),
            profile_users: FxMap::default(),
            active_profiles: FxMap::default(),
            deny_all: Arc::new(rules::deny_all()),
            default_allow: Arc::new(rules::default_allow()),
            tiers: Tiers::default(),
            ipsets: IpSets::default(),
            pools: BTreeMap::new(),
            seq: Sequencer::default(),
            errors: Vec::new(),
            failed_safe: BTreeMap::new(),
            changes_at_reoptimize: 0,
            reoptimizations: 0,
            reoptimize_min_changes: index::REOPTIMIZE_MIN_CHANGES,
            staged: FxMap::default(),
            shadows: FxMap::default(),
            staged_k8s: None,
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// Applies one update. Never panics on bad input: invalid resources are treated as deleted
    /// and reported through [`CalcGraph::take_errors`].
    pub fn apply(&mut self, u: Update) {
        match u {
            Update::InSync => {
                if !self.seq.in_sync {
                    self.seq.in_sync = true;
                    // Posting-list sizes are known now: re-choose the selector index terms.
                    self.reoptimize_indices();
                }
            }
            Update::Resource { key, value } => {
                let value = match value {
                    Some(r) => match check(&key, &r) {
                        Ok(()) => Some(r),
                        Err(msg) => {
                            self.errors.push((key.clone(), msg));
                            None
                        }
                    },
                    None => None,
                };
                self.apply_resource(&key, value);
            }
            Update::Valid(v) => {
                let (key, r) = v.into_parts();
                self.apply_resource(&key, Some(r));
            }
            Update::Remote {
                cluster,
                key,
                value,
            } => self.apply_remote(&cluster, key, value, false),
            Update::RemoteValid { cluster, value } => {
                let (key, r) = value.into_parts();
                self.apply_remote(&cluster, key, Some(r), true);
            }
        }
    }

    /// The outputs accumulated since the last flush, ordered (see `proto` and [`sequencer`]).
    /// Empty before `InSync`.
    pub fn flush(&mut self) -> Vec<Output> {
        if self.seq.in_sync {
            let drift = self.global.changes + self.local.changes - self.changes_at_reoptimize;
            if drift >= (self.store.len() as u64).max(self.reoptimize_min_changes) {
                self.reoptimize_indices();
            }
        }
        let mut seq = std::mem::take(&mut self.seq);
        let out = seq.flush(&*self);
        self.seq = seq;
        out
    }

    /// Re-chooses both indices' covers from the current posting-list sizes (matches unchanged).
    /// The policy index takes the cluster-wide one as its prior, so it goes second.
    fn reoptimize_indices(&mut self) {
        self.global.reoptimize(&mut self.interner, None);
        self.local
            .reoptimize(&mut self.interner, Some(&self.global));
        self.changes_at_reoptimize = self.global.changes + self.local.changes;
        self.reoptimizations += 1;
    }

    /// After the initial snapshot, covers are re-chosen once items have changed as many times as
    /// there are items, and at least `n` times (default 1024). Matches never depend on it: this
    /// trades a re-choice now and then against selector evaluations per change.
    pub fn set_reoptimize_min_changes(&mut self, n: u64) {
        self.reoptimize_min_changes = n.max(1);
    }

    /// Bounds how many unused IP sets (and members over them) are kept up to date after their
    /// last policy went away, so that a policy flapping in and out of use does not rebuild them
    /// from scratch. `(0, 0)` disables lingering. Default: 64 sets, 100,000 members.
    pub fn set_ip_set_lingering(&mut self, max_sets: usize, max_members: usize) {
        self.ipsets.limits = (max_sets, max_members);
    }

    /// Whether a flush would return something.
    pub fn has_pending(&self) -> bool {
        self.seq.in_sync && self.seq.has_pending()
    }

    /// Errors recorded since the last call: (resource, why), e.g. validation failures.
    pub fn take_errors(&mut self) -> Vec<(ResourceKey, GraphError)> {
        std::mem::take(&mut self.errors)
    }

    /// Every policy or profile (of the whole cluster, active or not) with rules that failed safe
    /// because of a field the dataplane does not enforce or know, in key order.
    pub fn failed_safe_rules(&self) -> impl Iterator<Item = (&ResourceKey, &FailedSafeRule)> {
        self.failed_safe
            .iter()
            .flat_map(|(k, rules)| rules.iter().map(move |r| (k, r)))
    }

    /// The failed-safe rules of one policy or profile.
    pub fn failed_safe_rules_of(&self, key: &ResourceKey) -> &[FailedSafeRule] {
        self.failed_safe.get(key).map_or(&[], Vec::as_slice)
    }

    fn set_failed_safe(&mut self, key: &ResourceKey, rules: Vec<FailedSafeRule>) {
        if rules.is_empty() {
            self.failed_safe.remove(key);
        } else {
            self.failed_safe.insert(key.clone(), rules);
        }
    }

    pub fn stats(&self) -> GraphStats {
        GraphStats {
            local_endpoints: self.local_eps.len() - self.local_host_endpoints(),
            local_host_endpoints: self.local_host_endpoints(),
            active_policies: self.active_policies.len(),
            active_profiles: self.active_profiles.len(),
            ip_sets: self.ipsets.len(),
            ip_set_members: self.ipsets.member_count(),
            lingering_ip_sets: self.ipsets.lingering(),
            items: self.store.len(),
            policies: self.policies.len(),
            unindexed_selectors: (self.local.unindexed_count(), self.global.unindexed_count()),
            selector_evaluations: self.local.evaluations + self.global.evaluations,
            index_reoptimizations: self.reoptimizations,
        }
    }

    fn local_host_endpoints(&self) -> usize {
        self.local_eps
            .values()
            .filter(|e| matches!(e.id, LocalId::Host(_)))
            .count()
    }

    fn apply_resource(&mut self, key: &ResourceKey, value: Option<Resource>) {
        match key.kind {
            Kind::WorkloadEndpoint => {
                let wep = match value {
                    Some(Resource::WorkloadEndpoint(w)) if !w.spec.ip_networks.is_empty() => {
                        Some(w)
                    }
                    _ => None,
                };
                match wep {
                    Some(mut w) => {
                        let (parents, data, local) = wep_item(key, &mut w, &self.node);
                        self.upsert_item(key, &wep_labels(key, &w), parents, data, local);
                    }
                    None => self.remove_item(key),
                }
            }
            Kind::HostEndpoint => match value {
                Some(Resource::HostEndpoint(h)) => {
                    let (parents, data, local) = hep_item(key, &h, &self.node);
                    self.upsert_item(key, &str_pairs(&h.metadata.labels), parents, data, local);
                }
                _ => self.remove_item(key),
            },
            Kind::NetworkSet | Kind::GlobalNetworkSet => {
                match value.as_ref().and_then(|r| net_set_item(key, r)) {
                    Some((labels, parents, data)) => {
                        self.upsert_item(key, &labels, parents, data, None)
                    }
                    None => self.remove_item(key),
                }
            }
            Kind::Profile => {
                let p = match value {
                    Some(Resource::Profile(p)) => Some(p),
                    _ => None,
                };
                self.apply_profile(key, p);
            }
            Kind::NetworkPolicy | Kind::GlobalNetworkPolicy => {
                let draft = value.and_then(|r| match build_policy(key, r) {
                    Ok((draft, failed_safe)) => {
                        self.set_failed_safe(key, failed_safe);
                        Some(draft)
                    }
                    Err(e) => {
                        self.errors.push((key.clone(), e));
                        None
                    }
                });
                if draft.is_none() {
                    self.set_failed_safe(key, Vec::new());
                }
                self.apply_policy(key, draft);
            }
            Kind::Tier => {
                let spec = match value {
                    Some(Resource::Tier(t)) => Some(t.spec),
                    _ => None,
                };
                self.tiers.set(&key.name, spec);
                let ids: Vec<LocalId> = self.local_eps.values().map(|e| e.id.clone()).collect();
                for id in ids {
                    self.seq.endpoint_dirty(&id);
                }
            }
            Kind::IpPool => {
                let pool = match value {
                    Some(Resource::IpPool(p)) => p.spec.cidr().map(|cidr| IpPool {
                        name: key.name.clone(),
                        cidr,
                        masquerade: p.spec.nat_outgoing,
                        load_balancer_only: p.spec.is_load_balancer_only(),
                    }),
                    _ => None,
                };
                match pool {
                    Some(p) => {
                        self.pools.insert(key.name.clone(), p);
                    }
                    None => {
                        self.pools.remove(&key.name);
                    }
                }
                self.seq.pool_dirty(&key.name);
            }
            Kind::StagedNetworkPolicy
            | Kind::StagedGlobalNetworkPolicy
            | Kind::StagedKubernetesNetworkPolicy => self.apply_staged(key, value),
        }
    }

    // --- items ---------------------------------------------------------------------------

    fn upsert_item(
        &mut self,
        key: &ResourceKey,
        labels: &[(&str, &str)],
        parents: Vec<String>,
        data: ItemData,
        local: Option<LocalEp>,
    ) {
        let ch = self
            .store
            .upsert(&mut self.interner, key, labels, parents, data);
        let id = ch.id;
        let data_changed = ch.old_data.as_ref() != Some(&self.store.item(id).data);
        let mut events = Vec::new();
        if data_changed {
            // Disjoint fields: the match lists are read in place, not copied.
            if let Some(old) = &ch.old_data {
                let old_matches = self.global.item_matches(id);
                self.ipsets
                    .contribute(old_matches, old, false, &mut self.seq);
            }
            let item = self.store.item(id);
            self.global
                .upsert_item(&self.interner, id, &item.effective, &mut events);
            let new_matches = self.global.item_matches(id);
            self.ipsets
                .contribute(new_matches, &item.data, true, &mut self.seq);
        } else {
            let item = self.store.item(id);
            self.global
                .upsert_item(&self.interner, id, &item.effective, &mut events);
            self.ipsets.on_matches(&events, &self.store, &mut self.seq);
        }
        self.set_local(id, local);
        if let Some(old) = ch.old_labels {
            LabelStore::release(&mut self.interner, old);
        }
    }

    fn remove_item(&mut self, key: &ResourceKey) {
        let Some(id) = self.store.id(key) else { return };
        self.set_local(id, None);
        let mut events = Vec::new();
        let matches = self.global.item_matches(id);
        self.ipsets
            .contribute(matches, &self.store.item(id).data, false, &mut self.seq);
        self.global.remove_item(id, &mut events);
        if let Some((_, labels, _)) = self.store.remove(&mut self.interner, key) {
            LabelStore::release(&mut self.interner, labels);
        }
    }

    /// Makes item `id` a local endpoint (`Some`) or not (`None`), updating the policy index,
    /// profile references and dirty endpoints.
    fn set_local(&mut self, id: ItemId, local: Option<LocalEp>) {
        let old = self.local_eps.remove(&id);
        if old.is_none() && local.is_none() {
            return;
        }
        let mut events = Vec::new();
        if let Some(o) = &old {
            self.seq.endpoint_dirty(&o.id);
            if local.as_ref().map(|n| &n.id) != Some(&o.id) {
                self.ep_items.remove(&o.id);
            }
        }
        match &local {
            Some(n) => {
                let item = self.store.item(id);
                self.local
                    .upsert_item(&self.interner, id, &item.effective, &mut events);
                self.ep_items.insert(n.id.clone(), id);
                self.seq.endpoint_dirty(&n.id);
            }
            None => self.local.remove_item(id, &mut events),
        }
        let new_profiles = local
            .as_ref()
            .map(|n| n.profiles.clone())
            .unwrap_or_default();
        if let Some(n) = local {
            self.local_eps.insert(id, n);
        }
        for p in &new_profiles {
            self.profile_ref(p, true);
        }
        for p in old.map(|o| o.profiles).unwrap_or_default() {
            self.profile_ref(&p, false);
        }
        self.on_local_events(&events);
    }

    fn on_local_events(&mut self, events: &[MatchEvent]) {
        let mut sels: Vec<SelId> = Vec::with_capacity(events.len());
        for ev in events {
            if let Some(ep) = self.local_eps.get(&ev.item) {
                self.seq.endpoint_dirty(&ep.id);
            }
            sels.push(ev.sel);
        }
        sels.sort_unstable();
        sels.dedup();
        for sel in sels {
            let keys = self.policies_by_sel.get(&sel).cloned().unwrap_or_default();
            for key in keys {
                self.sync_policy_activity(&key);
            }
        }
    }

    /// Re-indexes an item whose effective labels changed through a profile.
    fn relabel_item(&mut self, id: ItemId) {
        let mut events = Vec::new();
        let item = self.store.item(id);
        self.global
            .upsert_item(&self.interner, id, &item.effective, &mut events);
        self.ipsets.on_matches(&events, &self.store, &mut self.seq);
        if self.local_eps.contains_key(&id) {
            events.clear();
            let item = self.store.item(id);
            self.local
                .upsert_item(&self.interner, id, &item.effective, &mut events);
            self.on_local_events(&events);
        }
    }

    // --- profiles ------------------------------------------------------------------------

    fn apply_profile(&mut self, key: &ResourceKey, p: Option<Profile>) {
        let name = key.name.clone();
        let mut labels = BTreeMap::new();
        let rules = match p {
            Some(p) => match rules::scan_rules(&p.spec.ingress, &p.spec.egress, None) {
                Ok(r) => {
                    self.set_failed_safe(key, r.failed_safe.clone());
                    labels = p.spec.labels_to_apply;
                    Some(Arc::new(r))
                }
                Err(e) => {
                    self.errors.push((key.clone(), e.into()));
                    None
                }
            },
            None => None,
        };
        if rules.is_none() {
            self.set_failed_safe(key, Vec::new());
        }
        match rules {
            Some(r) => self.profiles.insert(name.clone(), r),
            None => self.profiles.remove(&name),
        };
        if self.active_profiles.contains_key(&name) {
            let new = self.profile_rules(&name);
            let old = self.active_profiles.insert(name.clone(), new.clone());
            self.swap_set_refs(Some(&new), old.as_deref());
            self.seq.profile_dirty(&name);
        }
        self.set_profile_labels(&name, &labels);
    }

    /// Sets the labels a profile gives its endpoints and network sets, relabelling them.
    fn set_profile_labels(&mut self, name: &str, labels: &BTreeMap<String, String>) {
        let changed = self
            .store
            .set_profile_labels(&mut self.interner, name, labels);
        for ch in changed {
            self.relabel_item(ch.id);
            if let Some(old) = ch.old_labels {
                LabelStore::release(&mut self.interner, old);
            }
        }
    }

    /// A profile's rules: as stored; else, for [`DEFAULT_ALLOW_PROFILE`], Calico's built-in
    /// allow-all; else deny-all (a missing profile fails closed).
    fn profile_rules(&self, name: &str) -> Arc<ScannedRules> {
        match self.profiles.get(name) {
            Some(r) => r.clone(),
            None if name == DEFAULT_ALLOW_PROFILE => self.default_allow.clone(),
            None => self.deny_all.clone(),
        }
    }

    fn profile_ref(&mut self, name: &str, add: bool) {
        let users = self.profile_users.entry(name.to_string()).or_insert(0);
        if add {
            *users += 1;
            if *users == 1 {
                let rules = self.profile_rules(name);
                self.swap_set_refs(Some(&rules), None);
                self.active_profiles.insert(name.to_string(), rules);
                self.seq.profile_dirty(name);
            }
        } else {
            *users -= 1;
            if *users == 0 {
                self.profile_users.remove(name);
                if let Some(rules) = self.active_profiles.remove(name) {
                    self.swap_set_refs(None, Some(&rules));
                }
                self.seq.profile_dirty(name);
            }
        }
    }
}
