//! Programming latency of the agent binary, end to end, on the real kernel (root, etcd).
//!
//! `cargo bench -p felixrs --bench agent_latency`
//!
//! A node with 250 local endpoints and 2,000 policies (each selecting 5 endpoints; 50 distinct
//! combinations, or `AGENT_BENCH_COMBOS`; `FELIXRS_SHARE_CHAINS=false` for Felix's per-pod
//! chains). 200 changes
//! (one policy's port each): etcd put -> `applied_revision` reaches the put's revision (long-poll
//! on `/status`). Floor: bare `iptables-nft-restore --noflush` + `ip6tables-nft-restore` of the
//! one-chain transaction each change needs, against a kernel holding the same rules. Then the
//! restart-to-programmed time from the snapshot with etcd down, on an empty kernel.
//!
//! `AGENT_BENCH_TRACE=DIR` profiles the changes: the agent runs with `--log
//! info,felixrs=debug,iptables=debug` and its log goes to `DIR/agent.log`, with each change's
//! put and answer times (UNIX µs) in `DIR/changes.tsv`, to line up with the log's stages.

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::http;
use felixrs_test_support::netns::{Netns, in_netns};
use serde_json::json;
use support::{Agent, PREFIX};

const ENDPOINTS: usize = 250;
const POLICIES: usize = 2000;
const CHANGES: usize = 200;

/// Distinct `app` labels, so distinct policy combinations on the node: 50, or
/// `AGENT_BENCH_COMBOS` (a divisor of 50, e.g. 25: issue 13's node). Namespaces: a fifth of it
/// (policies select within their namespace, so every combination stays in one).
fn combos() -> usize {
    std::env::var("AGENT_BENCH_COMBOS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

fn namespaces() -> usize {
    combos() / 5
}

fn wep(i: usize) -> (String, String) {
    let ns = format!("ns{}", i % namespaces());
    let name = format!("node--1-k8s-pod{i}-eth0");
    let v = json!({"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint",
        "metadata":{"name":name,"namespace":ns,
            "labels":{"app":format!("app{}", i % combos()),"projectcalico.org/namespace":ns,
                      "projectcalico.org/orchestrator":"k8s"}},
        "spec":{"orchestrator":"k8s","node":"node-1","pod":format!("pod{i}"),"endpoint":"eth0",
            "interfaceName":format!("cali{i:011x}"),
            "ipNetworks":[format!("10.80.{}.{}/32", i / 200, i % 200 + 1)],
            "profiles":[format!("kns.{ns}")]}});
    (
        format!("{PREFIX}workloadendpoints/{ns}/{name}"),
        v.to_string(),
    )
}

fn policy(i: usize, port: u16) -> (String, String) {
    let ns = format!("ns{}", i % namespaces());
    let v = json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
        "metadata":{"name":format!("p{i}"),"namespace":ns},
        "spec":{"tier":"default","order":1000,"selector":format!("app == 'app{}'", i % combos()),
            "types":["Ingress"],
            "ingress":[{"action":"Allow","protocol":"TCP",
                "source":{"selector":format!("app == 'app{}'", (i + 1) % combos())},
                "destination":{"ports":[port]}}]}});
    (format!("{PREFIX}networkpolicies/{ns}/p{i}"), v.to_string())
}

