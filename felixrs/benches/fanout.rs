//! Fan-out: N of the agent's real syncers (one process, one etcd client each) against a 3-member
//! etcd cluster, direct (spread over the members) vs through one `etcd grpc-proxy`.
//!
//! `cargo bench -p felixrs --bench fanout [-- N...]` (default N = 100 500 2000)
//!
//! Knobs (environment): `FANOUT_PROXIES=k` (default 1) starts k proxies and spreads the syncers of
//! the proxy mode over them (syncer i → proxy i mod k); `FANOUT_MODES=direct,proxy` (default both)
//! picks the modes; `FANOUT_STORM=etcd,proxy` (default none) adds, after each window, a reconnect
//! storm per kind named (see `storm`) and prints a second table. The process raises its own
//! open-file limit to the hard limit (each syncer holds a connection; etcd and the proxies inherit
//! it). The bench's own CPU (the load generator, from /proc/self/stat) and the load average are
//! printed beside the numbers, because generator, etcd and proxies share the machine's cores.
//! `FANOUT_IDLE=s` (default 0) keeps the syncers idle that long after the window, counting their
//! disconnects (what the liveness check does to a quiet fleet); `FANOUT_WORKERS=k` (default 2)
//! sets the runtime's worker threads; `FANOUT_PROGRESS_MS` the syncers' progress request interval
//! (default the agent's 1 s; they are about half the generator's and the proxy's CPU at 1,000
//! idle syncers; keep it under 5,000 in direct mode, where the progress requests are the
//! liveness check's); `FANOUT_LOG=1` the syncers' own logs on stderr.
//!
//! Telling load from latency: besides p50/p99 as the bench counts a delivery (after the syncer's
//! channel and the bench's shared queue, both served by the generator's loaded runtime), the
//! latency is stamped on each syncer's own task when its watch decodes the event (*decoded*
//! p50/p99), and a 10 ms ticker on the same runtime measures the generator's scheduling delay
//! over the window (*bench lag p99*): when the lag is of the order of p99, p99 is the generator's,
//! not the system's. Disconnects are counted by reason (the liveness check's "silent", a
//! request's "timed out", anything else) over the window and the idle time.
//!
//! Fixed inputs: 200 keys (100 global network sets, 100 policies) under Calico's prefix. Per run:
//! all N syncers listed; then a 10 s window with 5 policy changes (one put each, waiting until all
//! N syncers saw it); reported: etcd watchers (sum of `etcd_debugging_mvcc_watcher_total` over the
//! members), the members' CPU seconds over the window and RSS after it (and the proxy's), and the
//! propagation latency of a change to all N (p50/p99 over N x 5 deliveries). The syncers ask for a
//! progress notification every second, as agents do, so the window includes that load.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use calc_graph::model::{CALICO_PREFIX, EtcdPrefix};
use felixrs::agent::datastore::{
    Datastore, DatastoreError, DatastoreWatch, EtcdDatastore, EtcdTls, EtcdWatch, Listing,
    WatchMessage,
};
use felixrs::agent::syncer::{self, SyncEvent, SyncerConfig};
use felixrs_test_support::etcd::cluster::{EtcdCluster, GrpcProxy};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

#[path = "fanout/probe.rs"]
mod probe;
use probe::{
    Peak, Sampler, cpu_seconds, load_average, member_pids, metric_sum, proxy_pids, rss_mib,
    self_cpu,
};

const CHANGES: usize = 5;
const WINDOW: Duration = Duration::from_secs(10);

fn change_key() -> String {
    format!("{CALICO_PREFIX}globalnetworkpolicies/bench-change")
}

/// What a syncer did, as the bench sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum What {
    /// It delivered a complete listing.
    Listed,
    /// It delivered change number n (as an event, or inside a listing that holds it).
    Change(usize),
    /// Its watch decoded change number n: stamped on the syncer's own task when the watch
    /// returned the event, before any queue (the receipt time, without the generator's queueing
    /// between the syncer and the bench's count).
    Decoded(usize),
    /// It lost its connection (and will reconnect), for this reason.
    Disconnected(Reason),
    /// Its task ended: it gave up (never expected before the bench cancels it).
    Ended,
}

