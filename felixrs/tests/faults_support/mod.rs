//! The node-side fault tests' world (issue 23): one etcd and one node namespace with three pods
//! (`client`, `server`, `intruder`) where the server's policy admits only the client; a prober
//! that connects from the intruder to the server (v4 and v6, back to back) for the whole of a
//! scenario; a watcher that `kill -9`s restore processes running in the node namespace; a
//! kube-proxy-like foreign writer; a small tmpfs for the state directory; and the comparison of
//! our (and the foreign writer's) objects in the kernel with a reference namespace programmed from
//! scratch. The node and its pods come from `felixrs_test_support::node`, etcd from its `etcd`, the
//! agent process from `support`.
#![allow(dead_code)]

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use calc_graph::proto::IpVersion;
use felixrs::cmd::shared::dataplane_args::DataplaneArgs;
use felixrs::cmd::shared::node_view::{SourceArgs, render_node};
use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::{self, Netns};
use felixrs_test_support::node::{self, ALLOWED_PORT, Pod};
use felixrs_test_support::prober;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner};
use serde_json::json;

use crate::support::{put_default_tier, put_json, put_ns1_profile};

pub const CLIENT_IF: &str = "cali0client";
pub const SERVER_IF: &str = "cali0server";
pub const INTRUDER_IF: &str = "cali0intrud";

/// The node and pods of `felixrs_test_support::node` with nothing programmed by the world itself:
/// the agent under test programs the node.
struct Unprogrammed;

impl node::Dataplane for Unprogrammed {
    type Programmed = ();

    fn interface_of(&self, pod: &str) -> String {
        match pod {
            "client" => CLIENT_IF.into(),
            _ => SERVER_IF.into(),
        }
    }

    fn program(self, _node: &Netns) {}
}

/// The shared setup of every scenario.
pub struct World {
    pub intruder: Pod,
    pub pods: node::NodeWorld<()>,
    pub etcd: Etcd,
    /// The lock file every legacy writer of the node (agent, foreign writer) is given as
    /// `XTABLES_LOCKFILE`, so the machine-wide `/run/xtables.lock` other tests use is left alone.
    pub lock_file: PathBuf,
    pub work: tempfile::TempDir,
}

impl World {
    pub fn new() -> World {
        let pods = node::NodeWorld::build(|_| Unprogrammed);
        let intruder = node::add_pod(&pods.node, INTRUDER_IF, "10.79.0.3", "fd79::3");
        let etcd = Etcd::start_in(pods.node.name());
        let work = tempfile::tempdir().unwrap();
        let lock_file = work.path().join("xtables.lock");
        File::create(&lock_file).unwrap();
        let w = World {
            intruder,
            pods,
            etcd,
            lock_file,
            work,
        };
        w.seed();
        w
    }

    pub fn node(&self) -> &Netns {
        &self.pods.node
    }

    fn seed(&self) {
        let etcd = &self.etcd;
        put_default_tier(etcd);
        put_ns1_profile(etcd);
        for (pod, iface, v4, v6) in [
            ("client", CLIENT_IF, "10.79.0.1", "fd79::1"),
            ("server", SERVER_IF, "10.79.0.2", "fd79::2"),
            ("intruder", INTRUDER_IF, "10.79.0.3", "fd79::3"),
        ] {
            let name = format!("node--1-k8s-{pod}-eth0");
            put_json(
                etcd,
                &format!("workloadendpoints/ns1/{name}"),
                json!({"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint",
                       "metadata":{"name":name,"namespace":"ns1",
                                   "labels":{"app":pod,"projectcalico.org/namespace":"ns1",
                                             "projectcalico.org/orchestrator":"k8s"}},
                       "spec":{"orchestrator":"k8s","node":"node-1","pod":pod,"endpoint":"eth0",
                               "interfaceName":iface,"ipNetworks":[format!("{v4}/32"), format!("{v6}/128")],
                               "profiles":["kns.ns1"]}}),
            );
        }
        self.put_policy(
            "admit-client",
            json!([{"action":"Allow","source":{"selector":"app == 'client'"}}]),
        );
    }

