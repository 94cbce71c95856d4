//! The synchronous source index: every known Kubernetes object, already converted.
//!
//! Owned by the watcher tasks through a `std::sync::Mutex` that is never held across an `.await`
//! (kubert's pattern: plain `apply` / `delete` / `reset`). A relist (`Init…InitDone`) replaces every
//! object of that kind (`relist_apply` per object as it arrives, `relist_done` at the end, together a
//! `reset`), so deletions missed while disconnected are applied.
//!
//! A Node also yields its automatic host endpoint (`<node>-auto-hep`), converted with the Node and
//! part of the desired state only while [`Index::set_auto_host_endpoints`] is on.
//!
//! The index knows which kinds it waits for; [`Index::desired`] returns `None` until each of them has
//! been listed once, so a fresh leader never mistakes a half-filled index for deletions.
//!
//! # Changes since the last pass
//! Besides the whole desired state, the index tracks which etcd keys changed since the writer last
//! took them ([`Index::take_changes`]): an object's keys are dirty only when what it stores (or
//! retains) differs from before, so a relist that brings back the same objects dirties nothing, and an
//! object whose `resourceVersion` did not change is not even converted again. Changes whose effect
//! is not confined to the object's own keys (the admin-policy kinds, which decide the admin tiers and
//! whether node network sets are stored; the automatic host endpoint toggle; the first complete
//! listing) mark everything dirty: the next pass recomputes the whole desired state (from the held
//! conversions, no reconversion).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_convert::strict_k8s::StrictNetworkPolicy;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;

use crate::convert::{self, ConvertOptions, Converted, ObjectRef, SkipReport};
use crate::manifests::ManifestSet;
use crate::writer::{Changes, Desired};

/// A Kubernetes kind the controller converts.
pub trait SourceKind: kube::Resource + ResourceExt {
    /// The kind's name, as in `ObjectRef::kind`.
    const KIND: &'static str;
    /// A CRD kind the cluster may not serve: `404 Not Found` then means "no objects".
    const OPTIONAL: bool = false;
    /// Converts one object.
    fn convert(&self, opts: &ConvertOptions) -> Converted;
    /// The automatic host endpoint the object stands for (Nodes), stored only while the controller
    /// is asked to create them ([`Index::set_auto_host_endpoints`]).
    fn auto_host_endpoint(&self, _opts: &ConvertOptions) -> Option<Converted> {
        None
    }
}

/// The [`SourceKind`] of each type: its kind name, conversion and, for a CRD kind, `optional`.
macro_rules! source_kinds {
    ($($ty:ty => $kind:literal, $convert:path $(, optional = $optional:literal)?
       $(, auto_host_endpoint = $hep:path)?;)*) => {$(
        impl SourceKind for $ty {
            const KIND: &'static str = $kind;
            $(const OPTIONAL: bool = $optional;)?
            fn convert(&self, opts: &ConvertOptions) -> Converted {
                $convert(self, opts)
            }
            $(fn auto_host_endpoint(&self, opts: &ConvertOptions) -> Option<Converted> {
                Some($hep(self, opts))
            })?
        }
    )*};
}

source_kinds! {
    Namespace => "Namespace", convert::namespace_to_profile;
    ServiceAccount => "ServiceAccount", convert::service_account_to_profile;
    Pod => "Pod", convert::pod_to_workload_endpoint;
    NetworkPolicy => "NetworkPolicy", convert::network_policy_to_calico;
    // What the watchers read: NetworkPolicy checked against the known schema.
    StrictNetworkPolicy => "NetworkPolicy", StrictNetworkPolicy::convert;
    Node => "Node", convert::node_to_network_set,
        auto_host_endpoint = convert::node_to_auto_host_endpoint;
    convert::admin::AdminNetworkPolicy => "AdminNetworkPolicy",
        convert::admin_network_policy_to_calico, optional = true;
    convert::admin::BaselineAdminNetworkPolicy => "BaselineAdminNetworkPolicy",
        convert::baseline_admin_network_policy_to_calico, optional = true;
    convert::admin::ClusterNetworkPolicy => "ClusterNetworkPolicy",
        convert::cluster_network_policy_to_calico, optional = true;
    k8s_convert::staged::WatchedStagedNetworkPolicy => "StagedNetworkPolicy",
        k8s_convert::staged::WatchedStagedNetworkPolicy::convert, optional = true;
    k8s_convert::staged::WatchedStagedGlobalNetworkPolicy => "StagedGlobalNetworkPolicy",
        k8s_convert::staged::WatchedStagedGlobalNetworkPolicy::convert, optional = true;
    k8s_convert::staged::WatchedStagedKubernetesNetworkPolicy => "StagedKubernetesNetworkPolicy",
        k8s_convert::staged::WatchedStagedKubernetesNetworkPolicy::convert, optional = true;
}

