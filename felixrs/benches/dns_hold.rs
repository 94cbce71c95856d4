//! The DNS hold (FQDN policy): what holding a response on the NFQUEUE until its address is in the
//! domain sets costs. Root (namespaces, iptables, ipset).
//!
//! `cargo bench -p felixrs --bench dns_hold [-- QUERIES]` (default 2000 sequential queries per
//! latency run, 10x that for throughput)
//!
//! Fixed inputs: the world of `tests/dns_support` (pod → routing node → DNS server in three
//! namespaces); query `i` asks for `n<i>.example.com`, which resolves to its own address, so every
//! held response learns a new (name, address) and writes a new set member.
//! * floor: the same queries with no hold rule (the kernel forwards the answer);
//! * held, netlink: the hold rule, the learner bound, members written over ipset netlink (the
//!   agent's writer);
//! * held, `ipset restore`: the same with one `ipset restore -exist` process per batch;
//! * learner alone: parse + learn + (null) write of ready-made packets in batches of 64, no
//!   kernel: the learner's own ceiling.
//!
//! Latency: one query at a time, p50/p99 of send → answer. Throughput: 64 queries in flight.

#[path = "../tests/dns_support/mod.rs"]
mod dns_support;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dns_support::*;
use felixrs::dns::learned::LearnedMap;
use felixrs::dns::learner::{Learner, LearnerConfig, SystemClock};
use felixrs::dns::metrics::DnsMetrics;
use felixrs::dns::setwriter::{RestoreSetWriter, SetAdd, SetWriter, WriteError};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Sequential queries `n<base>..n<base+n>`: their round-trip times.
fn latency(w: &World, base: usize, n: usize) -> Vec<Duration> {
    let client = w.client.name().to_string();
    felixrs_test_support::netns::in_netns(&client, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let server: SocketAddr = format!("{SERVER4}:53").parse().unwrap();
        let mut buf = [0u8; 1500];
        let mut out = Vec::with_capacity(n);
        for i in base..base + n {
            let q = query(&format!("n{i}.example.com."), false);
            let t = Instant::now();
            s.send_to(&q, server).unwrap();
            s.recv_from(&mut buf).expect("answer within 5 s");
            out.push(t.elapsed());
        }
        out
    })
}

/// `n` queries with 64 in flight: answers per second (and answers received).
fn throughput(w: &World, base: usize, n: usize) -> (f64, usize) {
    let client = w.client.name().to_string();
    felixrs_test_support::netns::in_netns(&client, move || {
        let s = Arc::new(UdpSocket::bind("0.0.0.0:0").unwrap());
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let server: SocketAddr = format!("{SERVER4}:53").parse().unwrap();
        let got = Arc::new(AtomicUsize::new(0));
        let (rs, rg) = (s.clone(), got.clone());
        let t = Instant::now();
        let rx = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            let mut last = Instant::now();
            while rg.load(Ordering::SeqCst) < n {
                match rs.recv_from(&mut buf) {
                    Ok(_) => {
                        rg.fetch_add(1, Ordering::SeqCst);
                        last = Instant::now();
                    }
                    Err(_) => break,
                }
            }
            last
        });
        for i in 0..n {
            // Lost answers (none expected) must not stall the window for ever.
            let deadline = Instant::now() + Duration::from_secs(2);
            while i >= got.load(Ordering::SeqCst) + 64 && Instant::now() < deadline {
                std::hint::spin_loop();
                std::thread::yield_now();
            }
            let q = query(&format!("n{}.example.com.", base + i), false);
            s.send_to(&q, server).unwrap();
        }
        let last = rx.join().unwrap();
        let answered = got.load(Ordering::SeqCst);
        (answered as f64 / (last - t).as_secs_f64(), answered)
    })
}

struct Null;
impl SetWriter for Null {
    fn add(&mut self, adds: &[SetAdd]) -> Vec<Result<(), WriteError>> {
        adds.iter().map(|_| Ok(())).collect()
    }
}

/// The learner alone on ready-made packets: responses per second.
fn learner_alone(n: usize) -> f64 {
    let learner = Learner::new(
        LearnerConfig {
            trusted_servers: vec![format!("{SERVER4}:53").parse().unwrap()],
            min_ttl: 0,
            max_learned: 100_000,
            persist_path: None,
        },
        LearnedMap::new(100_000),
        Box::new(Null),
        Arc::new(SystemClock),
        DnsMetrics::default(),
    );
    learner.set_active(vec![domain_set(
        "*.example.com",
        "cali40d:test",
        Some("cali60d:test"),
    )]);
    let packets: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let q = query(&format!("n{i}.example.com."), false);
            let r = response_to(&q).unwrap();
            ipv4_udp(&r)
        })
        .collect();
    let t = Instant::now();
    for chunk in packets.chunks(64) {
        let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
        learner.handle(&refs);
    }
    n as f64 / t.elapsed().as_secs_f64()
}

