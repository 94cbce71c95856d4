//! The agent's datastore state: the raw key -> value map, fed into the calculation graph.
//!
//! Invariants:
//! * `kvs` mirrors exactly what the graph has been told (a malformed value is logged, counted and
//!   skipped: the key keeps its previous value, so a typo never silently drops a policy).
//! * A full view (etcd list or snapshot) replaces the previous one wholesale: changed keys are
//!   updated and keys that disappeared are deleted.
//! * No batch reaches the apply loop before the first full view (no kernel write before in-sync).
//! * Only data that came from etcd is persisted into the snapshot.
//! * The view is scoped: the local cluster's keys, and each remote cluster's remote keys
//!   ([`federation`](super::federation)). A full view of one scope (local list, snapshot, a
//!   remote's list) replaces that scope only; a remote never changes `in_sync`, `source` or the
//!   revision, which are the local store's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::mpsc::Sender;

use calc_graph::graph::GraphError;
use calc_graph::model::{
    CALICO_PREFIX, ModelError, REMOTE_CLUSTER_PLURAL, RemoteCluster, ResourceKey,
    felix_configuration_name, remote_cluster_name,
};
use calc_graph::proto::Output;

use super::apply_loop::Batch;
use super::federation::{
    REMOTE_ROOT, RemoteKeyError, is_federated, remote_key, remote_scope, split_remote_key,
};
use super::metrics::felix::{RESYNC_IN_SYNC, RESYNC_WAIT};
use super::metrics::remote_labels;
use super::snapshot::{KvMap, Snapshot};
use super::status::{FailedSafeRuleStatus, RemoteStatus, Source, Status, StatusHub};
use super::syncer::SyncEvent;

/// Which part of the view a full replacement concerns.
#[derive(Debug, Clone, Copy)]
enum Scope<'a> {
    Local,
    Remote(&'a str),
}

impl Scope<'_> {
    fn contains(&self, key: &str) -> bool {
        match self {
            Scope::Local => !key.starts_with(REMOTE_ROOT),
            Scope::Remote(c) => split_remote_key(key).is_some_and(|(kc, _)| kc == *c),
        }
    }
}

/// Entries from `start` on, in key order.
fn from_key<'a>(
    m: &'a KvMap,
    start: &str,
) -> impl Iterator<Item = (&'a Arc<str>, &'a Arc<[u8]>)> + use<'a> {
    use std::ops::Bound;
    let start: Arc<str> = Arc::from(start);
    m.range::<Arc<str>, _>((Bound::Included(start), Bound::Unbounded))
}

fn rcc_prefix() -> String {
    format!("{CALICO_PREFIX}{REMOTE_CLUSTER_PLURAL}/")
}

/// Why a datastore value did not reach the graph (or the graph refused part of it): each names
/// the resource and, where there is one, the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PipelineError {
    /// The key or value does not decode, or the resource is invalid.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A remote cluster's key is not one.
    #[error(transparent)]
    RemoteKey(#[from] RemoteKeyError),
    /// A remote cluster's value does not decode or is invalid.
    #[error("remote cluster {cluster}: {source}")]
    Remote { cluster: String, source: ModelError },
    /// The graph's own errors for the update: (resource, what).
    #[error("{}", .0.iter().map(|(k, e)| format!("{k}: {e}")).collect::<Vec<_>>().join("; "))]
    Graph(Vec<(ResourceKey, GraphError)>),
}

/// Datastore keys in, graph outputs out (the calculation graph behind a small seam).
pub trait Pipeline: 'static {
    /// One key changed (`None`: deleted). `Err` names what is malformed in the value; the caller
    /// logs it and keeps the key's previous value.
    fn update(&mut self, key: &str, value: Option<&[u8]>) -> Result<(), PipelineError>;
    /// The first full view has been given.
    fn in_sync(&mut self);
    /// Everything the graph has to say since the last flush, in dependency order.
    fn flush(&mut self) -> Vec<Output>;
    /// The rules (cluster-wide) that currently fail safe because of a field the agent does not
    /// enforce or know.
    fn failed_safe_rules(&self) -> Vec<FailedSafeRuleStatus> {
        Vec::new()
    }
}

/// The apply thread no longer takes batches: it ended (`/liveness` says why).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("apply thread gone: the batch up to revision {revision} cannot be applied")]
pub struct ApplyThreadGone {
    pub revision: i64,
}

