//! IP sets: which sets active rules need, and their reference-counted members.
//!
//! A set is active while at least one active policy or profile references it (`users` > 0).
//! Its selector is registered in the cluster-wide [`SelectorIndex`]; its members are the
//! contributions of every item that selector matches: endpoint addresses and network-set CIDRs
//! for a selector set, `address,protocol:port` pairs of matching endpoints' named ports for a
//! named-port set.
//!
//! Invariant: `set.members[m]` is the number of matching items that contribute `m` (two pods
//! may share an address); a member is announced to the [`Sequencer`] when its count goes 0 → 1
//! and withdrawn on 1 → 0.
//!
//! Lingering: a set whose last user goes away is not torn down at once. It stays registered
//! (members kept up to date, but not active: the dataplane is told to remove it) so that a
//! policy flapping in and out of use does not rebuild a large set from scratch each time.
//! By default at most [`MAX_LINGERING_SETS`] sets and [`MAX_LINGERING_MEMBERS`] members linger;
//! beyond that the oldest are evicted.

use std::sync::{Arc, OnceLock};

use crate::model::{DomainPattern, Protocol};
use crate::proto::{IpSetId, IpSetKind, IpSetMember};

use super::index::{MatchEvent, SelId, SelectorIndex};
use super::intern::{FxMap, Interner};
use super::labels::{ItemData, ItemId, LabelStore};
use super::rules::{DomainSetSpec, IpSetSpec};
use super::sequencer::Sequencer;

pub(crate) struct SetState {
    pub kind: IpSetKind,
    sel: SelId,
    named_port: Option<(Protocol, String)>,
    users: u32,
    pub members: FxMap<IpSetMember, u32>,
    /// The members sorted, built on first use and dropped whenever a member comes or goes, so
    /// that re-emitting an unchanged set in full (a lingering set revived when a policy comes
    /// back into use) is a copy rather than a collect-and-sort.
    sorted: OnceLock<Arc<[IpSetMember]>>,
}

impl SetState {
    /// The members in sorted order, shared: re-emitting an unchanged set costs a reference count.
    pub(crate) fn sorted_members(&self) -> Arc<[IpSetMember]> {
        self.sorted
            .get_or_init(|| {
                let mut members: Vec<IpSetMember> = self.members.keys().cloned().collect();
                members.sort_unstable();
                members.into()
            })
            .clone()
    }
}

/// Bounds of the lingering sets (see the module docs).
pub(crate) const MAX_LINGERING_SETS: usize = 64;
pub(crate) const MAX_LINGERING_MEMBERS: usize = 100_000;

/// Active (and lingering) IP sets.
pub(crate) struct IpSets {
    /// Active domain sets: patterns and users. They have no members here (the agent learns them
    /// from DNS) and do not linger: reviving one costs nothing.
    domains: FxMap<IpSetId, (Arc<[DomainPattern]>, u32)>,
    /// Lingering bounds (sets, members).
    pub limits: (usize, usize),
    sets: FxMap<IpSetId, SetState>,
    by_sel: FxMap<SelId, Vec<IpSetId>>,
    /// Sets with `users > 0`.
    active: usize,
    /// Members of active sets.
    member_count: usize,
    /// Lingering sets, oldest first.
    lingering: std::collections::VecDeque<IpSetId>,
    lingering_members: usize,
}

impl Default for IpSets {
    fn default() -> Self {
        IpSets {
            domains: FxMap::default(),
            limits: (MAX_LINGERING_SETS, MAX_LINGERING_MEMBERS),
            sets: FxMap::default(),
            by_sel: FxMap::default(),
            active: 0,
            member_count: 0,
            lingering: std::collections::VecDeque::new(),
            lingering_members: 0,
        }
    }
}

/// Normalises an endpoint port's protocol to the named-port protocols (TCP, UDP, SCTP).
fn port_protocol(p: Protocol) -> Protocol {
    match p {
        Protocol::Tcp | Protocol::Number(6) => Protocol::Tcp,
        Protocol::Udp | Protocol::Number(17) => Protocol::Udp,
        Protocol::Sctp | Protocol::Number(132) => Protocol::Sctp,
        other => other,
    }
}