    /// Namespaced policy `ns1/name` on the server with these ingress rules; returns the revision.
    pub fn put_policy(&self, name: &str, ingress: serde_json::Value) -> i64 {
        put_json(
            &self.etcd,
            &format!("networkpolicies/ns1/{name}"),
            json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
                   "metadata":{"name":name,"namespace":"ns1"},
                   "spec":{"tier":"default","order":100,"selector":"app == 'server'",
                           "types":["Ingress"],"ingress":ingress}}),
        )
    }

    /// Large payloads, generation `generation` (every member and rule differs from the last
    /// generation's): a GlobalNetworkSet of `members` /32s (one IP set of that many members, the
    /// server admitting TCP port 9 from it) and a policy of `rules` rules (one rule each: TCP to
    /// port 10000+i from one /32). None of them is an intruder's address. Returns the revision.
    pub fn put_bulk(&self, generation: u32, members: u32, rules: u32) -> i64 {
        let g = generation % 200;
        let nets: Vec<String> = (0..members)
            .map(|i| format!("10.{}.{}.{}/32", 100 + g % 50, i / 250, i % 250 + 1))
            .collect();
        put_json(
            &self.etcd,
            "globalnetworksets/bulk",
            json!({"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkSet",
                   "metadata":{"name":"bulk","labels":{"bulk":"yes"}},"spec":{"nets":nets}}),
        );
        let ingress: Vec<_> = (0..rules)
            .map(|i| {
                json!({"action":"Allow","protocol":"TCP",
                       "source":{"nets":[format!("10.{}.{}.{}/32", 150 + g % 50, i / 250, i % 250 + 1)]},
                       "destination":{"ports":[10000 + (i + generation) % 20000]}})
            })
            .chain([json!({"action":"Allow","protocol":"TCP",
                           "source":{"selector":"bulk == 'yes'","namespaceSelector":"global()"},
                           "destination":{"ports":[9]}})])
            .collect();
        self.put_policy("bulk", json!(ingress))
    }

    /// Whether the client (the admitted peer) reaches the server, v4 and v6.
    pub fn client_admitted(&self) -> bool {
        let (c, s) = (&self.pods.client, &self.pods.server);
        node::connects(&c.ns, s.v4, ALLOWED_PORT) && node::connects(&c.ns, s.v6, ALLOWED_PORT)
    }

    /// Polls until the client reaches the server again; how long it took.
    pub fn await_client(&self, timeout: Duration) -> Duration {
        let started = Instant::now();
        while !self.client_admitted() {
            assert!(
                started.elapsed() < timeout,
                "the admitted peer still cannot reach the server after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        started.elapsed()
    }
}

/// Connects from the intruder to the server (v4 and v6, TCP, 150 ms timeout, two threads each)
/// back to back until stopped: test-support's prober, one per family.
pub struct Prober([prober::Prober; 2]);

/// What a prober saw.
#[derive(Debug, Clone, Copy)]
pub struct Probed {
    pub attempts: u64,
    /// Denied connections that were delivered (the worst window, in connections).
    pub delivered: u64,
}

impl Prober {
    pub fn start(w: &World) -> Prober {
        let from = w.intruder.ns.name();
        Prober([w.pods.server.v4, w.pods.server.v6].map(|a| {
            let to = SocketAddr::new(a, ALLOWED_PORT);
            prober::Prober::start(from, to, 2, Duration::from_millis(150))
        }))
    }

    pub fn stop(self) -> Probed {
        let [a, b] = self.0.map(|p| p.counts());
        Probed {
            attempts: a.attempts + b.attempts,
            delivered: a.delivered + b.delivered,
        }
    }
}

/// Which restores the [`Killer`] looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restore {
    /// `iptables-*-restore`, `ip6tables-*-restore`.
    Iptables,
    /// `ipset … restore`.
    Ipset,
}

impl Restore {
    fn matches(self, argv: &[String]) -> bool {
        let prog = argv
            .first()
            .map(|a| a.rsplit('/').next().unwrap_or(a))
            .unwrap_or("");
        match self {
            Restore::Iptables => prog.contains("tables") && prog.ends_with("-restore"),
            Restore::Ipset => prog == "ipset" && argv.iter().any(|a| a == "restore"),
        }
    }
}

/// The inode of network namespace `name` (what `/proc/<pid>/ns/net` links to).
fn netns_inode(name: &str) -> u64 {
    std::fs::metadata(netns::path(name))
        .expect("netns file")
        .ino()
}