/// Owned by the agent's main task.
pub struct AgentState<P> {
    pipeline: P,
    kvs: KvMap,
    source: Source,
    in_sync: bool,
    revision: i64,
    /// Changes since the last `emit`.
    dirty: bool,
    /// etcd data changed since the last snapshot was taken.
    snapshot_dirty: bool,
    batches: Sender<Batch>,
    hub: Arc<StatusHub>,
    /// A RemoteClusterConfiguration key changed since [`Self::take_remote_configs`].
    remotes_dirty: bool,
    /// Keys of `kvs` changed since the last batch: the next batch carries their values, so the
    /// applied view ([`super::view`]) follows the kernel at the cost of the changes alone.
    touched: BTreeSet<Arc<str>>,
    /// A FelixConfiguration key changed since [`Self::take_felix_config_changed`].
    felix_config_dirty: bool,
    /// When the first change since the last batch reached the agent (the next batch's
    /// `received`).
    received: Option<std::time::Instant>,
    /// Graph time of the keys given since the last batch (decode, validation and apply).
    graph_time: GraphTime,
}

/// The graph's share of a batch: the keys given to it and the time they took, logged with the
/// flush at each [`AgentState::emit`] (the first batch, the initial sync, at info; later ones at
/// debug, target `felixrs::agent::state`).
#[derive(Debug, Default)]
struct GraphTime {
    keys: u64,
    update: std::time::Duration,
    batches: u64,
}

impl<P: Pipeline> AgentState<P> {
    pub fn new(pipeline: P, batches: Sender<Batch>, hub: Arc<StatusHub>) -> Self {
        Self {
            pipeline,
            kvs: KvMap::new(),
            source: Source::None,
            in_sync: false,
            revision: 0,
            dirty: false,
            snapshot_dirty: false,
            batches,
            hub,
            remotes_dirty: false,
            touched: BTreeSet::new(),
            felix_config_dirty: false,
            received: None,
            graph_time: GraphTime::default(),
        }
    }

    pub fn source(&self) -> Source {
        self.source
    }

    /// Absorbs one syncer event (call [`Self::emit`] after a burst).
    pub fn on_event(&mut self, ev: SyncEvent) {
        match ev {
            SyncEvent::Listed { revision, kvs } => {
                self.hub.metrics.resyncs.inc();
                let kvs = kvs
                    .into_iter()
                    .map(|(k, v)| (Arc::from(k.as_str()), Arc::from(v.as_slice())))
                    .collect();
                self.replace(revision, kvs, Source::Etcd);
                self.answered();
            }
            SyncEvent::Changes { revision, changes } => {
                for c in changes {
                    self.hub.metrics.datastore_updates.inc();
                    self.change(Arc::from(c.key.as_str()), c.value.map(Arc::from));
                }
                self.advance(revision);
                if self.source == Source::Etcd {
                    self.snapshot_dirty = true;
                }
                self.answered();
            }
            SyncEvent::Progress { revision } => {
                self.advance(revision);
                self.answered();
            }
            SyncEvent::Disconnected { reason } => {
                self.hub.metrics.datastore_disconnects.inc();
                self.hub.metrics.felix.set_resync_state(RESYNC_WAIT);
                self.hub.update(|s| {
                    s.datastore_connected = false;
                    s.datastore_error = Some(reason);
                });
            }
        }
    }

    /// The datastore answered: connected (in `/status`), and in sync once its list is in the view
    /// (Felix's `felix_resync_state`; a resumed watch keeps the listed view).
    fn answered(&self) {
        self.hub.update(connected);
        if self.source == Source::Etcd {
            self.hub.metrics.felix.set_resync_state(RESYNC_IN_SYNC);
        }
    }

    /// Uses a persisted snapshot as the full view (only while nothing came from etcd).
    pub fn load_snapshot(&mut self, snap: Snapshot) -> bool {
        if self.source != Source::None {
            return false;
        }
        let local = snap
            .kvs
            .into_iter()
            .filter(|(k, _)| Scope::Local.contains(k))
            .collect();
        self.replace(snap.revision, local, Source::Snapshot);
        self.snapshot_dirty = false;
        true
    }

