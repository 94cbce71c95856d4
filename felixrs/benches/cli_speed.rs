//! Issue 26, "parsing and rendering": `felixrs iptables roundtrip` and `felixrs render` timed as
//! whole processes (the release `felixrs` binary cargo builds for this bench), each against its
//! floors measured in the same run.
//!
//! Inputs are generated deterministically into a temp dir: a 90,000-rule Calico-style filter dump
//! (900 chains, the five rule shapes of `iptables/benches/parse.rs`) and the manifests of
//! `scripts/gen-render-manifests.py DIR 20000 2000` (20k pods, 2,000 NetworkPolicies, 100
//! namespaces, 50 nodes).
//!
//! * roundtrip: the process (`felixrs iptables roundtrip FILE > /dev/null`); floors: `cat FILE >
//!   /dev/null` (process start + read) and the library in this process (read, parse, render).
//! * render: the process (`felixrs render --manifests DIR --node-name node-0 > /dev/null`);
//!   floors: `cat` of the manifest files, and the library's manifest loading alone
//!   (`k8s_convert::load_manifests`: read, decode, convert, validate).
//!
//! `cargo bench -p felixrs --bench cli_speed`; `FXB_RUNS=n` (default 9) runs of each, best and
//! median reported. `FXB_BEFORE=BINARY` also times another `felixrs` binary (e.g. main's), its runs
//! alternating with this one's, for a before/after in the same run. `FXB_KEEP=DIR` writes the inputs into DIR (kept) for `perf`/callgrind of the
//! binary: `felixrs iptables roundtrip DIR/dump.txt`, `felixrs render --manifests DIR/manifests
//! --node-name node-0`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RULES: usize = 90_000;
const CHAINS: usize = 900;
const SETS: usize = 200;
const PODS: usize = 20_000;
const POLICIES: usize = 2_000;

const FELIXRS: &str = env!("CARGO_BIN_EXE_felixrs");

/// Best and median of `n` timings of `f`.
fn timed(n: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut v: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    (v[0], v[n / 2])
}

/// Best and median of `n` timings of each binary, their runs alternating.
fn timed_bins(
    n: usize,
    bins: &[(String, String)],
    args: impl Fn(&mut Command) -> &mut Command,
) -> Vec<(Duration, Duration)> {
    let mut v: Vec<Vec<Duration>> = vec![Vec::new(); bins.len()];
    for _ in 0..n {
        for (i, (_, bin)) in bins.iter().enumerate() {
            let t = Instant::now();
            run(args(&mut Command::new(bin)));
            v[i].push(t.elapsed());
        }
    }
    v.into_iter()
        .map(|mut d| {
            d.sort();
            (d[0], d[n / 2])
        })
        .collect()
}

