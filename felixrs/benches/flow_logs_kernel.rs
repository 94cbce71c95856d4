//! Flow logs under load on the real kernel (issue 27: "bounded memory and CPU under load, measure
//! at 10k new connections/s"). Root, real etcd, the agent binary of this build.
//!
//! `cargo bench -p felixrs --bench flow_logs_kernel [-- RATE SECS]` (default 10000 new
//! connections/s for 20 s)
//!
//! A node namespace (etcd, the agent, a TCP server on the node's address) and one pod `ns1/web`
//! behind its veth, wired as the agent tests wire it. The pod's egress policy allows TCP 7001 and
//! denies UDP 7002, so both NFLOG paths run: load threads in the pod's namespace (`setns`) open
//! short-lived TCP connections to 7001 (accepted and closed by the server; the client aborts with
//! RST so no TIME_WAIT holds ports) and send one-datagram UDP flows to 7002 (one in ten, denied),
//! each from a new source port, paced to RATE.
//!
//! Two runs in the same process: the floor (the agent without `--flow-logs`), then the agent with
//! `--flow-logs`. For each: the achieved rate, connections that failed, the agent's CPU (% of one
//! core, `/proc/<pid>/stat` over the load window), its RSS (peak `VmHWM` and at the end) and, with
//! flow logs, the collector thread's own CPU, its counters (`felixrs_flow_logs_*`, read after the
//! conntrack entries of the load have ended) and the records in the file.

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use felixrs_test_support::netns::{Netns, enter, in_netns};
use felixrs_test_support::node::Pod;
use serde_json::json;
use support::{Agent, WebNode};

const HOST: &str = "10.70.255.1";
const TCP_PORT: u16 = 7001;
const UDP_PORT: u16 = 7002;
/// Load threads (TCP connects block for a round trip; UDP sends do not).
const WORKERS: usize = 6;
/// One flow in `DENY_EVERY` is a denied UDP datagram.
const DENY_EVERY: u64 = 10;

/// Fields drop in order: the pod before the node (its etcd, then its namespace).
struct Node {
    pod: Pod,
    web: WebNode,
}

fn node() -> Node {
    let web = WebNode::start(
        "web-egress",
        json!({"tier":"default","order":1000,"selector":"app == 'web'",
               "types":["Egress"],
               "egress":[{"action":"Allow","protocol":"TCP",
                          "destination":{"ports":[TCP_PORT]}},
                         {"action":"Deny","protocol":"UDP",
                          "destination":{"ports":[UDP_PORT]}}]}),
    );
    let pod = web.add_web_pod(HOST);
    pod.ns
        .sysctl("net.ipv4.ip_local_port_range", "1024 65535")
        .unwrap();
    serve(&web.ns, HOST.parse().unwrap());
    Node { pod, web }
}

/// Accepts and closes on `TCP_PORT` (backlog 4096, two accept threads) for the whole process.
fn serve(ns: &Netns, host: IpAddr) {
    let sock = SocketAddr::new(host, TCP_PORT);
    let listener = ns.in_thread(move || TcpListener::bind(sock).expect("bind on the node"));
    // SAFETY: listen(2) again on our listening socket only raises its backlog.
    unsafe { libc::listen(listener.as_raw_fd(), 4096) };
    for _ in 0..2 {
        let l = listener.try_clone().unwrap();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                drop(conn);
            }
        });
    }
}