/// What the desired state was built from, for logs and metrics.
#[derive(Debug, Clone, Default)]
pub struct DesiredState {
    pub desired: Desired,
    pub skips: Vec<SkipReport>,
}

/// What changed since the writer last took the index's changes ([`Index::take_changes`]).
#[derive(Debug)]
pub enum Changed {
    /// Something whose effect is not confined to its own keys: the whole desired state.
    Everything(DesiredState),
    /// These keys only (possibly none): each one's desired value, or `None` when nothing desires it.
    Keys(Changes),
}

/// Which keys are dirty.
#[derive(Debug)]
enum Dirty {
    Everything,
    Keys(BTreeSet<String>),
}

/// The kinds whose changes reach beyond their own keys (admin tiers, node network sets).
const GLOBAL_KINDS: [&str; 3] = [
    "AdminNetworkPolicy",
    "BaselineAdminNetworkPolicy",
    "ClusterNetworkPolicy",
];

/// One source object's conversion, with what it stores encoded once, when it is applied (not at
/// every reconcile).
#[derive(Debug)]
struct Held {
    skips: Vec<SkipReport>,
    retain_key: Option<String>,
    /// `(etcd key, stored JSON)`.
    stored: Option<(String, String)>,
    /// A Node's automatic host endpoint, converted whether or not it is asked for (so turning the
    /// feature on needs no reconversion).
    auto_hep: Option<Box<Held>>,
    /// The source object's `resourceVersion`: the same version is not converted again (a relist).
    resource_version: Option<String>,
}

/// What a held conversion contributes, by role: 0 stored, 1 automatic host endpoint, 2 retained,
/// 3 automatic host endpoint retained; with the stored JSON.
type Entry<'a> = (u8, &'a str, Option<&'a str>);

impl Held {
    fn new(c: Converted) -> Self {
        let stored = c.resource.and_then(|r| match r.etcd_key() {
            Ok(k) => Some((k, r.to_json())),
            Err(e) => {
                tracing::warn!(resource = %r.name, "no etcd key: {e}");
                None
            }
        });
        Held {
            skips: c.skips,
            retain_key: c.retain_key,
            stored,
            auto_hep: None,
            resource_version: None,
        }
    }

    /// Adds what this part contributes to a desired state.
    fn add_to(&self, state: &mut DesiredState) {
        state.skips.extend(self.skips.iter().cloned());
        if let Some(k) = &self.retain_key {
            state.desired.retain.insert(k.clone());
        }
        if let Some((k, json)) = &self.stored {
            state.desired.resources.insert(k.clone(), json.clone());
        }
    }

    fn entries(&self) -> Vec<Entry<'_>> {
        let mut v = Vec::with_capacity(2);
        if let Some((k, j)) = &self.stored {
            v.push((0, k.as_str(), Some(j.as_str())));
        }
        if let Some(k) = &self.retain_key {
            v.push((2, k.as_str(), None));
        }
        if let Some(h) = &self.auto_hep {
            if let Some((k, j)) = &h.stored {
                v.push((1, k.as_str(), Some(j.as_str())));
            }
            if let Some(k) = &h.retain_key {
                v.push((3, k.as_str(), None));
            }
        }
        v
    }

    fn has_skips(&self) -> bool {
        !self.skips.is_empty() || self.auto_hep.as_ref().is_some_and(|h| h.has_skips())
    }
}