/// Runs `cmd` with stdout to /dev/null; panics (with its stderr) unless it succeeds.
fn run(cmd: &mut Command) {
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// A deterministic Calico-style filter table with `RULES` rules in `CHAINS` chains, in the
/// kernel's save format (so it comes back byte for byte).
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

/// The dump, and the manifests as JSON documents and as block-style YAML (the same objects).
fn write_inputs(dir: &Path) -> (PathBuf, [(&'static str, PathBuf); 2]) {
    let dump = dir.join("dump.txt");
    std::fs::write(&dump, generated_dump()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gen-render-manifests.py");
    let manifests = [
        ("JSON", dir.join("manifests")),
        ("YAML", dir.join("manifests-yaml")),
    ];
    for (form, path) in &manifests {
        let mut cmd = Command::new("python3");
        cmd.arg(&script);
        if *form == "YAML" {
            cmd.arg("--yaml");
        }
        run(cmd
            .arg(path)
            .arg(PODS.to_string())
            .arg(POLICIES.to_string()));
    }
    (dump, manifests)
}

fn manifest_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

fn main() {
    let runs: usize = std::env::var("FXB_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let tmp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os("FXB_KEEP") {
        Some(d) => {
            std::fs::create_dir_all(&d).unwrap();
            PathBuf::from(d)
        }
        None => tmp.path().to_path_buf(),
    };
    let (dump, manifests) = write_inputs(&dir);
    if std::env::var_os("FXB_KEEP").is_some() {
        println!("inputs in {}", dir.display());
    }
    let text = std::fs::read_to_string(&dump).unwrap();
    let rules = text.lines().filter(|l| l.starts_with("-A ")).count();
    let size = text.len();
    drop(text);
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "nproc {}, load {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );

    // The process's output is the input, byte for byte (kernel save format).
    let out = Command::new(FELIXRS)
        .args(["iptables", "roundtrip"])
        .arg(&dump)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        out.stdout == std::fs::read(&dump).unwrap(),
        "roundtrip output differs from the dump"
    );

    println!(
        "\n## iptables roundtrip: {rules} rules, {:.1} MB, best / median of {runs}",
        size as f64 / 1e6
    );
    let rate = |d: Duration| rules as f64 / d.as_secs_f64() / 1e6;
    let (cat_b, cat_m) = timed(runs, || run(Command::new("cat").arg(&dump)));
    let (lib_b, lib_m) = timed(runs, || {
        let t = std::fs::read_to_string(&dump).unwrap();
        let rs = iptables::parse::parse_save(&t).unwrap();
        std::hint::black_box(rs.render());
    });
    let (stream_b, stream_m) = timed(runs, || {
        let t = std::fs::read_to_string(&dump).unwrap();
        let mut out = String::with_capacity(t.len() + t.len() / 8 + 64);
        iptables::parse::roundtrip_save(&t, &mut out).unwrap();
        std::hint::black_box(out);
    });
    let mut bins = vec![("felixrs".to_string(), FELIXRS.to_string())];
    if let Ok(b) = std::env::var("FXB_BEFORE") {
        bins.push(("before".to_string(), b));
    }
    let procs = timed_bins(runs, &bins, |c| {
        c.args(["iptables", "roundtrip"]).arg(&dump)
    });
    println!(
        "floor: cat FILE > /dev/null       {} / {}",
        ms(cat_b),
        ms(cat_m)
    );
    println!(
        "library: read + parse + render   {} / {}  = {:.2} / {:.2} M rules/s",
        ms(lib_b),
        ms(lib_m),
        rate(lib_b),
        rate(lib_m)
    );
    println!(
        "library: read + roundtrip_save   {} / {}  = {:.2} / {:.2} M rules/s",
        ms(stream_b),
        ms(stream_m),
        rate(stream_b),
        rate(stream_m)
    );
    for ((label, _), (pr_b, pr_m)) in bins.iter().zip(procs) {
        println!(
            "{label:<8} iptables roundtrip      {} / {}  = {:.2} / {:.2} M rules/s  ({:.2}x / {:.2}x the library, {:.2}x / {:.2}x library + cat)",
            ms(pr_b),
            ms(pr_m),
            rate(pr_b),
            rate(pr_m),
            pr_b.as_secs_f64() / lib_b.as_secs_f64(),
            pr_m.as_secs_f64() / lib_m.as_secs_f64(),
            pr_b.as_secs_f64() / (lib_b + cat_b).as_secs_f64(),
            pr_m.as_secs_f64() / (lib_m + cat_m).as_secs_f64(),
        );
    }

    let opts = k8s_convert::ConvertOptions {
        interface_prefix: "cali".to_string(),
    };
    for (form, manifests) in &manifests {
        println!(
            "\n## render ({form} manifests): {PODS} pods, {POLICIES} policies, 100 namespaces, best / median of {runs}"
        );
        let files = manifest_files(manifests);
        let (cat_b, cat_m) = timed(runs, || run(Command::new("cat").args(&files)));
        let (load_b, load_m) = timed(runs, || {
            let set = k8s_convert::load_manifests(std::slice::from_ref(manifests), &opts).unwrap();
            assert!(set.skipped.is_empty(), "{:?}", set.skipped.first());
            std::hint::black_box(set);
        });
        let procs = timed_bins(runs, &bins, |c| {
            c.args(["render", "--manifests"])
                .arg(manifests)
                .args(["--node-name", "node-0"])
        });
        println!(
            "floor: cat of the manifests      {} / {}",
            ms(cat_b),
            ms(cat_m)
        );
        println!(
            "library: load_manifests          {} / {}",
            ms(load_b),
            ms(load_m)
        );
        for ((label, _), (r_b, r_m)) in bins.iter().zip(procs) {
            println!(
                "{label:<8} render                  {} / {}  ({:.2}x / {:.2}x load_manifests)",
                ms(r_b),
                ms(r_m),
                r_b.as_secs_f64() / load_b.as_secs_f64(),
                r_m.as_secs_f64() / load_m.as_secs_f64(),
            );
        }
    }
}