/// (syncer, what, when).
type Seen = (usize, What, Instant);

/// Why a syncer lost its connection (from the `Disconnected` reason's text).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Reason {
    /// The watch liveness check: "etcd watch silent for …".
    Silent,
    /// A request's timeout: "etcd request timed out after …".
    Timeout,
    /// Anything else (refused, reset, broken pipe, …).
    Other,
}

impl Reason {
    fn of(reason: &str) -> Reason {
        if reason.contains("watch silent") {
            Reason::Silent
        } else if reason.contains("timed out") {
            Reason::Timeout
        } else {
            Reason::Other
        }
    }
}

/// Disconnects by reason: silent / timed out / other.
#[derive(Default, Clone, Copy)]
struct Reasons([usize; 3]);

impl Reasons {
    fn add(&mut self, r: Reason) {
        self.0[r as usize] += 1;
    }
}

impl std::fmt::Display for Reasons {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} / {} / {}", self.0[0], self.0[1], self.0[2])
    }
}

/// The agent's etcd datastore, with the bench's change stamped on the syncer's own task as the
/// watch decodes it ([`What::Decoded`]).
struct Stamped {
    inner: EtcdDatastore,
    id: usize,
    tx: mpsc::UnboundedSender<Seen>,
}

struct StampedWatch {
    inner: EtcdWatch,
    id: usize,
    tx: mpsc::UnboundedSender<Seen>,
    key: String,
}

impl Datastore for Stamped {
    type Watch = StampedWatch;
    async fn list(&mut self, prefix: &str) -> Result<Listing, DatastoreError> {
        self.inner.list(prefix).await
    }
    async fn watch(
        &mut self,
        prefix: &str,
        start_revision: i64,
    ) -> Result<StampedWatch, DatastoreError> {
        Ok(StampedWatch {
            inner: self.inner.watch(prefix, start_revision).await?,
            id: self.id,
            tx: self.tx.clone(),
            key: change_key(),
        })
    }
    fn reset(&mut self) {
        self.inner.reset();
    }
}

impl DatastoreWatch for StampedWatch {
    async fn next(&mut self) -> Result<WatchMessage, DatastoreError> {
        let m = self.inner.next().await?;
        if let WatchMessage::Changes { changes, .. } = &m {
            let now = Instant::now();
            for c in changes.iter().filter(|c| c.key == self.key) {
                let n = c.value.as_deref().map_or(usize::MAX, tag_of);
                let _ = self.tx.send((self.id, What::Decoded(n), now));
            }
        }
        Ok(m)
    }
    async fn request_progress(&mut self) -> Result<(), DatastoreError> {
        self.inner.request_progress().await
    }
    fn ping(&self) -> impl Future<Output = Result<(), DatastoreError>> + Send + 'static {
        self.inner.ping()
    }
}

fn tag_of(value: &[u8]) -> usize {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.trim_matches('"').parse().ok())
        .unwrap_or(usize::MAX)
}

