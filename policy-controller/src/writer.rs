//! Reconciles the desired set of Calico resources into etcd.
//!
//! # Ownership
//! The controller only ever creates, updates or deletes keys it owns:
//! * by name pattern, the resources it derives from Kubernetes objects:
//!   `networkpolicies/<ns>/knp.default.*`, `profiles/kns.*`, `profiles/ksa.*`, `workloadendpoints/*` and
//!   the admin policies' `globalnetworkpolicies/{kanp.adminnetworkpolicy.,kbanp.baselineadminnetworkpolicy.,kcnp.}*`
//!   (their Tier resources are owned by marker, like manifest resources), and the nodes' network sets
//!   `globalnetworksets/knode.*`;
//! * by marker, the `projectcalico.org/v3` resources it wrote from manifests: for each such key it keeps
//!   `/felixrs/policy-controller/owned<key>` (outside Calico's prefix, so Calico tooling ignores it).
//!   A v3 resource that someone else created and that a manifest later also defines is taken over;
//! * by label, the automatic host endpoints: `hostendpoints/*` labelled
//!   `projectcalico.org/created-by: calico-kube-controllers`, as kube-controllers recognises them
//!   (so those it made before the controller replaced it are kept in step, or removed when their
//!   node is gone or the feature is off). A host endpoint without that label is never written or
//!   deleted, even when it has an automatic one's name.
//!
//! Everything else under `/calico/` is never touched.
//!
//! # Prefix
//! With `--etcd-prefix` the cluster's keys live under another prefix ([`EtcdPrefix`]); the writer
//! plans on canonical keys and translates at the etcd edge, and keeps its markers under
//! [`EtcdPrefix::private_key`] so two clusters' controllers never see each other's.
//!
//! # Writes
//! Every write is compare-and-swap: a create requires the key to be absent, an update or delete requires
//! the mod revision read at the start of the pass. Values are compared as JSON, so a second pass with
//! nothing changed writes nothing. Operations go out in transactions of at most [`MAX_TXN_OPS`] (etcd's
//! default `--max-txn-ops`). If a [`Fence`] is set (the elected leader's key), every transaction also
//! requires that key to still exist with its creation revision, so a deposed leader cannot write.
//! A failed compare means someone else wrote concurrently: the pass re-reads and starts again.
//! A transaction also stays under [`MAX_TXN_BYTES`] (etcd's default `--max-request-bytes` is 1.5 MiB).
//!
//! # The writer's index
//! A full pass ([`Writer::sync`]) reads the prefix and the markers (one ranged read each) and leaves
//! the writer an index of what etcd holds: for every key a hash of its value, its mod revision and
//! whether its label makes it ours, and the markers' mod revisions. Every successful transaction
//! updates it with the transaction's revision. The passes in between ([`Writer::sync_changes`] for
//! the keys that changed, [`Writer::sync_indexed`] for a whole desired state) plan against that index
//! and read nothing from etcd, so their cost is proportional to what changed. Invariant: after every
//! successful pass the index equals etcd (for the keys it covers). A write by someone else makes a
//! compare fail: the index is dropped and those passes answer `None`, asking for a full pass, which
//! repairs any divergence; so does the periodic resync.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hasher;
use std::time::Instant;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use serde_json::Value;

use calc_graph::model::EtcdPrefix;

use crate::convert::{CREATED_BY_LABEL, CREATED_BY_VALUE, RESOURCE_PREFIX};

/// etcd's default maximum number of operations in one transaction.
pub const MAX_TXN_OPS: usize = 128;
/// The most bytes (keys, values and compares, roughly) one transaction carries; etcd's default
/// `--max-request-bytes` is 1.5 MiB.
pub const MAX_TXN_BYTES: usize = 1024 * 1024;
/// Prefix of ownership markers for resources written from v3 manifests.
pub const OWNER_MARKER_PREFIX: &str = "/felixrs/policy-controller/owned";
/// How many times a pass restarts after losing a compare-and-swap race.
const MAX_ATTEMPTS: usize = 5;