    /// Takes the remote clusters' members from a snapshot while they have none of their own yet
    /// (at start, whatever the local etcd does): a remote that is down keeps its last members
    /// across restarts. Configurations that no longer exist are dropped once the local view is in.
    pub fn seed_remotes(&mut self, snap: &Snapshot) {
        let mut seeded: BTreeMap<String, usize> = BTreeMap::new();
        for (k, v) in from_key(&snap.kvs, REMOTE_ROOT) {
            let Some((cluster, _)) = split_remote_key(k) else {
                break;
            };
            if self.kvs.contains_key(k) {
                continue;
            }
            *seeded.entry(cluster.to_string()).or_default() += 1;
            self.change(k.clone(), Some(v.clone()));
        }
        for (cluster, keys) in seeded {
            tracing::info!(%cluster, keys, "remote cluster members from the snapshot");
            self.hub.update(|s| {
                let r = s.remote_clusters.entry(cluster).or_default();
                r.source = Source::Snapshot;
                r.keys = keys;
            });
        }
    }

    /// One remote syncer's event (call [`Self::emit`] after a burst).
    pub fn on_remote_event(&mut self, cluster: &str, ev: SyncEvent) {
        let status = |this: &Self, f: &dyn Fn(&mut RemoteStatus)| {
            let keys = this.remote_keys(cluster);
            let mut connected = false;
            this.hub.update(|s| {
                let r = s.remote_clusters.entry(cluster.to_string()).or_default();
                f(r);
                r.keys = keys;
                connected = r.connected;
            });
            let labels = remote_labels(cluster);
            let m = &this.hub.metrics;
            m.remote_connected
                .get_or_create(&labels)
                .set(i64::from(connected));
            m.remote_keys.get_or_create(&labels).set(keys as i64);
        };
        let (revision, listed) = match ev {
            SyncEvent::Listed { revision, kvs } => {
                let new = kvs
                    .into_iter()
                    .filter(|(k, _)| is_federated(k))
                    .map(|(k, v)| (Arc::from(remote_key(cluster, &k)), Arc::from(v)))
                    .collect();
                let removed = self.replace_scope(Scope::Remote(cluster), new);
                tracing::info!(%cluster, revision, removed, "listed remote cluster");
                self.after_remote_change();
                (revision, true)
            }
            SyncEvent::Changes { revision, changes } => {
                for c in changes.into_iter().filter(|c| is_federated(&c.key)) {
                    self.hub.metrics.datastore_updates.inc();
                    let key = Arc::from(remote_key(cluster, &c.key));
                    self.change(key, c.value.map(Arc::from));
                }
                self.after_remote_change();
                (revision, false)
            }
            SyncEvent::Progress { revision } => (revision, false),
            SyncEvent::Disconnected { reason } => {
                tracing::warn!(%cluster, %reason, "remote cluster unreachable; keeping its last members");
                return status(self, &|r| {
                    r.connected = false;
                    r.error = Some(reason.clone());
                });
            }
        };
        // Its etcd answered: a list replaces the revision, the rest only advance it.
        status(self, &|r| {
            r.connected = true;
            r.error = None;
            if listed {
                r.revision = revision;
                r.source = Source::Etcd;
            } else {
                r.revision = r.revision.max(revision);
            }
        });
    }

    fn after_remote_change(&mut self) {
        if self.source == Source::Etcd {
            self.snapshot_dirty = true;
        }
    }

    fn remote_keys(&self, cluster: &str) -> usize {
        let scope = remote_scope(cluster);
        from_key(&self.kvs, &scope)
            .take_while(|(k, _)| k.starts_with(&scope))
            .count()
    }

    /// Removes a remote cluster's members (its configuration was deleted).
    pub fn drop_remote(&mut self, cluster: &str) {
        let removed = self.replace_scope(Scope::Remote(cluster), KvMap::new());
        tracing::info!(%cluster, removed, "remote cluster removed with its members");
        self.after_remote_change();
        self.hub.update(|s| {
            s.remote_clusters.remove(cluster);
        });
        let labels = remote_labels(cluster);
        self.hub.metrics.remote_connected.remove(&labels);
        self.hub.metrics.remote_keys.remove(&labels);
    }

    /// Clusters with members in the view.
    pub fn remote_clusters_in_view(&self) -> Vec<String> {
        let mut clusters: Vec<&str> = from_key(&self.kvs, REMOTE_ROOT)
            .map_while(|(k, _)| split_remote_key(k).map(|(c, _)| c))
            .collect();
        clusters.dedup();
        clusters.into_iter().map(String::from).collect()
    }