/// Closes with RST (SO_LINGER 0): no TIME_WAIT, the conntrack entry ends within 10 s.
fn abort(s: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we own, with a correctly sized linger struct.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

#[derive(Default)]
struct Load {
    tcp: AtomicU64,
    udp: AtomicU64,
    failed: AtomicU64,
}

/// Paces `WORKERS` threads in the pod's namespace to `rate` new flows/s for `secs`; returns the
/// counts and the window's length.
fn load(pod: &str, rate: u64, secs: u64) -> (Arc<Load>, Duration) {
    let counts = Arc::new(Load::default());
    let host: IpAddr = HOST.parse().unwrap();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(secs);
    let per_worker = rate as f64 / WORKERS as f64;
    let threads: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (pod, c) = (pod.to_string(), counts.clone());
            std::thread::spawn(move || {
                enter(&pod).expect("setns into the pod");
                let mut n: u64 = 0;
                loop {
                    let now = Instant::now();
                    if now >= end {
                        return;
                    }
                    let due = (now - t0).as_secs_f64() * per_worker;
                    if (n as f64) >= due {
                        std::thread::sleep(Duration::from_micros(200));
                        continue;
                    }
                    n += 1;
                    if (n * WORKERS as u64 + w as u64).is_multiple_of(DENY_EVERY) {
                        let ok = UdpSocket::bind("0.0.0.0:0")
                            .and_then(|s| s.send_to(b"x", (host, UDP_PORT)));
                        match ok {
                            Ok(_) => c.udp.fetch_add(1, Ordering::Relaxed),
                            Err(_) => c.failed.fetch_add(1, Ordering::Relaxed),
                        };
                    } else {
                        let to = SocketAddr::new(host, TCP_PORT);
                        match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                            Ok(s) => {
                                abort(s);
                                c.tcp.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                c.failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    (counts, t0.elapsed())
}

/// utime + stime of `/proc/<pid>[/task/<tid>]/stat`, in clock ticks.
fn cpu_ticks(stat: &str) -> u64 {
    let text = std::fs::read_to_string(stat).unwrap_or_default();
    // Fields after the parenthesised comm: state is field 3, utime 14, stime 15.
    let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}

fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// `/proc/<pid>/task/<tid>/stat` of the agent's thread named `name`.
fn thread_stat(pid: u32, name: &str) -> Option<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .map(|t| t.path().join("stat").display().to_string())
}

/// `VmHWM` and `VmRSS` in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let mut s = String::new();
    let _ = std::fs::File::open(format!("/proc/{pid}/status"))
        .and_then(|mut f| f.read_to_string(&mut s));
    let field = |k: &str| -> u64 {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Messages the kernel dropped at full receive buffers, summed over the NETLINK_NETFILTER (12)
/// sockets of `pid`'s namespace (`/proc/<pid>/net/netlink` `Drops`): only the agent holds such
/// sockets open there (NFLOG and conntrack events).
fn netfilter_socket_drops(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/net/netlink"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&"12")).then(|| f.get(8)?.parse::<u64>().ok())?
        })
        .sum()
}

/// The agent's `felixrs_flow_logs_*` samples.
fn counters(agent: &Agent) -> Vec<(String, u64)> {
    let (_, body) = agent.get("/metrics").expect("GET /metrics");
    body.lines()
        .filter(|l| l.starts_with("felixrs_flow_logs_"))
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn counter(c: &[(String, u64)], name: &str) -> u64 {
    c.iter().find(|(k, _)| k == name).map_or(0, |(_, v)| *v)
}

fn run(node: &Node, flow_logs: bool, rate: u64, secs: u64) {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("logs/flows.jsonl");
    let mut extra: Vec<String> = Vec::new();
    if flow_logs {
        extra.extend(
            [
                "--flow-logs",
                "--flow-logs-interval",
                "5",
                "--flow-logs-file",
                file.to_str().unwrap(),
            ]
            .map(String::from),
        );
    }
    let agent = Agent::start_with(
        node.web.ns.name(),
        &node.web.etcd.client_url(),
        &state.path().join("state"),
        extra.as_slice(),
    );
    agent.wait_applied(node.web.rev);
    let pid = agent.pid().expect("agent pid");
    // Settle after programming; then the window.
    std::thread::sleep(Duration::from_secs(2));
    let collector = thread_stat(pid, "flow-logs");
    let (a0, c0) = (
        cpu_ticks(&format!("/proc/{pid}/stat")),
        collector.as_deref().map_or(0, cpu_ticks),
    );
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let s = sampling.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while s.load(Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid).1);
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        })
    };
    let (counts, took) = load(node.pod.ns.name(), rate, secs);
    let (a1, c1) = (
        cpu_ticks(&format!("/proc/{pid}/stat")),
        collector.as_deref().map_or(0, cpu_ticks),
    );
    sampling.store(false, Ordering::Relaxed);
    let peak_window = sampler.join().unwrap();
    let (hwm, rss) = rss_kib(pid);
    let tps = ticks_per_sec();
    let pct = |t: u64| 100.0 * t as f64 / tps / took.as_secs_f64();
    let (tcp, udp, failed) = (
        counts.tcp.load(Ordering::Relaxed),
        counts.udp.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
    );
    println!(
        "{}: target {rate}/s for {secs} s: {} flows in {:.1} s = {:.0}/s ({tcp} tcp allowed, \
         {udp} udp denied, {failed} failed)",
        if flow_logs {
            "flow logs on"
        } else {
            "floor (flow logs off)"
        },
        tcp + udp,
        took.as_secs_f64(),
        (tcp + udp) as f64 / took.as_secs_f64(),
    );
    println!(
        "  agent cpu {:.1}% of a core; rss peak in window {:.1} MiB, VmHWM {:.1} MiB, at end {:.1} MiB",
        pct(a1 - a0),
        peak_window as f64 / 1024.0,
        hwm as f64 / 1024.0,
        rss as f64 / 1024.0,
    );
    if !flow_logs {
        return;
    }
    println!(
        "  collector thread cpu {:.1}% of a core",
        pct(c1.saturating_sub(c0))
    );
    // Wait for the load's conntrack entries to end (CLOSE lasts 10 s) and one more interval.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = u64::MAX;
    let c = loop {
        std::thread::sleep(Duration::from_secs(6));
        let c = counters(&agent);
        let ended = counter(&c, "felixrs_flow_logs_conntrack_ended_total");
        if ended == last || ended >= tcp || Instant::now() > deadline {
            std::thread::sleep(Duration::from_secs(6));
            break counters(&agent);
        }
        last = ended;
    };
    for (k, v) in &c {
        println!("  {k} {v}");
    }
    let nflog = counter(&c, "felixrs_flow_logs_nflog_packets_total");
    let ended = counter(&c, "felixrs_flow_logs_conntrack_ended_total");
    println!(
        "  nflog packets {nflog} of {} flows ({:.2}% missing); conntrack ends {ended} of {tcp} \
         tcp ({:.2}% missing)",
        tcp + udp,
        100.0 * (tcp + udp).saturating_sub(nflog) as f64 / (tcp + udp).max(1) as f64,
        100.0 * tcp.saturating_sub(ended) as f64 / tcp.max(1) as f64,
    );
    let mut lines = 0;
    for f in std::fs::read_dir(file.parent().unwrap()).unwrap().flatten() {
        lines += std::fs::read_to_string(f.path())
            .unwrap_or_default()
            .lines()
            .count();
    }
    println!("  records in the file {lines}");
    println!(
        "  kernel drops at the agent's netfilter sockets' receive buffers: {}",
        netfilter_socket_drops(pid)
    );
    let (hwm, rss) = rss_kib(pid);
    println!(
        "  after the drain: VmHWM {:.1} MiB, rss {:.1} MiB",
        hwm as f64 / 1024.0,
        rss as f64 / 1024.0
    );
}

fn main() {
    felixrs_test_support::require_root();
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rate = args.first().copied().unwrap_or(10_000);
    let secs = args.get(1).copied().unwrap_or(20);
    let node = node();
    // The pod reaches the node before any rule.
    let host: IpAddr = HOST.parse().unwrap();
    let reached = in_netns(node.pod.ns.name(), move || {
        TcpStream::connect_timeout(&SocketAddr::new(host, TCP_PORT), Duration::from_secs(2)).is_ok()
    });
    assert!(reached, "the pod cannot reach the node's server");
    run(&node, false, rate, secs);
    run(&node, true, rate, secs);
}
