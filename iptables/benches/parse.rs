//! Parse-throughput benchmark (harness = false; `cargo bench -p iptables --bench parse`).
//!
//! 1. The two largest corpus dumps (021/022 kernel re-saves), parse and render.
//! 2. A generated 100k-rule Calico-style dump (fixed, deterministic), parse and render.
//! 3. The same 100k rules loaded with `iptables-restore` into a network namespace this bench creates
//!    (`fxb-<pid>`, deleted on exit, also on panic): time `iptables-save` printing them (nft and
//!    legacy backends), then time our parse of exactly the text it printed. Needs root, `ip`,
//!    `ipset`, `iptables-restore`/`iptables-save` (+ `-legacy`); fails loudly when they are missing.
//!    Set `FXB_SKIP_KERNEL=1` to run only 1 and 2; `FXB_PROFILE_ITERS=n` only parses the generated
//!    dump n times (for `perf record`/callgrind; `FXB_PROFILE_FILE=path` parses that file instead,
//!    `FXB_PROFILE_ROUNDTRIP=1` runs the sequential streaming roundtrip instead of the parse).

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use felixrs_test_support::netns::Netns;
use iptables::parse::{parse_save, roundtrip_save, roundtrip_save_parts, roundtrip_threads};

const RULES: usize = 100_000;
const CHAINS: usize = 1_000;
const SETS: usize = 20;

/// CPU time of this thread so far (`/proc/thread-self/schedstat`, ns on CPU): the measure that
/// stays meaningful when other processes share the cores.
fn thread_cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("read /proc/thread-self/schedstat");
    Duration::from_nanos(
        s.split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .expect("schedstat format"),
    )
}

/// CPU time (user + system) of waited-for children so far (`/proc/self/stat` cutime + cstime, 100 Hz).
fn children_cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    let after = &s[s.rfind(')').expect("stat format") + 2..];
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // Fields 16 and 17 of stat (cutime, cstime) are 13 and 14 after the ')' + state field.
    Duration::from_millis((f[13] + f[14]) * 10)
}

/// Best wall-clock time and mean CPU time of `n` runs of `f` (the scheduler's CPU accounting is
/// too coarse for the minimum of short runs).
#[derive(Clone, Copy)]
struct Timing {
    wall: Duration,
    cpu: Duration,
}