    /// The valid RemoteClusterConfigurations of the local view, if one changed since the last
    /// call. An invalid one is logged, counted and shown in `/status`; its remote keeps running
    /// with the last valid configuration if there was one (a typo never drops a cluster).
    pub fn take_remote_configs(
        &mut self,
        running: &dyn Fn(&str) -> Option<RemoteCluster>,
    ) -> Option<BTreeMap<String, RemoteCluster>> {
        if !std::mem::take(&mut self.remotes_dirty) {
            return None;
        }
        let prefix = rcc_prefix();
        let mut out = BTreeMap::new();
        // Each configuration's name is in `errors` (invalid) or else in `out`.
        let mut errors = BTreeMap::new();
        for (k, v) in from_key(&self.kvs, &prefix).take_while(|(k, _)| k.starts_with(&prefix)) {
            let Some(name) = remote_cluster_name(k) else {
                continue;
            };
            let config = match RemoteCluster::from_etcd(k, v) {
                Ok(rc) => Some(rc),
                Err(error) => {
                    self.malformed(k, &error);
                    errors.insert(name.to_string(), error.to_string());
                    running(name)
                }
            };
            out.extend(config.map(|c| (name.to_string(), c)));
        }
        self.hub.update(|s| {
            // A cluster without a configuration any more is gone from the status (its members go
            // with `drop_remote`).
            s.remote_clusters
                .retain(|name, _| out.contains_key(name) || errors.contains_key(name));
            for (name, r) in s.remote_clusters.iter_mut() {
                r.config_error = errors.remove(name);
            }
            for (name, e) in errors {
                s.remote_clusters.entry(name).or_default().config_error = Some(e);
            }
        });
        Some(out)
    }

    /// Whether a FelixConfiguration key changed (or a full view came in) since the last call.
    pub fn take_felix_config_changed(&mut self) -> bool {
        std::mem::take(&mut self.felix_config_dirty)
    }

    fn replace(&mut self, revision: i64, new: KvMap, source: Source) {
        let removed = self.replace_scope(Scope::Local, new);
        tracing::info!(
            revision,
            ?source,
            keys = self.kvs.len(),
            removed,
            "replacing the datastore view"
        );
        self.source = source;
        self.revision = revision;
        if source == Source::Etcd {
            self.snapshot_dirty = true;
        }
        if !self.in_sync {
            let started = std::time::Instant::now();
            self.pipeline.in_sync();
            self.graph_time.update += started.elapsed();
            self.in_sync = true;
        }
        self.dirty = true;
        self.remotes_dirty = true;
        self.felix_config_dirty = true;
        self.hub.update(|s| {
            s.in_sync = true;
            s.source = source;
            s.observed_revision = revision;
        });
    }

    /// Replaces the keys of `scope` with `new` (whose keys must all be in it), telling the graph
    /// only what changed; returns how many keys were removed.
    fn replace_scope(&mut self, scope: Scope<'_>, new: KvMap) -> usize {
        self.received.get_or_insert_with(std::time::Instant::now);
        let (mut old, keep): (KvMap, KvMap) = std::mem::take(&mut self.kvs)
            .into_iter()
            .partition(|(k, _)| scope.contains(k));
        self.kvs = keep;
        self.touched.extend(old.keys().cloned());
        for (k, v) in new {
            let prev = old.remove(&k);
            self.put(k, v, prev);
        }
        let removed = old.len();
        for k in old.into_keys() {
            self.delete(&k);
        }
        self.dirty = true;
        removed
    }

    fn change(&mut self, key: Arc<str>, value: Option<Arc<[u8]>>) {
        self.received.get_or_insert_with(std::time::Instant::now);
        self.touched.insert(key.clone());
        if key.starts_with(&rcc_prefix()) {
            self.remotes_dirty = true;
        }
        if felix_configuration_name(&key).is_some() {
            self.felix_config_dirty = true;
        }
        match value {
            None => {
                if self.kvs.remove(&key).is_some() {
                    self.delete(&key);
                }
            }
            Some(v) => {
                let prev = self.kvs.remove(&key);
                self.put(key, v, prev);
            }
        }
    }

