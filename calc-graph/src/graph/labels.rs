//! Labelled items (workload endpoints, host endpoints, network sets) and label inheritance.
//!
//! An item's *effective* labels are its own labels, then, for each profile it names in order,
//! the profile's `labelsToApply` that are not already set (own labels win; among profiles the
//! first one wins), as Felix's `InheritIndex` computes them.
//!
//! Invariants:
//! * every label set is sorted by key symbol and holds one interner reference per symbol;
//! * `profiles[p].children` is exactly the set of items that name `p` among their parents, and a
//!   profile entry exists while it has labels or children.

use std::collections::BTreeMap;

use ipnet::IpNet;

use crate::model::{Protocol, ResourceKey};
use crate::selector::Labels;

use super::intern::{FxMap, FxSet, Interner, Sym};

/// Dense id of an item (slab index).
pub(crate) type ItemId = u32;

/// Sorted `(key, value)` symbol pairs.
pub(crate) type LabelSet = Vec<(Sym, Sym)>;

/// A named port an endpoint declares (contributes `ip,proto:port` members to named-port sets).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct NamedPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// What an item contributes to IP sets besides its labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ItemData {
    /// Members for selector sets: endpoint addresses as host networks, network-set CIDRs (a /0
    /// already split into two /1).
    pub nets: Vec<IpNet>,
    /// Named ports; only endpoints have them.
    pub ports: Vec<NamedPort>,
}

pub(crate) struct Item {
    own: LabelSet,
    parents: Vec<String>,
    pub effective: LabelSet,
    pub data: ItemData,
}

#[derive(Default)]
struct ProfileLabels {
    labels: LabelSet,
    children: FxSet<ItemId>,
}

/// Labels of one item resolved through the interner; implements the selector [`Labels`] trait.
pub(crate) struct LabelView<'a> {
    pub labels: &'a [(Sym, Sym)],
    pub interner: &'a Interner,
}

impl Labels for LabelView<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        let k = self.interner.lookup(key)?;
        let i = self.labels.binary_search_by_key(&k, |(k, _)| *k).ok()?;
        Some(self.interner.resolve(self.labels[i].1))
    }
}

/// The item store.
#[derive(Default)]
pub(crate) struct LabelStore {
    items: Vec<Option<Item>>,
    free: Vec<ItemId>,
    by_key: FxMap<ResourceKey, ItemId>,
    profiles: FxMap<String, ProfileLabels>,
}

/// Result of an item or profile change: the item's previous effective labels (still holding
/// their references until [`LabelStore::release`]) and previous data.
pub(crate) struct Changed {
    pub id: ItemId,
    pub old_labels: Option<LabelSet>,
    pub old_data: Option<ItemData>,
}

pub(crate) fn intern_map(interner: &mut Interner, map: &BTreeMap<String, String>) -> LabelSet {
    let mut out: LabelSet = map
        .iter()
        .map(|(k, v)| (interner.intern(k), interner.intern(v)))
        .collect();
    out.sort_unstable();
    out
}

/// Interns label pairs; when a key repeats, the last pair wins.
pub(crate) fn intern_pairs(interner: &mut Interner, pairs: &[(&str, &str)]) -> LabelSet {
    let mut out: LabelSet = pairs
        .iter()
        .map(|(k, v)| (interner.intern(k), interner.intern(v)))
        .collect();
    out.sort_by_key(|(k, _)| *k); // stable: equal keys keep their input order
    let mut dedup: LabelSet = Vec::with_capacity(out.len());
    for (k, v) in out {
        match dedup.last_mut() {
            Some(last) if last.0 == k => {
                interner.release(k);
                interner.release(last.1);
                last.1 = v;
            }
            _ => dedup.push((k, v)),
        }
    }
    dedup
}

fn merge(interner: &mut Interner, own: &LabelSet, inherited: &[&LabelSet]) -> LabelSet {
    let mut out = own.clone();
    for parent in inherited {
        for &(k, v) in parent.iter() {
            if let Err(pos) = out.binary_search_by_key(&k, |(k, _)| *k) {
                out.insert(pos, (k, v));
            }
        }
    }
    for &(k, v) in &out {
        interner.retain(k);
        interner.retain(v);
    }
    out
}

