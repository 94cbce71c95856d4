//! Drivers for the real binaries: etcd (Debian's `etcd-server`, launched by `felixrs-test-support`),
//! `policy-controller sync --once`, and one `felixrs agent` per node namespace, polled over HTTP.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

pub use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::http;
use felixrs_test_support::netns::{Netns, in_netns};

/// The workspace's built binaries, next to this test executable (`target/<profile>/`); refused when
/// older than their sources.
pub fn binary(name: &str) -> PathBuf {
    // The workspace crates each binary is built from.
    let crates: &[&str] = match name {
        "policy-controller" => &["calc-graph", "k8s-convert", "etcd-tls", "policy-controller"],
        _ => &[
            "calc-graph",
            "iptables",
            "k8s-convert",
            "etcd-tls",
            "felixrs",
        ],
    };
    felixrs_test_support::binaries::workspace_binary(name, crates)
}

/// A child process running inside a network namespace, killed on drop; output goes to a log file.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(ns: &Netns, program: &Path, args: &[String], log: PathBuf) -> Result<Proc> {
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name()])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Proc {
            child: Some(child),
            log,
        })
    }

    /// SIGTERM, as the kubelet stops a container (a DaemonSet rolling update); SIGKILL if it has
    /// not exited within `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(c.id()) {
            // SAFETY: kill(2) on our own child's pid; it has not been reaped (we own `c`).
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let v: Vec<&str> = text.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `f` every 50 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An HTTP/1.1 GET from inside a namespace with a short read timeout (for polls); returns (status, body).
pub fn http_get(netns: &str, addr: &str, path: &str) -> Result<(u16, String)> {
    let addr: SocketAddr = addr
        .parse()
        .with_context(|| format!("bad address {addr}"))?;
    let path = path.to_string();
    Ok(in_netns(netns, move || {
        http::get_with_timeout(addr, &path, Duration::from_secs(3))
    })?)
}

/// etcd serving `http://<ip>:2379` inside `ns` (data and logs under `work/etcd`), kept across restarts.
pub fn start_etcd(ns: &Netns, ip: &str, work: &Path) -> Etcd {
    Etcd::builder()
        .netns(ns.name())
        .host(ip.parse().expect("etcd address"))
        .client_port(2379)
        .dir(&work.join("etcd"))
        .start()
}

/// Runs `policy-controller sync --once` inside `ns` and returns the etcd revision it printed.
pub fn controller_sync(ns: &Netns, endpoint: &str, manifests: &Path) -> Result<i64> {
    let v = controller_sync_report(ns, endpoint, manifests)?;
    v["revision"]
        .as_i64()
        .with_context(|| format!("no revision in {v}"))
}

/// Runs `policy-controller sync --once` inside `ns` and returns the JSON report it printed
/// (`revision`, counts, and `skips`: one entry per object or field it did not store).
pub fn controller_sync_report(ns: &Netns, endpoint: &str, manifests: &Path) -> Result<Value> {
    let bin = binary("policy-controller");
    let out = ns.exec_unchecked(&[
        bin.to_str().expect("utf-8 path"),
        "sync",
        "--etcd-endpoints",
        endpoint,
        "--manifests",
        manifests.to_str().expect("utf-8 path"),
        "--once",
    ])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "policy-controller sync failed: {}\n{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let last = stdout
        .lines()
        .last()
        .context("policy-controller printed nothing")?;
    serde_json::from_str(last).with_context(|| format!("last stdout line is not JSON: {last}"))
}

/// `felixrs agent` with its etcd, node name and state directory, `/status` on [`HEALTH_ADDR`], a
/// 2 s refresh, and source spoofing as a Felix with WorkloadSourceSpoofing=Any (Felix's spelling):
/// each pod's allowedSourcePrefixes annotation then decides what it may send from.
pub fn agent_args(endpoint: &str, node_name: &str, state_dir: &str) -> Vec<String> {
    let args = [
        "agent",
        "--etcd-endpoints",
        endpoint,
        "--node-name",
        node_name,
        "--state-dir",
        state_dir,
        "--health-listen",
        HEALTH_ADDR,
        "--refresh-interval",
        "2",
        "--workload-source-spoofing",
        "Any",
    ];
    args.iter().map(|s| s.to_string()).collect()
}

