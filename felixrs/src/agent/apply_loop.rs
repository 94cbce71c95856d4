//! The apply loop: a dedicated thread that owns the dataplane (renderer + blocking applier).
//!
//! Invariants:
//! * Batches are coalesced: everything queued while an apply runs goes into the next single apply,
//!   so a local endpoint's chains, policies and IP sets reach the kernel in one transaction.
//! * Nothing is written before the first batch, and the first batch is only sent once the agent
//!   is in sync (see `state`), so the kernel's existing rules keep enforcing until then.
//! * `applied_revision` becomes R only after an apply that covered every batch up to R succeeded
//!   (or when those batches changed nothing). A failed apply is retried with backoff; the
//!   revision does not advance meanwhile.
//! * Stopping the loop never touches the kernel: rules stay in place.
//! * The thread beats the hub's [`Liveness`](super::liveness::Liveness) at least every
//!   [`TICK`] while it waits for work (the dataplane's commands beat it while it works); when it
//!   ends, by a panic or a return, the cause is recorded there for `/liveness` and the runtime.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use calc_graph::proto::{EndpointId, IpVersion, Output};
use iptables::apply::ApplyError;

use super::liveness::{NotAlive, TICK, panic_message};
use super::metrics::felix::TableCount;
use super::status::StatusHub;
use super::view::ViewDelta;

/// Graph output up to a datastore revision.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub outputs: Vec<Output>,
    pub revision: i64,
    /// The datastore keys changed since the previous batch, with their values up to `revision`
    /// (`None`: deleted), applied to the view served to the operator tools once the batch is in
    /// the kernel ([`super::view`]).
    pub view: ViewDelta,
    /// When the first datastore change of this batch reached the agent (its list, for the first
    /// batch): `felixrs_endpoint_programming_seconds` times each local endpoint's program from it.
    pub received: Instant,
}

/// What the kernel holds after an apply, for status and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub local_endpoints: usize,
    /// Host endpoints of this node the renderer holds.
    pub local_host_endpoints: usize,
    pub active_policies: usize,
    pub ip_sets: usize,
    pub rules: usize,
    pub chains: usize,
    /// iptables-restore / ipset restore invocations during this apply.
    pub restore_calls: u64,
    /// Failed invocations that were retried successfully during this apply.
    pub restore_errors: u64,
    /// Chains and rules per family and table (Felix's `felix_iptables_chains`/`_rules`).
    pub tables: Vec<TableCount>,
    /// Selectors whose IP sets active rules use (Felix's `felix_active_local_selectors`).
    pub active_selectors: usize,
    /// iptables-restore payload lines written per family and table during this apply.
    pub iptables_lines: Vec<(u8, &'static str, u64)>,
    /// ipset restore payload lines written during this apply.
    pub ipset_lines: u64,
}

/// Why an apply, refresh or drift check failed (its text is `/status`'s `last_apply_error`).
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// The iptables backend could not be chosen (before either family was touched).
    #[error("iptables backend detection: {0}")]
    Detection(#[source] ApplyError),
    /// One or both families failed; the others' work stands.
    #[error("{}", join_families(.0))]
    Families(Vec<FamilyError>),
    /// The thread programming one family panicked.
    #[error("{family}: apply thread panicked", family = family_name(*.0))]
    FamilyPanicked(IpVersion),
}

/// One family's failure, as `ipv4: <error>`.
#[derive(Debug, thiserror::Error)]
#[error("{family}: {error}", family = family_name(self.family))]
pub struct FamilyError {
    pub family: IpVersion,
    #[source]
    pub error: ApplyError,
}

fn family_name(v: IpVersion) -> String {
    format!("ipv{}", v.number())
}

