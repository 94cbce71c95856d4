//! The output buffer (Felix's `EventSequencer`): coalesces changes and emits them in an order that
//! never leaves the dataplane inconsistent.
//!
//! The sequencer remembers what it has *emitted* (the dataplane's view) and which objects are
//! *dirty*. On flush it compares each dirty object's desired state (asked from the graph through
//! [`Desired`]) with what was emitted and emits only the difference, so an object appears at most
//! once per flush (last state wins) and an object created and deleted between two flushes emits
//! nothing. IP set members are tracked as deltas against the emitted membership: an add cancels a
//! pending remove of the same member and vice versa.
//!
//! Order of a flushed batch (see `proto`): `IpSetCreated` and `DomainSetCreated`, member deltas, `PolicyUpdated`,
//! `ProfileUpdated`, `EndpointUpdated` / `HostEndpointUpdated` (workloads first), then
//! `EndpointRemoved` / `HostEndpointRemoved`, `ProfileRemoved`, `PolicyRemoved`,
//! `IpSetRemoved`, then `IpPoolUpdated`, `IpPoolRemoved`, and `InSync` once. Within a group, outputs are sorted by id. Because the graph's
//! desired state is closed (every active policy's sets are active, every local endpoint's policies
//! and profiles are active), creations-before-updates-before-removals means no output references
//! anything not yet created or already removed.
//!
//! Before the `InSync` input, [`Sequencer::flush`] returns nothing and keeps accumulating, as
//! Felix's calculation graph sends nothing before the datastore is in sync; the first flush after
//! it returns the complete state followed by `Output::InSync`.

use std::sync::Arc;

use super::intern::{FxMap, FxSet};

use super::convert::LocalId;
use crate::proto::{
    ActivePolicy, ActiveProfile, DomainPattern, IpPool, IpSetId, IpSetKind, IpSetMember,
    LocalEndpoint, LocalHostEndpoint, Output, PolicyId,
};

/// The desired (or emitted) state of a local endpoint.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum EpState {
    Workload(LocalEndpoint),
    Host(LocalHostEndpoint),
}

/// The graph's current desired state, queried on flush.
pub(crate) trait Desired {
    /// Kind and full sorted membership of an active set, `None` if inactive.
    fn ip_set(&self, id: &str) -> Option<(IpSetKind, Arc<[IpSetMember]>)>;
    fn ip_set_active(&self, id: &str) -> bool;
    /// The patterns of an active domain set, `None` for any other id.
    fn domain_patterns(&self, id: &str) -> Option<Arc<[DomainPattern]>>;
    fn policy(&self, id: &PolicyId) -> Option<ActivePolicy>;
    fn profile(&self, id: &str) -> Option<ActiveProfile>;
    fn endpoint(&self, id: &LocalId) -> Option<EpState>;
    fn ip_pool(&self, name: &str) -> Option<IpPool>;
}

/// What happened to an IP set since the last flush.
enum Pending {
    /// Member changes against the emitted membership (nothing is tracked for a set that has not
    /// been emitted: the flush sends its full membership).
    Deltas {
        added: FxSet<IpSetMember>,
        removed: FxSet<IpSetMember>,
    },
    /// The emitted set was deactivated; `emitted` (sorted) is what the dataplane holds. If the set
    /// is active again at flush time, the flush diffs its membership against this.
    Replaced { emitted: Vec<IpSetMember> },
}

impl Default for Pending {
    fn default() -> Self {
        Pending::Deltas {
            added: FxSet::default(),
            removed: FxSet::default(),
        }
    }
}

#[derive(Default)]
pub(crate) struct Sequencer {
    /// The `InSync` input has been seen.
    pub in_sync: bool,
    sent_in_sync: bool,
    emitted_sets: FxSet<IpSetId>,
    dirty_sets: FxMap<IpSetId, Pending>,
    emitted_policies: FxMap<PolicyId, ActivePolicy>,
    dirty_policies: FxSet<PolicyId>,
    emitted_profiles: FxMap<String, ActiveProfile>,
    dirty_profiles: FxSet<String>,
    emitted_endpoints: FxMap<LocalId, EpState>,
    dirty_endpoints: FxSet<LocalId>,
    emitted_pools: FxMap<String, IpPool>,
    dirty_pools: FxSet<String>,
}