/// Puts through etcd-client from a thread inside the netns; returns each put's revision.
fn put_all(ns: &str, url: &str, kvs: Vec<(String, String)>) -> Vec<i64> {
    let url = url.to_string();
    in_netns(ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut c = etcd_client::Client::connect([url], None).await.unwrap();
            let mut revs = Vec::new();
            for (k, v) in kvs {
                let r = c.put(k, v, None).await.unwrap();
                revs.push(r.header().unwrap().revision());
            }
            revs
        })
    })
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn restore(ns: &Netns, prog: &str, payload: &str) -> Duration {
    let t = Instant::now();
    let mut c = ns
        .command(prog)
        .args(["--noflush", "--wait", "10"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(payload.as_bytes())
        .unwrap();
    assert!(c.wait().unwrap().success(), "{prog} failed on:\n{payload}");
    t.elapsed()
}

fn main() {
    let ns = Netns::new();
    let mut etcd = Etcd::start_in(ns.name());
    let mut seed = vec![(
        format!("{PREFIX}tiers/default"),
        json!({"apiVersion":"projectcalico.org/v3","kind":"Tier","metadata":{"name":"default"},
               "spec":{"order":1000000}})
        .to_string(),
    )];
    for n in 0..namespaces() {
        seed.push((
            format!("{PREFIX}profiles/kns.ns{n}"),
            json!({"apiVersion":"projectcalico.org/v3","kind":"Profile",
                   "metadata":{"name":format!("kns.ns{n}")},
                   "spec":{"ingress":[{"action":"Allow"}],"egress":[{"action":"Allow"}]}})
            .to_string(),
        ));
    }
    seed.extend((0..ENDPOINTS).map(wep));
    seed.extend((0..POLICIES).map(|i| policy(i, 8000)));
    let t = Instant::now();
    let rev = *put_all(ns.name(), &etcd.admin_url(), seed).last().unwrap();
    eprintln!("seeded in {:?}", t.elapsed());

    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    let t = Instant::now();
    let trace = std::env::var_os("AGENT_BENCH_TRACE").map(std::path::PathBuf::from);
    let log_args: &[&str] = match trace {
        Some(_) => &["--log", "info,felixrs=debug,iptables=debug"],
        None => &[],
    };
    let agent = Agent::start_with(ns.name(), &etcd.client_url(), &state_dir, log_args);
    let s = agent.wait_applied(rev);
    let initial = t.elapsed();
    eprintln!("initial program: {initial:?} {s}");

    // 200 changes, one at a time.
    let mut lat = Vec::new();
    let mut times = String::from("change\tput_unix_us\tanswered_unix_us\n");
    for c in 0..CHANGES {
        let i = (c * 7) % POLICIES;
        let kv = policy(i, 9000 + c as u16);
        let (health, url) = (agent.health, etcd.admin_url());
        let (ms, put_at, answered_at) = in_netns(ns.name(), move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut client = rt
                .block_on(etcd_client::Client::connect([url], None))
                .unwrap();
            let put_at = unix_us();
            let t = Instant::now();
            let r = rt.block_on(client.put(kv.0, kv.1, None)).unwrap();
            let rev = r.header().unwrap().revision();
            let (_, body) = http::get(
                health,
                &format!("/status?min_revision={rev}&timeout_ms=30000"),
            )
            .unwrap();
            let s: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert!(s["applied_revision"].as_i64().unwrap() >= rev, "{s}");
            (t.elapsed().as_secs_f64() * 1000.0, put_at, unix_us())
        });
        lat.push(ms);
        times.push_str(&format!("{c}\t{put_at}\t{answered_at}\n"));
    }
    if let Some(dir) = &trace {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("agent.log"), agent.log()).unwrap();
        std::fs::write(dir.join("changes.tsv"), &times).unwrap();
    }

    // Floor: the one-chain transaction per change, both families, against the same kernel.
    let save4 = ns.ok("iptables-nft-save", &["-t", "filter"]);
    let save6 = ns.ok("ip6tables-nft-save", &["-t", "filter"]);
    // The transaction one change needs in one family: rewrite the policy chain's rule.
    let payload = |save: &str, i: usize| {
        let chain = save
            .lines()
            .find(|l| l.starts_with(":cali-pi-") && l.contains(&format!("/p{i} ")))
            .map(|l| l[1..].split(' ').next().unwrap().to_string())
            .expect("policy chain in the kernel");
        let rule = save
            .lines()
            .find(|l| l.starts_with(&format!("-A {chain} ")))
            .unwrap()
            .replace(" --dports ", " --dports 1")
            .replacen(&format!("-A {chain} "), &format!("-R {chain} 1 "), 1);
        format!("*filter\n{rule}\nCOMMIT\n")
    };
    let mut floor = Vec::new();
    for c in 0..CHANGES {
        let i = (c * 7) % POLICIES;
        let d4 = restore(&ns, "iptables-nft-restore", &payload(&save4, i));
        let d6 = restore(&ns, "ip6tables-nft-restore", &payload(&save6, i));
        floor.push((d4 + d6).as_secs_f64() * 1000.0);
    }
    let (p50, p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    let (f50, f99) = (pct(&mut floor, 0.5), pct(&mut floor, 0.99));
    let rules = ns
        .ok("iptables-nft-save", &[])
        .lines()
        .filter(|l| l.starts_with("-A"))
        .count();

    // The restart's floor: the two whole saves it must read, run concurrently (best of 3).
    let save_floor = (0..3)
        .map(|_| {
            let t = Instant::now();
            std::thread::scope(|s| {
                let h = s.spawn(|| ns.ok("ip6tables-nft-save", &[]));
                ns.ok("iptables-nft-save", &[]);
                h.join().unwrap();
            });
            t.elapsed().as_secs_f64() * 1000.0
        })
        .fold(f64::MAX, f64::min);

    // Restart from the snapshot with etcd down: on the same kernel (rules still there, the usual
    // restart) and on an empty kernel (fresh netns), same state dir.
    std::thread::sleep(Duration::from_millis(1500));
    drop(agent);
    etcd.stop();
    let restart_same = restart(&ns, &etcd, &state_dir);
    let ns2 = Netns::new();
    let restart_empty = restart(&ns2, &etcd, &state_dir);

    println!(
        "endpoints={ENDPOINTS} policies={POLICIES} combinations={} changes={CHANGES} v4 rules={rules} share_chains={}",
        combos(),
        std::env::var("FELIXRS_SHARE_CHAINS").unwrap_or_else(|_| "true".into())
    );
    println!(
        "floor of a restart on the same kernel: v4 + v6 whole saves, concurrently: {save_floor:.0} ms"
    );
    println!(
        "initial sync+program: {:.0} ms",
        initial.as_secs_f64() * 1000.0
    );
    println!("programming latency  p50 {p50:.1} ms  p99 {p99:.1} ms");
    println!("bare restore floor   p50 {f50:.1} ms  p99 {f99:.1} ms  (v4+v6, one chain)");
    println!("ratio p50 {:.2}x  p99 {:.2}x", p50 / f50, p99 / f99);
    for (what, (total, apply)) in [
        ("same kernel", restart_same),
        ("empty kernel", restart_empty),
    ] {
        println!(
            "restart-to-programmed from snapshot, etcd down, {what}: {total:.0} ms (apply {apply:.0} ms)"
        );
    }
}

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// Spawn to `programmed` of an agent whose etcd is down; (total ms, last apply ms).
fn restart(ns: &Netns, etcd: &Etcd, state_dir: &std::path::Path) -> (f64, f64) {
    let t = Instant::now();
    let agent = Agent::start(ns.name(), &etcd.client_url(), state_dir);
    let s = loop {
        let s = agent.status();
        if s["programmed"] == true {
            break s;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let total = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(s["source"], "snapshot", "{s}");
    (total, s["last_apply_duration_ms"].as_f64().unwrap())
}