/// Pids of processes inside the network namespace with inode `ino` whose argv `pick` accepts.
fn pids_in(ino: u64, pick: impl Fn(&[String]) -> bool) -> Vec<i32> {
    let want = format!("net:[{ino}]");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let argv: Vec<String> = cmd
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            pick(&argv)
                && std::fs::read_link(format!("/proc/{pid}/ns/net"))
                    .is_ok_and(|l| l.to_string_lossy() == want)
        })
        .collect()
}

/// Bytes a restore must have read of its payload before the [`Killer`] strikes (more than a pipe
/// buffer and than the files a tool reads at start: it is mid-payload).
pub const MID_PAYLOAD: u64 = 64 * 1024;

/// Watches the node namespace (and only it) for a restore of one kind and, once it has read
/// [`MID_PAYLOAD`] bytes, `kill -9`s it, or the agent while it runs.
pub struct Killer {
    done: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Option<u64>>>,
}

impl Killer {
    /// `kill_agent`: kill the namespace's `felixrs agent` instead of the restore (the restore
    /// then loses its feeder mid-payload).
    pub fn arm(node: &Netns, kind: Restore, kill_agent: bool) -> Killer {
        let ino = netns_inode(node.name());
        let (done, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (d, s) = (done.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                for pid in pids_in(ino, |a| kind.matches(a)) {
                    // Until it is mid-payload (or gone: a small restore, look for the next).
                    while let Some(read) = bytes_read(pid) {
                        if read < MID_PAYLOAD {
                            std::thread::sleep(Duration::from_micros(100));
                            continue;
                        }
                        let target = match kill_agent {
                            false => pid,
                            true => *pids_in(ino, is_agent).first().expect("the agent runs"),
                        };
                        // SAFETY: kill(2) on a process found in the test's own namespace.
                        unsafe { libc::kill(target, libc::SIGKILL) };
                        eprintln!(
                            "killed {target} (-9) when {kind:?} restore {pid} had read {read} bytes"
                        );
                        d.store(true, Ordering::SeqCst);
                        return Some(read);
                    }
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            None
        });
        Killer {
            done,
            stop,
            thread: Some(thread),
        }
    }

    pub fn fired(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    /// Stops watching; how many bytes the restore had read when the kill came, if it came.
    pub fn disarm(mut self) -> Option<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).flatten()
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn is_agent(argv: &[String]) -> bool {
    argv.first().is_some_and(|a| a.ends_with("/felixrs"))
        && argv.get(1).is_some_and(|a| a == "agent")
}

/// Bytes process `pid` has read so far (`rchar`); `None` once it is gone or a zombie.
fn bytes_read(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    if stat.rsplit(')').next()?.trim_start().starts_with('Z') {
        return None;
    }
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: ")?.trim().parse().ok())
}

/// Holds an exclusive `flock` on a file (as iptables does on its lock) until dropped.
pub struct HeldLock(File);

impl HeldLock {
    pub fn take(path: &Path) -> HeldLock {
        let f = File::open(path).expect("lock file");
        // SAFETY: flock on a file descriptor we own.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        HeldLock(f)
    }
}

/// A tmpfs of `size` mounted on a directory of the test (unmounted on drop, also on panic).
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        sh(
            "mount",
            &["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"],
            dir,
        );
        Tmpfs {
            dir: dir.to_path_buf(),
        }
    }

    /// Remounts read-only (`true`) or read-write.
    pub fn read_only(&self, ro: bool) {
        let opts = if ro { "remount,ro" } else { "remount,rw" };
        sh("mount", &["-o", opts], &self.dir);
    }

    /// Fills the file system up with a file `filler` (ENOSPC for any further write).
    pub fn fill(&self) {
        let out = Command::new("dd")
            .args(["if=/dev/zero", "bs=4k"])
            .arg(format!("of={}", self.dir.join("filler").display()))
            .output()
            .expect("dd");
        // dd fails with "No space left on device": that is the point.
        assert!(!out.status.success(), "the tmpfs did not fill up");
    }

