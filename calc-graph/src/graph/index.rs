//! Incremental selector ↔ item matching with label posting lists.
//!
//! A [`SelectorIndex`] holds a set of items (id → effective labels) and a set of selectors, and
//! keeps, for both sides, which of the other side match. The graph uses two: policy selectors
//! against local endpoints, and IP-set selectors against every item in the cluster.
//!
//! Indexing. Each selector gets a *cover*: a set of label terms (`k == v` or "has key `k`") such
//! that every item the selector matches carries at least one of them. `==` and `in` give value
//! terms, `has`/`contains`/`starts with`/`ends with` give key terms, a conjunction takes the
//! cheapest cover among its operands (smallest posting lists) and a disjunction the union of its
//! operands' covers. Selectors without a cover (`all()`, `!has(x)`, `a != 'b'`, ...) are
//! *unindexed* and evaluated for every item change.
//!
//! * A new selector evaluates only the items in its cover's posting lists (or all items when it
//!   has no cover).
//! * A changed item evaluates only the selectors registered under one of its labels (or keys),
//!   plus the unindexed ones, and of those only the ones that test a key whose value changed:
//!   the others keep their previous result.
//!
//! Choosing covers. A term's cost is the number of items carrying it (each of their changes
//! evaluates the selectors registered under it). The policy index holds only this node's
//! endpoints, whose few posting lists say little about a label value none of them carries yet;
//! it is given the cluster-wide index as a prior (see [`SelectorIndex::posting_cost`]).
//!
//! Covers are chosen when a selector is added, again for all selectors once the initial snapshot
//! is in, and again whenever items have changed as often as there are items (at least
//! [`REOPTIMIZE_MIN_CHANGES`] times) since: a long-running node whose workloads and labels drift
//! keeps cheap covers, at an amortised constant cost per change.
//!
//! Invariants: `sel.matches` contains exactly the items whose labels the selector matches, and
//! `item.matched` is exactly the sorted list of selectors that match the item. Covers may be
//! re-chosen ([`SelectorIndex::reoptimize`]) without changing any match.

use crate::selector::{Expr, Selector};

use super::intern::{FxMap, FxSet, Interner, Sym};
use super::labels::{ItemId, LabelSet, LabelView};

/// Dense id of a selector in one index.
pub(crate) type SelId = u32;

/// A match that appeared or disappeared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MatchEvent {
    pub sel: SelId,
    pub item: ItemId,
    pub added: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Term {
    Kv(Sym, Sym),
    Key(Sym),
}

/// A cover term before interning.
enum StrTerm<'a> {
    Kv(&'a str, &'a str),
    Key(&'a str),
}

struct SelEntry {
    sel: Selector,
    canonical: String,
    refs: u32,
    cover: Option<Vec<Term>>,
    /// Every label key the selector tests, sorted (one interner reference each): an item change
    /// that touches none of them cannot change the selector's result.
    keys: Vec<Sym>,
    matches: FxSet<ItemId>,
}

#[derive(Default)]
struct IndexedItem {
    labels: LabelSet,
    matched: Vec<SelId>,
}

/// See the module docs.
#[derive(Default)]
pub(crate) struct SelectorIndex {
    items: FxMap<ItemId, IndexedItem>,
    by_kv: FxMap<(Sym, Sym), FxSet<ItemId>>,
    by_key: FxMap<Sym, FxSet<ItemId>>,
    sels: Vec<Option<SelEntry>>,
    free: Vec<SelId>,
    by_canonical: FxMap<String, SelId>,
    sels_by_kv: FxMap<(Sym, Sym), Vec<SelId>>,
    sels_by_key: FxMap<Sym, Vec<SelId>>,
    unindexed: Vec<SelId>,
    /// Selector evaluations performed so far (a cost counter for tests and benches).
    pub evaluations: u64,
    /// Item label changes (creations, relabels, removals) so far: how far posting-list sizes may
    /// have drifted from those the covers were chosen with.
    pub changes: u64,
}

/// Item changes below which covers are never re-chosen after the initial snapshot.
pub(crate) const REOPTIMIZE_MIN_CHANGES: u64 = 1024;