impl Sequencer {
    fn pending(&mut self, id: &IpSetId) -> &mut Pending {
        if !self.dirty_sets.contains_key(id) {
            self.dirty_sets.insert(id.clone(), Pending::default());
        }
        self.dirty_sets.get_mut(id).expect("just inserted")
    }

    /// Whether the dataplane has been told about the set.
    pub(crate) fn is_emitted(&self, id: &str) -> bool {
        self.emitted_sets.contains(id)
    }

    /// A set became active (or its state otherwise needs a look at flush time).
    pub(crate) fn set_dirty(&mut self, id: &IpSetId) {
        self.pending(id);
    }

    /// Members whose reference count went 0 → 1.
    pub(crate) fn members_added(&mut self, id: &IpSetId, members: Vec<IpSetMember>) {
        let emitted = self.emitted_sets.contains(id);
        if let Pending::Deltas { added, removed } = self.pending(id)
            && emitted
        {
            for m in members {
                if !removed.remove(&m) {
                    added.insert(m);
                }
            }
        }
    }

    /// Members whose reference count went 1 → 0.
    pub(crate) fn members_removed(&mut self, id: &IpSetId, members: Vec<IpSetMember>) {
        let emitted = self.emitted_sets.contains(id);
        if let Pending::Deltas { added, removed } = self.pending(id)
            && emitted
        {
            for m in members {
                if !added.remove(&m) {
                    removed.insert(m);
                }
            }
        }
    }

    /// The set was deactivated; `members` is its membership at that point (only needed, and
    /// only built by the caller, when [`Sequencer::is_emitted`]).
    pub(crate) fn set_deactivated(&mut self, id: &IpSetId, members: Vec<IpSetMember>) {
        let emitted = self.emitted_sets.contains(id);
        let p = self.pending(id);
        if !emitted {
            *p = Pending::default();
            return;
        }
        if let Pending::Deltas { added, removed } = p {
            let mut dp: Vec<IpSetMember> = members
                .into_iter()
                .filter(|m| !added.contains(m))
                .chain(removed.drain())
                .collect();
            dp.sort_unstable();
            *p = Pending::Replaced { emitted: dp };
        }
    }

    pub(crate) fn policy_dirty(&mut self, id: &PolicyId) {
        if !self.dirty_policies.contains(id) {
            self.dirty_policies.insert(id.clone());
        }
    }

    pub(crate) fn profile_dirty(&mut self, id: &str) {
        if !self.dirty_profiles.contains(id) {
            self.dirty_profiles.insert(id.to_string());
        }
    }

    pub(crate) fn endpoint_dirty(&mut self, id: &LocalId) {
        if !self.dirty_endpoints.contains(id) {
            self.dirty_endpoints.insert(id.clone());
        }
    }

    pub(crate) fn pool_dirty(&mut self, name: &str) {
        if !self.dirty_pools.contains(name) {
            self.dirty_pools.insert(name.to_string());
        }
    }

    /// Whether anything is waiting to be flushed.
    pub(crate) fn has_pending(&self) -> bool {
        !self.dirty_sets.is_empty()
            || !self.dirty_policies.is_empty()
            || !self.dirty_profiles.is_empty()
            || !self.dirty_endpoints.is_empty()
            || !self.dirty_pools.is_empty()
            || (self.in_sync && !self.sent_in_sync)
    }