fn best<T>(n: usize, mut f: impl FnMut() -> T) -> Timing {
    let mut wall = Duration::MAX;
    let c0 = thread_cpu();
    for _ in 0..n {
        let w = Instant::now();
        black_box(f());
        wall = wall.min(w.elapsed());
    }
    Timing {
        wall,
        cpu: (thread_cpu() - c0) / n as u32,
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64() / 1e6
}

fn rule_count(text: &str) -> usize {
    text.lines()
        .filter(|l| l.starts_with("-A") || (l.starts_with('[') && l.contains("] -A")))
        .count()
}

fn report(name: &str, text: &str, iters: usize) {
    let rules = rule_count(text);
    let parse = best(iters, || parse_save(text).expect("bench input parses"));
    let rs = parse_save(text).unwrap();
    assert_eq!(rs.render(), text, "{name} must round-trip");
    let render = best(iters, || rs.render());
    // The streaming roundtrip `felixrs iptables roundtrip` runs (parse and render line by line,
    // into a fresh buffer as the process does).
    let stream = best(iters, || {
        let mut out = String::with_capacity(text.len() + text.len() / 8 + 64);
        roundtrip_save(text, &mut out).expect("bench input parses");
        out
    });
    println!(
        "{:<40} {rules:>6} rules | roundtrip_save cpu {:>7.2} ms = {:>5.2} M rules/s, wall {:>7.2} ms = {:>5.2} M rules/s",
        "",
        stream.cpu.as_secs_f64() * 1e3,
        rate(rules, stream.cpu),
        stream.wall.as_secs_f64() * 1e3,
        rate(rules, stream.wall),
    );
    // What the process does (`roundtrip_save_parts`, the machine's thread count for this size)
    // against the sequential path (one chunk), their runs alternating: the wall is what counts
    // (the calling thread's CPU column leaves out the other threads' work).
    let threads = roundtrip_threads(text.len());
    let (mut seq, mut par) = (Duration::MAX, Duration::MAX);
    for _ in 0..iters.max(3) {
        seq = seq.min(best(1, || roundtrip_save_parts(text, 1).expect("parses")).wall);
        par = par.min(best(1, || roundtrip_save_parts(text, threads).expect("parses")).wall);
    }
    println!(
        "{:<40} {rules:>6} rules | parts, 1 thread wall {:>7.2} ms = {:>5.2} M rules/s; {threads} threads wall {:>7.2} ms = {:>5.2} M rules/s ({:.2}x)",
        "",
        seq.as_secs_f64() * 1e3,
        rate(rules, seq),
        par.as_secs_f64() * 1e3,
        rate(rules, par),
        par.as_secs_f64() / seq.as_secs_f64(),
    );
    println!(
        "{name:<40} {rules:>6} rules {:>5.2} MB | parse cpu {:>7.2} ms = {:>5.2} M rules/s ({:>5.1} MB/s), wall {:>7.2} ms = {:>5.2} M rules/s | render cpu {:>6.2} ms = {:>5.2} M rules/s",
        text.len() as f64 / 1e6,
        parse.cpu.as_secs_f64() * 1e3,
        rate(rules, parse.cpu),
        text.len() as f64 / parse.cpu.as_secs_f64() / 1e6,
        parse.wall.as_secs_f64() * 1e3,
        rate(rules, parse.wall),
        render.cpu.as_secs_f64() * 1e3,
        rate(rules, render.cpu),
    );
}

/// A deterministic Calico-style filter table with `RULES` rules in `CHAINS` chains.
fn generated_dump() -> String {
    let mut s = String::with_capacity(RULES * 160);
    s.push_str("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    let mut names: Vec<String> = (0..CHAINS)
        .map(|c| format!("cali-pi-{c:05x}bench"))
        .collect();
    names.sort();
    for n in &names {
        writeln!(s, ":{n} - [0:0]").unwrap();
    }
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (c, chain) in names.iter().enumerate() {
        for r in 0..RULES / CHAINS {
            let h = next();
            let hash: String = (0..16)
                .map(|i| {
                    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
                        [((h >> (i * 4)) % 64) as usize] as char
                })
                .collect();
            let set = (h % SETS as u64) as usize;
            match r % 5 {
                0 => writeln!(s, "-A {chain} -m comment --comment \"cali:{hash}\" -j MARK --set-xmark 0x0/0x30000").unwrap(),
                1 => writeln!(
                    s,
                    "-A {chain} -p tcp -m comment --comment \"cali:{hash}\" -m set --match-set cali40s-{set} src -m multiport --dports 80,443,{} -j MARK --set-xmark 0x10000/0x10000",
                    1024 + h % 60000
                )
                .unwrap(),
                2 => writeln!(s, "-A {chain} -m comment --comment \"cali:{hash}\" -m mark --mark 0x10000/0x10000 -j RETURN").unwrap(),
                3 => writeln!(
                    s,
                    "-A {chain} -s 10.{}.{}.0/24 -i cali+ -p udp -m comment --comment \"cali:{hash}\" -m udp --dport {} -m conntrack --ctstate NEW -j ACCEPT",
                    c % 256,
                    r % 256,
                    h % 65535
                )
                .unwrap(),
                _ => writeln!(s, "-A {chain} -m comment --comment \"cali:{hash}\" -m set ! --match-set cali40s-{set} dst -j DROP").unwrap(),
            }
        }
    }
    s.push_str("COMMIT\n");
    s
}

fn kernel_comparison(dump: &str) {
    felixrs_test_support::require_tools(&[
        "ip",
        "ipset",
        "iptables-restore",
        "iptables-save",
        "iptables-legacy-restore",
        "iptables-legacy-save",
    ]);
    let ns = Netns::with_tag("bench");
    for i in 0..SETS {
        ns.ok("ipset", &["create", &format!("cali40s-{i}"), "hash:net"]);
    }
    for (restore, save_cmd) in [
        ("iptables-restore", "iptables-save"),
        ("iptables-legacy-restore", "iptables-legacy-save"),
    ] {
        let t = Instant::now();
        ns.feed(restore, &[], dump);
        let load = t.elapsed();
        let mut printed = String::new();
        let mut save_cpu = Duration::MAX;
        let save = best(3, || {
            let c = children_cpu();
            printed = ns.ok(save_cmd, &["-t", "filter"]);
            save_cpu = save_cpu.min(children_cpu() - c);
        });
        let rules = rule_count(&printed);
        assert_eq!(rules, RULES, "{save_cmd} printed {rules} rules");
        let parse = best(5, || parse_save(&printed).expect("kernel output parses"));
        assert_eq!(
            parse_save(&printed).unwrap().render(),
            printed,
            "kernel output must round-trip"
        );
        println!(
            "kernel {save_cmd:<21} {rules} rules: restore {:.1} s | save wall {:>7.1} ms ({:.2} M rules/s), cpu {:>6.0} ms | our parse of its output wall {:>6.1} ms ({:.2} M rules/s), cpu {:>6.1} ms | ratio wall {:.1}x, cpu {:.1}x",
            load.as_secs_f64(),
            save.wall.as_secs_f64() * 1e3,
            rate(rules, save.wall),
            save_cpu.as_secs_f64() * 1e3,
            parse.wall.as_secs_f64() * 1e3,
            rate(rules, parse.wall),
            parse.cpu.as_secs_f64() * 1e3,
            save.wall.as_secs_f64() / parse.wall.as_secs_f64(),
            save_cpu.as_secs_f64() / parse.cpu.as_secs_f64(),
        );
        // Empty the table before the other backend loads (they share the netns' xtables state).
        ns.feed(restore, &[], "*filter\nCOMMIT\n");
    }
}

fn main() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!(
        "machine: {} CPUs ({cpu})",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if let Some(n) = std::env::var("FXB_PROFILE_ITERS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        // Profiling aid (`perf record`, callgrind): only parse the generated dump (or the file
        // named by FXB_PROFILE_FILE), n times.
        let dump = match std::env::var_os("FXB_PROFILE_FILE") {
            Some(f) => std::fs::read_to_string(&f)
                .unwrap_or_else(|e| panic!("FXB_PROFILE_FILE {}: {e}", f.to_string_lossy())),
            None => generated_dump(),
        };
        // FXB_PROFILE_ROUNDTRIP=1: the sequential streaming roundtrip instead of `parse_save`.
        let (what, t) = if std::env::var_os("FXB_PROFILE_ROUNDTRIP").is_some() {
            let t = best(n, || roundtrip_save_parts(&dump, 1).expect("parses"));
            ("roundtrips", t)
        } else {
            ("parses", best(n, || parse_save(&dump).expect("parses")))
        };
        println!(
            "profile: {n} {what}, cpu {:.2} ms each",
            t.cpu.as_secs_f64() * 1e3
        );
        return;
    }
    let corpus = felixrs_test_support::iptables_corpus_dir();
    for f in [
        "021-netnet-tum-i8-large-v4.kernel.txt",
        "022-netnet-tum-i8-large-v6.kernel.txt",
    ] {
        let text = std::fs::read_to_string(corpus.join(f))
            .unwrap_or_else(|e| panic!("corpus file {f}: {e}"));
        report(f, &text, 200);
    }
    let dump = generated_dump();
    report("generated Calico-style dump", &dump, 10);
    if std::env::var_os("FXB_SKIP_KERNEL").is_some() {
        println!("kernel comparison skipped (FXB_SKIP_KERNEL set)");
        return;
    }
    kernel_comparison(&dump);
}