/// Extra cost, in posting-list entries, of term kinds that tend to be unselective; it breaks
/// ties while the posting lists are still empty (before the initial snapshot is loaded).
const KEY_TERM_PENALTY: usize = 4;
const ORCHESTRATOR_PENALTY: usize = 6;
const POSTING_WEIGHT: usize = 8;

/// Label keys an expression tests, sorted and deduplicated.
fn expr_keys(e: &Expr) -> Vec<&str> {
    fn walk<'a>(e: &'a Expr, out: &mut Vec<&'a str>) {
        match e {
            Expr::Not(inner) => walk(inner, out),
            Expr::And(ops) | Expr::Or(ops) => ops.iter().for_each(|op| walk(op, out)),
            leaf => out.extend(leaf.key()),
        }
    }
    let mut out = Vec::new();
    walk(e, &mut out);
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether two sorted symbol lists share an element.
fn intersects(a: &[Sym], b: &[Sym]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

/// Keys whose value differs between two label sets sorted by key (added, removed or changed),
/// sorted (a merge of the two sorted lists).
fn changed_keys(old: &[(Sym, Sym)], new: &[(Sym, Sym)]) -> Vec<Sym> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a.0 == b.0 => {
                if a.1 != b.1 {
                    out.push(a.0);
                }
                i += 1;
                j += 1;
            }
            (Some(a), b) if b.is_none_or(|b| a.0 < b.0) => {
                out.push(a.0);
                i += 1;
            }
            (_, Some(b)) => {
                out.push(b.0);
                j += 1;
            }
            _ => unreachable!("loop condition"),
        }
    }
    out
}

impl SelectorIndex {
    fn entry(&self, id: SelId) -> &SelEntry {
        self.sels[id as usize].as_ref().expect("live selector id")
    }

    fn entry_mut(&mut self, id: SelId) -> &mut SelEntry {
        self.sels[id as usize].as_mut().expect("live selector id")
    }

    /// Items the selector matches.
    pub(crate) fn matches(&self, id: SelId) -> &FxSet<ItemId> {
        &self.entry(id).matches
    }

    /// Selectors matching the item (sorted), empty for unknown items.
    pub(crate) fn item_matches(&self, item: ItemId) -> &[SelId] {
        self.items.get(&item).map_or(&[], |i| &i.matched)
    }

    /// Number of selectors that must be evaluated on every item change.
    pub(crate) fn unindexed_count(&self) -> usize {
        self.unindexed.len()
    }

    /// Number of items carrying the term.
    fn postings(&self, interner: &Interner, t: &StrTerm<'_>) -> usize {
        match *t {
            StrTerm::Kv(k, v) => match (interner.lookup(k), interner.lookup(v)) {
                (Some(k), Some(v)) => self.by_kv.get(&(k, v)).map_or(0, |s| s.len()),
                _ => 0,
            },
            StrTerm::Key(k) => interner
                .lookup(k)
                .and_then(|k| self.by_key.get(&k))
                .map_or(0, |s| s.len()),
        }
    }

    /// Expected cost of registering a selector under the term: roughly how many of this index's
    /// items carry it (each of their changes evaluates the selector).
    ///
    /// A small index (the policy index holds only this node's endpoints) estimates badly from
    /// its own posting lists: a label value no local endpoint has *yet* costs zero, so thousands
    /// of policies could pile onto it and all be evaluated when one endpoint takes that value.
    /// The `prior` index (the cluster-wide one) says how common the term is in general; its
    /// count, scaled to this index's size, is added to the local count.
    fn posting_cost(&self, interner: &Interner, t: &StrTerm<'_>, prior: Option<&Self>) -> f64 {
        let mut n = self.postings(interner, t) as f64;
        if let Some(p) = prior {
            let scale = self.items.len().max(1) as f64 / p.items.len().max(1) as f64;
            n += p.postings(interner, t) as f64 * scale;
        }
        let penalty = match *t {
            StrTerm::Kv("projectcalico.org/orchestrator", _) => ORCHESTRATOR_PENALTY,
            StrTerm::Kv(..) => 0,
            StrTerm::Key(_) => KEY_TERM_PENALTY,
        };
        n * POSTING_WEIGHT as f64 + penalty as f64
    }

