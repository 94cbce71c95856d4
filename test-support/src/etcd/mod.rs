//! A real etcd (`/usr/bin/etcd`, or `$ETCD_BIN`) for tests.
//!
//! [`Etcd`] listens on two client URLs: the *client* URL, for the code under test, and the *admin* URL,
//! for the test's own `etcdctl` calls. [`Etcd::restart_admin_only`] brings etcd back with only the admin
//! URL open, so a test can change the store while the code under test cannot reach it. Ports are free
//! ports on 127.0.0.1 unless the builder says otherwise; etcd may run inside a network namespace at a
//! given address. The data directory (and the logs, one file per start) live in a temp dir unless the
//! builder names a directory; a restart keeps the data. Optional TLS: both URLs serve only TLS and demand
//! a client certificate signed by a throwaway CA ([`pki`]).
//!
//! Invariants: `start`/`restart` return only once etcd answers `endpoint health`; the process is killed
//! and reaped on drop (the temp dir then goes too); a missing binary or a start failure panics with the
//! etcd log tail.

pub mod cluster;
mod cluster_status;
pub mod pki;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use pki::{Pki, TlsFiles};

use crate::free_port;

const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// How to start an [`Etcd`]; [`Etcd::builder`].
#[derive(Debug, Clone, Default)]
pub struct EtcdBuilder {
    netns: Option<String>,
    host: Option<IpAddr>,
    client_port: Option<u16>,
    tls: bool,
    dir: Option<PathBuf>,
}

impl EtcdBuilder {
    /// Runs etcd inside network namespace `name` (ports are still picked free in the caller's
    /// namespace: a fresh namespace has nothing listening).
    pub fn netns(mut self, name: &str) -> Self {
        self.netns = Some(name.to_string());
        self
    }

    /// Serves the client URL on `host` instead of 127.0.0.1 (the admin URL stays on 127.0.0.1).
    pub fn host(mut self, host: IpAddr) -> Self {
        self.host = Some(host);
        self
    }

    /// Serves the client URL on this port instead of a free one.
    pub fn client_port(mut self, port: u16) -> Self {
        self.client_port = Some(port);
        self
    }

    /// Serves TLS only and demands client certificates (CA and certificates made with `openssl`).
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Keeps data, logs and certificates under `dir` (which outlives the etcd) instead of a temp dir.
    pub fn dir(mut self, dir: &Path) -> Self {
        self.dir = Some(dir.to_path_buf());
        self
    }

    /// Starts etcd and waits until it is healthy; panics (with its log) when it does not come up.
    pub fn start(self) -> Etcd {
        let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| "/usr/bin/etcd".to_string());
        crate::require_tools(&[&bin, "etcdctl"]);
        if self.netns.is_some() {
            crate::require_root();
        }
        let (tmp, dir) = match self.dir {
            Some(d) => (None, d),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("felixrs-etcd")
                    .tempdir()
                    .expect("create etcd temp dir");
                let d = t.path().to_path_buf();
                (Some(t), d)
            }
        };
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("create etcd dir {}: {e}", dir.display()));
        let host = self.host.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let pki = self
            .tls
            .then(|| Pki::generate(&dir.join("etcd-pki"), "felixrs-test-ca", &[host]));
        let mut etcd = Etcd {
            child: None,
            _tmp: tmp,
            dir,
            bin,
            netns: self.netns,
            host,
            fixed_client_port: self.client_port.is_some(),
            client_port: self.client_port.unwrap_or_else(free_port),
            admin_port: free_port(),
            peer_port: free_port(),
            pki,
            starts: 0,
        };
        etcd.launch(true, true);
        etcd
    }
}

/// A running etcd; see the module docs.
pub struct Etcd {
    child: Option<Child>,
    // Dropped after `child` is killed (fields drop in order after `Drop::drop`).
    _tmp: Option<tempfile::TempDir>,
    dir: PathBuf,
    bin: String,
    netns: Option<String>,
    host: IpAddr,
    /// The builder fixed the client port (it is never re-picked).
    fixed_client_port: bool,
    client_port: u16,
    admin_port: u16,
    peer_port: u16,
    pki: Option<Pki>,
    starts: u32,
}

impl Etcd {
    pub fn builder() -> EtcdBuilder {
        EtcdBuilder::default()
    }

    /// Plain HTTP on free 127.0.0.1 ports, temp data dir.
    pub fn start() -> Etcd {
        Etcd::builder().start()
    }

    /// TLS with client-certificate authentication on free 127.0.0.1 ports.
    pub fn start_tls() -> Etcd {
        Etcd::builder().tls().start()
    }

    /// Plain HTTP on free 127.0.0.1 ports inside network namespace `netns`.
    pub fn start_in(netns: &str) -> Etcd {
        Etcd::builder().netns(netns).start()
    }

