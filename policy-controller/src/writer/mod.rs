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
//!
//! # Files
//! `ownership.rs` (which keys are ours: by name pattern, by label, by marker), `index.rs` (what
//! etcd holds: a full pass's read, and the writer's index of it), `plan.rs` (the changes that take
//! one key, or a whole state, from what is stored to what is desired), `txn.rs` (the etcd edge:
//! the reads, the fence check and the batched compare-and-swap transactions).

mod index;
mod ownership;
mod plan;
mod txn;

use std::collections::{BTreeMap, BTreeSet};

use calc_graph::model::EtcdPrefix;
use etcd_client::Client;

use index::{Known, value_hash};
pub use ownership::{owned_by_label, owned_by_pattern};
use plan::{Change, json_equal, plan, plan_key, sort_changes};

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
}