/// `dns` in an IPv4/UDP packet from the server's port 53 (checksums are not checked).
fn ipv4_udp(dns: &[u8]) -> Vec<u8> {
    let total = 28 + dns.len();
    let mut p = vec![0x45, 0];
    p.extend((total as u16).to_be_bytes());
    p.extend([0, 0, 0x40, 0, 64, 17, 0, 0]);
    p.extend(SERVER4.parse::<std::net::Ipv4Addr>().unwrap().octets());
    p.extend([10, 77, 1, 2]);
    p.extend(53u16.to_be_bytes());
    p.extend(40000u16.to_be_bytes());
    p.extend(((8 + dns.len()) as u16).to_be_bytes());
    p.extend([0, 0]);
    p.extend(dns);
    p
}

/// Encoding and atomically writing a full map (`--dns-max-learned` entries): seconds, bytes.
fn persist_full(entries: usize) -> (f64, usize) {
    let mut map = LearnedMap::new(entries);
    for i in 0..entries {
        let addr = std::net::Ipv4Addr::from(0x0a00_0000 | i as u32);
        map.learn(&format!("n{i}.example.com"), addr.into(), 300, 1_000_000);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(felixrs::dns::persist::FILE_NAME);
    let t = Instant::now();
    let bytes = felixrs::dns::persist::encode(&map);
    felixrs::dns::persist::save(&path, &bytes).unwrap();
    (t.elapsed().as_secs_f64(), bytes.len())
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    let warm = 200;
    let row = |name: &str, mut l: Vec<Duration>, floor: Option<(Duration, Duration)>| {
        let (p50, p99) = (pct(&mut l, 0.5), pct(&mut l, 0.99));
        let ratio = floor.map_or(String::new(), |(f50, f99)| {
            format!(
                "  ({:.2}x / {:.2}x the floor, +{} µs / +{} µs)",
                p50.as_secs_f64() / f50.as_secs_f64(),
                p99.as_secs_f64() / f99.as_secs_f64(),
                p50.as_micros() as i128 - f50.as_micros() as i128,
                p99.as_micros() as i128 - f99.as_micros() as i128
            )
        });
        println!(
            "{name:<28} p50 {:>6} µs  p99 {:>6} µs{ratio}",
            p50.as_micros(),
            p99.as_micros()
        );
        (p50, p99)
    };

    let floor_w = world_with(false);
    latency(&floor_w, 0, warm);
    let floor = row("floor (no hold)", latency(&floor_w, warm, n), None);
    let (floor_rps, floor_got) = throughput(&floor_w, 100_000, 10 * n);
    drop(floor_w);

    let held = world();
    let learner = bind_learner(&held, 53);
    learner.set_active(vec![domain_set(
        "*.example.com",
        "cali40d:test",
        Some("cali60d:test"),
    )]);
    latency(&held, 0, warm);
    row("held, ipset netlink", latency(&held, warm, n), Some(floor));
    let (held_rps, held_got) = throughput(&held, 100_000, 10 * n);
    let members = held.router.ok("ipset", &["list", "-t", "cali40d:test"]);
    let entries = members
        .lines()
        .find_map(|l| l.strip_prefix("Number of entries: "))
        .unwrap_or("?")
        .to_string();
    drop(held);

    let restore = world();
    let l2 = bind_learner_with(&restore, 53, || Box::new(RestoreSetWriter::default()));
    l2.set_active(vec![domain_set(
        "*.example.com",
        "cali40d:test",
        Some("cali60d:test"),
    )]);
    latency(&restore, 0, warm / 4);
    row(
        "held, ipset restore",
        latency(&restore, warm, n / 4),
        Some(floor),
    );
    drop(restore);

    println!(
        "throughput, 64 in flight: floor {floor_rps:.0}/s ({floor_got} answers), held {held_rps:.0}/s ({held_got} answers, {:.2}x the floor; {entries} set members)",
        held_rps / floor_rps
    );
    println!(
        "learner alone (parse + learn, null writer, batches of 64): {:.0} responses/s",
        learner_alone(10 * n)
    );
    let (secs, bytes) = persist_full(100_000);
    println!(
        "persisting a full map (100,000 entries): {:.0} ms, {:.1} MB",
        secs * 1000.0,
        bytes as f64 / 1e6
    );
}
