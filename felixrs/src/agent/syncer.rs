//! The datastore syncer: list at a revision, then watch from the next one, forever.
//!
//! Invariants:
//! * Every `Listed` carries the complete contents under the prefix at one revision; the consumer
//!   replaces its state with it wholesale (deletions included). A list happens at start and after
//!   a compaction made the watch's start revision unavailable.
//! * After a disconnect the watch resumes at `last revision + 1`, so no change is lost and none is
//!   delivered twice; the consumer's state survives the outage unchanged.
//! * A `Progress { revision }` means every change up to `revision` has been delivered, even when
//!   the latest writes fell outside the prefix. etcd before 3.4.24/3.5.8 may answer a progress
//!   request ahead of events still queued in the same stream (etcd#15220), so a progress revision
//!   is only confirmed by the *next* watch response after it (requested at once, one round trip).
//!   Those versions also answer progress requests for a watch that is still catching up (or is
//!   about to be cancelled for compaction), so progress is only requested once the watch is known
//!   to be synced: it started at the store's head, or it delivered events up to the revision the
//!   store had when it was created, or `SYNC_GRACE` passed (etcd syncs catching-up watchers every
//!   100 ms and reports compaction on the first pass).
//! * Reconnect attempts back off exponentially (`min_backoff` doubling to `max_backoff`) and each
//!   pause is drawn uniformly from its upper half ([`jittered`]), so thousands of agents that lost
//!   etcd at the same instant (an etcd restart) do not retry in lockstep; no pause is longer than
//!   `max_backoff`.
//! * Watch liveness: a connection is dead when the evidence says so, not when the agent was late.
//!   An open watch that says nothing (no event, no progress answer) for half of
//!   `liveness_timeout` (5 s) is *checked*: by the progress requests it gets every second, or,
//!   for a watch that has never answered one (etcd 3.4's grpc-proxy ignores them), by a
//!   serializable one-key read over its connection (whose answer counts as alive, as does
//!   anything the watch delivers meanwhile). Each check has 5 s to be answered, counted from when
//!   it was sent; the connection is dead after **two consecutive** unanswered checks: the syncer
//!   reports `Disconnected`, drops the connection and reconnects as after any error (resuming at
//!   `last revision + 1`). So a stopped member or proxy, or a half-open TCP connection, is noticed
//!   within [`SyncerConfig::dead_connection_bound`] (1.5 × `liveness_timeout`, 15 s) of its last
//!   word while the agent runs. Time the agent was not running does not count: a deadline whose
//!   timer fires late (a process starved of CPU, or stopped) moves by that lateness, up to 5 s
//!   more per check, so a starved agent notices within 2.5 × `liveness_timeout` (25 s) at most
//!   (`watch_liveness`; before, one late answer was enough, and 5,000 starved syncers took
//!   their own backlog for dead connections). (Behind such a proxy a watch that is silent on a
//!   live connection cannot be told from an idle one.) This check replaces HTTP/2 keepalive
//!   pings, which the agent does not send (see `datastore`).
//! * Keys leave the syncer canonical (under Calico's default layout, whatever the cluster's
//!   `--etcd-prefix`), so the state, the snapshot and the graph never depend on the prefix.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use calc_graph::model::EtcdPrefix;

use super::datastore::{Change, Datastore, DatastoreError, DatastoreWatch, WatchMessage};
use super::watch_liveness::{Liveness, Verdict};

/// How long a catching-up watch may stay silent before it is considered synced.
const SYNC_GRACE: Duration = Duration::from_secs(1);

/// What the syncer tells the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncEvent {
    /// The complete contents under the prefix at `revision`.
    Listed {
        revision: i64,
        kvs: Vec<(String, Vec<u8>)>,
    },
    /// Changes up to and including `revision`.
    Changes { revision: i64, changes: Vec<Change> },
    /// Nothing else happened under the prefix up to `revision`.
    Progress { revision: i64 },
    /// The connection was lost (state is kept; the syncer reconnects).
    Disconnected { reason: String },
}

