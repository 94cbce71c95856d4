//! The agent's task layout, independent of which datastore, graph and dataplane it drives.
//!
//! ```text
//! [syncer task] --SyncEvent--> [main task: AgentState + graph] --Batch--> [apply thread]
//! [remote syncer tasks] --RemoteEvent--^    |                                   |
//!                                           +--Snapshot--> [snapshot writer]    +--> StatusHub <-- [HTTP]
//!                                                                      applied view --^ <-- [agent.sock]
//! ```
//!
//! Remote syncers (federation) start once the local view is in (from etcd or the snapshot), one per
//! RemoteClusterConfiguration in it; their members are seeded from the snapshot at start.
//!
//! Startup: the syncer starts at once. If etcd has not delivered its first full list within
//! `etcd_timeout` (or the first attempt already failed), the persisted snapshot (if valid) is used as the full view, and etcd's list
//! replaces it wholesale when it arrives. Without either, nothing is written to the kernel.
//! Shutdown (cancel): tasks stop, the apply thread finishes its current apply, the kernel is left
//! as it is.
//!
//! The main task watches the apply thread ([`Liveness`](super::liveness::Liveness)): if it ends
//! (a panic) or its heartbeat goes stale (stuck), or a batch cannot be handed to it, the agent
//! logs the cause, stops like on cancel (without waiting for a stuck thread) and `run` returns
//! the cause as its error, so the process exits non-zero and is restarted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::apply_loop::{self, Dataplane, RefreshPeriod};
use super::datastore::Datastore;
use super::federation::Remotes;
use super::felix_config::ConfigWatch;
use super::liveness::NotAlive;
use super::snapshot::{Snapshot, SnapshotStore};
use super::state::{AgentState, ApplyThreadGone, Pipeline};
use super::status::{self, Source, StatusHub};
use super::syncer::{self, SyncEvent, SyncerConfig};

/// Everything the runtime needs besides its three parts.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub prefix: calc_graph::model::EtcdPrefix,
    pub state_dir: PathBuf,
    pub health_listen: SocketAddr,
    /// How long to wait for etcd before programming from the snapshot.
    pub etcd_timeout: Duration,
    /// The full refresh's period (changeable while running).
    pub refresh_interval: RefreshPeriod,
    /// Period of the fast drift check (`None`: only the full refresh repairs drift).
    pub drift_interval: Option<Duration>,
    /// Minimum time between two snapshot writes.
    pub snapshot_interval: Duration,
    /// The agent's settings from FelixConfiguration, re-read when one of this node's changes;
    /// a restart-needing change stops the runtime like a cancel (the agent then re-execs).
    pub felix_config: Option<Arc<std::sync::Mutex<ConfigWatch>>>,
    /// Routes served beside the status router's (`/flows`, the web view); empty by default.
    pub http_routes: axum::Router,
}

