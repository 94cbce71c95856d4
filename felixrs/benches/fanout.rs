//! Fan-out: N of the agent's real syncers (one process, one etcd client each) against a 3-member
//! etcd cluster, direct (spread over the members) vs through one `etcd grpc-proxy`.
//!
//! `cargo bench -p felixrs --bench fanout [-- N...]` (default N = 100 500 2000)
//!
//! Fixed inputs: 200 keys (100 global network sets, 100 policies) under Calico's prefix. Per run:
//! all N syncers listed; then a 10 s window with 5 policy changes (one put each, waiting until all
//! N syncers saw it); reported: etcd watchers (sum of `etcd_debugging_mvcc_watcher_total` over the
//! members), the members' CPU seconds over the window and RSS after it (and the proxy's), and the
//! propagation latency of a change to all N (p50/p99 over N x 5 deliveries). The syncers ask for a
//! progress notification every second, as agents do, so the window includes that load.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use calc_graph::model::{CALICO_PREFIX, EtcdPrefix};
use felixrs::agent::datastore::{EtcdDatastore, EtcdTls};
use felixrs::agent::syncer::{self, SyncEvent, SyncerConfig};
use felixrs_test_support::etcd::cluster::{EtcdCluster, GrpcProxy};
use felixrs_test_support::http;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

const CHANGES: usize = 5;
const WINDOW: Duration = Duration::from_secs(10);

fn change_key() -> String {
    format!("{CALICO_PREFIX}globalnetworkpolicies/bench-change")
}

/// (syncer, change number) when a syncer saw change `n`; `usize::MAX` when it listed.
type Seen = (usize, usize, Instant);

fn spawn(url: String, id: usize, tx: mpsc::UnboundedSender<Seen>, cancel: &CancellationToken) {
    let ds = EtcdDatastore::new(vec![url], EtcdTls::default(), Duration::from_secs(10));
    let cfg = SyncerConfig::new(EtcdPrefix::default());
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
                SyncEvent::Listed { .. } => {
                    let _ = tx.send((id, usize::MAX, Instant::now()));
                }
                SyncEvent::Changes { changes, .. } => {
                    for c in changes.iter().filter(|c| c.key == key) {
                        let n = c
                            .value
                            .as_deref()
                            .and_then(|v| std::str::from_utf8(v).ok())
                            .and_then(|v| v.trim_matches('"').parse().ok())
                            .unwrap_or(usize::MAX - 1);
                        let _ = tx.send((id, n, Instant::now()));
                    }
                }
                _ => {}
            }
        }
    });
}

fn metric_sum(addr: &str, name: &str) -> f64 {
    let addr: SocketAddr = addr.parse().expect("addr");
    let Ok((200, body)) = http::get_with_timeout(addr, "/metrics", Duration::from_secs(5)) else {
        return f64::NAN;
    };
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// CPU seconds (user + system) of a process so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

struct Row {
    mode: &'static str,
    n: usize,
    watchers: f64,
    etcd_cpu: f64,
    etcd_rss: f64,
    proxy_cpu: f64,
    proxy_rss: f64,
    p50: Duration,
    p99: Duration,
    list_all: Duration,
}

async fn run(
    cluster: &EtcdCluster,
    proxy: &GrpcProxy,
    n: usize,
    via_proxy: bool,
    round: usize,
) -> Row {
    let cancel = CancellationToken::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let started = Instant::now();
    for id in 0..n {
        let url = if via_proxy {
            proxy.url()
        } else {
            cluster.client_url(id % cluster.len())
        };
        spawn(url, id, tx.clone(), &cancel);
    }
    let mut listed = 0;
    while listed < n {
        let (_, c, _) = tokio::time::timeout(Duration::from_secs(120), rx.recv())
            .await
            .expect("all syncers list within 120 s")
            .expect("channel open");
        if c == usize::MAX {
            listed += 1;
        }
    }
    let list_all = started.elapsed();
    let member_pids: Vec<u32> = (0..cluster.len()).filter_map(|i| cluster.pid(i)).collect();
    let cpu0: f64 = member_pids.iter().map(|p| cpu_seconds(*p)).sum();
    let pcpu0 = cpu_seconds(proxy.pid());
    let window_start = Instant::now();
    let mut lat = Vec::with_capacity(n * CHANGES);
    for c in 0..CHANGES {
        let tag = round * 100 + c;
        let put_at = Instant::now();
        cluster.put(&change_key(), &format!("\"{tag}\""));
        let mut seen = 0;
        while seen < n {
            let (_, got, at) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .expect("every syncer sees the change within 60 s")
                .expect("channel open");
            if got == tag {
                seen += 1;
                lat.push(at - put_at);
            }
        }
    }
    if let Some(rest) = WINDOW.checked_sub(window_start.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let secs = window_start.elapsed().as_secs_f64();
    let etcd_cpu = (member_pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - cpu0) / secs;
    let proxy_cpu = (cpu_seconds(proxy.pid()) - pcpu0) / secs;
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
    let proxy_rss = rss_mib(proxy.pid());
    cancel.cancel();
    lat.sort();
    Row {
        mode: if via_proxy { "grpc-proxy" } else { "direct" },
        n,
        watchers,
        etcd_cpu,
        etcd_rss,
        proxy_cpu,
        proxy_rss,
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        list_all,
    }
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
    raise_fd_limit();
    let cluster = EtcdCluster::start(3);
    let proxy = GrpcProxy::start(&cluster.endpoints());
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
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "| N | mode | etcd watchers | etcd CPU (cores) | etcd RSS (MiB, 3 members) | proxy CPU | proxy RSS (MiB) | p50 | p99 | all listed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut round = 0;
    for n in ns {
        for via_proxy in [false, true] {
            round += 1;
            let r = rt.block_on(run(&cluster, &proxy, n, via_proxy, round));
            println!(
                "| {} | {} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.1} ms | {:.1} ms | {:.1} s |",
                r.n,
                r.mode,
                r.watchers,
                r.etcd_cpu,
                r.etcd_rss,
                r.proxy_cpu,
                r.proxy_rss,
                r.p50.as_secs_f64() * 1e3,
                r.p99.as_secs_f64() * 1e3,
                r.list_all.as_secs_f64()
            );
            // Let the cancelled syncers' connections close before the next run.
            std::thread::sleep(Duration::from_secs(3));
        }
    }
}