/// Tunables of the syncer.
#[derive(Debug, Clone)]
pub struct SyncerConfig {
    /// The cluster's etcd prefix: the syncer watches its resources and emits canonical keys.
    pub prefix: EtcdPrefix,
    /// How often to ask etcd for a progress notification.
    pub progress_interval: Duration,
    /// Twice the quiet time after which an open watch's connection is checked, and twice the
    /// time each check has to be answered; two unanswered checks in a row make it dead (see the
    /// module doc and [`SyncerConfig::dead_connection_bound`]).
    pub liveness_timeout: Duration,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

impl SyncerConfig {
    pub fn new(prefix: EtcdPrefix) -> Self {
        Self {
            prefix,
            progress_interval: Duration::from_secs(1),
            // 5 s per check: five progress requests, far beyond a loaded etcd's answer time (a
            // progress answer is a header, sent ahead of any queued events), and as long as the
            // HTTP/2 keepalive it replaces gave a ping to answer. Dead after 15 s of silence.
            liveness_timeout: Duration::from_secs(10),
            min_backoff: Duration::from_millis(100),
            // After a long outage the agent retries every second at most, so it is back in sync
            // within about a second of etcd answering again (issue 23); each attempt is one
            // connection (no cost to etcd worth the wait of a longer pause).
            max_backoff: Duration::from_secs(1),
        }
    }

