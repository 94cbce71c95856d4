//! The fan-out bench's view of the processes it runs: etcd's metrics, CPU and RSS from /proc,
//! and a sampler of their peaks.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use felixrs_test_support::etcd::cluster::{EtcdCluster, GrpcProxy};
use felixrs_test_support::http;

pub fn metric_sum(addr: &str, name: &str) -> f64 {
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
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

pub fn load_average() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

pub fn self_cpu() -> f64 {
    cpu_seconds(std::process::id())
}

/// Peaks of CPU (cores, summed over a group of processes) and RSS (MiB, summed), sampled every
/// 250 ms from /proc by a thread; the groups' pids may change (a restarted member).
#[derive(Default, Clone, Copy)]
pub struct Peak {
    pub etcd_cpu: f64,
    pub etcd_rss: f64,
    pub proxy_cpu: f64,
    pub proxy_rss: f64,
    pub bench_cpu: f64,
}

pub struct Sampler {
    pids: Arc<Mutex<(Vec<u32>, Vec<u32>)>>,
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Peak>,
}

impl Sampler {
    pub fn start(etcd: Vec<u32>, proxies: Vec<u32>) -> Sampler {
        let pids = Arc::new(Mutex::new((etcd, proxies)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, st) = (pids.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            const TICK: Duration = Duration::from_millis(250);
            let mut last: HashMap<u32, f64> = HashMap::new();
            let mut peak = Peak::default();
            let mut me = self_cpu();
            while !st.load(Ordering::Relaxed) {
                std::thread::sleep(TICK);
                let (etcd, proxies) = p.lock().expect("sampler pids").clone();
                let mut group = |pids: &[u32]| -> (f64, f64) {
                    let (mut cores, mut rss) = (0.0, 0.0);
                    for &pid in pids {
                        let now = cpu_seconds(pid);
                        if let Some(prev) = last.insert(pid, now) {
                            cores += (now - prev).max(0.0) / TICK.as_secs_f64();
                        }
                        let r = rss_mib(pid);
                        if r.is_finite() {
                            rss += r;
                        }
                    }
                    (cores, rss)
                };
                let (ec, er) = group(&etcd);
                let (pc, pr) = group(&proxies);
                let me_now = self_cpu();
                peak.etcd_cpu = peak.etcd_cpu.max(ec);
                peak.etcd_rss = peak.etcd_rss.max(er);
                peak.proxy_cpu = peak.proxy_cpu.max(pc);
                peak.proxy_rss = peak.proxy_rss.max(pr);
                peak.bench_cpu = peak.bench_cpu.max((me_now - me) / TICK.as_secs_f64());
                me = me_now;
            }
            peak
        });
        Sampler { pids, stop, handle }
    }

    pub fn set_pids(&self, etcd: Vec<u32>, proxies: Vec<u32>) {
        *self.pids.lock().expect("sampler pids") = (etcd, proxies);
    }

    pub fn finish(self) -> Peak {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("sampler thread")
    }
}

pub fn member_pids(cluster: &EtcdCluster) -> Vec<u32> {
    (0..cluster.len()).filter_map(|i| cluster.pid(i)).collect()
}

pub fn proxy_pids(proxies: &[GrpcProxy]) -> Vec<u32> {
    proxies.iter().map(GrpcProxy::pid).collect()
}