    fn cover<'a>(
        &self,
        interner: &Interner,
        e: &'a Expr,
        prior: Option<&Self>,
    ) -> Option<(Vec<StrTerm<'a>>, f64)> {
        match e {
            Expr::Eq(k, v) => {
                let t = StrTerm::Kv(k, v);
                let c = self.posting_cost(interner, &t, prior);
                Some((vec![t], c))
            }
            Expr::In(k, set) => {
                let terms: Vec<StrTerm<'a>> = set
                    .iter()
                    .map(|v| StrTerm::Kv(k.as_str(), v.as_str()))
                    .collect();
                let c = terms
                    .iter()
                    .map(|t| self.posting_cost(interner, t, prior))
                    .sum();
                Some((terms, c))
            }
            Expr::Has(k) | Expr::Contains(k, _) | Expr::StartsWith(k, _) | Expr::EndsWith(k, _) => {
                let t = StrTerm::Key(k);
                let c = self.posting_cost(interner, &t, prior);
                Some((vec![t], c))
            }
            Expr::And(ops) => ops
                .iter()
                .filter_map(|op| self.cover(interner, op, prior))
                .min_by(|(_, a), (_, b)| a.total_cmp(b)),
            Expr::Or(ops) => {
                let mut all = Vec::new();
                let mut cost = 0.0;
                for op in ops {
                    let (terms, c) = self.cover(interner, op, prior)?;
                    all.extend(terms);
                    cost += c;
                }
                Some((all, cost))
            }
            Expr::All | Expr::Global | Expr::Ne(..) | Expr::NotIn(..) | Expr::Not(_) => None,
        }
    }

    fn register_cover(&mut self, interner: &mut Interner, id: SelId, prior: Option<&Self>) {
        let cover = {
            let e = self.entry(id);
            self.cover(interner, e.sel.expr(), prior).map(|(terms, _)| {
                terms
                    .into_iter()
                    .map(|t| match t {
                        StrTerm::Kv(k, v) => Term::Kv(interner.intern(k), interner.intern(v)),
                        StrTerm::Key(k) => Term::Key(interner.intern(k)),
                    })
                    .collect::<Vec<_>>()
            })
        };
        match &cover {
            Some(terms) => {
                for t in terms {
                    match *t {
                        Term::Kv(k, v) => self.sels_by_kv.entry((k, v)).or_default().push(id),
                        Term::Key(k) => self.sels_by_key.entry(k).or_default().push(id),
                    }
                }
            }
            None => self.unindexed.push(id),
        }
        self.entry_mut(id).cover = cover;
    }

    fn unregister_cover(&mut self, interner: &mut Interner, id: SelId) {
        let cover = self.entry_mut(id).cover.take();
        match cover {
            Some(terms) => {
                for t in terms {
                    match t {
                        Term::Kv(k, v) => {
                            remove_from(&mut self.sels_by_kv, &(k, v), id);
                            interner.release(k);
                            interner.release(v);
                        }
                        Term::Key(k) => {
                            remove_from(&mut self.sels_by_key, &k, id);
                            interner.release(k);
                        }
                    }
                }
            }
            None => self.unindexed.retain(|s| *s != id),
        }
    }

    /// Adds a reference to `sel`, registering it (and computing its matches) if it is new.
    /// Returns the id and whether it was new. `prior` refines the choice of index terms (see
    /// [`SelectorIndex::posting_cost`]).
    pub(crate) fn add_selector(
        &mut self,
        interner: &mut Interner,
        sel: &Selector,
        prior: Option<&Self>,
    ) -> (SelId, bool) {
        let canonical = sel.canonical();
        if let Some(&id) = self.by_canonical.get(&canonical) {
            self.entry_mut(id).refs += 1;
            return (id, false);
        }
        let mut keys: Vec<Sym> = expr_keys(sel.expr())
            .into_iter()
            .map(|k| interner.intern(k))
            .collect();
        keys.sort_unstable();
        let entry = SelEntry {
            sel: sel.clone(),
            canonical: canonical.clone(),
            refs: 1,
            cover: None,
            keys,
            matches: FxSet::default(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.sels[id as usize] = Some(entry);
                id
            }
            None => {
                self.sels.push(Some(entry));
                (self.sels.len() - 1) as SelId
            }
        };
        self.by_canonical.insert(canonical, id);
        self.register_cover(interner, id, prior);

        // Initial matches from the cover's posting lists.
        let mut candidates: Vec<ItemId> = match &self.entry(id).cover {
            Some(terms) => {
                let mut c = Vec::new();
                for t in terms {
                    let set = match *t {
                        Term::Kv(k, v) => self.by_kv.get(&(k, v)),
                        Term::Key(k) => self.by_key.get(&k),
                    };
                    if let Some(set) = set {
                        c.extend(set.iter().copied());
                    }
                }
                c
            }
            None => self.items.keys().copied().collect(),
        };
        candidates.sort_unstable();
        candidates.dedup();
        self.evaluations += candidates.len() as u64;
        let mut matched = Vec::new();
        {
            let e = self.entry(id);
            for item in candidates {
                let labels = &self.items[&item].labels;
                if e.sel.matches(&LabelView { labels, interner }) {
                    matched.push(item);
                }
            }
        }
        for &item in &matched {
            let it = self.items.get_mut(&item).expect("candidate is indexed");
            if let Err(pos) = it.matched.binary_search(&id) {
                it.matched.insert(pos, id);
            }
        }
        self.entry_mut(id).matches.extend(matched);
        (id, true)
    }

    /// Drops a reference; the last one unregisters the selector. Returns true if it was freed.
    pub(crate) fn remove_selector(&mut self, interner: &mut Interner, id: SelId) -> bool {
        let e = self.entry_mut(id);
        e.refs -= 1;
        if e.refs > 0 {
            return false;
        }
        self.unregister_cover(interner, id);
        let e = self.sels[id as usize].take().expect("live selector id");
        for k in &e.keys {
            interner.release(*k);
        }
        for item in e.matches {
            if let Some(it) = self.items.get_mut(&item)
                && let Ok(pos) = it.matched.binary_search(&id)
            {
                it.matched.remove(pos);
            }
        }
        self.by_canonical.remove(&e.canonical);
        self.free.push(id);
        true
    }

    /// Creates or updates an item with new effective labels, appending match changes to `events`.
    pub(crate) fn upsert_item(
        &mut self,
        interner: &Interner,
        item: ItemId,
        labels: &LabelSet,
        events: &mut Vec<MatchEvent>,
    ) {
        let old = self.items.remove(&item);
        let existed = old.is_some();
        let old = old.unwrap_or_default();
        if existed && old.labels == *labels {
            // Matches depend only on the labels (selector changes are applied when selectors
            // are added or removed), so nothing can have changed.
            self.items.insert(item, old);
            return;
        }
        self.update_postings(item, &old.labels, labels);
        self.changes += 1;

        let mut candidates: Vec<SelId> = self.unindexed.clone();
        for &(k, v) in labels {
            if let Some(s) = self.sels_by_kv.get(&(k, v)) {
                candidates.extend_from_slice(s);
            }
            if let Some(s) = self.sels_by_key.get(&k) {
                candidates.extend_from_slice(s);
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        // A selector that tests none of the keys that changed keeps its result: only the others
        // are evaluated (a new item evaluates every candidate).
        let changed = existed.then(|| changed_keys(&old.labels, labels));
        let view = LabelView { labels, interner };
        let mut matched = Vec::with_capacity(candidates.len().min(8));
        let mut evaluations = 0;
        for id in candidates {
            let e = self.entry(id);
            let is_match = match &changed {
                Some(changed) if !intersects(&e.keys, changed) => {
                    old.matched.binary_search(&id).is_ok()
                }
                _ => {
                    evaluations += 1;
                    e.sel.matches(&view)
                }
            };
            if is_match {
                matched.push(id);
            }
        }
        self.evaluations += evaluations;

        // Diff the sorted lists.
        let (mut i, mut j) = (0, 0);
        while i < old.matched.len() || j < matched.len() {
            let a = old.matched.get(i).copied();
            let b = matched.get(j).copied();
            match (a, b) {
                (Some(x), Some(y)) if x == y => {
                    i += 1;
                    j += 1;
                }
                (Some(x), y) if y.is_none_or(|y| x < y) => {
                    self.entry_mut(x).matches.remove(&item);
                    events.push(MatchEvent {
                        sel: x,
                        item,
                        added: false,
                    });
                    i += 1;
                }
                (_, Some(y)) => {
                    self.entry_mut(y).matches.insert(item);
                    events.push(MatchEvent {
                        sel: y,
                        item,
                        added: true,
                    });
                    j += 1;
                }
                _ => unreachable!("loop condition"),
            }
        }
        self.items.insert(
            item,
            IndexedItem {
                labels: labels.clone(),
                matched,
            },
        );
    }

    /// Removes an item, appending a removal event for each selector that matched it.
    pub(crate) fn remove_item(&mut self, item: ItemId, events: &mut Vec<MatchEvent>) {
        let Some(old) = self.items.remove(&item) else {
            return;
        };
        self.update_postings(item, &old.labels, &[]);
        self.changes += 1;
        for sel in old.matched {
            self.entry_mut(sel).matches.remove(&item);
            events.push(MatchEvent {
                sel,
                item,
                added: false,
            });
        }
    }

    fn update_postings(&mut self, item: ItemId, old: &[(Sym, Sym)], new: &[(Sym, Sym)]) {
        for &(k, v) in old {
            if !new.contains(&(k, v)) {
                remove_item_from(&mut self.by_kv, &(k, v), item);
            }
            if !new.iter().any(|(nk, _)| *nk == k) {
                remove_item_from(&mut self.by_key, &k, item);
            }
        }
        for &(k, v) in new {
            if !old.contains(&(k, v)) {
                self.by_kv.entry((k, v)).or_default().insert(item);
            }
            if !old.iter().any(|(ok, _)| *ok == k) {
                self.by_key.entry(k).or_default().insert(item);
            }
        }
    }

    /// Re-chooses every selector's cover from the current posting-list sizes (after the initial
    /// snapshot, when sizes are finally known). Matches are unchanged.
    pub(crate) fn reoptimize(&mut self, interner: &mut Interner, prior: Option<&Self>) {
        let ids: Vec<SelId> = self.by_canonical.values().copied().collect();
        for id in ids {
            // Register the new cover before releasing the old one so shared symbols stay live.
            let old = self.entry_mut(id).cover.take();
            match &old {
                Some(terms) => {
                    for t in terms {
                        match *t {
                            Term::Kv(k, v) => remove_from(&mut self.sels_by_kv, &(k, v), id),
                            Term::Key(k) => remove_from(&mut self.sels_by_key, &k, id),
                        }
                    }
                }
                None => self.unindexed.retain(|s| *s != id),
            }
            self.register_cover(interner, id, prior);
            for t in old.into_iter().flatten() {
                match t {
                    Term::Kv(k, v) => {
                        interner.release(k);
                        interner.release(v);
                    }
                    Term::Key(k) => interner.release(k),
                }
            }
        }
    }
}

fn remove_from<K: std::hash::Hash + Eq>(map: &mut FxMap<K, Vec<SelId>>, key: &K, id: SelId) {
    if let Some(v) = map.get_mut(key) {
        if let Some(pos) = v.iter().position(|s| *s == id) {
            v.swap_remove(pos);
        }
        if v.is_empty() {
            map.remove(key);
        }
    }
}

fn remove_item_from<K: std::hash::Hash + Eq>(
    map: &mut FxMap<K, FxSet<ItemId>>,
    key: &K,
    item: ItemId,
) {
    if let Some(s) = map.get_mut(key) {
        s.remove(&item);
        if s.is_empty() {
            map.remove(key);
        }
    }
}