/// Runs the agent until `cancel` fires.
pub async fn run<D: Datastore, P: Pipeline, DP: Dataplane>(
    cfg: RuntimeConfig,
    datastore: D,
    pipeline: P,
    dataplane: DP,
    hub: Arc<StatusHub>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.health_listen)
        .await
        .with_context(|| format!("binding health listener {}", cfg.health_listen))?;
    tracing::info!(addr = %listener.local_addr()?, "serving status, health and metrics");
    let server = tokio::spawn(status::serve_routes(
        listener,
        status::router(hub.clone()).merge(cfg.http_routes.clone()),
        cancel.clone().cancelled_owned(),
    ));

    let apply = apply_loop::spawn(
        dataplane,
        hub.clone(),
        cfg.refresh_interval.clone(),
        cfg.drift_interval,
    );
    let (sync_tx, mut sync_rx) = mpsc::channel(1024);
    let syncer = tokio::spawn(syncer::run(
        datastore,
        SyncerConfig::new(cfg.prefix.clone()),
        sync_tx,
        hub.nudge.clone(),
        cancel.child_token(),
    ));
    let store = SnapshotStore::new(&cfg.state_dir);
    // The operator tools on the node read what the kernel holds from here (see `view`).
    let view_server = tokio::spawn(super::view::serve(
        cfg.state_dir.clone(),
        hub.clone(),
        cancel.clone().cancelled_owned(),
    ));
    let (snap_tx, snap_rx) = watch::channel(None);
    let writer = tokio::spawn(snapshot_writer(store.clone(), snap_rx, hub.clone()));

    let mut state = AgentState::new(pipeline, apply.tx.clone(), hub.clone());
    drop(apply.tx);
    // Read once: remote members are seeded from it now, the local view only if etcd is late.
    let mut loaded = {
        let store = store.clone();
        Some(tokio::task::spawn_blocking(move || store.load()).await?)
    };
    if let Some(Ok(Some(snap))) = &loaded {
        state.seed_remotes(snap);
    }
    let (remote_tx, mut remote_rx) = mpsc::channel(1024);
    let mut remotes = Remotes::new(remote_tx, cfg.etcd_timeout, cancel.child_token());
    let fallback_at = tokio::time::Instant::now() + cfg.etcd_timeout;
    let mut fallback_tried = false;
    let mut snap_tick = tokio::time::interval(cfg.snapshot_interval);
    let liveness = hub.liveness.clone();
    let mut failure: Option<ApplyThreadFailure> = None;
    let mut restart = false;
    loop {
        let emitted = tokio::select! {
            _ = cancel.cancelled() => break,
            why = liveness.failure() => {
                failure = Some(ApplyThreadFailure::NotAlive(why));
                break;
            }
            ev = sync_rx.recv() => {
                let Some(ev) = ev else { break };
                let listed = matches!(ev, SyncEvent::Listed { .. });
                // etcd refused or failed before its first list: no point waiting for the timeout.
                let early_failure = matches!(ev, SyncEvent::Disconnected { .. })
                    && !fallback_tried
                    && state.source() == Source::None;
                state.on_event(ev);
                if early_failure {
                    fallback_tried = true;
                    fallback(&mut state, &hub, loaded.take());
                }
                while let Ok(ev) = sync_rx.try_recv() {
                    state.on_event(ev);
                }
                reconcile_remotes(&mut state, &mut remotes);
                restart |= felix_config_changed(&cfg, &mut state, &hub);
                let emitted = state.emit();
                if listed {
                    // Persist a fresh full view at once, not at the next tick.
                    if let Some(s) = state.take_snapshot() {
                        snap_tx.send_replace(Some(Pending::new(s, &hub)));
                    }
                }
                emitted
            }
            Some(ev) = remote_rx.recv() => {
                let mut ev = Some(ev);
                while let Some(e) = ev {
                    if remotes.is_current(&e) {
                        state.on_remote_event(&e.cluster, e.event);
                    }
                    ev = remote_rx.try_recv().ok();
                }
                state.emit()
            }
            _ = tokio::time::sleep_until(fallback_at), if !fallback_tried && state.source() == Source::None => {
                fallback_tried = true;
                fallback(&mut state, &hub, loaded.take());
                reconcile_remotes(&mut state, &mut remotes);
                restart |= felix_config_changed(&cfg, &mut state, &hub);
                state.emit()
            }
            _ = snap_tick.tick() => {
                if let Some(s) = state.take_snapshot() {
                    snap_tx.send_replace(Some(Pending::new(s, &hub)));
                }
                Ok(())
            }
        };
        if let Err(gone) = emitted {
            // Its cause, if recorded by now, is the better message.
            failure = Some(match liveness.check() {
                Err(why) => ApplyThreadFailure::NotAlive(why),
                Ok(()) => ApplyThreadFailure::Gone(gone),
            });
            break;
        }
        if restart {
            // Stops like a cancel: the snapshot (with the new configuration) is written first.
            break;
        }
    }
    if let Some(f) = &failure {
        tracing::error!(cause = %f, "the apply thread is not alive; stopping the agent");
    }
    cancel.cancel();
    // Persist the newest etcd view before exiting (the writer drains it before it stops).
    if let Some(s) = state.take_snapshot() {
        snap_tx.send_replace(Some(Pending::new(s, &hub)));
    }
    drop(state);
    drop(snap_tx);
    let _ = syncer.await;
    let _ = writer.await;
    let _ = view_server.await;
    if let Some(f) = failure {
        // A stuck thread is not waited for: the process exit ends it.
        if f.thread_ended() {
            let _ = tokio::task::spawn_blocking(move || apply.thread.join()).await;
        }
        let _ = server.await;
        tracing::info!("stopped; kernel rules left in place");
        return Err(f.into());
    }
    tokio::task::spawn_blocking(move || apply.thread.join())
        .await?
        .map_err(|_| anyhow::anyhow!("apply thread panicked"))?;
    server.await?.context("status server")?;
    tracing::info!("stopped; kernel rules left in place");
    Ok(())
}

