//! Per-policy counters in `/metrics`: a thread of its own reads the kernel's counters of our rules
//! every `--counters-interval` and attributes them to policy, tier, direction and action.
//!
//! * The apply thread publishes, after programs that changed the filter chains, what each of our
//!   rules counts towards ([`Attribution`], both families) and the backend in use
//!   ([`CounterHub::publish`]); building it walks the rendered policy, profile and endpoint chains,
//!   so it is done after the first program, then when the apply thread goes idle, or at most every
//!   5 s under a churn that never lets it (`KernelDataplane::with_counters`).
//! * The counter thread ([`spawn`]) never holds anything the apply thread waits for: it clones the
//!   published `Arc`, runs `iptables-save -c -t filter` (no xtables lock) per family and stores
//!   the tally. A read never blocks an apply; a slow read only delays the next read.
//! * A scrape encodes the last stored tally ([`PolicyCounters`](super::metrics::PolicyCounters), a
//!   prometheus-client collector, in `metrics`): no
//!   kernel read per scrape. At most [`MAX_SERIES`] label sets per family (the busiest; the rest
//!   are folded into `policy="(other)"`), and series disappear with their policy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use super::apply_loop::FamilyError;
use super::status::StatusHub;
use calc_graph::proto::IpVersion;
use iptables::apply::Runner;
use iptables::apply::backend::Mode;
use iptables::apply::counters::read_filter_counters;
use iptables::stats::{Attribution, Tally};

/// Label sets per family in `/metrics` at most.
pub const MAX_SERIES: usize = 1000;

/// What the apply thread publishes for the counter thread.
#[derive(Debug)]
pub struct Published {
    pub mode: Mode,
    pub v4: Attribution,
    pub v6: Attribution,
}

/// The hand-over point between the apply thread and the counter thread.
#[derive(Debug, Default)]
pub struct CounterHub {
    published: Mutex<Option<Arc<Published>>>,
}

impl CounterHub {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn publish(&self, p: Published) {
        *self.published.lock().expect("counter hub lock") = Some(Arc::new(p));
    }

    pub fn current(&self) -> Option<Arc<Published>> {
        self.published.lock().expect("counter hub lock").clone()
    }
}

/// Handle of the counter thread; [`CounterThread::stop`] ends it.
pub struct CounterThread {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl CounterThread {
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// Reads the counters once with what was last published; `None` before the first program.
pub fn read_once(
    hub: &CounterHub,
    runner: &dyn Runner,
) -> Option<Result<Vec<(IpVersion, Tally)>, FamilyError>> {
    let p = hub.current()?;
    let mut out = Vec::new();
    for (v, a) in [(IpVersion::V4, &p.v4), (IpVersion::V6, &p.v6)] {
        match read_filter_counters(runner, p.mode, v) {
            Ok(save) => out.push((v, a.attribute(&save).capped(MAX_SERIES))),
            Err(error) => return Some(Err(FamilyError { family: v, error })),
        }
    }
    Some(Ok(out))
}

/// Starts the counter thread: every `interval`, reads and publishes to `status.metrics`.
pub fn spawn<R: Runner + 'static>(
    runner: R,
    hub: Arc<CounterHub>,
    status: Arc<StatusHub>,
    interval: Duration,
) -> CounterThread {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("counters".into())
        .spawn(move || {
            let mut next = Instant::now() + interval;
            while !flag.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(100)));
                    continue;
                }
                next = now + interval;
                let started = Instant::now();
                let m = &status.metrics;
                match read_once(&hub, &runner) {
                    None => {}
                    Some(Ok(tallies)) => {
                        let missing: usize = tallies.iter().map(|(_, t)| t.rules_missing).sum();
                        m.policy_counter_rules_missing.set(missing as i64);
                        m.policy_counters.set(tallies);
                        m.counter_reads.inc();
                        m.counter_read_seconds
                            .observe(started.elapsed().as_secs_f64());
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "cannot read the kernel's rule counters");
                        m.counter_read_errors.inc();
                    }
                }
            }
        })
        .expect("spawn counter thread");
    CounterThread { stop, thread }
}