impl LabelStore {
    pub(crate) fn id(&self, key: &ResourceKey) -> Option<ItemId> {
        self.by_key.get(key).copied()
    }

    pub(crate) fn item(&self, id: ItemId) -> &Item {
        self.items[id as usize].as_ref().expect("live item id")
    }

    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Drops the references of a label set returned in [`Changed`].
    pub(crate) fn release(interner: &mut Interner, labels: LabelSet) {
        for (k, v) in labels {
            interner.release(k);
            interner.release(v);
        }
    }

    fn effective_for(
        &self,
        interner: &mut Interner,
        own: &LabelSet,
        parents: &[String],
    ) -> LabelSet {
        let inherited: Vec<&LabelSet> = parents
            .iter()
            .filter_map(|p| self.profiles.get(p).map(|pl| &pl.labels))
            .collect();
        merge(interner, own, &inherited)
    }

    /// Creates or replaces an item. `own` labels are taken as given (the caller strips reserved
    /// prefixes and adds the namespace label).
    pub(crate) fn upsert(
        &mut self,
        interner: &mut Interner,
        key: &ResourceKey,
        own: &[(&str, &str)],
        parents: Vec<String>,
        data: ItemData,
    ) -> Changed {
        let own = intern_pairs(interner, own);
        let effective = self.effective_for(interner, &own, &parents);
        match self.by_key.get(key).copied() {
            Some(id) => {
                let item = self.items[id as usize].as_mut().expect("live item id");
                let old_own = std::mem::replace(&mut item.own, own);
                let old_eff = std::mem::replace(&mut item.effective, effective);
                let old_data = std::mem::replace(&mut item.data, data);
                let old_parents = std::mem::replace(&mut item.parents, parents);
                Self::release(interner, old_own);
                if old_parents != item.parents {
                    let parents = item.parents.clone();
                    self.unlink(id, &old_parents);
                    self.link(id, &parents);
                }
                Changed {
                    id,
                    old_labels: Some(old_eff),
                    old_data: Some(old_data),
                }
            }
            None => {
                let item = Item {
                    own,
                    parents: Vec::new(),
                    effective,
                    data,
                };
                let id = match self.free.pop() {
                    Some(id) => {
                        self.items[id as usize] = Some(item);
                        id
                    }
                    None => {
                        self.items.push(Some(item));
                        (self.items.len() - 1) as ItemId
                    }
                };
                self.by_key.insert(key.clone(), id);
                self.link(id, &parents);
                if let Some(item) = self.items[id as usize].as_mut() {
                    item.parents = parents;
                }
                Changed {
                    id,
                    old_labels: None,
                    old_data: None,
                }
            }
        }
    }

    /// Removes an item, returning its id, last effective labels (references still held) and data.
    pub(crate) fn remove(
        &mut self,
        interner: &mut Interner,
        key: &ResourceKey,
    ) -> Option<(ItemId, LabelSet, ItemData)> {
        let id = self.by_key.remove(key)?;
        let item = self.items[id as usize].take().expect("live item id");
        self.free.push(id);
        self.unlink(id, &item.parents);
        Self::release(interner, item.own);
        Some((id, item.effective, item.data))
    }

    fn link(&mut self, id: ItemId, parents: &[String]) {
        for p in parents {
            // Look up before inserting: most parents exist already, so no key clone is needed.
            match self.profiles.get_mut(p) {
                Some(pl) => pl.children.insert(id),
                None => self
                    .profiles
                    .entry(p.clone())
                    .or_default()
                    .children
                    .insert(id),
            };
        }
    }

    fn unlink(&mut self, id: ItemId, parents: &[String]) {
        for p in parents {
            if let Some(pl) = self.profiles.get_mut(p) {
                pl.children.remove(&id);
                if pl.children.is_empty() && pl.labels.is_empty() {
                    self.profiles.remove(p);
                }
            }
        }
    }