/// Errors from a reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// An etcd request failed.
    #[error("etcd {op} failed")]
    Etcd {
        op: &'static str,
        #[source]
        source: etcd_client::Error,
    },
    /// The leader fence no longer holds: this replica lost leadership.
    #[error("lost leadership: leader key {0} is gone or changed")]
    Fenced(String),
    /// Concurrent writers kept winning every compare-and-swap.
    #[error("gave up after {0} conflicting passes")]
    Conflict(usize),
}

/// The state to reach.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Desired {
    /// etcd key → JSON value.
    pub resources: BTreeMap<String, String>,
    /// Owned keys to leave alone even though nothing desires them (objects that failed validation).
    pub retain: BTreeSet<String>,
}

/// Changes to some keys only ([`Writer::sync_changes`]): each key's desired value (`None` when
/// nothing desires it), and which of them are retained (owned keys to leave alone even though
/// nothing desires them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    pub resources: BTreeMap<String, Option<String>>,
    pub retain: BTreeSet<String>,
}

/// A leader key that must still exist (with this creation revision) for a write to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub key: Vec<u8>,
    pub create_revision: i64,
}

/// Counts from one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SyncStats {
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
    /// The etcd revision at which everything written is visible.
    pub revision: i64,
}

/// Whether a key belongs to the controller by its name pattern.
pub fn owned_by_pattern(key: &str) -> bool {
    let Some(rest) = key.strip_prefix(RESOURCE_PREFIX) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        ["networkpolicies", _ns, name] => name.starts_with("knp.default."),
        ["profiles", name] => name.starts_with("kns.") || name.starts_with("ksa."),
        ["globalnetworkpolicies", _name] => crate::convert::admin::is_admin_policy_key(key),
        ["globalnetworksets", name] => name.starts_with(crate::convert::KNODE_PREFIX),
        ["workloadendpoints", _ns, _name] => true,
        _ => false,
    }
}

/// Whether a stored resource belongs to the controller by its content: a host endpoint labelled
/// [`CREATED_BY_LABEL`]` = `[`CREATED_BY_VALUE`] (an automatic host endpoint, ours or one calico
/// kube-controllers made before us, which is how kube-controllers itself recognises them).
pub fn owned_by_label(key: &str, json: &[u8]) -> bool {
    let is_hep = key
        .strip_prefix(RESOURCE_PREFIX)
        .is_some_and(|r| r.starts_with("hostendpoints/"));
    is_hep
        && serde_json::from_slice::<Value>(json).is_ok_and(|v| {
            v.pointer("/metadata/labels")
                .and_then(|l| l.get(CREATED_BY_LABEL))
                .and_then(Value::as_str)
                == Some(CREATED_BY_VALUE)
        })
}

/// The ownership marker of canonical key `key`, for the cluster at `p`.
fn marker_key(p: &EtcdPrefix, key: &str) -> String {
    format!("{}{key}", p.private_key(OWNER_MARKER_PREFIX))
}

/// What is in etcd now, for the keys that matter.
struct Current {
    /// Every key under the Calico prefix: value and mod revision.
    values: BTreeMap<String, (Vec<u8>, i64)>,
    /// Keys that carry an ownership marker, with the marker's mod revision.
    markers: BTreeMap<String, i64>,
    revision: i64,
}

/// The writer's index of etcd: what [`Current`] holds, with each value reduced to a hash.
#[derive(Debug, Default)]
struct Known {
    values: HashMap<String, KnownValue>,
    markers: HashMap<String, i64>,
}

#[derive(Debug, Clone, Copy)]
struct KnownValue {
    hash: u64,
    rev: i64,
    /// [`owned_by_label`] of the stored value.
    label_owned: bool,
}

fn value_hash(v: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(v);
    h.finish()
}

