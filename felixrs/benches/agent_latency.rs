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

#[path = "node_load/mod.rs"]
mod node_load;

use std::time::{Duration, Instant};

use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;
use node_load::{ENDPOINTS, POLICIES, combos, pct, policy, put_all, put_and_wait_applied, restore};
use support::Agent;

const CHANGES: usize = 200;

fn main() {
    let ns = Netns::new();
    let mut etcd = Etcd::start_in(ns.name());
    let seed = node_load::seed();
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
        let a = put_and_wait_applied(ns.name(), &etcd.admin_url(), agent.health, kv);
        let (ms, put_at, answered_at) = (a.ms, a.put_at_us, a.answered_at_us);
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
    let restart_same = restart(&ns, &etcd, &state_dir, log_args, &trace, "same");
    let ns2 = Netns::new();
    let restart_empty = restart(&ns2, &etcd, &state_dir, log_args, &trace, "empty");

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

/// Spawn to `programmed` of an agent whose etcd is down; (total ms, last apply ms). With a
/// trace directory, the agent's log goes to `restart-<what>.log` there.
fn restart(
    ns: &Netns,
    etcd: &Etcd,
    state_dir: &std::path::Path,
    log_args: &[&str],
    trace: &Option<std::path::PathBuf>,
    what: &str,
) -> (f64, f64) {
    let t = Instant::now();
    let agent = Agent::start_with(ns.name(), &etcd.client_url(), state_dir, log_args);
    let s = loop {
        let s = agent.status();
        if s["programmed"] == true {
            break s;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let total = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(s["source"], "snapshot", "{s}");
    if let Some(dir) = trace {
        std::fs::write(dir.join(format!("restart-{what}.log")), agent.log()).unwrap();
    }
    (total, s["last_apply_duration_ms"].as_f64().unwrap())
}