    /// `key` (not in `kvs`) is now `value`: the graph is told unless `prev` was the same; a
    /// malformed value keeps `prev`.
    fn put(&mut self, key: Arc<str>, value: Arc<[u8]>, prev: Option<Arc<[u8]>>) {
        self.touched.insert(key.clone());
        if prev.as_ref() == Some(&value) {
            self.kvs.insert(key, value);
            return;
        }
        match self.graph_update(&key, Some(&value)) {
            Ok(()) => {
                self.hub.metrics.felix.cluster_put(&key, &value);
                self.kvs.insert(key, value);
                self.dirty = true;
            }
            Err(error) => {
                self.malformed(&key, &error);
                if let Some(prev) = prev {
                    self.kvs.insert(key, prev);
                }
            }
        }
    }

    fn delete(&mut self, key: &str) {
        self.hub.metrics.felix.cluster_delete(key);
        if let Err(error) = self.graph_update(key, None) {
            self.malformed(key, &error);
        }
        self.dirty = true;
    }

    /// Gives one key to the graph, timed (Felix's `felix_calc_graph_update_time_seconds`).
    fn graph_update(&mut self, key: &str, value: Option<&[u8]>) -> Result<(), PipelineError> {
        let started = std::time::Instant::now();
        let res = self.pipeline.update(key, value);
        let took = started.elapsed();
        self.graph_time.keys += 1;
        self.graph_time.update += took;
        let felix = &self.hub.metrics.felix;
        felix.calc_graph_update_seconds.observe(took.as_secs_f64());
        res
    }

    fn malformed(&self, key: &str, error: &dyn std::fmt::Display) {
        tracing::warn!(key, %error, "skipping malformed datastore value");
        self.hub.metrics.malformed_values.inc();
        self.hub.update(|s| s.malformed_values += 1);
    }

    fn advance(&mut self, revision: i64) {
        if revision > self.revision {
            self.revision = revision;
            self.hub.update(|s| s.observed_revision = revision);
        }
    }

    /// Flushes the graph and hands the batch to the apply loop (nothing before in-sync). The
    /// apply thread takes batches for as long as the agent runs: an error means it ended.
    pub fn emit(&mut self) -> Result<(), ApplyThreadGone> {
        if !self.in_sync {
            return Ok(());
        }
        let view = (std::mem::take(&mut self.touched).into_iter())
            .map(|k| {
                let v = self.kvs.get(&k).cloned();
                (k, v)
            })
            .collect();
        let outputs = if self.dirty {
            let failed_safe = self.pipeline.failed_safe_rules();
            self.hub
                .metrics
                .failed_safe_rules
                .set(failed_safe.len() as i64);
            self.hub.update(|s| s.failed_safe_rules = failed_safe);
            let started = std::time::Instant::now();
            let outputs = self.pipeline.flush();
            self.log_graph_time(started.elapsed(), outputs.len());
            outputs
        } else {
            Vec::new()
        };
        self.dirty = false;
        self.batches
            .send(Batch {
                outputs,
                revision: self.revision,
                view,
                received: self.received.take().unwrap_or_else(std::time::Instant::now),
            })
            .map_err(|_| ApplyThreadGone {
                revision: self.revision,
            })
    }

    /// Logs the graph's time for the batch being emitted: the keys' updates since the last batch
    /// and this `flush`.
    fn log_graph_time(&mut self, flush: std::time::Duration, outputs: usize) {
        let g = std::mem::take(&mut self.graph_time);
        let (keys, update_us, flush_us) = (g.keys, g.update.as_micros(), flush.as_micros());
        let total_us = update_us + flush_us;
        if g.batches == 0 {
            tracing::info!(
                keys,
                update_us,
                flush_us,
                total_us,
                outputs,
                "initial sync through the calculation graph"
            );
        } else {
            tracing::debug!(keys, update_us, flush_us, total_us, outputs, "graph batch");
        }
        self.graph_time.batches = g.batches + 1;
    }

    /// The etcd data to persist, if it changed since the last call.
    pub fn take_snapshot(&mut self) -> Option<Snapshot> {
        if !self.snapshot_dirty || self.source != Source::Etcd {
            return None;
        }
        self.snapshot_dirty = false;
        Some(Snapshot {
            revision: self.revision,
            kvs: self.kvs.clone(),
        })
    }

    /// Current raw contents (tests and diagnostics).
    pub fn kvs(&self) -> &BTreeMap<Arc<str>, Arc<[u8]>> {
        &self.kvs
    }
}

/// The datastore answered: connected, and the last connection error is history.
fn connected(s: &mut Status) {
    s.datastore_connected = true;
    s.datastore_error = None;
}

#[cfg(test)]
#[path = "state_federation_tests.rs"]
mod federation_tests;

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
