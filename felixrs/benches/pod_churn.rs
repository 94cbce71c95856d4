//! Pod churn on a node, through the agent binary (root, real etcd, real kernel; issue 26).
//!
//! `cargo bench -p felixrs --bench pod_churn`
//!
//! The `agent_latency` node (250 local endpoints, 2,000 policies, `AGENT_BENCH_COMBOS`), then
//! `POD_CHURN_SECS` (30) seconds of `POD_CHURN_RATE` (20) pods/s added and as many deleted, the
//! oldest first, so 250 stay: each new pod's labels select it into existing policies (its chains
//! and dispatch entries) and into their source IP sets. Measured: pod add → programmed, from the
//! start of its etcd put to the first `/status` long-poll answer with `applied_revision` ≥ the
//! put's revision; and `felixrs_endpoint_programming_seconds` over the churn.
//!
//! Floor, same run: the agent logs each apply's payloads (`--log felixrs::agent::kernel=debug`);
//! the kernel as it was before the churn (both families' saves and `ipset save`) is restored into
//! a second namespace and every apply of the churn is replayed there in order with the bare tools
//! (`ipset -exist restore`, `iptables-nft-restore --noflush` per table, the v4 and v6 families
//! concurrently, as the agent runs them), timed per apply.
//!
//! Each apply of the agent is also split (its runner's debug lines: each program's end and
//! `took_us`) into the time its kernel programs ran (first start to last end) and its own time
//! outside them (`applying` to `apply done`, less the programs' span): the first,
//! set against the floor's replay of the same apply, says how much slower the same restores ran
//! inside the churn (the node's other work sharing its cores) than alone; the second is what the
//! agent itself adds.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "node_load/mod.rs"]
mod node_load;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::http;
use felixrs_test_support::netns::{Netns, in_netns};
use node_load::{ENDPOINTS, combos, pct, put_all, restore, run_stdin, wep, with_etcd};
use support::Agent;

fn env(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One family's payloads of one apply, as the agent logged them.
#[derive(Debug, Default, Clone)]
struct FamilyPayloads {
    ipsets: String,
    iptables: Vec<String>,
    ipset_deletions: String,
}

impl FamilyPayloads {
    fn is_empty(&self) -> bool {
        self.ipsets.is_empty() && self.iptables.is_empty() && self.ipset_deletions.is_empty()
    }

    /// The agent's three phases with the bare tools.
    fn replay(&self, ns: &Netns, v6: bool) {
        if !self.ipsets.is_empty() {
            run_stdin(ns, "ipset", &["-exist", "restore"], &self.ipsets);
        }
        for p in &self.iptables {
            restore(
                ns,
                if v6 {
                    "ip6tables-nft-restore"
                } else {
                    "iptables-nft-restore"
                },
                p,
            );
        }
        if !self.ipset_deletions.is_empty() {
            run_stdin(ns, "ipset", &["-exist", "restore"], &self.ipset_deletions);
        }
    }
}

/// A Rust `Debug` string at the start of `s` (`"…"`): its text and what follows it.
fn debug_str(s: &str) -> (String, &str) {
    let mut out = String::new();
    let mut chars = s.strip_prefix('"').expect("a quoted string").char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (out, &s[i + 2..]),
            '\\' => match chars.next().unwrap().1 {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '0' => out.push('\0'),
                'u' => {
                    let hex: String = chars
                        .by_ref()
                        .map(|(_, c)| c)
                        .skip(1)
                        .take_while(|c| *c != '}')
                        .collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap());
                }
                c => out.push(c),
            },
            c => out.push(c),
        }
    }
    panic!("unterminated string in {s}")
}