    /// Within how long of its last word a dead connection is noticed while the agent runs: a
    /// quiet half of `liveness_timeout`, then two unanswered checks of half of it each. Time the
    /// process was not running adds to it, at most half of `liveness_timeout` per check.
    pub fn dead_connection_bound(&self) -> Duration {
        Liveness::bound(self.liveness_timeout / 2)
    }
}

/// Runs until `cancel` fires or the receiver of `tx` is dropped. `nudge` asks for a progress
/// notification now (a status client is waiting).
pub async fn run<D: Datastore>(
    mut ds: D,
    cfg: SyncerConfig,
    tx: mpsc::Sender<SyncEvent>,
    nudge: Arc<Notify>,
    cancel: CancellationToken,
) {
    let mut backoff = cfg.min_backoff;
    let mut last_revision: Option<i64> = None;
    loop {
        let reason = tokio::select! {
            _ = cancel.cancelled() => return,
            r = session(&mut ds, &cfg, &tx, &nudge, &mut last_revision, &mut backoff) => match r {
                Ok(()) => return,
                Err(error) => error.to_string(),
            },
        };
        // Whatever broke, the next attempt starts on a fresh connection.
        ds.reset();
        let pause = jittered(backoff, fastrand::f64());
        tracing::warn!(%reason, ?pause, "datastore connection lost; keeping current state");
        if tx.send(SyncEvent::Disconnected { reason }).await.is_err() {
            return;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        backoff = (backoff * 2).min(cfg.max_backoff);
    }
}

/// The pause before a reconnect: `backoff` scaled into its upper half by `unit` (in `[0, 1)`),
/// i.e. uniform in `[backoff / 2, backoff)` for a uniform `unit` ("equal jitter"). Half the pause
/// stays, so the attempt rate still falls exponentially; the other half spreads agents that failed
/// together. `unit` outside `[0, 1]` is clamped, so the pause never exceeds `backoff`.
pub fn jittered(backoff: Duration, unit: f64) -> Duration {
    backoff / 2 + (backoff / 2).mul_f64(unit.clamp(0.0, 1.0))
}

/// One connection's life: (list if needed,) watch, forward. `Ok(())` means the receiver is gone.
async fn session<D: Datastore>(
    ds: &mut D,
    cfg: &SyncerConfig,
    tx: &mpsc::Sender<SyncEvent>,
    nudge: &Notify,
    last_revision: &mut Option<i64>,
    backoff: &mut Duration,
) -> Result<(), DatastoreError> {
    loop {
        let start = match *last_revision {
            Some(rev) => rev,
            None => {
                let listing = ds.list(cfg.prefix.resources()).await?;
                let revision = listing.revision;
                let kvs: Vec<_> = (listing.kvs.into_iter())
                    .filter_map(|(k, v)| Some((cfg.prefix.to_canonical(&k)?, v)))
                    .collect();
                tracing::info!(revision, keys = kvs.len(), "listed datastore");
                *last_revision = Some(revision);
                if tx.send(SyncEvent::Listed { revision, kvs }).await.is_err() {
                    return Ok(());
                }
                revision
            }
        };
        let mut watch = ds.watch(cfg.prefix.resources(), start + 1).await?;
        match pump(&mut watch, cfg, tx, nudge, last_revision, backoff).await? {
            Pumped::ReceiverGone => return Ok(()),
            Pumped::Compacted(compact_revision) => {
                tracing::warn!(compact_revision, "watch revision compacted; listing again");
                *last_revision = None;
            }
        }
    }
}

/// A liveness read on its way ([`DatastoreWatch::ping`]).
type PingRead = Pin<Box<dyn Future<Output = Result<(), DatastoreError>> + Send>>;

enum Pumped {
    ReceiverGone,
    Compacted(i64),
}

/// Forwards what `watch` (started right after `last_revision`) delivers.
async fn pump<W: DatastoreWatch>(
    watch: &mut W,
    cfg: &SyncerConfig,
    tx: &mpsc::Sender<SyncEvent>,
    nudge: &Notify,
    last_revision: &mut Option<i64>,
    backoff: &mut Duration,
) -> Result<Pumped, DatastoreError> {
    let mut confirmed = last_revision.unwrap_or(0);
    let start_revision = confirmed + 1;
    let mut pending: Option<i64> = None;
    let created_at = Instant::now();
    // The store's revision when the watch was created; `None` until the creation response.
    let mut created_revision: Option<i64> = None;
    let mut synced = false;
    let mut next_request = created_at + SYNC_GRACE;
    // Liveness (see `watch_liveness`): after a quiet half of `liveness_timeout` the connection is
    // checked, and it is dead after two checks in a row unanswered, not counting time this task
    // was not running. A watch that answers progress requests is checked by them (they go out
    // every `progress_interval` anyway) and only the watch's own messages count; one that has
    // never answered one (etcd 3.4's grpc-proxy ignores them) is checked by a small read over
    // its connection, whose answer counts too.
    let mut answers_progress = false;
    let mut live = Liveness::new(cfg.liveness_timeout / 2, created_at);
    let mut ping: Option<PingRead> = None;
    loop {
        let msg = tokio::select! {
            biased;
            m = watch.next() => m?,
            r = async { ping.as_mut().expect("guarded by is_some").await }, if ping.is_some() => {
                ping = None;
                r?;
                if !answers_progress {
                    live.heard(Instant::now());
                }
                continue;
            }
            _ = sleep_until(live.deadline()) => {
                match live.expired(Instant::now()) {
                    Verdict::Wait => {}
                    Verdict::Dead(silence) => {
                        return Err(DatastoreError::WatchSilent(tenths(silence)));
                    }
                    Verdict::Check if !answers_progress && ping.is_none() => {
                        ping = Some(Box::pin(watch.ping()));
                    }
                    // A ping still on its way is the check; a watch that answers progress
                    // requests is asked every `progress_interval` already.
                    Verdict::Check => {}
                }
                continue;
            }
            _ = sleep_until(next_request) => {
                synced = true;
                next_request = Instant::now() + cfg.progress_interval;
                // Bounded too: a request into a dead connection may never be taken; the liveness
                // deadline then decides.
                if let Ok(r) = timeout_at(live.deadline(), watch.request_progress()).await {
                    r?;
                }
                continue;
            }
            _ = nudge.notified(), if synced => {
                if let Ok(r) = timeout_at(live.deadline(), watch.request_progress()).await {
                    r?;
                }
                continue;
            }
        };
        answers_progress |= matches!(msg, WatchMessage::Progress { .. });
        live.heard(Instant::now());
        *backoff = cfg.min_backoff;
        let ev = match msg {
            WatchMessage::Created { revision } => {
                created_revision = Some(revision);
                if revision < start_revision && !synced {
                    synced = true;
                    next_request = Instant::now();
                }
                continue;
            }
            WatchMessage::Compacted { compact_revision } => {
                return Ok(Pumped::Compacted(compact_revision));
            }
            WatchMessage::Changes { revision, changes } => {
                confirmed = confirmed.max(revision);
                *last_revision = Some(confirmed);
                if !synced && created_revision.is_some_and(|c| revision >= c) {
                    synced = true;
                    next_request = Instant::now();
                }
                let changes = changes
                    .into_iter()
                    .filter_map(|mut c| {
                        c.key = cfg.prefix.to_canonical(&c.key)?;
                        Some(c)
                    })
                    .collect();
                SyncEvent::Changes { revision, changes }
            }
            WatchMessage::Progress { .. } if !synced => continue,
            WatchMessage::Progress { revision } => {
                let confirmed_now = match pending.take() {
                    Some(p) if p > confirmed => {
                        confirmed = p;
                        true
                    }
                    _ => false,
                };
                if revision > confirmed {
                    // Confirm it with one more round trip.
                    pending = Some(revision);
                    next_request = Instant::now();
                }
                if !confirmed_now {
                    continue;
                }
                *last_revision = Some(confirmed);
                SyncEvent::Progress {
                    revision: confirmed,
                }
            }
        };
        if tx.send(ev).await.is_err() {
            return Ok(Pumped::ReceiverGone);
        }
        // Time spent waiting for the consumer is not the watch's silence.
        live.heard(Instant::now());
    }
}

/// `d` to a tenth of a second, for the log.
fn tenths(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64 / 100 * 100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::datastore::Listing;

    /// A store whose watch says nothing after its creation, and whose connection answers the
    /// liveness read (after 50 ms) or never.
    struct Quiet {
        ping_answers: bool,
    }

    struct QuietWatch {
        created: bool,
        ping_answers: bool,
    }

    impl Datastore for Quiet {
        type Watch = QuietWatch;
        async fn list(&mut self, _: &str) -> Result<Listing, DatastoreError> {
            Ok(Listing {
                revision: 5,
                kvs: Vec::new(),
            })
        }
        async fn watch(&mut self, _: &str, _: i64) -> Result<QuietWatch, DatastoreError> {
            Ok(QuietWatch {
                created: false,
                ping_answers: self.ping_answers,
            })
        }
        fn reset(&mut self) {}
    }

    impl DatastoreWatch for QuietWatch {
        async fn next(&mut self) -> Result<WatchMessage, DatastoreError> {
            if !std::mem::replace(&mut self.created, true) {
                return Ok(WatchMessage::Created { revision: 5 });
            }
            std::future::pending().await
        }
        async fn request_progress(&mut self) -> Result<(), DatastoreError> {
            Ok(())
        }
        fn ping(&self) -> impl Future<Output = Result<(), DatastoreError>> + Send + 'static {
            let answers = self.ping_answers;
            async move {
                if !answers {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(())
            }
        }
    }

    fn start(ds: Quiet) -> (mpsc::Receiver<SyncEvent>, CancellationToken) {
        let (tx, rx) = mpsc::channel(16);
        let cancel = CancellationToken::new();
        let cfg = SyncerConfig::new(EtcdPrefix::default());
        tokio::spawn(run(ds, cfg, tx, Arc::new(Notify::new()), cancel.clone()));
        (rx, cancel)
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_answers_nothing_is_dead_after_two_checks() {
        let (mut rx, cancel) = start(Quiet {
            ping_answers: false,
        });
        assert!(matches!(rx.recv().await, Some(SyncEvent::Listed { .. })));
        let t0 = Instant::now();
        let ev = rx.recv().await.expect("an event");
        let took = Instant::now() - t0;
        let bound = SyncerConfig::new(EtcdPrefix::default()).dead_connection_bound();
        assert_eq!(bound, Duration::from_secs(15));
        assert!(
            took >= bound && took < bound + Duration::from_millis(100),
            "noticed after {took:?}"
        );
        let SyncEvent::Disconnected { reason } = ev else {
            panic!("{ev:?}");
        };
        assert_eq!(
            reason,
            "etcd watch silent for 15s (no event and no progress answer): presumed dead"
        );
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_watch_whose_connection_answers_is_alive() {
        let (mut rx, cancel) = start(Quiet { ping_answers: true });
        assert!(matches!(rx.recv().await, Some(SyncEvent::Listed { .. })));
        // Two minutes of an idle watch behind a proxy that ignores progress requests.
        let got = tokio::time::timeout(Duration::from_secs(120), rx.recv()).await;
        assert!(got.is_err(), "{got:?}");
        cancel.cancel();
    }

    #[test]
    fn jittered_pause_stays_in_the_upper_half_of_the_backoff() {
        let b = Duration::from_millis(800);
        assert_eq!(jittered(b, 0.0), Duration::from_millis(400));
        assert_eq!(jittered(b, 0.5), Duration::from_millis(600));
        assert_eq!(jittered(b, 1.0), b);
        assert_eq!(jittered(b, -3.0), Duration::from_millis(400));
        assert_eq!(jittered(b, 7.0), b);
        assert_eq!(jittered(Duration::ZERO, 0.7), Duration::ZERO);
    }

    #[test]
    fn backoff_sequence_is_bounded_by_max_and_spread_by_jitter() {
        let cfg = SyncerConfig::new(EtcdPrefix::default());
        let mut backoff = cfg.min_backoff;
        let mut pauses = Vec::new();
        for _ in 0..1000 {
            let p = jittered(backoff, fastrand::f64());
            assert!(
                p >= backoff / 2 && p <= backoff,
                "{p:?} outside [{backoff:?}/2, {backoff:?}]"
            );
            assert!(p <= cfg.max_backoff, "{p:?} over max {:?}", cfg.max_backoff);
            pauses.push(p);
            backoff = (backoff * 2).min(cfg.max_backoff);
        }
        // At the cap, 1,000 draws are not all the same pause (the point of the jitter), and they
        // cover most of [max/2, max].
        let capped = &pauses[10..];
        let (lo, hi) = (capped.iter().min().unwrap(), capped.iter().max().unwrap());
        assert!(
            *lo < cfg.max_backoff * 6 / 10,
            "smallest capped pause {lo:?}"
        );
        assert!(
            *hi > cfg.max_backoff * 9 / 10,
            "largest capped pause {hi:?}"
        );
    }
}