/// Converted objects by source object.
#[derive(Debug)]
pub struct Index {
    opts: ConvertOptions,
    objects: BTreeMap<ObjectRef, Held>,
    waiting_for: BTreeSet<&'static str>,
    manifests: ManifestSet,
    /// The manifests' resources, encoded once: etcd key → stored JSON.
    manifest_json: BTreeMap<String, String>,
    /// The manifests' Nodes' automatic host endpoints.
    manifest_auto_heps: Vec<Held>,
    /// Whether automatic host endpoints are desired.
    auto_host_endpoints: bool,
    /// Keys changed since the writer last took them.
    dirty: Dirty,
    /// Which object stores each key (its resource or its automatic host endpoint).
    by_key: HashMap<String, ObjectRef>,
    /// Which object retains each key (it failed validation; its last good version stays).
    retained_by: HashMap<String, ObjectRef>,
    /// Objects with skip reports.
    with_skips: BTreeSet<ObjectRef>,
    /// The desired keys as of the last pass (for the `objects_synced` count).
    desired_keys: HashSet<String>,
}

impl Default for Index {
    fn default() -> Self {
        Index::new(ConvertOptions::default(), &[], ManifestSet::default())
    }
}

fn obj_ref<K: SourceKind>(o: &K) -> ObjectRef {
    ObjectRef::new(K::KIND, o.namespace().as_deref(), &o.name_any())
}

fn is_node_set_key(key: &str) -> bool {
    key.rsplit_once("/globalnetworksets/")
        .is_some_and(|(_, n)| n.starts_with(convert::KNODE_PREFIX))
}

fn uses_node_sets(key: &str, json: &str) -> bool {
    convert::admin::is_admin_policy_key(key) && convert::admin::uses_node_sets(json)
}

impl Index {
    /// An index that waits for the listed kinds before it reports a desired state.
    pub fn new(opts: ConvertOptions, waiting_for: &[&'static str], manifests: ManifestSet) -> Self {
        let manifest_json = (manifests.resources.iter())
            .map(|(k, r)| (k.clone(), r.to_json()))
            .collect();
        let manifest_auto_heps = manifests
            .auto_host_endpoints
            .iter()
            .map(|c| Held::new(c.clone()))
            .collect();
        Index {
            opts,
            objects: BTreeMap::new(),
            waiting_for: waiting_for.iter().copied().collect(),
            manifests,
            manifest_json,
            manifest_auto_heps,
            auto_host_endpoints: false,
            dirty: Dirty::Everything,
            by_key: HashMap::new(),
            retained_by: HashMap::new(),
            with_skips: BTreeSet::new(),
            desired_keys: HashSet::new(),
        }
    }

    /// Turns the Nodes' automatic host endpoints on or off; returns whether that changed anything.
    pub fn set_auto_host_endpoints(&mut self, on: bool) -> bool {
        let changed = std::mem::replace(&mut self.auto_host_endpoints, on) != on;
        if changed {
            self.dirty = Dirty::Everything;
        }
        changed
    }

    /// Whether the Nodes' automatic host endpoints are desired.
    pub fn auto_host_endpoints(&self) -> bool {
        self.auto_host_endpoints
    }

    /// An object was added or changed.
    pub fn apply<K: SourceKind>(&mut self, o: &K) {
        let r = obj_ref(o);
        let rv = o.resource_version();
        if rv.is_some()
            && self
                .objects
                .get(&r)
                .is_some_and(|h| h.resource_version == rv)
        {
            return;
        }
        let converted = o.convert(&self.opts);
        for s in &converted.skips {
            tracing::warn!(object = %r, field = %s.field, "skipping: {}", s.message);
        }
        let mut held = Held::new(converted);
        held.auto_hep = o
            .auto_host_endpoint(&self.opts)
            .map(|c| Box::new(Held::new(c)));
        held.resource_version = rv;
        self.replace(r, Some(held));
    }

    /// An object was deleted.
    pub fn delete<K: SourceKind>(&mut self, o: &K) {
        self.replace(obj_ref(o), None);
    }

    /// Puts (or removes) an object's conversion and marks the keys whose contribution changed.
    fn replace(&mut self, r: ObjectRef, new: Option<Held>) {
        let old = match new {
            Some(h) => self.objects.insert(r.clone(), h),
            None => self.objects.remove(&r),
        };
        let new = self.objects.get(&r);
        let old_e = old.as_ref().map(Held::entries).unwrap_or_default();
        let new_e = new.map(Held::entries).unwrap_or_default();
        let removed: Vec<(u8, String)> = (old_e.iter())
            .filter(|e| !new_e.contains(e))
            .map(|(t, k, _)| (*t, k.to_string()))
            .collect();
        let added: Vec<(u8, String)> = (new_e.iter())
            .filter(|e| !old_e.contains(e))
            .map(|(t, k, _)| (*t, k.to_string()))
            .collect();
        if new.is_some_and(Held::has_skips) {
            self.with_skips.insert(r.clone());
        } else {
            self.with_skips.remove(&r);
        }
        if removed.is_empty() && added.is_empty() {
            return;
        }
        if GLOBAL_KINDS.contains(&r.kind.as_str()) {
            self.dirty = Dirty::Everything;
        }
        for (tag, k) in removed {
            let map = if tag >= 2 {
                &mut self.retained_by
            } else {
                &mut self.by_key
            };
            if map.get(&k) == Some(&r) {
                map.remove(&k);
            }
            self.mark(k);
        }
        for (tag, k) in added {
            let map = if tag >= 2 {
                &mut self.retained_by
            } else {
                &mut self.by_key
            };
            map.insert(k.clone(), r.clone());
            self.mark(k);
        }
    }

    fn mark(&mut self, key: String) {
        if let Dirty::Keys(keys) = &mut self.dirty {
            keys.insert(key);
        }
    }

    /// A full relist of one kind: everything of that kind not in `objs` is gone. Objects that come
    /// back unchanged dirty nothing.
    pub fn reset<K: SourceKind>(&mut self, objs: &[K]) {
        let mut seen = HashSet::with_capacity(objs.len());
        for o in objs {
            self.relist_apply(&mut seen, o);
        }
        self.relist_done::<K>(&seen);
    }

    /// One object of a relist in progress, applied as it arrives (so the listing is never held
    /// whole); `seen` collects what the relist brought for [`Index::relist_done`].
    pub fn relist_apply<K: SourceKind>(&mut self, seen: &mut HashSet<ObjectRef>, o: &K) {
        seen.insert(obj_ref(o));
        self.apply(o);
    }

    /// The end of a relist of kind `K`: every object of that kind not `seen` is gone.
    pub fn relist_done<K: SourceKind>(&mut self, seen: &HashSet<ObjectRef>) {
        let gone: Vec<ObjectRef> = self
            .of_kind(K::KIND)
            .filter(|r| !seen.contains(*r))
            .cloned()
            .collect();
        for r in gone {
            self.replace(r, None);
        }
        if self.waiting_for.remove(K::KIND) && self.waiting_for.is_empty() {
            self.dirty = Dirty::Everything;
        }
    }

    /// The held objects of one kind.
    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a ObjectRef> + 'a {
        let first = ObjectRef {
            kind: kind.to_string(),
            namespace: None,
            name: String::new(),
        };
        self.objects
            .range(first..)
            .map(|(r, _)| r)
            .take_while(move |r| r.kind == kind)
    }

