//! The synchronous source index: every known Kubernetes object, already converted.
//!
//! Owned by the watcher tasks through a `std::sync::Mutex` that is never held across an `.await`
//! (kubert's pattern: plain `apply` / `delete` / `reset`). A relist (`Init…InitDone`) becomes one
//! `reset` that replaces every object of that kind, so deletions missed while disconnected are applied.
//!
//! The index knows which kinds it waits for; [`Index::desired`] returns `None` until each of them has
//! been listed once, so a fresh leader never mistakes a half-filled index for deletions.

use std::collections::{BTreeMap, BTreeSet};

use k8s_convert::strict_k8s::StrictNetworkPolicy;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;

use crate::convert::{self, ConvertOptions, Converted, ObjectRef, SkipReport};
use crate::manifests::ManifestSet;
use crate::writer::Desired;

/// A Kubernetes kind the controller converts.
pub trait SourceKind: kube::Resource + ResourceExt {
    /// The kind's name, as in `ObjectRef::kind`.
    const KIND: &'static str;
    /// A CRD kind the cluster may not serve: `404 Not Found` then means "no objects".
    const OPTIONAL: bool = false;
    /// Converts one object.
    fn convert(&self, opts: &ConvertOptions) -> Converted;
}

/// The [`SourceKind`] of each type: its kind name, conversion and, for a CRD kind, `optional`.
macro_rules! source_kinds {
    ($($ty:ty => $kind:literal, $convert:path $(, optional = $optional:literal)?;)*) => {$(
        impl SourceKind for $ty {
            const KIND: &'static str = $kind;
            $(const OPTIONAL: bool = $optional;)?
            fn convert(&self, opts: &ConvertOptions) -> Converted {
                $convert(self, opts)
            }
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
    Node => "Node", convert::node_to_network_set;
    convert::admin::AdminNetworkPolicy => "AdminNetworkPolicy",
        convert::admin_network_policy_to_calico, optional = true;
    convert::admin::BaselineAdminNetworkPolicy => "BaselineAdminNetworkPolicy",
        convert::baseline_admin_network_policy_to_calico, optional = true;
    convert::admin::ClusterNetworkPolicy => "ClusterNetworkPolicy",
        convert::cluster_network_policy_to_calico, optional = true;
}

/// What the desired state was built from, for logs and metrics.
#[derive(Debug, Clone, Default)]
pub struct DesiredState {
    pub desired: Desired,
    pub skips: Vec<SkipReport>,
}

/// One source object's conversion, with what it stores encoded once, when it is applied (not at
/// every reconcile).
#[derive(Debug)]
struct Held {
    skips: Vec<SkipReport>,
    retain_key: Option<String>,
    /// `(etcd key, stored JSON)`.
    stored: Option<(String, String)>,
}

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
        }
    }
}

/// Converted objects by source object.
#[derive(Debug, Default)]
pub struct Index {
    opts: ConvertOptions,
    objects: BTreeMap<ObjectRef, Held>,
    waiting_for: BTreeSet<&'static str>,
    manifests: ManifestSet,
    /// The manifests' resources, encoded once: `(etcd key, stored JSON)`.
    manifest_json: Vec<(String, String)>,
}

fn obj_ref<K: SourceKind>(o: &K) -> ObjectRef {
    ObjectRef::new(K::KIND, o.namespace().as_deref(), &o.name_any())
}

impl Index {
    /// An index that waits for the listed kinds before it reports a desired state.
    pub fn new(opts: ConvertOptions, waiting_for: &[&'static str], manifests: ManifestSet) -> Self {
        let manifest_json = (manifests.resources.iter())
            .map(|(k, r)| (k.clone(), r.to_json()))
            .collect();
        Index {
            opts,
            objects: BTreeMap::new(),
            waiting_for: waiting_for.iter().copied().collect(),
            manifests,
            manifest_json,
        }
    }

    /// An object was added or changed.
    pub fn apply<K: SourceKind>(&mut self, o: &K) {
        let converted = o.convert(&self.opts);
        for s in &converted.skips {
            tracing::warn!(object = %obj_ref(o), field = %s.field, "skipping: {}", s.message);
        }
        self.objects.insert(obj_ref(o), Held::new(converted));
    }

    /// An object was deleted.
    pub fn delete<K: SourceKind>(&mut self, o: &K) {
        self.objects.remove(&obj_ref(o));
    }

    /// A full relist of one kind: everything of that kind not in `objs` is gone.
    pub fn reset<K: SourceKind>(&mut self, objs: &[K]) {
        self.objects.retain(|r, _| r.kind != K::KIND);
        for o in objs {
            self.apply(o);
        }
        self.waiting_for.remove(K::KIND);
    }

    /// Whether a kind has been listed at least once.
    pub fn is_listed(&self, kind: &str) -> bool {
        !self.waiting_for.contains(kind)
    }

    /// Number of objects held of one kind.
    pub fn count(&self, kind: &str) -> usize {
        self.objects.keys().filter(|r| r.kind == kind).count()
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
            state.skips.extend(c.skips.iter().cloned());
            if let Some(k) = &c.retain_key {
                state.desired.retain.insert(k.clone());
            }
            if let Some((k, json)) = &c.stored {
                state.desired.resources.insert(k.clone(), json.clone());
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
}