impl Known {
    fn from_current(c: &Current) -> Self {
        Known {
            values: (c.values.iter())
                .map(|(k, (v, rev))| {
                    let kv = KnownValue {
                        hash: value_hash(v),
                        rev: *rev,
                        label_owned: owned_by_label(k, v),
                    };
                    (k.clone(), kv)
                })
                .collect(),
            markers: (c.markers.iter()).map(|(k, r)| (k.clone(), *r)).collect(),
        }
    }

    fn have(&self, key: &str, want: Option<&str>) -> Option<Have> {
        self.values.get(key).map(|kv| Have {
            rev: kv.rev,
            same: want.is_some_and(|w| kv.hash == value_hash(w.as_bytes())),
            label_owned: kv.label_owned,
        })
    }

    /// Records a transaction that succeeded at `revision`.
    fn record(&mut self, effects: Vec<Effect>, revision: i64) {
        for e in effects {
            match e {
                Effect::Put {
                    key,
                    hash,
                    label_owned,
                } => {
                    let kv = KnownValue {
                        hash,
                        rev: revision,
                        label_owned,
                    };
                    self.values.insert(key, kv);
                }
                Effect::Delete(key) => {
                    self.values.remove(&key);
                }
                Effect::Marker(key) => {
                    self.markers.insert(key, revision);
                }
                Effect::Unmarker(key) => {
                    self.markers.remove(&key);
                }
            }
        }
    }
}

/// A stored key as the plan sees it.
struct Have {
    rev: i64,
    /// Whether the stored value equals the desired one.
    same: bool,
    label_owned: bool,
}

/// What a change does to the writer's index once its transaction succeeds.
enum Effect {
    Put {
        key: String,
        hash: u64,
        label_owned: bool,
    },
    Delete(String),
    Marker(String),
    Unmarker(String),
}

/// One planned change: its compares and operations travel in the same transaction.
struct Change {
    compares: Vec<Compare>,
    ops: Vec<TxnOp>,
    kind: ChangeKind,
    /// Dependency rank of the key's resource type ([`rank`]).
    rank: u8,
    effects: Vec<Effect>,
    /// Roughly what the change adds to the request.
    bytes: usize,
}

/// Dependency rank: tiers, then sets, then policies, then profiles, then endpoints. Creates and
/// updates go out in rising rank and deletes in falling rank, so even when a pass spans several
/// transactions a new endpoint never appears before the policies and profiles that apply to it, and
/// an endpoint is removed before its policies are. This is the order Felix's calc graph emits (felix-reference §8.5).
fn rank(key: &str) -> u8 {
    let plural = key
        .strip_prefix(RESOURCE_PREFIX)
        .and_then(|r| r.split('/').next())
        .unwrap_or("");
    match plural {
        "tiers" => 0,
        "globalnetworksets" | "networksets" => 1,
        "profiles" => 3,
        "workloadendpoints" | "hostendpoints" => 4,
        _ => 2,
    }
}

#[derive(Clone, Copy)]
enum ChangeKind {
    Create,
    Update,
    /// Only an ownership marker is added to an existing, identical resource.
    Adopt,
    Delete,
    /// A marker whose resource is already gone is removed.
    Cleanup,
}

/// Writes desired state into etcd.
pub struct Writer {
    client: Client,
    fence: Option<Fence>,
    metrics: Option<crate::metrics::Metrics>,
    prefix: EtcdPrefix,
    /// What etcd holds, as of the last successful pass; `None` until a full pass, and after a failed
    /// compare or an etcd error (then only a full pass rebuilds it).
    known: Option<Known>,
    /// The revision of the last read or successful write.
    revision: i64,
}

impl Writer {
    pub fn new(client: Client) -> Self {
        Writer {
            client,
            fence: None,
            metrics: None,
            prefix: EtcdPrefix::default(),
            known: None,
            revision: 0,
        }
    }

    /// Writes the cluster whose keys live under `prefix` (default: Calico's).
    pub fn set_prefix(&mut self, prefix: EtcdPrefix) {
        self.prefix = prefix;
        self.known = None;
    }