    /// Emits the pending changes (nothing before in-sync). See the module docs for the order.
    pub(crate) fn flush(&mut self, d: &impl Desired) -> Vec<Output> {
        if !self.in_sync {
            return Vec::new();
        }
        let mut created = Vec::new();
        let mut deltas = Vec::new();
        let mut set_removals = Vec::new();
        let mut dirty: Vec<(IpSetId, Pending)> = self.dirty_sets.drain().collect();
        dirty.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (id, pending) in dirty {
            let emitted = self.emitted_sets.contains(&id);
            if !d.ip_set_active(&id) {
                if emitted {
                    self.emitted_sets.remove(&id);
                    set_removals.push(Output::IpSetRemoved(id));
                }
                continue;
            }
            if !emitted {
                if let Some(patterns) = d.domain_patterns(&id) {
                    self.emitted_sets.insert(id.clone());
                    created.push(Output::DomainSetCreated { id, patterns });
                } else if let Some((kind, members)) = d.ip_set(&id) {
                    self.emitted_sets.insert(id.clone());
                    created.push(Output::IpSetCreated { id, kind, members });
                }
                continue;
            }
            let (mut added, mut removed): (Vec<IpSetMember>, Vec<IpSetMember>) = match pending {
                Pending::Deltas { added, removed } => {
                    (added.into_iter().collect(), removed.into_iter().collect())
                }
                Pending::Replaced { emitted } => {
                    let now = d.ip_set(&id).map(|(_, m)| m).unwrap_or_default();
                    sorted_diff(&emitted, &now)
                }
            };
            if !added.is_empty() {
                added.sort_unstable();
                deltas.push(Output::IpSetMembersAdded {
                    id: id.clone(),
                    members: added,
                });
            }
            if !removed.is_empty() {
                removed.sort_unstable();
                deltas.push(Output::IpSetMembersRemoved {
                    id,
                    members: removed,
                });
            }
        }

        let (policy_updates, policy_removals) = diff(
            &mut self.dirty_policies,
            &mut self.emitted_policies,
            |id| d.policy(id),
            Output::PolicyUpdated,
            Output::PolicyRemoved,
        );
        let (profile_updates, profile_removals) = diff(
            &mut self.dirty_profiles,
            &mut self.emitted_profiles,
            |id| d.profile(id),
            Output::ProfileUpdated,
            Output::ProfileRemoved,
        );
        let (endpoint_updates, endpoint_removals) = diff(
            &mut self.dirty_endpoints,
            &mut self.emitted_endpoints,
            |id| d.endpoint(id),
            |ep| match ep {
                EpState::Workload(e) => Output::EndpointUpdated(e),
                EpState::Host(h) => Output::HostEndpointUpdated(h),
            },
            |id| match id {
                LocalId::Workload(e) => Output::EndpointRemoved(e),
                LocalId::Host(h) => Output::HostEndpointRemoved(h),
            },
        );
        let (pool_updates, pool_removals) = diff(
            &mut self.dirty_pools,
            &mut self.emitted_pools,
            |name| d.ip_pool(name),
            Output::IpPoolUpdated,
            Output::IpPoolRemoved,
        );

        let mut out = created;
        out.extend(deltas);
        out.extend(policy_updates);
        out.extend(profile_updates);
        out.extend(endpoint_updates);
        out.extend(endpoint_removals);
        out.extend(profile_removals);
        out.extend(policy_removals);
        out.extend(set_removals);
        out.extend(pool_updates);
        out.extend(pool_removals);
        if !self.sent_in_sync {
            self.sent_in_sync = true;
            out.push(Output::InSync);
        }
        out
    }
}

/// (in `new` but not `old`, in `old` but not `new`) of two sorted lists.
fn sorted_diff(old: &[IpSetMember], new: &[IpSetMember]) -> (Vec<IpSetMember>, Vec<IpSetMember>) {
    let (mut added, mut removed) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), b) if b.is_none_or(|b| a < b) => {
                removed.push(a.clone());
                i += 1;
            }
            (_, Some(b)) => {
                added.push(b.clone());
                j += 1;
            }
            _ => unreachable!("loop condition"),
        }
    }
    (added, removed)
}

/// Compares dirty objects with what was emitted; returns (updates, removals) in id order.
fn diff<K, V>(
    dirty: &mut FxSet<K>,
    emitted: &mut FxMap<K, V>,
    desired: impl Fn(&K) -> Option<V>,
    update: impl Fn(V) -> Output,
    remove: impl Fn(K) -> Output,
) -> (Vec<Output>, Vec<Output>)
where
    K: Clone + Ord + std::hash::Hash + Eq,
    V: Clone + PartialEq,
{
    let mut ids: Vec<K> = dirty.drain().collect();
    ids.sort_unstable();
    let mut updates = Vec::new();
    let mut removals = Vec::new();
    for id in ids {
        match desired(&id) {
            Some(v) => {
                if emitted.get(&id) != Some(&v) {
                    emitted.insert(id, v.clone());
                    updates.push(update(v));
                }
            }
            None => {
                if emitted.remove(&id).is_some() {
                    removals.push(remove(id));
                }
            }
        }
    }
    (updates, removals)
}