    pub fn unfill(&self) {
        std::fs::remove_file(self.dir.join("filler")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

fn sh(program: &str, args: &[&str], path: &Path) {
    let out = Command::new(program)
        .args(args)
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The iptables backend name in tool names (`iptables-legacy-save`).
pub fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Legacy => "legacy",
        _ => "nft",
    }
}

/// The lines `pick` accepts of both families' tables (as `-save` prints them, counters dropped),
/// grouped by table and chain: chains sorted by name, rules in their order. With `sets`, the IP
/// sets `pick` accepts as well (`create` lines reduced to name and type, members sorted).
pub fn objects(ns: &Netns, b: Backend, pick: &dyn Fn(&str) -> bool, sets: bool) -> String {
    let mut out = String::new();
    for tool in ["iptables", "ip6tables"] {
        let save = ns.ok(&format!("{tool}-{}-save", backend_name(b)), &[]);
        let mut table = "";
        let mut chains = std::collections::BTreeMap::<String, Vec<String>>::new();
        let mut flush = |table: &str, chains: &mut std::collections::BTreeMap<_, Vec<String>>| {
            for (c, rules) in std::mem::take(chains) {
                out.push_str(&format!("{tool} {table} {c}\n"));
                for r in rules {
                    out.push_str(&format!("  {r}\n"));
                }
            }
        };
        for l in save.lines() {
            if let Some(t) = l.strip_prefix('*') {
                flush(table, &mut chains);
                table = t;
            } else if let Some(decl) = l.strip_prefix(':') {
                let name = decl.split(' ').next().unwrap_or_default();
                if pick(name) {
                    chains.entry(name.to_string()).or_default();
                }
            } else if let Some(rule) = l.strip_prefix("-A ") {
                let chain = rule.split(' ').next().unwrap_or_default();
                if pick(rule) {
                    chains
                        .entry(chain.to_string())
                        .or_default()
                        .push(l.to_string());
                }
            }
        }
        flush(table, &mut chains);
    }
    if sets {
        let mut lines: Vec<String> = ns
            .ok("ipset", &["save"])
            .lines()
            .filter(|l| l.split(' ').nth(1).is_some_and(pick))
            .map(|l| match l.strip_prefix("create ") {
                Some(c) => format!(
                    "create {}",
                    c.split(' ').take(2).collect::<Vec<_>>().join(" ")
                ),
                None => l.to_string(),
            })
            .collect();
        lines.sort();
        out.push_str(&lines.join("\n"));
    }
    out
}

/// Ours: `cali-` chains, rules naming them or our sets, `cali4`/`cali6` sets.
pub fn is_ours(s: &str) -> bool {
    s.contains("cali")
}

/// The kube-proxy-like writer's: `KUBE-` chains and the rules naming them.
pub fn is_foreign(s: &str) -> bool {
    s.contains("KUBE-")
}

/// Our objects as a fresh namespace holds them after one apply of what `felixrs render` makes of
/// the agent's snapshot in `state_dir` (with `foreign`, that payload applied there first): what
/// the node must hold, whatever happened before.
pub fn reference(state_dir: &Path, b: Backend, foreign: Option<&str>) -> (String, String) {
    let view = render_node(
        &SourceArgs {
            manifests: Vec::new(),
            state_dir: Some(state_dir.to_path_buf()),
        },
        node::NODE,
        &DataplaneArgs::default(),
    )
    .expect("render the snapshot");
    let ns = Netns::with_tag("ref");
    if let Some(payload) = foreign {
        ForeignWriter::install(&ns, b, payload);
    }
    let runner = ExecRunner::in_netns(ns.name()).unwrap();
    for v in [IpVersion::V4, IpVersion::V6] {
        let mut applier = Applier::new(
            runner.clone(),
            ApplierConfig {
                family: v,
                backend: b,
                ..ApplierConfig::default()
            },
        );
        applier
            .apply(view.renderer.desired_ref(v))
            .expect("apply the reference");
    }
    (
        objects(&ns, b, &is_ours, true),
        objects(&ns, b, &is_foreign, false),
    )
}

/// A kube-proxy-like writer: its own `KUBE-` chains in filter and nat with hook rules at the top
/// of `FORWARD` and `PREROUTING`, the chains rewritten with `iptables-restore --noflush` 20 times a
/// second (every rewrite different), in the node namespace, honouring the test's xtables lock.
pub struct ForeignWriter {
    stop: Arc<AtomicBool>,
    last: Arc<Mutex<String>>,
    writes: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

impl ForeignWriter {
    /// The rewrite number `n`: like kube-proxy's, the mark/conntrack accepts in `KUBE-FORWARD` (a
    /// new connection of the intruder matches none of them) and service DNATs to the server.
    pub fn payload(n: u32) -> String {
        let mut p = String::from("*filter\n:KUBE-FORWARD - [0:0]\n:KUBE-SERVICES - [0:0]\n");
        p += &format!(
            "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules {n}\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n"
        );
        p += "-A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n";
        p += &format!(
            "-A KUBE-SERVICES -d 10.96.{}.{}/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable\n",
            n / 250 % 250,
            n % 250 + 1
        );
        p += "COMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-WEB - [0:0]\n";
        p += &format!(
            "-A KUBE-SERVICES -d 10.96.0.{}/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-WEB\n",
            n % 200 + 10
        );
        p += "-A KUBE-SVC-WEB -p tcp -j DNAT --to-destination 10.79.0.2:8080\nCOMMIT\n";
        p
    }

    /// The hook rules (once, as kube-proxy's `-C`/`-I`) and one rewrite.
    pub fn install(ns: &Netns, b: Backend, payload: &str) {
        let ipt = format!("iptables-{}", backend_name(b));
        for (table, chain, target) in [
            ("filter", "FORWARD", "KUBE-FORWARD"),
            ("filter", "FORWARD", "KUBE-SERVICES"),
            ("nat", "PREROUTING", "KUBE-SERVICES"),
        ] {
            ns.feed(
                &format!("{ipt}-restore"),
                &["--noflush"],
                &format!("*{table}\n:{target} - [0:0]\nCOMMIT\n"),
            );
            ns.ok(&ipt, &["-t", table, "-I", chain, "-j", target]);
        }
        ns.feed(&format!("{ipt}-restore"), &["--noflush"], payload);
    }

    /// Starts rewriting in `ns` (hooks installed first) with `lock_file` as `XTABLES_LOCKFILE`.
    pub fn start(ns: &Netns, b: Backend, lock_file: &Path) -> ForeignWriter {
        Self::install(ns, b, &Self::payload(0));
        let stop = Arc::new(AtomicBool::new(false));
        let last = Arc::new(Mutex::new(Self::payload(0)));
        let writes = Arc::new(AtomicU32::new(0));
        let (s, l, w) = (stop.clone(), last.clone(), writes.clone());
        let (name, lock) = (ns.name().to_string(), lock_file.to_path_buf());
        let program = format!("iptables-{}-restore", backend_name(b));
        let thread = std::thread::spawn(move || {
            let mut n = 1;
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                let payload = Self::payload(n);
                let mut child = Command::new("ip")
                    .args(["netns", "exec", &name, &program, "--noflush", "-w", "10"])
                    .env("XTABLES_LOCKFILE", &lock)
                    .stdin(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("foreign restore");
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(payload.as_bytes())
                    .unwrap();
                let out = child.wait_with_output().unwrap();
                assert!(
                    out.status.success(),
                    "foreign restore failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                *l.lock().unwrap() = payload;
                w.fetch_add(1, Ordering::Relaxed);
                n += 1;
                std::thread::sleep(Duration::from_millis(50).saturating_sub(started.elapsed()));
            }
        });
        ForeignWriter {
            stop,
            last,
            writes,
            thread: Some(thread),
        }
    }

    /// Stops; the last payload written and the number of rewrites.
    pub fn stop(mut self) -> (String, u32) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("the foreign writer failed");
        }
        (
            self.last.lock().unwrap().clone(),
            self.writes.load(Ordering::Relaxed),
        )
    }

    /// Removes its chains and hooks (before the other backend's turn).
    pub fn remove(ns: &Netns, b: Backend) {
        let ipt = format!("iptables-{}", backend_name(b));
        for (table, chain, target) in [
            ("filter", "FORWARD", "KUBE-FORWARD"),
            ("filter", "FORWARD", "KUBE-SERVICES"),
            ("nat", "PREROUTING", "KUBE-SERVICES"),
        ] {
            ns.ok(&ipt, &["-t", table, "-D", chain, "-j", target]);
        }
        for (table, chains) in [
            ("filter", &["KUBE-FORWARD", "KUBE-SERVICES"][..]),
            ("nat", &["KUBE-SERVICES", "KUBE-SVC-WEB"][..]),
        ] {
            for c in chains {
                ns.ok(&ipt, &["-t", table, "-F", c]);
            }
            for c in chains {
                ns.ok(&ipt, &["-t", table, "-X", c]);
            }
        }
    }
}

impl Drop for ForeignWriter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A metric's value (`0` when absent).
pub fn metric(agent: &crate::support::Agent, name: &str) -> f64 {
    let (_, m) = agent.get("/metrics").unwrap();
    m.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