    /// Requires the given leader key for every write from now on.
    pub fn set_fence(&mut self, fence: Option<Fence>) {
        self.fence = fence;
    }

    /// Records write latency and counts.
    pub fn set_metrics(&mut self, metrics: crate::metrics::Metrics) {
        self.metrics = Some(metrics);
    }

    /// Whether the writer has an index of etcd (a full pass succeeded and nothing has invalidated it
    /// since), so [`Writer::sync_changes`] and [`Writer::sync_indexed`] can run.
    pub fn is_indexed(&self) -> bool {
        self.known.is_some()
    }

    /// One full reconcile pass: reads the prefix (one ranged read, and one for the markers), writes
    /// the differences and rebuilds the writer's index.
    pub async fn sync(&mut self, desired: &Desired) -> Result<SyncStats, WriterError> {
        let mut stats = SyncStats::default();
        for _ in 0..MAX_ATTEMPTS {
            let current = self.read().await?;
            stats.revision = current.revision;
            self.revision = current.revision;
            let mut known = Known::from_current(&current);
            // A stored value equal as JSON but written differently is known as the desired one.
            for (key, want) in &desired.resources {
                if let (Some((old, _)), Some(kv)) =
                    (current.values.get(key), known.values.get_mut(key))
                    && old.as_slice() != want.as_bytes()
                    && json_equal(old, want)
                {
                    kv.hash = value_hash(want.as_bytes());
                }
            }
            self.known = Some(known);
            let changes = plan(desired, &current, &self.prefix);
            drop(current);
            if changes.is_empty() {
                return Ok(stats);
            }
            match self.apply(changes, &mut stats).await? {
                true => return Ok(stats),
                false => {
                    tracing::info!("concurrent write detected, re-reading etcd");
                    self.check_fence().await?;
                }
            }
        }
        Err(WriterError::Conflict(MAX_ATTEMPTS))
    }

    /// Writes what differs between the given keys' desired values and the writer's index, without
    /// reading etcd. `Ok(None)` when there is no index or a compare failed (someone else wrote):
    /// run a full [`Writer::sync`].
    pub async fn sync_changes(
        &mut self,
        changes: &Changes,
    ) -> Result<Option<SyncStats>, WriterError> {
        let Some(known) = &self.known else {
            return Ok(None);
        };
        let p = &self.prefix;
        let planned: Vec<Change> = (changes.resources.iter())
            .filter_map(|(key, want)| {
                let want = want.as_deref();
                let retained = changes.retain.contains(key);
                let marker = known.markers.get(key).copied();
                plan_key(key, want, retained, known.have(key, want), marker, p)
            })
            .collect();
        self.apply_indexed(planned).await
    }

    /// Writes what differs between a whole desired state and the writer's index, without reading
    /// etcd. `Ok(None)` as for [`Writer::sync_changes`].
    pub async fn sync_indexed(
        &mut self,
        desired: &Desired,
    ) -> Result<Option<SyncStats>, WriterError> {
        let Some(known) = &self.known else {
            return Ok(None);
        };
        let p = &self.prefix;
        let mut planned = Vec::new();
        for (key, want) in &desired.resources {
            let marker = known.markers.get(key).copied();
            let have = known.have(key, Some(want));
            planned.extend(plan_key(key, Some(want), false, have, marker, p));
        }
        let mut stored: Vec<&String> = (known.values.keys())
            .filter(|k| !desired.resources.contains_key(*k))
            .collect();
        stored.sort();
        for key in stored {
            let retained = desired.retain.contains(key);
            let marker = known.markers.get(key).copied();
            planned.extend(plan_key(
                key,
                None,
                retained,
                known.have(key, None),
                marker,
                p,
            ));
        }
        let mut orphans: Vec<(&String, &i64)> = (known.markers.iter())
            .filter(|(k, _)| !known.values.contains_key(*k) && !desired.resources.contains_key(*k))
            .collect();
        orphans.sort();
        for (key, mrev) in orphans {
            planned.extend(plan_key(key, None, false, None, Some(*mrev), p));
        }
        self.apply_indexed(planned).await
    }