fn join_families(errors: &[FamilyError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The kernel side: folds graph outputs into the desired state and makes the kernel equal to it.
/// Blocking; called only from the apply thread.
pub trait Dataplane: Send + 'static {
    /// Absorbs `outputs` and programs the kernel (one transaction per table). An empty `outputs`
    /// re-applies the current desired state (retry after an error, or the first program).
    fn apply(&mut self, outputs: Vec<Output>) -> Result<ApplyReport, DataplaneError>;
    /// Re-reads the kernel and repairs drift.
    fn refresh(&mut self) -> Result<ApplyReport, DataplaneError>;
    /// Called once when the apply thread starts, before the first batch arrives (the snapshot or
    /// the datastore is still being read): may read the kernel ahead, never writes. The default
    /// does nothing.
    fn prepare(&mut self) {}
    /// The fast drift check between refreshes: asks whether the kernel changed, and if so
    /// repairs what of ours drifted. The default finds nothing.
    fn check_drift(&mut self) -> Result<Drift, DataplaneError> {
        Ok(Drift::default())
    }
    /// Called when the apply thread has had no batch for [`IDLE_GRACE`]: work that need not
    /// delay an apply (nor `applied_revision`) is done here. The default does nothing.
    fn idle(&mut self) {}
    /// Called after a successful apply was reported (`applied_revision` moved): work that
    /// must not wait for the apply thread to go idle, but need not delay the report either.
    /// The default does nothing.
    fn after_apply(&mut self) {}
}

/// How long the queue must stay empty before the dataplane's deferred work ([`Dataplane::idle`])
/// runs: a change that follows an apply within it (etcd's commit and the watch take a few ms)
/// finds the apply thread waiting, not building the counters' attribution (~16 ms at 2,000
/// policies, which was the p50 of a change's wait for the apply thread).
const IDLE_GRACE: Duration = Duration::from_millis(50);

/// An idle drift check that took T is paid back by T times this of time (2% of one core).
pub const DRIFT_BUDGET_FACTOR: u32 = 50;

/// What the drift budget saves up to: an occasional slower check (legacy's save hash, about
/// 0.5 s for both families at 2,000 policies) is paid from savings instead of stretching the
/// next interval past the 5 s bound.
const DRIFT_BUDGET_SAVINGS: Duration = Duration::from_secs(1);

/// The drift check's budget, 2% of one core, as a bucket: time fills it at one
/// [`DRIFT_BUDGET_FACTOR`]th, up to [`DRIFT_BUDGET_SAVINGS`] (full at the start); an idle check
/// spends what it took. In debt, the next check waits until it is paid back, so a node whose
/// checks are slow every time (a foreign writer moving the tables all the time) checks less
/// often instead of spending a core on it.
#[derive(Debug)]
struct DriftBudget {
    /// Seconds of check time at hand; negative: owed.
    balance: f64,
    at: Instant,
}

impl DriftBudget {
    fn new(now: Instant) -> Self {
        DriftBudget {
            balance: DRIFT_BUDGET_SAVINGS.as_secs_f64(),
            at: now,
        }
    }

    /// Books a check that ended at `now` having spent `spent`; when the next one is due.
    fn next(&mut self, now: Instant, spent: Duration, period: Duration) -> Instant {
        let factor = f64::from(DRIFT_BUDGET_FACTOR);
        let earned = now.saturating_duration_since(self.at).as_secs_f64() / factor;
        self.at = now;
        self.balance =
            (self.balance + earned).min(DRIFT_BUDGET_SAVINGS.as_secs_f64()) - spent.as_secs_f64();
        now + period.max(Duration::from_secs_f64((-self.balance).max(0.0) * factor))
    }
}

/// What a fast drift check found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drift {
    /// `ipv4 filter/cali-FORWARD`, `ipv6 ipset/cali60s:…` (each repaired).
    pub repaired: Vec<String>,
    /// A root chain of ours was flushed or deleted (the table was likely flushed wholesale).
    pub full_refresh: bool,
}

/// The full refresh's period, which may change while the thread runs (FelixConfiguration's
/// `iptablesRefreshInterval` applies live): the next refresh is due this long after the last
/// program or refresh, read afresh each time the thread waits.
#[derive(Debug, Clone)]
pub struct RefreshPeriod(Arc<AtomicU64>);