    /// Whether a kind has been listed at least once.
    pub fn is_listed(&self, kind: &str) -> bool {
        !self.waiting_for.contains(kind)
    }

    /// Number of objects held of one kind.
    pub fn count(&self, kind: &str) -> usize {
        self.of_kind(kind).count()
    }

    /// Whether every awaited kind has been listed.
    pub fn is_ready(&self) -> bool {
        self.waiting_for.is_empty()
    }

    /// Number of source objects held.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Whether an object is held.
    pub fn contains(&self, r: &ObjectRef) -> bool {
        self.objects.contains_key(r)
    }

    /// The desired store contents: Kubernetes-derived resources, then manifest resources (a manifest
    /// defining the same key wins). `None` until every awaited kind has been listed.
    pub fn desired(&self) -> Option<DesiredState> {
        if !self.is_ready() {
            return None;
        }
        let mut state = DesiredState::default();
        for c in self.objects.values() {
            c.add_to(&mut state);
            if self.auto_host_endpoints
                && let Some(hep) = &c.auto_hep
            {
                hep.add_to(&mut state);
            }
        }
        if self.auto_host_endpoints {
            for hep in &self.manifest_auto_heps {
                hep.add_to(&mut state);
            }
        }
        for (k, json) in &self.manifest_json {
            state.desired.resources.insert(k.clone(), json.clone());
        }
        convert::admin::add_admin_tiers(
            &mut state.desired.resources,
            |json| json.as_str().into(),
            |t| t.to_json(),
        );
        state
            .desired
            .retain
            .extend(self.manifests.retain.iter().cloned());
        state
            .skips
            .extend(self.manifests.skipped.iter().map(|s| s.report.clone()));
        Some(state)
    }