    async fn apply_indexed(
        &mut self,
        mut planned: Vec<Change>,
    ) -> Result<Option<SyncStats>, WriterError> {
        let mut stats = SyncStats {
            revision: self.revision,
            ..SyncStats::default()
        };
        if planned.is_empty() {
            return Ok(Some(stats));
        }
        sort_changes(&mut planned);
        if self.apply(planned, &mut stats).await? {
            Ok(Some(stats))
        } else {
            tracing::info!("concurrent write detected, the writer's index is stale");
            self.check_fence().await?;
            Ok(None)
        }
    }

    async fn read(&mut self) -> Result<Current, WriterError> {
        let etcd = |source| WriterError::Etcd { op: "get", source };
        let resp = self
            .client
            .get(
                self.prefix.resources(),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(etcd)?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        let mut values = BTreeMap::new();
        for kv in resp.kvs() {
            if let Some(k) = kv.key_str().ok().and_then(|k| self.prefix.to_canonical(k)) {
                values.insert(k, (kv.value().to_vec(), kv.mod_revision()));
            }
        }
        drop(resp);
        // Read markers at the same revision so both views are consistent.
        let marker_prefix = self.prefix.private_key(OWNER_MARKER_PREFIX);
        let resp = self
            .client
            .get(
                marker_prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_revision(revision)),
            )
            .await
            .map_err(etcd)?;
        let mut markers = BTreeMap::new();
        for kv in resp.kvs() {
            if let Ok(k) = kv.key_str()
                && let Some(target) = k.strip_prefix(marker_prefix.as_str())
            {
                markers.insert(target.to_string(), kv.mod_revision());
            }
        }
        Ok(Current {
            values,
            markers,
            revision,
        })
    }

    async fn check_fence(&mut self) -> Result<(), WriterError> {
        let Some(f) = self.fence.clone() else {
            return Ok(());
        };
        let resp = self
            .client
            .get(f.key.clone(), None)
            .await
            .map_err(|source| WriterError::Etcd { op: "get", source })?;
        match resp.kvs().first() {
            Some(kv) if kv.create_revision() == f.create_revision => Ok(()),
            _ => Err(WriterError::Fenced(
                String::from_utf8_lossy(&f.key).into_owned(),
            )),
        }
    }

    /// Sends the changes in batches; `Ok(false)` when a compare failed. Each successful batch is
    /// recorded in the writer's index; a failed one (or an etcd error) drops the index.
    async fn apply(
        &mut self,
        changes: Vec<Change>,
        stats: &mut SyncStats,
    ) -> Result<bool, WriterError> {
        let fence_cmp = self
            .fence
            .as_ref()
            .map(|f| Compare::create_revision(f.key.clone(), CompareOp::Equal, f.create_revision));
        let reserved = usize::from(fence_cmp.is_some());
        let reserved_bytes = self.fence.as_ref().map_or(0, |f| f.key.len() + 16);
        let mut batch: Vec<Change> = Vec::new();
        let mut batches = Vec::new();
        let (mut n_cmp, mut n_ops, mut n_bytes) = (reserved, 0, reserved_bytes);
        for c in changes {
            if !batch.is_empty()
                && (n_cmp + c.compares.len() > MAX_TXN_OPS
                    || n_ops + c.ops.len() > MAX_TXN_OPS
                    || n_bytes + c.bytes > MAX_TXN_BYTES)
            {
                batches.push(std::mem::take(&mut batch));
                (n_cmp, n_ops, n_bytes) = (reserved, 0, reserved_bytes);
            }
            n_cmp += c.compares.len();
            n_ops += c.ops.len();
            n_bytes += c.bytes;
            batch.push(c);
        }
        if !batch.is_empty() {
            batches.push(batch);
        }
        for batch in batches {
            let mut compares: Vec<Compare> = fence_cmp.iter().cloned().collect();
            let mut ops = Vec::new();
            let mut effects = Vec::new();
            let kinds: Vec<ChangeKind> = batch.iter().map(|c| c.kind).collect();
            for c in batch {
                compares.extend(c.compares);
                ops.extend(c.ops);
                effects.extend(c.effects);
            }
            let started = Instant::now();
            let resp = match self
                .client
                .txn(Txn::new().when(compares).and_then(ops))
                .await
            {
                Ok(r) => r,
                Err(source) => {
                    self.known = None;
                    return Err(WriterError::Etcd { op: "txn", source });
                }
            };
            if let Some(m) = &self.metrics {
                m.observe_write(started.elapsed());
            }
            if !resp.succeeded() {
                self.known = None;
                return Ok(false);
            }
            if let Some(h) = resp.header() {
                stats.revision = h.revision();
                self.revision = h.revision();
            }
            if let Some(known) = &mut self.known {
                known.record(effects, stats.revision);
            }
            for k in kinds {
                match k {
                    ChangeKind::Create => stats.created += 1,
                    ChangeKind::Update => stats.updated += 1,
                    ChangeKind::Delete => stats.deleted += 1,
                    ChangeKind::Adopt | ChangeKind::Cleanup => {}
                }
            }
        }
        if let Some(m) = &self.metrics {
            m.record_sync(stats);
        }
        Ok(true)
    }
}