    fn scheme(&self) -> &'static str {
        if self.pki.is_some() { "https" } else { "http" }
    }

    /// The URL for the code under test.
    pub fn client_url(&self) -> String {
        let host = match self.host {
            IpAddr::V6(ip) => format!("[{ip}]"),
            IpAddr::V4(ip) => ip.to_string(),
        };
        format!("{}://{host}:{}", self.scheme(), self.client_port)
    }

    /// The URL the test's own `etcdctl` calls use; open also after [`Etcd::restart_admin_only`].
    pub fn admin_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.admin_port)
    }

    /// The client-side TLS files (CA, client certificate and key) when TLS is on.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        self.pki.as_ref().map(Pki::client_files)
    }

    /// The directory holding data, logs and certificates.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills etcd (SIGKILL, as a crash would); the data stays for a restart.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// (Re)starts etcd on the same data and ports with both URLs open.
    pub fn restart(&mut self) {
        self.stop();
        self.launch(true, false);
    }

    /// (Re)starts etcd with only the admin URL open: the code under test sees a dead etcd while the test
    /// keeps writing.
    pub fn restart_admin_only(&mut self) {
        self.stop();
        self.launch(false, false);
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("etcd-{}.log", self.starts))
    }

    /// The last `lines` lines of the current log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let v: Vec<&str> = text.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }

    fn in_netns(&self, program: &str) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        }
    }

    /// Starts etcd and waits until it is healthy. If a port is taken after all (another program
    /// bound it between our check and etcd's bind), it tries again after a pause, with new ports
    /// (but a client port the builder fixed) on the first start (`repick`).
    fn launch(&mut self, client_url_open: bool, repick: bool) {
        const ATTEMPTS: u32 = 5;
        for attempt in 1..=ATTEMPTS {
            match self.try_launch(client_url_open) {
                Ok(()) => return,
                Err(log) if log.contains("address already in use") && attempt < ATTEMPTS => {
                    if repick {
                        if !self.fixed_client_port {
                            self.client_port = free_port();
                        }
                        self.admin_port = free_port();
                        self.peer_port = free_port();
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(log) => panic!("etcd exited at start:\n{log}"),
            }
        }
    }

    /// One start: `Err(log tail)` if etcd exited before it was healthy.
    fn try_launch(&mut self, client_url_open: bool) -> Result<(), String> {
        assert!(self.child.is_none(), "etcd already running");
        self.starts += 1;
        let mut urls = vec![self.admin_url()];
        if client_url_open {
            urls.push(self.client_url());
        }
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.log_path())
            .unwrap_or_else(|e| panic!("create {}: {e}", self.log_path().display()));
        let mut cmd = self.in_netns(&self.bin);
        cmd.args(["--name", "test", "--data-dir"])
            .arg(self.dir.join("etcd-data"))
            .args(["--listen-client-urls", &urls.join(",")])
            .args(["--advertise-client-urls", &self.admin_url()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")]);
        if let Some(p) = &self.pki {
            cmd.arg("--cert-file").arg(&p.server_cert);
            cmd.arg("--key-file").arg(&p.server_key);
            cmd.arg("--trusted-ca-file").arg(&p.ca);
            cmd.arg("--client-cert-auth");
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log fd"))
            .stderr(log);
        self.child = Some(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", self.bin)),
        );
        self.wait_healthy()
    }

    fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let out = self
                .etcdctl(&["endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run etcdctl");
            if out.success() {
                return Ok(());
            }
            if !self.is_running() {
                self.child = None;
                return Err(self.log_tail(30));
            }
            assert!(
                Instant::now() < deadline,
                "etcd at {} not healthy after {READY_TIMEOUT:?}:\n{}",
                self.admin_url(),
                self.log_tail(30)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `etcdctl` (v3 API) against the admin URL, with the TLS client files when TLS is on, inside the
    /// namespace when there is one: add the command's arguments and run it.
    pub fn etcdctl(&self, args: &[&str]) -> Command {
        let mut cmd = self.in_netns("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.admin_url()])
            .args(["--dial-timeout", "1s", "--command-timeout", "5s"]);
        if let Some(t) = self.tls_files() {
            cmd.arg("--cacert").arg(t.ca);
            cmd.arg("--cert").arg(t.cert);
            cmd.arg("--key").arg(t.key);
        }
        cmd.args(args);
        cmd
    }

    /// Runs `etcdctl args` with `stdin`; returns stdout, panics with stderr on failure.
    pub fn ctl(&self, args: &[&str], stdin: Option<&[u8]>) -> String {
        let mut child = self
            .etcdctl(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn etcdctl");
        let mut input = child.stdin.take().expect("piped stdin");
        if let Some(data) = stdin {
            input.write_all(data).expect("write etcdctl stdin");
        }
        drop(input);
        let out = child.wait_with_output().expect("wait for etcdctl");
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Puts a key and returns the store's revision after the write.
    pub fn put(&self, key: &str, value: &str) -> i64 {
        // The value goes through stdin so it may start with '-'.
        self.ctl(&["put", key], Some(value.as_bytes()));
        self.revision()
    }

    /// Deletes a key and returns the store's revision after the delete.
    pub fn delete(&self, key: &str) -> i64 {
        self.ctl(&["del", key], None);
        self.revision()
    }

    /// The value of `key`, if any.
    pub fn get(&self, key: &str) -> Option<String> {
        let out = self.ctl(&["get", key, "--print-value-only"], None);
        let value = out.strip_suffix('\n').unwrap_or(&out);
        (!out.is_empty()).then(|| value.to_string())
    }

    /// The store's current revision.
    pub fn revision(&self) -> i64 {
        let out = self.ctl(&["endpoint", "status", "-w", "json"], None);
        let v: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("endpoint status json: {e}: {out}"));
        v[0]["Status"]["header"]["revision"]
            .as_i64()
            .unwrap_or_else(|| panic!("no revision in endpoint status: {out}"))
    }

    /// Compacts (physically) up to `revision`.
    pub fn compact(&self, revision: i64) {
        self.ctl(&["compact", &revision.to_string(), "--physical"], None);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() && self.starts > 0 {
            eprintln!(
                "---- etcd log {} (tail) ----\n{}",
                self.log_path().display(),
                self.log_tail(20)
            );
        }
    }
}