fn spawn(url: String, id: usize, tx: mpsc::UnboundedSender<Seen>, cancel: &CancellationToken) {
    let ds = Stamped {
        inner: EtcdDatastore::new(vec![url], EtcdTls::default(), Duration::from_secs(10)),
        id,
        tx: tx.clone(),
    };
    let mut cfg = SyncerConfig::new(EtcdPrefix::default());
    if let Some(ms) = env_number("FANOUT_PROGRESS_MS") {
        cfg.progress_interval = Duration::from_millis(ms as u64);
    }
    let (etx, mut erx) = mpsc::channel(64);
    tokio::spawn(syncer::run(
        ds,
        cfg,
        etx,
        Arc::new(Notify::new()),
        cancel.child_token(),
    ));
    let key = change_key();
    tokio::spawn(async move {
        while let Some(ev) = erx.recv().await {
            match ev {
                SyncEvent::Listed { kvs, .. } => {
                    let now = Instant::now();
                    let _ = tx.send((id, What::Listed, now));
                    if let Some((_, v)) = kvs.iter().find(|(k, _)| *k == key) {
                        let _ = tx.send((id, What::Change(tag_of(v)), now));
                    }
                }
                SyncEvent::Changes { changes, .. } => {
                    for c in changes.iter().filter(|c| c.key == key) {
                        let n = c.value.as_deref().map_or(usize::MAX, tag_of);
                        let _ = tx.send((id, What::Change(n), Instant::now()));
                    }
                }
                SyncEvent::Disconnected { reason } => {
                    let what = What::Disconnected(Reason::of(&reason));
                    let _ = tx.send((id, what, Instant::now()));
                }
                _ => {}
            }
        }
        let _ = tx.send((id, What::Ended, Instant::now()));
    });
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

struct Row {
    mode: String,
    n: usize,
    watchers: f64,
    etcd_cpu: f64,
    etcd_rss: f64,
    proxy_cpu: f64,
    proxy_rss: f64,
    p50: Duration,
    p99: Duration,
    list_all: Duration,
    bench_cpu: f64,
    load: String,
    /// Connections the syncers lost during the window (etcd 3.4's grpc-proxy closes a client's
    /// connection for "too many pings" about every 20 s: it accepts keepalive pings no more often
    /// than every 5 minutes, and the agent pings every 5 s).
    reconnects: usize,
    /// The propagation latency to the syncers' watches (stamped when decoded, on each syncer's
    /// own task), p50 and p99.
    decoded_p50: Duration,
    decoded_p99: Duration,
    /// The generator's scheduler lag over the window: how late a 10 ms ticker on the same
    /// runtime woke, p99 (a loaded generator shows here, not in the system's latency).
    lag_p99: Duration,
    /// Disconnects by reason (silent / timed out / other), in the window and over the idle
    /// time after it (`FANOUT_IDLE`).
    reasons: Reasons,
}

/// How late a 10 ms ticker on the bench's runtime wakes, until `stop`: the generator's own
/// scheduling delay (all N syncers share the runtime's 2 worker threads).
fn lag_ticker(stop: CancellationToken) -> tokio::task::JoinHandle<Vec<Duration>> {
    const TICK: Duration = Duration::from_millis(10);
    tokio::spawn(async move {
        let mut lags = Vec::new();
        let mut next = tokio::time::Instant::now() + TICK;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(next) => {}
            }
            let now = tokio::time::Instant::now();
            lags.push(now - next);
            next = now + TICK;
        }
        lags
    })
}

fn env_number(name: &str) -> Option<usize> {
    let v = std::env::var(name).ok()?;
    Some(v.parse().unwrap_or_else(|_| panic!("{name} is a number")))
}

/// The next event, or a loud failure: a syncer whose task ended gave up, which must never happen.
async fn next_seen(rx: &mut mpsc::UnboundedReceiver<Seen>, deadline: Duration, what: &str) -> Seen {
    let seen = tokio::time::timeout(deadline, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {deadline:?}"))
        .expect("channel open");
    assert!(
        seen.1 != What::Ended,
        "{what}: syncer {} gave up (its task ended)",
        seen.0
    );
    seen
}

/// How a reconnect storm is caused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum StormKind {
    /// SIGKILL every etcd member, keep them down for `OUTAGE`, start them again on their data
    /// (a whole-cluster restart: every connection to etcd gets a reset, as a real restart gives;
    /// SIGSTOP would not model it, the kernel keeps the TCP connections up and nothing
    /// reconnects). Then one change is written and etcd compacted past it, so every syncer that
    /// had not yet resumed its watch must list again.
    Etcd,
    /// SIGKILL every proxy; during the outage one change is written and etcd compacted past it;
    /// the proxies start again: every syncer reconnects at once and must list again (all N relist).
    Proxy,
}

const OUTAGE: Duration = Duration::from_secs(3);