fn json_equal(a: &[u8], b: &str) -> bool {
    match (
        serde_json::from_slice::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b.as_bytes(),
    }
}

/// The change (if any) that takes one key from what is stored (`have`, and its marker's mod
/// revision) to what is desired (`want`; `retained`: leave it even though nothing desires it).
fn plan_key(
    key: &str,
    want: Option<&str>,
    retained: bool,
    have: Option<Have>,
    marker: Option<i64>,
    p: &EtcdPrefix,
) -> Option<Change> {
    // Keys are canonical until they reach etcd.
    let k = p.from_canonical(key);
    let m = marker_key(p, key);
    let has_marker = marker.is_some();
    let overhead = 16;
    match (want, have) {
        (Some(value), have) => {
            let auto_hep = owned_by_label(key, value.as_bytes());
            let needs_marker = !owned_by_pattern(key) && !auto_hep;
            if let Some(h) = &have
                && auto_hep
                && !has_marker
                && !h.label_owned
            {
                // Someone else's host endpoint with the automatic one's name: never taken over.
                tracing::warn!(%key, "not writing the automatic host endpoint: a host endpoint without the {CREATED_BY_LABEL} label has its name");
                return None;
            }
            let put = Effect::Put {
                key: key.to_string(),
                hash: value_hash(value.as_bytes()),
                label_owned: auto_hep,
            };
            let mut ops = Vec::new();
            let mut effects = Vec::new();
            let mut bytes = 2 * (k.len() + overhead);
            let same = have.as_ref().is_some_and(|h| h.same);
            if !same {
                ops.push(TxnOp::put(k.as_str(), value, None));
                effects.push(put);
                bytes += value.len();
            }
            if needs_marker && (have.is_none() || !has_marker) {
                ops.push(TxnOp::put(m.as_str(), "", None));
                effects.push(Effect::Marker(key.to_string()));
                bytes += m.len() + overhead;
            }
            if ops.is_empty() {
                return None;
            }
            let (compare, kind) = match &have {
                None => (
                    Compare::create_revision(k.as_str(), CompareOp::Equal, 0),
                    ChangeKind::Create,
                ),
                Some(h) => (
                    Compare::mod_revision(k.as_str(), CompareOp::Equal, h.rev),
                    if h.same {
                        ChangeKind::Adopt
                    } else {
                        ChangeKind::Update
                    },
                ),
            };
            Some(Change {
                compares: vec![compare],
                ops,
                kind,
                rank: rank(key),
                effects,
                bytes,
            })
        }
        (None, Some(h)) => {
            if retained || (!owned_by_pattern(key) && !has_marker && !h.label_owned) {
                return None;
            }
            let mut ops = vec![TxnOp::delete(k.as_str(), None)];
            let mut effects = vec![Effect::Delete(key.to_string())];
            let mut bytes = 2 * (k.len() + overhead);
            if has_marker {
                ops.push(TxnOp::delete(m.as_str(), None));
                effects.push(Effect::Unmarker(key.to_string()));
                bytes += m.len() + overhead;
            }
            Some(Change {
                compares: vec![Compare::mod_revision(k.as_str(), CompareOp::Equal, h.rev)],
                ops,
                kind: ChangeKind::Delete,
                rank: rank(key),
                effects,
                bytes,
            })
        }
        // A marker whose resource is gone (deleted by someone else) and not desired.
        (None, None) => {
            let mrev = marker?;
            Some(Change {
                compares: vec![Compare::mod_revision(m.as_str(), CompareOp::Equal, mrev)],
                ops: vec![TxnOp::delete(m.as_str(), None)],
                kind: ChangeKind::Cleanup,
                rank: 0,
                effects: vec![Effect::Unmarker(key.to_string())],
                bytes: 2 * (m.len() + overhead),
            })
        }
    }
}

