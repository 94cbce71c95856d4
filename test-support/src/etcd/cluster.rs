//! A real multi-member etcd cluster on 127.0.0.1 and an `etcd grpc-proxy` in front of it, for the
//! fan-out tests and benchmark.
//!
//! Invariants: [`EtcdCluster::start`] returns once every member answers `endpoint health`; a killed
//! member keeps its data and [`EtcdCluster::restart`] brings it back on the same ports; every process
//! is killed and reaped on drop (the temp dir then goes too). [`GrpcProxy::start`] returns once the
//! proxy serves a read through to the cluster.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

const READY_TIMEOUT: Duration = Duration::from_secs(30);

fn etcd_bin() -> String {
    std::env::var("ETCD_BIN").unwrap_or_else(|_| "/usr/bin/etcd".to_string())
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    starts: u32,
}

/// An `n`-member etcd cluster; see the module docs.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: PathBuf,
    netns: Option<String>,
    host: IpAddr,
    _tmp: tempfile::TempDir,
}

/// `program` run inside network namespace `netns`, if any.
fn command_in(netns: Option<&str>, program: &str) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, program]);
            c
        }
        None => Command::new(program),
    }
}

impl EtcdCluster {
    /// Starts `n` members on 127.0.0.1 and waits until all are healthy; panics with the logs
    /// otherwise.
    pub fn start(n: usize) -> EtcdCluster {
        Self::start_in(n, None, IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// [`EtcdCluster::start`] inside network namespace `netns` (root needed), clients served on
    /// `host` (an address of that namespace); ports are picked free in the caller's namespace.
    pub fn start_in(n: usize, netns: Option<&str>, host: IpAddr) -> EtcdCluster {
        if netns.is_some() {
            crate::require_root();
        }
        crate::require_tools(&[&etcd_bin(), "etcdctl"]);
        let tmp = tempfile::Builder::new()
            .prefix("felixrs-etcd-cluster")
            .tempdir()
            .expect("create etcd cluster temp dir");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
                starts: 0,
            })
            .collect();
        let mut c = EtcdCluster {
            dir: tmp.path().to_path_buf(),
            members,
            netns: netns.map(String::from),
            host,
            _tmp: tmp,
        };
        for i in 0..n {
            c.launch(i);
        }
        for i in 0..n {
            c.wait_healthy(i);
        }
        c
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn log_path(&self, i: usize) -> PathBuf {
        let m = &self.members[i];
        self.dir.join(format!("{}-{}.log", m.name, m.starts))
    }

    fn launch(&mut self, i: usize) {
        let initial = self.initial_cluster();
        self.members[i].starts += 1;
        let log = std::fs::File::create(self.log_path(i)).expect("create member log");
        let m = &self.members[i];
        let client = format!("http://{}:{}", self.host, m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = command_in(self.netns.as_deref(), &etcd_bin())
            .args(["--name", &m.name, "--data-dir"])
            .arg(self.dir.join(format!("{}.data", m.name)))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "felixrs-test"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log fd"))
            .stderr(log)
            .spawn()
            .expect("start etcd member");
        self.members[i].child = Some(child);
    }

    fn wait_healthy(&mut self, i: usize) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let url = self.client_url(i);
        loop {
            let ok = command_in(self.netns.as_deref(), "etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &url, "--dial-timeout", "1s"])
                .args(["--command-timeout", "3s", "endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run etcdctl")
                .success();
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd member {i} not healthy after {READY_TIMEOUT:?}:\n{}",
                self.log_tail(i, 30)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s client URL.
    pub fn client_url(&self, i: usize) -> String {
        format!("http://{}:{}", self.host, self.members[i].client_port)
    }

    /// Every member's client URL, comma separated.
    pub fn endpoints(&self) -> String {
        (0..self.len())
            .map(|i| self.client_url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i`'s process id while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// SIGKILL member `i`, as a crash would; its data stays.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data and ports and waits until it is healthy.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.launch(i);
        self.wait_healthy(i);
    }

    /// Starts every killed member again on its data and ports, all at once (one member alone has
    /// no quorum), and waits until each is healthy: with [`EtcdCluster::kill`] on every member, a
    /// whole-cluster restart.
    pub fn start_stopped(&mut self) {
        let stopped: Vec<usize> = (0..self.len())
            .filter(|i| self.members[*i].child.is_none())
            .collect();
        for &i in &stopped {
            self.launch(i);
        }
        for &i in &stopped {
            self.wait_healthy(i);
        }
    }

    /// `etcdctl` against the members that run (any of them may answer).
    pub fn etcdctl(&self, args: &[&str]) -> Command {
        let eps: Vec<String> = (0..self.len())
            .filter(|i| self.members[*i].child.is_some())
            .map(|i| self.client_url(i))
            .collect();
        let mut cmd = command_in(self.netns.as_deref(), "etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .args(["--endpoints", &eps.join(",")])
            .args(["--dial-timeout", "2s", "--command-timeout", "10s"])
            .args(args);
        cmd
    }

    /// Puts `key` (a value that does not start with '-'), retrying for up to 30 s while the
    /// cluster elects a leader (a put is idempotent); panics when it keeps failing.
    pub fn put(&self, key: &str, value: &str) {
        self.retry(&["put", key, value]);
    }

    /// Deletes `key`, retrying as [`EtcdCluster::put`] does.
    pub fn delete(&self, key: &str) {
        self.retry(&["del", key]);
    }

    fn retry(&self, args: &[&str]) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match crate::run_checked(self.etcdctl(args).stdin(Stdio::null())) {
                Ok(_) => return,
                Err(e) if Instant::now() > deadline => panic!("etcdctl {args:?}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let v: Vec<&str> = text.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// `etcd grpc-proxy start` in front of some endpoints; killed on drop.
pub struct GrpcProxy {
    child: Child,
    endpoints: String,
    netns: Option<String>,
    host: IpAddr,
    port: u16,
    metrics_port: u16,
    _tmp: tempfile::TempDir,
}

impl GrpcProxy {
    /// Starts a proxy on 127.0.0.1 for `endpoints` (comma separated URLs) and waits until it
    /// answers.
    pub fn start(endpoints: &str) -> GrpcProxy {
        Self::start_in(endpoints, None, IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// [`GrpcProxy::start`] inside network namespace `netns`, serving on `host`.
    pub fn start_in(endpoints: &str, netns: Option<&str>, host: IpAddr) -> GrpcProxy {
        let tmp = tempfile::Builder::new()
            .prefix("felixrs-grpc-proxy")
            .tempdir()
            .expect("create proxy temp dir");
        let (port, metrics_port) = (free_port(), free_port());
        let child = Self::spawn(endpoints, netns, host, port, metrics_port, tmp.path());
        let p = GrpcProxy {
            child,
            endpoints: endpoints.to_string(),
            netns: netns.map(String::from),
            host,
            port,
            metrics_port,
            _tmp: tmp,
        };
        p.wait_ready();
        p
    }

    fn spawn(
        endpoints: &str,
        netns: Option<&str>,
        host: IpAddr,
        port: u16,
        metrics_port: u16,
        dir: &std::path::Path,
    ) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("proxy.log"))
            .expect("create proxy log");
        command_in(netns, &etcd_bin())
            .args(["grpc-proxy", "start", "--endpoints", endpoints])
            .args(["--listen-addr", &format!("{host}:{port}")])
            .args(["--advertise-client-url", &format!("{host}:{port}")])
            .args([
                "--metrics-addr",
                &format!("http://127.0.0.1:{metrics_port}"),
            ])
            .arg("--data-dir")
            .arg(dir.join("proxy.data"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log fd"))
            .stderr(log)
            .spawn()
            .expect("start etcd grpc-proxy")
    }

    fn wait_ready(&self) {
        let netns = self.netns.as_deref();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ok = command_in(netns, "etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &self.url(), "--dial-timeout", "1s"])
                .args(["--command-timeout", "3s", "get", "/felixrs-proxy-probe"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run etcdctl")
                .success();
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "grpc-proxy not answering after {READY_TIMEOUT:?}:\n{}",
                self.log_tail(30)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs the proxy, as a crash or a rolled pod would: every client connection breaks.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the proxy again on the same ports (after [`GrpcProxy::kill`]) and waits until it
    /// answers.
    pub fn restart(&mut self) {
        self.kill();
        let netns = self.netns.clone();
        self.child = Self::spawn(
            &self.endpoints,
            netns.as_deref(),
            self.host,
            self.port,
            self.metrics_port,
            self._tmp.path(),
        );
        self.wait_ready();
    }

    /// The URL clients connect to.
    pub fn url(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// The proxy's Prometheus endpoint (`/metrics`), as `127.0.0.1:port` (in its namespace).
    pub fn metrics_addr(&self) -> String {
        format!("127.0.0.1:{}", self.metrics_port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self._tmp.path().join("proxy.log")).unwrap_or_default();
        let v: Vec<&str> = text.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for GrpcProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