/// How long the storm may take before the bench calls the syncers that are still out wedged
/// (`FANOUT_STORM_DEADLINE` seconds, default 180).
fn storm_deadline() -> Duration {
    let secs = std::env::var("FANOUT_STORM_DEADLINE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(180);
    Duration::from_secs(secs)
}

struct StormRow {
    kind: StormKind,
    restart: Duration,
    in_sync: Duration,
    disconnected: usize,
    relisted: usize,
    peak: Peak,
    load: String,
}

/// With all N syncers in sync, causes a storm of `kind` and waits until every syncer holds the
/// change written during it; fails loudly when one gave up or is still out after `STORM_DEADLINE`.
#[allow(clippy::too_many_arguments)]
async fn storm(
    cluster: &mut EtcdCluster,
    proxies: &mut [GrpcProxy],
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    n: usize,
    kind: StormKind,
    tag: usize,
) -> StormRow {
    let sampler = Sampler::start(member_pids(cluster), proxy_pids(proxies));
    let write_and_compact = |cluster: &EtcdCluster| {
        let rev = cluster.put_rev(&change_key(), &format!("\"{tag}\""));
        // A write outside the prefix, so the compaction can be past the change: a watch that
        // resumes at the change's revision (or earlier) is then told to list again.
        let rev2 = cluster.put_rev("/felixrs-bench/storm-filler", &tag.to_string());
        assert!(rev2 > rev, "filler after the change ({rev2} > {rev})");
        cluster.compact(rev2);
    };
    let t_kill = Instant::now();
    match kind {
        StormKind::Etcd => {
            for i in 0..cluster.len() {
                cluster.kill(i);
            }
            std::thread::sleep(OUTAGE);
            cluster.start_stopped();
        }
        StormKind::Proxy => {
            for p in proxies.iter_mut() {
                p.kill();
            }
            write_and_compact(cluster);
            std::thread::sleep(OUTAGE.saturating_sub(t_kill.elapsed()));
            for p in proxies.iter_mut() {
                p.restart();
            }
        }
    }
    let t_up = Instant::now();
    sampler.set_pids(member_pids(cluster), proxy_pids(proxies));
    if kind == StormKind::Etcd {
        write_and_compact(cluster);
    }
    let (mut disconnected, mut relisted) = (vec![false; n], vec![false; n]);
    let mut synced = vec![false; n];
    let mut in_sync = 0;
    let deadline = storm_deadline();
    while in_sync < n {
        let left = deadline.saturating_sub(t_up.elapsed());
        let got = tokio::time::timeout(left, rx.recv()).await;
        let Ok(Some((id, what, _))) = got else {
            let out: Vec<usize> = (0..n).filter(|i| !synced[*i]).collect();
            let out_disc = out.iter().filter(|i| disconnected[**i]).count();
            let out_list = out.iter().filter(|i| relisted[**i]).count();
            panic!(
                "storm {kind:?}: {} of {n} syncers wedged (not in sync {deadline:?} after the restart; \
                 {out_disc} of them saw the disconnect, {out_list} listed again), e.g. {:?}",
                out.len(),
                &out[..out.len().min(10)]
            );
        };
        match what {
            What::Ended => panic!("storm {kind:?}: syncer {id} gave up (its task ended)"),
            What::Disconnected(_) => disconnected[id] = true,
            What::Decoded(_) => {}
            What::Listed => relisted[id] = true,
            What::Change(t) if t == tag && !synced[id] => {
                synced[id] = true;
                in_sync += 1;
            }
            What::Change(_) => {}
        }
    }
    let in_sync_at = t_up.elapsed();
    // Keep sampling a little after the last syncer, so the peak includes the tail.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let peak = sampler.finish();
    StormRow {
        kind,
        restart: t_up - t_kill,
        in_sync: in_sync_at,
        disconnected: disconnected.iter().filter(|d| **d).count(),
        relisted: relisted.iter().filter(|d| **d).count(),
        peak,
        load: load_average(),
    }
}

async fn run(
    cluster: &mut EtcdCluster,
    proxies: &mut [GrpcProxy],
    n: usize,
    via_proxy: bool,
    round: usize,
    storms: &[StormKind],
) -> (Row, Vec<StormRow>) {
    let cancel = CancellationToken::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let started = Instant::now();
    for id in 0..n {
        let url = if via_proxy {
            proxies[id % proxies.len()].url()
        } else {
            cluster.client_url(id % cluster.len())
        };
        spawn(url, id, tx.clone(), &cancel);
    }
    let mut listed = 0;
    while listed < n {
        let (_, what, _) = next_seen(&mut rx, Duration::from_secs(120), "all syncers list").await;
        if what == What::Listed {
            listed += 1;
        }
    }
    let list_all = started.elapsed();
    let member_pids = member_pids(cluster);
    let cpu0: f64 = member_pids.iter().map(|p| cpu_seconds(*p)).sum();
    let pcpu0: f64 = proxies.iter().map(|p| cpu_seconds(p.pid())).sum();
    let me0 = self_cpu();
    let window_start = Instant::now();
    let lag_stop = CancellationToken::new();
    let lag = lag_ticker(lag_stop.clone());
    let mut lat = Vec::with_capacity(n * CHANGES);
    let mut decoded = Vec::with_capacity(n * CHANGES);
    let mut reconnects = 0;
    let mut reasons = Reasons::default();
    for c in 0..CHANGES {
        let tag = round * 100 + c;
        let put_at = Instant::now();
        cluster.put(&change_key(), &format!("\"{tag}\""));
        let mut seen = 0;
        while seen < n {
            let (_, got, at) = next_seen(
                &mut rx,
                Duration::from_secs(60),
                "every syncer sees the change",
            )
            .await;
            match got {
                What::Change(t) if t == tag => {
                    seen += 1;
                    lat.push(at - put_at);
                }
                What::Decoded(t) if t == tag => decoded.push(at - put_at),
                What::Disconnected(r) => {
                    reconnects += 1;
                    reasons.add(r);
                }
                _ => {}
            }
        }
    }
    if let Some(rest) = WINDOW.checked_sub(window_start.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let secs = window_start.elapsed().as_secs_f64();
    let bench_cpu = (self_cpu() - me0) / secs;
    lag_stop.cancel();
    let mut lags = lag.await.expect("lag ticker");
    lags.sort();
    let window_end = Instant::now();
    // Idle syncers (`FANOUT_IDLE` seconds): what the liveness check does to a quiet fleet.
    let idle = Duration::from_secs(env_number("FANOUT_IDLE").unwrap_or(0) as u64);
    tokio::time::sleep(idle).await;
    while let Ok((id, what, at)) = rx.try_recv() {
        assert!(what != What::Ended, "syncer {id} gave up (its task ended)");
        if let What::Disconnected(r) = what {
            reasons.add(r);
            reconnects += usize::from(at < window_end);
        }
    }
    let etcd_cpu = (member_pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - cpu0) / secs;
    let proxy_cpu = (proxies.iter().map(|p| cpu_seconds(p.pid())).sum::<f64>() - pcpu0) / secs;
    let watchers: f64 = (0..cluster.len())
        .map(|i| {
            let url = cluster.client_url(i);
            metric_sum(
                url.trim_start_matches("http://"),
                "etcd_debugging_mvcc_watcher_total",
            )
        })
        .sum();
    let etcd_rss = member_pids.iter().map(|p| rss_mib(*p)).sum();
    let proxy_rss = proxies.iter().map(|p| rss_mib(p.pid())).sum();
    let load = load_average();
    let mut storm_rows = Vec::new();
    for (i, kind) in storms.iter().enumerate() {
        if *kind == StormKind::Proxy && !via_proxy {
            continue;
        }
        let tag = round * 100 + CHANGES + i;
        storm_rows.push(storm(cluster, proxies, &mut rx, n, *kind, tag).await);
    }
    cancel.cancel();
    lat.sort();
    decoded.sort();
    let mode = match (via_proxy, proxies.len()) {
        (false, _) => "direct".to_string(),
        (true, 1) => "grpc-proxy".to_string(),
        (true, k) => format!("grpc-proxy x{k}"),
    };
    let row = Row {
        mode,
        n,
        watchers,
        etcd_cpu,
        etcd_rss,
        proxy_cpu,
        proxy_rss,
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        list_all,
        bench_cpu,
        load,
        reconnects,
        decoded_p50: pct(&decoded, 0.5),
        decoded_p99: pct(&decoded, 0.99),
        lag_p99: pct(&lags, 0.99),
        reasons,
    };
    (row, storm_rows)
}

fn raise_fd_limit() {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn main() {
    let ns: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ns = if ns.is_empty() {
        vec![100, 500, 2000]
    } else {
        ns
    };
    let k: usize = std::env::var("FANOUT_PROXIES")
        .ok()
        .map(|v| v.parse().expect("FANOUT_PROXIES is a number"))
        .unwrap_or(1)
        .max(1);
    let modes = env_list("FANOUT_MODES", "direct,proxy");
    let storms: Vec<StormKind> = env_list("FANOUT_STORM", "")
        .iter()
        .map(|s| match s.as_str() {
            "etcd" => StormKind::Etcd,
            "proxy" => StormKind::Proxy,
            other => panic!("FANOUT_STORM: unknown storm {other:?} (etcd, proxy)"),
        })
        .collect();
    if std::env::var_os("FANOUT_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::DEBUG)
            .init();
    }
    raise_fd_limit();
    let mut cluster = EtcdCluster::start(3);
    let mut proxies: Vec<GrpcProxy> = (0..k)
        .map(|_| GrpcProxy::start(&cluster.endpoints()))
        .collect();
    for i in 0..100 {
        cluster.put(
            &format!("{CALICO_PREFIX}globalnetworksets/s{i}"),
            &format!("{{\"nets\":[\"10.{}.{}.0/24\"]}}", i / 256, i % 256),
        );
        cluster.put(
            &format!("{CALICO_PREFIX}globalnetworkpolicies/p{i}"),
            &format!("{{\"selector\":\"app == 'a{i}'\"}}"),
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_number("FANOUT_WORKERS").unwrap_or(2))
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "| N | mode | etcd watchers | etcd CPU (cores) | etcd RSS (MiB, 3 members) | proxy CPU | proxy RSS (MiB) | p50 | p99 | all listed | bench CPU (cores) | load | reconnects in window | decoded p50 | decoded p99 | bench lag p99 | disconnects silent / timed out / other (window + idle) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut round = 0;
    let mut storm_rows = Vec::new();
    for n in ns {
        for via_proxy in [false, true] {
            let name = if via_proxy { "proxy" } else { "direct" };
            if !modes.iter().any(|m| m == name) {
                continue;
            }
            round += 1;
            let (r, s) = rt.block_on(run(
                &mut cluster,
                &mut proxies,
                n,
                via_proxy,
                round,
                &storms,
            ));
            println!(
                "| {} | {} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.1} ms | {:.1} ms | {:.1} s | {:.2} | {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {} |",
                r.n,
                r.mode,
                r.watchers,
                r.etcd_cpu,
                r.etcd_rss,
                r.proxy_cpu,
                r.proxy_rss,
                r.p50.as_secs_f64() * 1e3,
                r.p99.as_secs_f64() * 1e3,
                r.list_all.as_secs_f64(),
                r.bench_cpu,
                r.load,
                r.reconnects,
                r.decoded_p50.as_secs_f64() * 1e3,
                r.decoded_p99.as_secs_f64() * 1e3,
                r.lag_p99.as_secs_f64() * 1e3,
                r.reasons,
            );
            storm_rows.extend(s.into_iter().map(|s| (r.n, r.mode.clone(), s)));
            // Let the cancelled syncers' connections close before the next run.
            std::thread::sleep(Duration::from_secs(3));
        }
    }
    if !storm_rows.is_empty() {
        println!();
        println!(
            "| N | mode | storm | down → up | up → all in sync | disconnected | relisted | etcd peak CPU (cores) | etcd peak RSS (MiB) | proxy peak CPU | proxy peak RSS (MiB) | bench peak CPU | load |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for (n, mode, s) in storm_rows {
            println!(
                "| {n} | {mode} | {} | {:.1} s | {:.2} s | {} | {} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {} |",
                match s.kind {
                    StormKind::Etcd => "etcd restart",
                    StormKind::Proxy => "proxy restart",
                },
                s.restart.as_secs_f64(),
                s.in_sync.as_secs_f64(),
                s.disconnected,
                s.relisted,
                s.peak.etcd_cpu,
                s.peak.etcd_rss,
                s.peak.proxy_cpu,
                s.peak.proxy_rss,
                s.peak.bench_cpu,
                s.load,
            );
        }
    }
}