/// `text` without ANSI colour sequences.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut it = text.chars();
    while let Some(c) = it.next() {
        if c == '\x1b' {
            for c in it.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The `applied` debug lines of the agent's log: (family, payloads), in order.
fn applied_lines(log: &str) -> Vec<(u8, FamilyPayloads)> {
    let mut out = Vec::new();
    for line in strip_ansi(log).lines() {
        let Some(rest) = line.split_once(" applied family=").map(|(_, r)| r) else {
            continue;
        };
        let family: u8 = rest[..1].parse().unwrap();
        let (ipsets, rest) = debug_str(rest.split_once("ipsets=").unwrap().1);
        let mut rest = rest.split_once("iptables={").unwrap().1;
        let mut iptables = Vec::new();
        while !rest.starts_with('}') {
            let (_, r) = rest.split_once(": ").unwrap();
            let (payload, r) = debug_str(r);
            iptables.push(payload);
            rest = r.strip_prefix(", ").unwrap_or(r);
        }
        let (ipset_deletions, _) = debug_str(rest.split_once("ipset_deletions=").unwrap().1);
        out.push((
            family,
            FamilyPayloads {
                ipsets,
                iptables,
                ipset_deletions,
            },
        ));
    }
    out
}

/// Seconds since midnight UTC (the agent's log timestamps' clock).
fn utc_secs_of_day(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64() % 86_400.0
}

/// The apply loop's `applying revision=R` debug lines: (seconds since midnight UTC, R).
fn applying_lines(log: &str) -> Vec<(f64, i64)> {
    strip_ansi(log)
        .lines()
        .filter_map(|line| {
            let (_, rev) = line.split_once(" applying revision=")?;
            let rev = rev.split(' ').next()?.parse().ok()?;
            Some((log_secs(line)?, rev))
        })
        .collect()
}

/// `2026-11-27T06:28:36.123456Z DEBUG …`: seconds since midnight.
fn log_secs(line: &str) -> Option<f64> {
    let time = line.split_once('T')?.1.split('Z').next()?;
    let mut hms = time.split(':').map(|x| x.parse::<f64>().ok());
    Some(hms.next()?? * 3600.0 + hms.next()?? * 60.0 + hms.next()??)
}

/// Each apply (in order, one per `applied family=6` line) split into its kernel programs' span
/// (the first restore's start to the last one's end, in ms) and the agent's own time outside
/// them (`applying` to `apply done`, less the span), from the apply thread's debug lines and
/// the runner's (`ran program=… took_us=…`, logged at its end). `None` for an apply that ran no
/// program.
fn apply_phases(log: &str) -> Vec<Option<(f64, f64)>> {
    let mut out = Vec::new();
    let (mut start, mut programs) = (None, Vec::<(f64, f64)>::new());
    // An `applied family=6` line was pushed and its apply's `apply done` is still to come.
    let mut awaiting = false;
    for line in strip_ansi(log).lines() {
        let Some(t) = log_secs(line) else { continue };
        if line.contains(" applying revision=") {
            (start, programs, awaiting) = (Some(t), Vec::new(), false);
        } else if let Some((_, rest)) = line.split_once(" ran program=\"") {
            // The apply's restores (`ipset restore` has input; the drift check's `ipset save` and
            // the counters' saves have none and run outside applies).
            let (program, rest) = rest.split_once('"').unwrap_or_default();
            let field = |name: &str| {
                (rest.split_once(name).and_then(|(_, v)| v.split(' ').next()))
                    .and_then(|v| v.parse::<f64>().ok())
            };
            let input = field("stdin_bytes=").unwrap_or(0.0);
            if start.is_some() && (program.ends_with("-restore") || input > 0.0) {
                let took = field("took_us=").unwrap_or(0.0) / 1e6;
                programs.push((t - took, t));
            }
        } else if line.contains(" applied family=6") {
            out.push(None);
            awaiting = true;
        } else if line.contains(" apply done ") && std::mem::take(&mut awaiting) {
            let phases = start.take().and_then(|s| {
                let first = programs.iter().map(|p| p.0).reduce(f64::min)?;
                let last = programs.iter().map(|p| p.1).reduce(f64::max)?;
                Some(((last - first) * 1000.0, ((t - s) - (last - first)) * 1000.0))
            });
            if let Some(last) = out.last_mut() {
                *last = phases;
            }
        }
    }
    out
}

/// `felixrs_<name>`'s `_count` and `_sum` in `/metrics`.
fn histogram(agent: &Agent, name: &str) -> (f64, f64) {
    let (_, metrics) = agent.get("/metrics").unwrap();
    let value = |suffix: &str| {
        let key = format!("felixrs_{name}_{suffix} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .unwrap_or_else(|| panic!("{key} in /metrics"))
            .parse::<f64>()
            .unwrap()
    };
    (value("count"), value("sum"))
}

fn main() {
    let secs = env("POD_CHURN_SECS", 30.0);
    let rate = env("POD_CHURN_RATE", 20.0);
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    let t = Instant::now();
    let rev = *put_all(ns.name(), &etcd.admin_url(), node_load::seed())
        .last()
        .unwrap();
    eprintln!("seeded in {:?}", t.elapsed());

    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    // `POD_CHURN_LOG` adds directives; `POD_CHURN_TRACE=FILE` keeps the agent's log there.
    let mut filter = "info,felixrs::agent::kernel=debug,felixrs::agent::apply_loop=debug,iptables::apply::runner=debug".to_string();
    if let Ok(extra) = std::env::var("POD_CHURN_LOG") {
        filter = format!("{filter},{extra}");
    }
    let agent = Agent::start_with(
        ns.name(),
        &etcd.client_url(),
        &state_dir,
        &["--log", &filter],
    );
    agent.wait_applied(rev);
    // Idle, then the kernel the churn starts from.
    std::thread::sleep(Duration::from_secs(2));
    let log_start = agent.log().len();
    let saves = [
        ns.ok("ipset", &["save"]),
        ns.ok("iptables-nft-save", &[]),
        ns.ok("ip6tables-nft-save", &[]),
    ];
    let (prog0, prog_sum0) = histogram(&agent, "endpoint_programming_seconds");
    let (apply0, apply_sum0) = histogram(&agent, "apply_seconds");

    // The poller: each advance of `applied_revision`, when the long-poll saw it.
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, health) = (stop.clone(), agent.health);
        let ns = ns.name().to_string();
        std::thread::spawn(move || {
            in_netns(&ns, move || {
                let mut seen: Vec<(Instant, i64)> = Vec::new();
                let mut last = 0;
                while !stop.load(Ordering::Relaxed) {
                    let path = format!("/status?min_revision={}&timeout_ms=500", last + 1);
                    let (_, body) = http::get(health, &path).unwrap();
                    let at = Instant::now();
                    let s: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let r = s["applied_revision"].as_i64().unwrap();
                    if r > last {
                        last = r;
                        seen.push((at, r));
                    }
                }
                seen
            })
        })
    };

    // The churn: pod `ENDPOINTS + k` added at k/rate, pod `k` deleted half a period later.
    let n = (secs * rate) as usize;
    let url = etcd.admin_url();
    let adds: Vec<(Instant, f64, i64)> = with_etcd(ns.name(), &url, move |mut c| async move {
        let start = tokio::time::Instant::now();
        let period = Duration::from_secs_f64(1.0 / rate);
        let mut adds = Vec::new();
        for k in 0..n {
            tokio::time::sleep_until(start + period * k as u32).await;
            let (key, value) = wep(ENDPOINTS + k);
            let (t, wall) = (Instant::now(), utc_secs_of_day(SystemTime::now()));
            let r = c.put(key, value, None).await.unwrap();
            adds.push((t, wall, r.header().unwrap().revision()));
            tokio::time::sleep_until(start + period * k as u32 + period / 2).await;
            c.delete(wep(k).0, None).await.unwrap();
        }
        adds
    });
    let last_rev = adds.last().unwrap().2 + 1;
    agent.wait_applied(last_rev);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let seen = poller.join().unwrap();
    let (prog1, prog_sum1) = histogram(&agent, "endpoint_programming_seconds");
    let (apply1, apply_sum1) = histogram(&agent, "apply_seconds");
    let status = agent.status();

    // Each add's latency, split at the start of the apply that covered it (the agent's
    // `applying` debug line): the wait for the apply before it, and its own apply to `/status`.
    let log = agent.log();
    if let Some(path) = std::env::var_os("POD_CHURN_TRACE") {
        std::fs::write(path, &log[log_start..]).unwrap();
    }
    let starts = applying_lines(&log[log_start..]);
    let (mut lat, mut waits, mut own) = (Vec::new(), Vec::new(), Vec::new());
    for (t, wall, rev) in &adds {
        let (at, _) = seen
            .iter()
            .find(|(_, r)| r >= rev)
            .expect("every add was seen applied");
        let ms = at.duration_since(*t).as_secs_f64() * 1000.0;
        let (start, _) = starts
            .iter()
            .find(|(_, r)| r >= rev)
            .expect("every add was applied");
        let wait = ((start - wall) * 1000.0).clamp(0.0, ms);
        lat.push(ms);
        waits.push(wait);
        own.push(ms - wait);
    }

    // The applies of the churn, paired by family (v4 then v6 per apply).
    let lines = applied_lines(&log[log_start..]);
    let phases = apply_phases(&log[log_start..]);
    assert_eq!(phases.len() * 2, lines.len(), "a split for each apply");
    let mut applies: Vec<[FamilyPayloads; 2]> = Vec::new();
    // For the applies with payloads: their programs' span and the agent's time outside them.
    let mut split: Vec<Option<(f64, f64)>> = Vec::new();
    let mut it = lines
        .into_iter()
        .zip(phases.iter().flat_map(|p| [None, Some(*p)]));
    while let Some(((f4, p4), _)) = it.next() {
        let ((f6, p6), phase) = it.next().expect("a v6 line after each v4 line");
        assert_eq!((f4, f6), (4, 6));
        if !(p4.is_empty() && p6.is_empty()) {
            applies.push([p4, p6]);
            split.push(phase.flatten());
        }
    }
    drop(agent);

    // The floor: the same applies, in order, with the bare tools on a copy of the kernel.
    let floor_ns = Netns::new();
    run_stdin(&floor_ns, "ipset", &["restore"], &saves[0]);
    run_stdin(&floor_ns, "iptables-nft-restore", &[], &saves[1]);
    run_stdin(&floor_ns, "ip6tables-nft-restore", &[], &saves[2]);
    let mut floor: Vec<f64> = applies
        .iter()
        .map(|[p4, p6]| {
            let t = Instant::now();
            std::thread::scope(|s| {
                let h = s.spawn(|| p6.replay(&floor_ns, true));
                p4.replay(&floor_ns, false);
                h.join().unwrap();
            });
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    // The same applies: the agent's programs against the floor's, and its time outside them.
    let (mut kernel_ratio, mut outside) = (Vec::new(), Vec::new());
    for (phase, f) in split.iter().zip(&floor) {
        if let Some((span, out)) = phase {
            kernel_ratio.push(span / f);
            outside.push(*out);
        }
    }
    let payload_lines: usize = applies
        .iter()
        .flatten()
        .map(|p| {
            p.ipsets.lines().count()
                + p.iptables.iter().map(|t| t.lines().count()).sum::<usize>()
                + p.ipset_deletions.lines().count()
        })
        .sum();

    let (p50, p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    let (f50, f99) = (pct(&mut floor, 0.5), pct(&mut floor, 0.99));
    let floor_mean = floor.iter().sum::<f64>() / floor.len() as f64;
    let applies_n = apply1 - apply0;
    let apply_mean = (apply_sum1 - apply_sum0) / applies_n * 1000.0;
    let programmed = prog1 - prog0;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "endpoints={ENDPOINTS} combinations={} churn: {n} adds + {n} deletes at {rate}/s each over {secs} s; load {}",
        combos(),
        load.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );
    println!(
        "kernel after: {} rules, {} chains, {} ip sets, {} local endpoints",
        status["rules"], status["chains"], status["ip_sets"], status["local_endpoints"]
    );
    println!(
        "applies during the churn: {applies_n} ({} with payloads, {:.1} payload lines each, {:.1} changes each); agent apply mean {apply_mean:.1} ms",
        applies.len(),
        payload_lines as f64 / applies.len() as f64,
        2.0 * n as f64 / applies_n
    );
    println!("pod add -> programmed (put -> /status)  p50 {p50:.1} ms  p99 {p99:.1} ms");
    let (w50, w99) = (pct(&mut waits, 0.5), pct(&mut waits, 0.99));
    let (o50, o99) = (pct(&mut own, 0.5), pct(&mut own, 0.99));
    println!(
        "  of which waiting for the apply before it: p50 {w50:.1} ms  p99 {w99:.1} ms; its own apply start -> /status: p50 {o50:.1} ms  p99 {o99:.1} ms"
    );
    println!(
        "felixrs_endpoint_programming_seconds: {programmed} observations, mean {:.1} ms",
        (prog_sum1 - prog_sum0) / programmed * 1000.0
    );
    println!(
        "floor: bare replay of each apply's payloads  p50 {f50:.1} ms  p99 {f99:.1} ms  mean {floor_mean:.1} ms"
    );
    if outside.is_empty() {
        println!("each apply: no split (an agent without the `apply done` debug line)");
    } else {
        let (x50, x99) = (pct(&mut outside, 0.5), pct(&mut outside, 0.99));
        let (k50, k99) = (pct(&mut kernel_ratio, 0.5), pct(&mut kernel_ratio, 0.99));
        println!(
            "each apply ({} of {} split): the agent's own time outside its kernel programs p50 {x50:.1} ms  p99 {x99:.1} ms; its programs' span / the floor's replay of the same apply: p50 {k50:.2}x  p99 {k99:.2}x",
            outside.len(),
            applies.len()
        );
    }
    println!(
        "ratio pod add / floor: p50 {:.2}x  p99 {:.2}x; own apply / floor: p50 {:.2}x  p99 {:.2}x; agent apply mean / floor mean {:.2}x",
        p50 / f50,
        p99 / f99,
        o50 / f50,
        o99 / f99,
        apply_mean / floor_mean
    );
}