impl RefreshPeriod {
    pub fn get(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::Relaxed))
    }

    pub fn set(&self, d: Duration) {
        self.0.store(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

impl From<Duration> for RefreshPeriod {
    fn from(d: Duration) -> Self {
        let p = RefreshPeriod(Arc::new(AtomicU64::new(0)));
        p.set(d);
        p
    }
}

/// Handle to the apply thread. Dropping every sender stops it after its current apply.
pub struct ApplyLoop {
    pub tx: Sender<Batch>,
    pub thread: std::thread::JoinHandle<()>,
}

/// `drift_interval`: the fast drift check's period (`None`: only the full refresh).
pub fn spawn<D: Dataplane>(
    dp: D,
    hub: Arc<StatusHub>,
    refresh_interval: RefreshPeriod,
    drift_interval: Option<Duration>,
) -> ApplyLoop {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("apply".into())
        .spawn(move || {
            let liveness = hub.liveness.clone();
            liveness.beat();
            let run = std::panic::AssertUnwindSafe(|| {
                run(dp, rx, hub, refresh_interval, drift_interval);
            });
            match std::panic::catch_unwind(run) {
                Ok(()) => liveness.ended(NotAlive::Stopped),
                Err(payload) => {
                    liveness.ended(NotAlive::Panicked(panic_message(payload.as_ref())));
                    std::panic::resume_unwind(payload);
                }
            }
        })
        .expect("spawn apply thread");
    ApplyLoop { tx, thread }
}

fn run<D: Dataplane>(
    mut dp: D,
    rx: Receiver<Batch>,
    hub: Arc<StatusHub>,
    refresh: RefreshPeriod,
    drift: Option<Duration>,
) {
    let mut programmed = false;
    let mut failed = false;
    let mut backoff = Duration::from_millis(50);
    let mut pending_revision: Option<i64> = None;
    // Every batch's changes since the last successful apply, in order.
    let mut pending_view: ViewDelta = Vec::new();
    // Local endpoints created or changed since the last successful apply, each with when its
    // earliest pending change reached the agent.
    let mut pending_endpoints = PendingEndpoints::default();
    let mut refreshed_at = Instant::now();
    let mut next_drift = drift.map(|d| Instant::now() + d);
    let mut budget = DriftBudget::new(Instant::now());
    dp.prepare();
    loop {
        hub.liveness.beat();
        let next_refresh = refreshed_at + refresh.get();
        // The drift check runs when due even while batches keep coming (it would never see a
        // receive timeout on a busy node).
        if programmed
            && !failed
            && let (Some(at), Some(period)) = (next_drift, drift)
            && Instant::now() >= at
        {
            next_drift = Some(timed_drift_check(&mut dp, &hub, period, &mut budget));
        }
        let wait = if failed {
            backoff
        } else if programmed {
            let next = next_drift.map_or(next_refresh, |d| d.min(next_refresh));
            next.saturating_duration_since(Instant::now()).min(TICK)
        } else {
            TICK
        };
        let mut outputs = Vec::new();
        // Nothing queued for a while: the dataplane's deferred work runs, not on the next
        // apply's path (a change that comes right after an apply does not wait for it).
        let next = match rx.try_recv() {
            Err(TryRecvError::Empty) => {
                let grace = IDLE_GRACE.min(wait);
                match rx.recv_timeout(grace) {
                    Err(RecvTimeoutError::Timeout) => {
                        dp.idle();
                        rx.recv_timeout(wait - grace)
                    }
                    other => other,
                }
            }
            Ok(b) => Ok(b),
            Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(b) => {
                let mut take = |b: Batch| {
                    pending_endpoints.absorb(&b.outputs, b.received);
                    outputs.extend(b.outputs);
                    pending_revision = Some(b.revision);
                    pending_view.extend(b.view);
                };
                take(b);
                while let Ok(b) = rx.try_recv() {
                    take(b);
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) if failed => {}
            Err(RecvTimeoutError::Timeout) => {
                if programmed && Instant::now() >= next_refresh {
                    let started = Instant::now();
                    let res = dp.refresh();
                    record(&hub, res, started, None, &mut Vec::new());
                    refreshed_at = Instant::now();
                }
                // A due drift check runs at the top of the loop.
                continue;
            }
        }
        let Some(revision) = pending_revision else {
            continue;
        };
        if outputs.is_empty() && programmed && !failed {
            hub.apply_view(revision, std::mem::take(&mut pending_view));
            hub.update(|s| s.applied_revision = s.applied_revision.max(revision));
            continue;
        }
        tracing::debug!(revision, outputs = outputs.len(), "applying");
        let started = Instant::now();
        let res = dp.apply(outputs);
        tracing::debug!(
            revision,
            took_us = started.elapsed().as_micros() as u64,
            ok = res.is_ok(),
            "apply done"
        );
        // Observed before `applied_revision` moves: who saw the revision sees the observations.
        if res.is_ok() {
            pending_endpoints.programmed(&hub.metrics.endpoint_programming_seconds);
        }
        failed = !record(&hub, res, started, Some(revision), &mut pending_view);
        if !failed {
            dp.after_apply();
        }
        if failed {
            backoff = (backoff * 2).min(Duration::from_secs(5));
        } else {
            programmed = true;
            backoff = Duration::from_millis(50);
            refreshed_at = Instant::now();
        }
    }
}

/// Local endpoints whose program is pending, for `felixrs_endpoint_programming_seconds`: one
/// observation per endpoint created or changed, from its earliest pending change's arrival to
/// the successful apply that put its chains and dispatch entries in the kernel (an endpoint
/// removed before that is not observed; a failed apply keeps them for the retry).
#[derive(Debug, Default)]
struct PendingEndpoints(std::collections::HashMap<EndpointId, Instant>);

impl PendingEndpoints {
    fn absorb(&mut self, outputs: &[Output], received: Instant) {
        for o in outputs {
            match o {
                Output::EndpointUpdated(ep) => {
                    self.0.entry(ep.id.clone()).or_insert(received);
                }
                Output::EndpointRemoved(id) => {
                    self.0.remove(id);
                }
                _ => {}
            }
        }
    }

    fn programmed(&mut self, histogram: &prometheus_client::metrics::histogram::Histogram) {
        let now = Instant::now();
        for (_, received) in self.0.drain() {
            histogram.observe(now.saturating_duration_since(received).as_secs_f64());
        }
    }
}

/// Runs the drift check and returns when the next one is due, within the `budget`
/// ([`DriftBudget`]). A repair is not the idle cost: it spends nothing, the next check comes on
/// time.
fn timed_drift_check<D: Dataplane>(
    dp: &mut D,
    hub: &StatusHub,
    period: Duration,
    budget: &mut DriftBudget,
) -> Instant {
    let started = Instant::now();
    let repaired = check_drift(dp, hub);
    let now = Instant::now();
    let spent = if repaired {
        Duration::ZERO
    } else {
        now - started
    };
    let next = budget.next(now, spent, period);
    if repaired { now + period } else { next }
}

/// Runs the fast drift check; a log line and a metric per repaired object. True if it repaired.
fn check_drift<D: Dataplane>(dp: &mut D, hub: &StatusHub) -> bool {
    let started = Instant::now();
    let m = &hub.metrics;
    m.drift_checks.inc();
    match dp.check_drift() {
        Ok(d) => {
            m.drift_check_seconds
                .observe(started.elapsed().as_secs_f64());
            for chain in &d.repaired {
                tracing::warn!(%chain, full_refresh = d.full_refresh, "drift: chain differed from what we wrote; repaired");
                if let Some((family, object)) = chain.split_once(' ') {
                    let labels = [("family", family), ("object", object)];
                    let labels = labels.map(|(k, v)| (k.to_string(), v.to_string()));
                    m.drift_repaired.get_or_create(&labels.to_vec()).inc();
                }
            }
            m.drift_repairs.inc_by(d.repaired.len() as u64);
            !d.repaired.is_empty()
        }
        Err(error) => {
            m.drift_check_errors.inc();
            tracing::warn!(%error, "drift check failed; the full refresh will repair");
            false
        }
    }
}

/// Publishes an apply's outcome; true on success. On success the `view` changes (taken) reach
/// the applied view before `applied_revision` moves, so a tool that saw the revision in `/status`
/// gets at least that view; on failure they wait for the retry.
fn record(
    hub: &StatusHub,
    res: Result<ApplyReport, DataplaneError>,
    started: Instant,
    revision: Option<i64>,
    view: &mut ViewDelta,
) -> bool {
    let elapsed = started.elapsed();
    let m = &hub.metrics;
    m.apply_seconds.observe(elapsed.as_secs_f64());
    match res {
        Ok(r) => {
            m.restore_calls.inc_by(r.restore_calls);
            m.restore_errors.inc_by(r.restore_errors);
            m.rules.set(r.rules as i64);
            m.chains.set(r.chains as i64);
            m.ip_sets.set(r.ip_sets as i64);
            m.local_endpoints.set(r.local_endpoints as i64);
            m.local_host_endpoints.set(r.local_host_endpoints as i64);
            m.active_policies.set(r.active_policies as i64);
            m.felix.applied(elapsed.as_secs_f64(), &r);
            if let Some(rev) = revision {
                hub.apply_view(rev, std::mem::take(view));
            }
            hub.update(|s| {
                if let Some(rev) = revision {
                    s.applied_revision = s.applied_revision.max(rev);
                    s.programmed = true;
                }
                s.local_endpoints = r.local_endpoints;
                s.local_host_endpoints = r.local_host_endpoints;
                s.active_policies = r.active_policies;
                s.ip_sets = r.ip_sets;
                s.rules = r.rules;
                s.chains = r.chains;
                s.last_apply_duration_ms = Some(elapsed.as_secs_f64() * 1000.0);
                s.last_apply_error = None;
            });
            true
        }
        Err(error) => {
            tracing::error!(%error, ?revision, "apply failed; will retry");
            m.apply_errors.inc();
            m.felix.apply_failed(elapsed.as_secs_f64());
            hub.update(|s| {
                s.last_apply_duration_ms = Some(elapsed.as_secs_f64() * 1000.0);
                s.last_apply_error = Some(error.to_string());
            });
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drift_budget_pays_a_rare_slow_check_from_savings_and_stretches_a_constant_one() {
        let period = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut b = DriftBudget::new(t0);
        // Cheap checks (10 ms every 2 s = 0.5%) with a 0.5 s one every 25th (1% more): on time.
        let mut now = t0;
        for i in 1..=200u32 {
            now += period;
            let spent = Duration::from_millis(if i % 25 == 0 { 500 } else { 10 });
            assert_eq!(b.next(now, spent, period), now + period, "check {i}");
        }
        // A 0.5 s check every time (25%): stretched to its 2% share.
        let mut waits = Vec::new();
        for _ in 0..10 {
            let next = b.next(now, Duration::from_millis(500), period);
            waits.push(next - now);
            now = next;
        }
        let last = *waits.last().unwrap();
        assert!(
            last >= Duration::from_secs(24) && last <= Duration::from_secs(26),
            "{waits:?}"
        );
    }
}