/// Re-reads the settings when a FelixConfiguration changed; true if they need a restart.
fn felix_config_changed<P: Pipeline>(
    cfg: &RuntimeConfig,
    state: &mut AgentState<P>,
    hub: &StatusHub,
) -> bool {
    let Some(watch) = &cfg.felix_config else {
        return false;
    };
    if state.source() == Source::None || !state.take_felix_config_changed() {
        return false;
    }
    let kvs = state.kvs();
    let get = |k: &str| kvs.get(k).map(|v| v.to_vec());
    watch.lock().expect("felix config lock").update(get, hub)
}

/// Why the runtime stopped the agent on its own.
#[derive(Debug, thiserror::Error)]
pub enum ApplyThreadFailure {
    #[error(transparent)]
    NotAlive(NotAlive),
    #[error(transparent)]
    Gone(ApplyThreadGone),
}

impl ApplyThreadFailure {
    /// The thread has ended (as opposed to being stuck).
    fn thread_ended(&self) -> bool {
        !matches!(self, ApplyThreadFailure::NotAlive(NotAlive::Stale { .. }))
    }
}

/// Once the local view is in: one remote syncer per valid RemoteClusterConfiguration, and no
/// members of a cluster that has none.
fn reconcile_remotes<P: Pipeline>(state: &mut AgentState<P>, remotes: &mut Remotes) {
    if state.source() == Source::None {
        return;
    }
    let Some(desired) = state.take_remote_configs(&|name| remotes.config(name)) else {
        return;
    };
    let mut gone: std::collections::BTreeSet<String> =
        remotes.reconcile(&desired).into_iter().collect();
    gone.extend(
        state
            .remote_clusters_in_view()
            .into_iter()
            .filter(|c| !desired.contains_key(c)),
    );
    for cluster in gone {
        state.drop_remote(&cluster);
    }
}

fn fallback<P: Pipeline>(
    state: &mut AgentState<P>,
    hub: &StatusHub,
    loaded: Option<Result<Option<Snapshot>, super::snapshot::SnapshotError>>,
) {
    match loaded {
        None => {}
        Some(Ok(Some(snap))) => {
            let (revision, keys) = (snap.revision, snap.kvs.len());
            if state.load_snapshot(snap) {
                tracing::warn!(
                    revision,
                    keys,
                    "etcd not answering; programming from snapshot"
                );
                hub.update(|s| s.snapshot_revision = Some(revision));
            }
        }
        Some(Ok(None)) => {
            tracing::warn!(
                "etcd not answering and no snapshot; kernel left untouched until in sync"
            );
            hub.update(|s| s.snapshot_error = Some("no snapshot".into()));
        }
        Some(Err(error)) => {
            tracing::error!(%error, "ignoring unusable snapshot; kernel left untouched until in sync");
            hub.update(|s| s.snapshot_error = Some(error.to_string()));
        }
    }
}

/// A snapshot to write, with the revision of each remote cluster it holds.
#[derive(Clone)]
struct Pending {
    snapshot: Arc<Snapshot>,
    remotes: Arc<Vec<(String, i64)>>,
}

impl Pending {
    fn new(snapshot: Snapshot, hub: &StatusHub) -> Self {
        let remotes = hub
            .snapshot()
            .remote_clusters
            .iter()
            .map(|(c, r)| (c.clone(), r.revision))
            .collect();
        Pending {
            snapshot: Arc::new(snapshot),
            remotes: Arc::new(remotes),
        }
    }
}

/// The first retry of a failed snapshot write comes after this; each further one after twice the
/// last, up to [`SNAPSHOT_RETRY_MAX`].
const SNAPSHOT_RETRY_MIN: Duration = Duration::from_secs(1);
const SNAPSHOT_RETRY_MAX: Duration = Duration::from_secs(30);