    /// The whole desired state (as [`Index::desired`]), and nothing dirty any more: for a full pass.
    pub fn take_desired(&mut self) -> Option<DesiredState> {
        let state = self.desired()?;
        self.dirty = Dirty::Keys(BTreeSet::new());
        self.desired_keys = state.desired.resources.keys().cloned().collect();
        Some(state)
    }

    /// What changed since the last [`Index::take_changes`] or [`Index::take_desired`]; `None`
    /// until every awaited kind has been listed.
    pub fn take_changes(&mut self) -> Option<Changed> {
        if !self.is_ready() {
            return None;
        }
        let keys = match std::mem::replace(&mut self.dirty, Dirty::Keys(BTreeSet::new())) {
            Dirty::Everything => return self.take_desired().map(Changed::Everything),
            Dirty::Keys(keys) => keys,
        };
        let node_sets_used = self.node_sets_used();
        let mut changes = Changes::default();
        for k in keys {
            let want = self.desired_value(&k, node_sets_used).map(str::to_string);
            if self.is_retained(&k) {
                changes.retain.insert(k.clone());
            }
            if want.is_some() {
                self.desired_keys.insert(k.clone());
            } else {
                self.desired_keys.remove(&k);
            }
            changes.resources.insert(k, want);
        }
        Some(Changed::Keys(changes))
    }

    /// The number of desired keys as of the last [`Index::take_changes`] or [`Index::take_desired`].
    pub fn desired_len(&self) -> usize {
        self.desired_keys.len()
    }

    /// The current skip reports, as [`Index::desired`] lists them.
    pub fn skips(&self) -> Vec<SkipReport> {
        let mut out = Vec::new();
        for r in &self.with_skips {
            let Some(h) = self.objects.get(r) else {
                continue;
            };
            out.extend(h.skips.iter().cloned());
            if self.auto_host_endpoints
                && let Some(hep) = &h.auto_hep
            {
                out.extend(hep.skips.iter().cloned());
            }
        }
        if self.auto_host_endpoints {
            for hep in &self.manifest_auto_heps {
                out.extend(hep.skips.iter().cloned());
            }
        }
        out.extend(self.manifests.skipped.iter().map(|s| s.report.clone()));
        out
    }

    /// Whether some admin policy has a `nodes` peer (only then are node network sets stored).
    fn node_sets_used(&self) -> bool {
        self.manifest_json.iter().any(|(k, j)| uses_node_sets(k, j))
            || GLOBAL_KINDS.iter().any(|kind| {
                self.of_kind(kind).any(|r| {
                    (self.objects[r].stored.as_ref()).is_some_and(|(k, j)| uses_node_sets(k, j))
                })
            })
    }

    /// The value [`Index::desired`] would give `key` (for a key that is not an admin tier).
    fn desired_value(&self, key: &str, node_sets_used: bool) -> Option<&str> {
        if is_node_set_key(key) && !node_sets_used {
            return None;
        }
        if let Some(j) = self.manifest_json.get(key) {
            return Some(j);
        }
        if self.auto_host_endpoints
            && let Some(j) = (self.manifest_auto_heps.iter().rev())
                .filter_map(|h| h.stored.as_ref())
                .find(|(k, _)| k == key)
                .map(|(_, j)| j)
        {
            return Some(j);
        }
        let held = self.objects.get(self.by_key.get(key)?)?;
        if let Some((k, j)) = &held.stored
            && k == key
        {
            return Some(j);
        }
        match &held.auto_hep {
            Some(h) if self.auto_host_endpoints => h
                .stored
                .as_ref()
                .filter(|(k, _)| k == key)
                .map(|(_, j)| j.as_str()),
            _ => None,
        }
    }

    /// Whether [`Index::desired`] would retain `key`.
    fn is_retained(&self, key: &str) -> bool {
        if self.manifests.retain.contains(key) {
            return true;
        }
        let Some(held) = self.retained_by.get(key).and_then(|r| self.objects.get(r)) else {
            return false;
        };
        held.retain_key.as_deref() == Some(key)
            || (self.auto_host_endpoints
                && held
                    .auto_hep
                    .as_ref()
                    .is_some_and(|h| h.retain_key.as_deref() == Some(key)))
    }
}