/// Stable sort: upserts by rising rank, then deletes by falling rank, then marker cleanup.
fn sort_changes(changes: &mut [Change]) {
    changes.sort_by_key(|c| match c.kind {
        ChangeKind::Create | ChangeKind::Update | ChangeKind::Adopt => (0, c.rank),
        ChangeKind::Delete => (1, u8::MAX - c.rank),
        ChangeKind::Cleanup => (2, 0),
    });
}

/// Works out the changes that take `current` to `desired`.
fn plan(desired: &Desired, current: &Current, p: &EtcdPrefix) -> Vec<Change> {
    let have = |key: &str, want: Option<&str>| {
        current.values.get(key).map(|(old, rev)| Have {
            rev: *rev,
            same: want.is_some_and(|w| old.as_slice() == w.as_bytes() || json_equal(old, w)),
            label_owned: owned_by_label(key, old),
        })
    };
    let mut changes = Vec::new();
    for (key, value) in &desired.resources {
        let marker = current.markers.get(key).copied();
        changes.extend(plan_key(
            key,
            Some(value),
            false,
            have(key, Some(value)),
            marker,
            p,
        ));
    }
    for key in current.values.keys() {
        if desired.resources.contains_key(key) {
            continue;
        }
        let retained = desired.retain.contains(key);
        let marker = current.markers.get(key).copied();
        changes.extend(plan_key(key, None, retained, have(key, None), marker, p));
    }
    for (key, mrev) in &current.markers {
        if !current.values.contains_key(key) && !desired.resources.contains_key(key) {
            changes.extend(plan_key(key, None, false, None, Some(*mrev), p));
        }
    }
    sort_changes(&mut changes);
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_patterns() {
        let p = RESOURCE_PREFIX;
        assert!(owned_by_pattern(&format!(
            "{p}networkpolicies/prod/knp.default.a"
        )));
        assert!(!owned_by_pattern(&format!("{p}networkpolicies/prod/mine")));
        assert!(owned_by_pattern(&format!("{p}profiles/kns.prod")));
        assert!(owned_by_pattern(&format!("{p}profiles/ksa.prod.default")));
        assert!(!owned_by_pattern(&format!(
            "{p}profiles/projectcalico-default-allow"
        )));
        assert!(owned_by_pattern(&format!(
            "{p}workloadendpoints/prod/n-k8s-p-eth0"
        )));
        assert!(!owned_by_pattern(&format!("{p}globalnetworkpolicies/x")));
        assert!(owned_by_pattern(&format!(
            "{p}globalnetworkpolicies/kanp.adminnetworkpolicy.x"
        )));
        assert!(owned_by_pattern(&format!(
            "{p}globalnetworkpolicies/kcnp.x"
        )));
        assert!(!owned_by_pattern("/other/profiles/kns.prod"));
    }

    #[test]
    fn endpoints_are_written_after_and_deleted_before_policies() {
        let p = RESOURCE_PREFIX;
        let desired = Desired {
            resources: [
                (format!("{p}workloadendpoints/ns/w"), "{}".to_string()),
                (format!("{p}profiles/kns.ns"), "{}".to_string()),
                (format!("{p}tiers/t"), "{}".to_string()),
                (
                    format!("{p}networkpolicies/ns/knp.default.a"),
                    "{}".to_string(),
                ),
            ]
            .into(),
            ..Desired::default()
        };
        let current = Current {
            values: [
                (
                    format!("{p}networkpolicies/ns/knp.default.old"),
                    (b"{}".to_vec(), 3),
                ),
                (format!("{p}workloadendpoints/ns/old"), (b"{}".to_vec(), 4)),
            ]
            .into(),
            markers: BTreeMap::new(),
            revision: 4,
        };
        let order: Vec<(u8, bool)> = plan(&desired, &current, &EtcdPrefix::default())
            .iter()
            .map(|c| (c.rank, matches!(c.kind, ChangeKind::Delete)))
            .collect();
        assert_eq!(
            order,
            vec![
                (0, false),
                (2, false),
                (3, false),
                (4, false),
                (4, true),
                (2, true)
            ]
        );
    }

    #[test]
    fn automatic_host_endpoints_are_owned_by_their_label_only() {
        let p = RESOURCE_PREFIX;
        let auto = br#"{"metadata":{"name":"n1-auto-hep","labels":{"projectcalico.org/created-by":"calico-kube-controllers"}}}"#;
        let user = br#"{"metadata":{"name":"n2-auto-hep","labels":{"a":"b"}}}"#;
        let zoned = r#"{"metadata":{"name":"n1-auto-hep","labels":{"projectcalico.org/created-by":"calico-kube-controllers","zone":"a"}}}"#;
        assert!(owned_by_label(
            &format!("{p}hostendpoints/n1-auto-hep"),
            auto
        ));
        assert!(!owned_by_label(
            &format!("{p}hostendpoints/n2-auto-hep"),
            user
        ));
        assert!(!owned_by_label(&format!("{p}globalnetworksets/x"), auto));
        assert!(!owned_by_label(&format!("{p}hostendpoints/x"), b"not json"));
        let key = |n: &str| format!("{p}hostendpoints/{n}");
        // Desired: n1 (changed) and n2 (whose name a user's endpoint holds); stored: a stale
        // automatic one and a user's one, neither desired.
        let desired = Desired {
            resources: [
                (key("n1-auto-hep"), zoned.to_string()),
                (
                    key("n2-auto-hep"),
                    String::from_utf8(auto.to_vec()).unwrap(),
                ),
            ]
            .into(),
            ..Desired::default()
        };
        let current = Current {
            values: [
                (key("n1-auto-hep"), (auto.to_vec(), 2)),
                (key("n2-auto-hep"), (user.to_vec(), 3)),
                (key("gone-auto-hep"), (auto.to_vec(), 4)),
                (key("users-eth0"), (user.to_vec(), 5)),
            ]
            .into(),
            markers: BTreeMap::new(),
            revision: 5,
        };
        // One update (n1), one delete (the stale one); the user's two are left alone, and no
        // ownership marker is written (the label is the marker).
        let kinds: Vec<(&str, usize)> = plan(&desired, &current, &EtcdPrefix::default())
            .iter()
            .map(|c| match c.kind {
                ChangeKind::Update => ("update", c.ops.len()),
                ChangeKind::Delete => ("delete", c.ops.len()),
                _ => ("other", c.ops.len()),
            })
            .collect();
        assert_eq!(kinds, vec![("update", 1), ("delete", 1)]);
    }

    #[test]
    fn json_comparison_ignores_formatting() {
        assert!(json_equal(br#"{"b":1, "a":2}"#, r#"{"a":2,"b":1}"#));
        assert!(!json_equal(br#"{"a":1}"#, r#"{"a":2}"#));
    }
}