fn contributions(named_port: &Option<(Protocol, String)>, data: &ItemData) -> Vec<IpSetMember> {
    match named_port {
        None => data.nets.iter().map(|n| IpSetMember::Net(*n)).collect(),
        Some((proto, name)) => {
            let mut out = Vec::new();
            for p in &data.ports {
                if p.name == *name && port_protocol(p.protocol) == *proto {
                    for n in &data.nets {
                        out.push(IpSetMember::IpPort {
                            addr: n.addr(),
                            protocol: *proto,
                            port: p.port,
                        });
                    }
                }
            }
            out
        }
    }
}

impl IpSets {
    /// An active set.
    pub(crate) fn get(&self, id: &str) -> Option<&SetState> {
        self.sets.get(id).filter(|s| s.users > 0)
    }

    /// Number of active sets (domain sets included).
    pub(crate) fn len(&self) -> usize {
        self.active + self.domains.len()
    }

    /// The patterns of an active domain set.
    pub(crate) fn domain_patterns(&self, id: &str) -> Option<Arc<[DomainPattern]>> {
        self.domains.get(id).map(|(p, _)| p.clone())
    }

    /// Takes a reference to a domain set, creating it if new.
    pub(crate) fn activate_domain(&mut self, spec: &DomainSetSpec, seq: &mut Sequencer) {
        let entry = self
            .domains
            .entry(spec.id.clone())
            .or_insert_with(|| (spec.patterns.clone(), 0));
        entry.1 += 1;
        if entry.1 == 1 {
            seq.set_dirty(&spec.id);
        }
    }

    /// Drops a reference to a domain set; the last one removes it.
    pub(crate) fn deactivate_domain(&mut self, id: &IpSetId, seq: &mut Sequencer) {
        let Some(entry) = self.domains.get_mut(id) else {
            return;
        };
        entry.1 -= 1;
        if entry.1 == 0 {
            self.domains.remove(id);
            seq.set_dirty(id);
        }
    }

    /// Number of lingering sets.
    pub(crate) fn lingering(&self) -> usize {
        self.lingering.len()
    }

    pub(crate) fn member_count(&self) -> usize {
        self.member_count
    }

    fn add_members(&mut self, id: &IpSetId, members: Vec<IpSetMember>, seq: &mut Sequencer) {
        let Some(set) = self.sets.get_mut(id) else {
            return;
        };
        let mut fresh = Vec::new();
        for m in members {
            match set.members.get_mut(&m) {
                Some(c) => *c += 1,
                None => {
                    set.members.insert(m.clone(), 1);
                    fresh.push(m);
                }
            }
        }
        if !fresh.is_empty() {
            set.sorted.take();
            if set.users > 0 {
                self.member_count += fresh.len();
            } else {
                self.lingering_members += fresh.len();
            }
            seq.members_added(id, fresh);
        }
    }

    fn remove_members(&mut self, id: &IpSetId, members: Vec<IpSetMember>, seq: &mut Sequencer) {
        let Some(set) = self.sets.get_mut(id) else {
            return;
        };
        let mut gone = Vec::new();
        for m in members {
            let Some(c) = set.members.get_mut(&m) else {
                continue;
            };
            *c -= 1;
            if *c == 0 {
                set.members.remove(&m);
                gone.push(m);
            }
        }
        if !gone.is_empty() {
            set.sorted.take();
            if set.users > 0 {
                self.member_count -= gone.len();
            } else {
                self.lingering_members -= gone.len();
            }
            seq.members_removed(id, gone);
        }
    }