/// Writes the newest snapshot handed over, one at a time (the watch channel keeps only the latest,
/// so a burst costs one write). A failed write (full or read-only state directory) marks the
/// snapshot stale (`/status` `snapshot_stale`, `felixrs_snapshot_stale`) and is retried with
/// backoff, or replaced by a newer one; the next good write clears it. The old file stays whole.
async fn snapshot_writer(
    store: SnapshotStore,
    mut rx: watch::Receiver<Option<Pending>>,
    hub: Arc<StatusHub>,
) {
    let mut retry: Option<Duration> = None;
    loop {
        let next = match retry {
            None => rx.changed().await.is_ok(),
            Some(after) => tokio::select! {
                r = rx.changed() => r.is_ok(),
                _ = tokio::time::sleep(after) => true,
            },
        };
        if !next {
            break;
        }
        let Some(Pending { snapshot, remotes }) = rx.borrow_and_update().clone() else {
            continue;
        };
        let store = store.clone();
        let started = Instant::now();
        let revision = snapshot.revision;
        let res = tokio::task::spawn_blocking(move || store.save(&snapshot)).await;
        hub.metrics
            .snapshot_write_seconds
            .observe(started.elapsed().as_secs_f64());
        let failed = |hub: &StatusHub, error: String| {
            hub.metrics.snapshot_write_errors.inc();
            hub.metrics.snapshot_stale.set(1);
            hub.update(|s| {
                s.snapshot_error = Some(error);
                s.snapshot_stale = true;
            });
        };
        match res {
            Ok(Ok(bytes)) => {
                retry = None;
                hub.metrics.snapshot_writes.inc();
                hub.metrics.snapshot_stale.set(0);
                tracing::debug!(revision, bytes, "snapshot written");
                hub.update(|s| {
                    s.snapshot_revision = Some(revision);
                    s.snapshot_error = None;
                    s.snapshot_stale = false;
                    for (c, rev) in remotes.iter() {
                        if let Some(r) = s.remote_clusters.get_mut(c) {
                            r.snapshot_revision = Some(*rev);
                        }
                    }
                });
            }
            Ok(Err(error)) => {
                let after = retry.map_or(SNAPSHOT_RETRY_MIN, |d| (d * 2).min(SNAPSHOT_RETRY_MAX));
                retry = Some(after);
                tracing::error!(%error, revision, retry_in = ?after, "snapshot write failed; the snapshot is stale, enforcement goes on");
                failed(&hub, error.to_string());
            }
            Err(error) => {
                retry = Some(retry.map_or(SNAPSHOT_RETRY_MIN, |d| (d * 2).min(SNAPSHOT_RETRY_MAX)));
                tracing::error!(%error, "snapshot writer panicked");
                failed(&hub, format!("snapshot writer panicked: {error}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::metrics::Metrics;

    /// A state directory that cannot be written (a file sits where it should be; as root,
    /// permissions would not stop a write): the snapshot is stale, the old file is untouched; once
    /// the obstacle is gone the writer's retry clears it without a newer snapshot.
    #[tokio::test]
    async fn a_failed_write_is_stale_until_a_retry_succeeds() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        std::fs::write(&dir, b"not a directory").unwrap();
        let hub = StatusHub::new(Metrics::new());
        let (tx, rx) = watch::channel(None);
        let writer = tokio::spawn(snapshot_writer(SnapshotStore::new(&dir), rx, hub.clone()));
        let snap = Snapshot {
            revision: 9,
            kvs: Default::default(),
        };
        tx.send_replace(Some(Pending::new(snap.clone(), &hub)));
        let until = |f: fn(&super::status::Status) -> bool| {
            let hub = hub.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(10), async {
                    while !f(&hub.snapshot()) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
                .await
                .is_ok()
            }
        };
        assert!(until(|s| s.snapshot_stale).await, "{:?}", hub.snapshot());
        let s = hub.snapshot();
        assert_eq!(s.snapshot_revision, None);
        assert!(
            s.snapshot_error.as_deref().unwrap().contains("state"),
            "{s:?}"
        );
        assert!(hub.metrics.render().contains("felixrs_snapshot_stale 1"));

        std::fs::remove_file(&dir).unwrap();
        assert!(until(|s| !s.snapshot_stale).await, "{:?}", hub.snapshot());
        let s = hub.snapshot();
        assert_eq!((s.snapshot_revision, s.snapshot_error), (Some(9), None));
        assert!(hub.metrics.render().contains("felixrs_snapshot_stale 0"));
        assert_eq!(SnapshotStore::new(&dir).load().unwrap(), Some(snap));
        drop(tx);
        writer.await.unwrap();
    }
}
