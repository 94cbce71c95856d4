//! The synchronous source index: every known Kubernetes object, already converted.
//!
//! Owned by the watcher tasks through a `std::sync::Mutex` that is never held across an `.await`
//! (kubert's pattern: plain `apply` / `delete` / `reset`). A relist (`Init…InitDone`) becomes one
//! `reset` that replaces every object of that kind, so deletions missed while disconnected are applied.
//!
//! A Node also yields its automatic host endpoint (`<node>-auto-hep`), converted with the Node and
//! part of the desired state only while [`Index::set_auto_host_endpoints`] is on.
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
            auto_hep: None,
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
    /// The manifests' Nodes' automatic host endpoints.
    manifest_auto_heps: Vec<Held>,
    /// Whether automatic host endpoints are desired.
    auto_host_endpoints: bool,
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
        }
    }

    /// Turns the Nodes' automatic host endpoints on or off; returns whether that changed anything.
    pub fn set_auto_host_endpoints(&mut self, on: bool) -> bool {
        std::mem::replace(&mut self.auto_host_endpoints, on) != on
    }

    /// Whether the Nodes' automatic host endpoints are desired.
    pub fn auto_host_endpoints(&self) -> bool {
        self.auto_host_endpoints
    }

    /// An object was added or changed.
    pub fn apply<K: SourceKind>(&mut self, o: &K) {
        let converted = o.convert(&self.opts);
        for s in &converted.skips {
            tracing::warn!(object = %obj_ref(o), field = %s.field, "skipping: {}", s.message);
        }
        let mut held = Held::new(converted);
        held.auto_hep = o
            .auto_host_endpoint(&self.opts)
            .map(|c| Box::new(Held::new(c)));
        self.objects.insert(obj_ref(o), held);
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
}