    /// Takes a reference to a set, creating it (and computing its members) if new.
    pub(crate) fn activate(
        &mut self,
        spec: &IpSetSpec,
        index: &mut SelectorIndex,
        interner: &mut Interner,
        store: &LabelStore,
        seq: &mut Sequencer,
    ) {
        if let Some(set) = self.sets.get_mut(&spec.id) {
            if set.users == 0 {
                // Revive a lingering set: its members are current.
                self.lingering.retain(|l| *l != spec.id);
                self.lingering_members -= set.members.len();
                self.member_count += set.members.len();
                self.active += 1;
                seq.set_dirty(&spec.id);
            }
            set.users += 1;
            return;
        }
        self.active += 1;
        let (sel, _) = index.add_selector(interner, &spec.selector, None);
        self.sets.insert(
            spec.id.clone(),
            SetState {
                kind: spec.kind(),
                sel,
                named_port: spec.named_port.clone(),
                users: 1,
                members: FxMap::default(),
                sorted: OnceLock::new(),
            },
        );
        self.by_sel.entry(sel).or_default().push(spec.id.clone());
        seq.set_dirty(&spec.id);
        let mut items: Vec<ItemId> = index.matches(sel).iter().copied().collect();
        items.sort_unstable();
        let np = spec.named_port.clone();
        for item in items {
            let members = contributions(&np, &store.item(item).data);
            self.add_members(&spec.id, members, seq);
        }
    }

    /// Drops a reference; the last one deactivates the set (it lingers, see the module docs).
    pub(crate) fn deactivate(
        &mut self,
        id: &IpSetId,
        index: &mut SelectorIndex,
        interner: &mut Interner,
        seq: &mut Sequencer,
    ) {
        let Some(set) = self.sets.get_mut(id) else {
            return;
        };
        set.users -= 1;
        if set.users > 0 {
            return;
        }
        self.active -= 1;
        self.member_count -= set.members.len();
        self.lingering_members += set.members.len();
        self.lingering.push_back(id.clone());
        seq.set_dirty(id);
        while self.lingering.len() > self.limits.0 || self.lingering_members > self.limits.1 {
            let Some(oldest) = self.lingering.pop_front() else {
                break;
            };
            self.evict(&oldest, index, interner, seq);
        }
    }

    /// Tears down an inactive set: members dropped, selector unregistered.
    fn evict(
        &mut self,
        id: &IpSetId,
        index: &mut SelectorIndex,
        interner: &mut Interner,
        seq: &mut Sequencer,
    ) {
        let Some(set) = self.sets.remove(id) else {
            return;
        };
        self.lingering_members -= set.members.len();
        // If the dataplane still has the set (no flush since it was deactivated) and it comes
        // back before the flush, the sequencer diffs against this snapshot.
        let members = if seq.is_emitted(id) {
            set.members.into_keys().collect()
        } else {
            Vec::new()
        };
        seq.set_deactivated(id, members);
        if let Some(v) = self.by_sel.get_mut(&set.sel) {
            v.retain(|s| s != id);
            if v.is_empty() {
                self.by_sel.remove(&set.sel);
            }
        }
        index.remove_selector(interner, set.sel);
    }

    /// Applies match changes of one item (whose data did not change).
    pub(crate) fn on_matches(
        &mut self,
        events: &[MatchEvent],
        store: &LabelStore,
        seq: &mut Sequencer,
    ) {
        for ev in events {
            let Some(ids) = self.by_sel.get(&ev.sel) else {
                continue;
            };
            let data = &store.item(ev.item).data;
            for id in ids.clone() {
                let np = self.sets[&id].named_port.clone();
                let members = contributions(&np, data);
                if ev.added {
                    self.add_members(&id, members, seq);
                } else {
                    self.remove_members(&id, members, seq);
                }
            }
        }
    }

    /// Withdraws (`add == false`) or adds an item's contributions to every set of `sels`.
    pub(crate) fn contribute(
        &mut self,
        sels: &[SelId],
        data: &ItemData,
        add: bool,
        seq: &mut Sequencer,
    ) {
        for sel in sels {
            let Some(ids) = self.by_sel.get(sel) else {
                continue;
            };
            for id in ids.clone() {
                let np = self.sets[&id].named_port.clone();
                let members = contributions(&np, data);
                if add {
                    self.add_members(&id, members, seq);
                } else {
                    self.remove_members(&id, members, seq);
                }
            }
        }
    }
}