    /// Sets a profile's `labelsToApply` (empty for a deleted profile) and recomputes every item
    /// that inherits from it. Returns the items whose effective labels changed.
    pub(crate) fn set_profile_labels(
        &mut self,
        interner: &mut Interner,
        profile: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<Changed> {
        let new = intern_map(interner, labels);
        let entry = self.profiles.entry(profile.to_string()).or_default();
        if entry.labels == new {
            Self::release(interner, new);
            if entry.labels.is_empty() && entry.children.is_empty() {
                self.profiles.remove(profile);
            }
            return Vec::new();
        }
        let old = std::mem::replace(&mut entry.labels, new);
        Self::release(interner, old);
        let mut children: Vec<ItemId> = entry.children.iter().copied().collect();
        if entry.labels.is_empty() && entry.children.is_empty() {
            self.profiles.remove(profile);
        }
        children.sort_unstable();
        let mut changed = Vec::new();
        for id in children {
            let item = self.items[id as usize].as_ref().expect("live item id");
            let effective = self.effective_for(interner, &item.own, &item.parents);
            let item = self.items[id as usize].as_mut().expect("live item id");
            if item.effective == effective {
                Self::release(interner, effective);
                continue;
            }
            let old = std::mem::replace(&mut item.effective, effective);
            changed.push(Changed {
                id,
                old_labels: Some(old),
                old_data: None,
            });
        }
        changed
    }

    /// Number of items inheriting from `profile` (tests and stats).
    #[cfg(test)]
    pub(crate) fn children(&self, profile: &str) -> usize {
        self.profiles.get(profile).map_or(0, |p| p.children.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn view<'a>(store: &'a LabelStore, i: &'a Interner, id: ItemId) -> LabelView<'a> {
        LabelView {
            labels: &store.item(id).effective,
            interner: i,
        }
    }

    #[test]
    fn own_labels_win_and_first_profile_wins() {
        let mut i = Interner::default();
        let mut s = LabelStore::default();
        s.set_profile_labels(&mut i, "p1", &labels(&[("a", "p1"), ("b", "p1")]));
        s.set_profile_labels(&mut i, "p2", &labels(&[("b", "p2"), ("c", "p2")]));
        let key = ResourceKey::namespaced(Kind::WorkloadEndpoint, "ns", "w");
        let ch = s.upsert(
            &mut i,
            &key,
            &[("a", "own"), ("b", "x"), ("b", "own-last")],
            vec!["p1".into(), "p2".into()],
            ItemData::default(),
        );
        let v = view(&s, &i, ch.id);
        assert_eq!(v.label("a"), Some("own"));
        assert_eq!(
            v.label("b"),
            Some("own-last"),
            "a repeated own key: last wins"
        );
        assert_eq!(v.label("c"), Some("p2"));
        assert_eq!(v.label("d"), None);

        let changed = s.set_profile_labels(&mut i, "p1", &labels(&[("b", "new"), ("x", "1")]));
        assert_eq!(changed.len(), 1);
        for c in changed {
            LabelStore::release(&mut i, c.old_labels.unwrap());
        }
        assert_eq!(
            view(&s, &i, ch.id).label("x"),
            Some("1"),
            "new profile label inherited"
        );
        assert_eq!(
            view(&s, &i, ch.id).label("b"),
            Some("own-last"),
            "own label still wins"
        );
        assert_eq!(s.children("p1"), 1);

        let (_, eff, _) = s.remove(&mut i, &key).unwrap();
        LabelStore::release(&mut i, eff);
        LabelStore::release(&mut i, ch.old_labels.unwrap_or_default());
        assert_eq!(s.children("p1"), 0);
        s.set_profile_labels(&mut i, "p1", &BTreeMap::new());
        s.set_profile_labels(&mut i, "p2", &BTreeMap::new());
        assert_eq!(i.len(), 0, "all label strings released");
    }
}