/// One `felixrs agent` in a node namespace.
pub struct Agent {
    pub node_name: String,
    pub netns: String,
    proc: Option<Proc>,
    program: PathBuf,
    args: Vec<String>,
    log_dir: PathBuf,
    starts: u32,
    pub state_dir: PathBuf,
}

pub const HEALTH_ADDR: &str = "127.0.0.1:9099";

impl Agent {
    pub fn start(node_ns: &Netns, node_name: &str, endpoint: &str, work: &Path) -> Result<Agent> {
        Self::start_with(node_ns, node_name, endpoint, work, &[])
    }

    /// [`Agent::start`] with extra flags (e.g. `--etcd-prefix`).
    pub fn start_with(
        node_ns: &Netns,
        node_name: &str,
        endpoint: &str,
        work: &Path,
        extra: &[&str],
    ) -> Result<Agent> {
        let state_dir = work.join(format!("state-{node_name}"));
        std::fs::create_dir_all(&state_dir)?;
        let state = state_dir.to_str().expect("utf-8 path");
        let mut args = agent_args(endpoint, node_name, state);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut a = Agent {
            node_name: node_name.to_string(),
            netns: node_ns.name().to_string(),
            proc: None,
            program: binary("felixrs"),
            args,
            log_dir: work.to_path_buf(),
            starts: 0,
            state_dir: state_dir.clone(),
        };
        a.restart(node_ns)?;
        Ok(a)
    }

    pub fn restart(&mut self, node_ns: &Netns) -> Result<()> {
        self.proc = None;
        self.starts += 1;
        self.proc = Some(Proc::spawn(
            node_ns,
            &self.program,
            &self.args,
            self.log_dir
                .join(format!("agent-{}-{}.log", self.node_name, self.starts)),
        )?);
        Ok(())
    }

    /// An upgrade as a DaemonSet rolling update does it: SIGTERM this agent, then start `program`
    /// (the new binary) with `state_dir` (the old one, or a fresh one as on a new node image) and
    /// otherwise the same flags. Returns at once: the caller probes the window.
    pub fn upgrade(&mut self, node_ns: &Netns, program: &Path, state_dir: &Path) -> Result<()> {
        if let Some(p) = self.proc.as_mut() {
            p.terminate(Duration::from_secs(10));
        }
        std::fs::create_dir_all(state_dir)?;
        let i = self
            .args
            .iter()
            .position(|a| a == "--state-dir")
            .context("agent args have --state-dir")?;
        self.args[i + 1] = state_dir.to_str().context("utf-8 path")?.to_string();
        self.state_dir = state_dir.to_path_buf();
        self.program = program.to_path_buf();
        self.restart(node_ns)
    }

    /// The binary this agent runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// SIGTERM the agent, as the kubelet stops it, and wait for it to exit (SIGKILL after 10 s).
    pub fn stop(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            p.terminate(Duration::from_secs(10));
        }
    }

    /// SIGKILL the agent, as a crash would; the kernel keeps whatever it had programmed.
    pub fn kill(&mut self) {
        self.proc = None;
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.proc
            .as_ref()
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }

    pub fn status(&self) -> Option<Value> {
        let (code, body) = http_get(&self.netns, HEALTH_ADDR, "/status").ok()?;
        if code != 200 {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    /// Waits until the agent reports in-sync with `applied_revision >= rev`.
    pub fn wait_applied(&mut self, rev: i64, timeout: Duration) -> Result<()> {
        let got = wait_for(timeout, || {
            self.status().filter(|s| {
                s["in_sync"].as_bool() == Some(true)
                    && s["applied_revision"].as_i64().unwrap_or(-1) >= rev
            })
        });
        if got.is_none() {
            bail!(
                "agent {} did not reach applied_revision {rev} (last status {:?}, running {}):\n{}",
                self.node_name,
                self.status(),
                self.proc.as_mut().is_some_and(Proc::is_running),
                self.log_tail(30)
            );
        }
        Ok(())
    }
}
