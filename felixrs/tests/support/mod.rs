//! Test support: a real etcd process, network namespaces and a tiny HTTP client.
//! Every resource is released on drop (also on panic).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const PREFIX: &str = "/calico/resources/v3/projectcalico.org/";

/// A free TCP port on 127.0.0.1 of the current network namespace.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .unwrap()
        .port()
}

/// A real etcd (`/usr/bin/etcd`) with a temp data dir, optionally inside a network namespace.
/// It listens on two client ports: `agent_url` (which tests can cut off by restarting etcd with
/// `listen_agent = false`) and `test_url` (always on).
pub struct Etcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    netns: Option<String>,
    pub agent_port: u16,
    pub test_port: u16,
    peer_port: u16,
}

impl Etcd {
    pub fn start() -> Self {
        Self::start_in(None)
    }

    /// Ports are chosen in the host namespace; a fresh netns has nothing listening, so they are
    /// free there too.
    pub fn start_in(netns: Option<&str>) -> Self {
        assert!(
            std::path::Path::new("/usr/bin/etcd").exists(),
            "/usr/bin/etcd is required by this test"
        );
        let mut e = Etcd {
            child: None,
            dir: tempfile::tempdir().expect("tempdir"),
            netns: netns.map(str::to_string),
            agent_port: free_port(),
            test_port: free_port(),
            peer_port: free_port(),
        };
        e.launch(true);
        e
    }

    pub fn agent_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.agent_port)
    }

    pub fn test_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.test_port)
    }

    /// Starts etcd; `listen_agent = false` leaves the agent's port closed.
    pub fn launch(&mut self, listen_agent: bool) {
        assert!(self.child.is_none(), "etcd already running");
        let mut urls = vec![self.test_url()];
        if listen_agent {
            urls.push(self.agent_url());
        }
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "/usr/bin/etcd"]);
                c
            }
            None => Command::new("/usr/bin/etcd"),
        };
        cmd.args(["--name", "t", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &urls.join(",")])
            .args(["--advertise-client-urls", &self.test_url()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.child = Some(cmd.spawn().expect("spawn etcd"));
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self
                .etcdctl(&["endpoint", "health"])
                .output()
                .expect("run etcdctl");
            if out.status.success() {
                return;
            }
            assert!(Instant::now() < deadline, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `etcdctl` against the test port (in the netns if there is one).
    pub fn etcdctl(&self, args: &[&str]) -> Command {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "etcdctl"]);
                c
            }
            None => Command::new("etcdctl"),
        };
        cmd.env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.test_url()])
            .args(args);
        cmd
    }

    fn ctl(&self, args: &[&str], stdin: Option<&[u8]>) -> String {
        let mut child = self
            .etcdctl(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn etcdctl");
        if let Some(data) = stdin {
            child.stdin.take().unwrap().write_all(data).unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Puts a key and returns the revision of the write.
    pub fn put(&self, key: &str, value: &str) -> i64 {
        // The value goes through stdin so it may start with '-'.
        self.ctl(&["put", key], Some(value.as_bytes()));
        self.revision()
    }

    pub fn delete(&self, key: &str) -> i64 {
        self.ctl(&["del", key], None);
        self.revision()
    }

    pub fn revision(&self) -> i64 {
        let out = self.ctl(&["endpoint", "status", "-w", "json"], None);
        let v: serde_json::Value = serde_json::from_str(&out).expect("endpoint status json");
        v[0]["Status"]["header"]["revision"]
            .as_i64()
            .expect("revision in endpoint status")
    }

    pub fn compact(&self, revision: i64) {
        self.ctl(&["compact", &revision.to_string(), "--physical"], None);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

static NETNS_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A network namespace `fxa-<pid>-<n>` with loopback up; deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new() -> Self {
        let name = format!(
            "fxa-{}-{}",
            std::process::id(),
            NETNS_SEQ.fetch_add(1, Ordering::SeqCst)
        );
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns { name };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs a command in the namespace and returns its stdout (panics on failure).
    pub fn exec(&self, args: &[&str]) -> String {
        run(self.command(args[0]).args(&args[1..]))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
    }
}

pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `GET path` over plain HTTP/1.1; returns (status code, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(70)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((code, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A temp directory path that lives as long as the returned guard.
pub fn state_dir() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("state");
    (d, p)
}

/// Runs `f` on a thread that has joined network namespace `ns` (setns affects only that thread).
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    use std::os::fd::AsRawFd;
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        // SAFETY: setns on a valid namespace fd changes only this thread's network namespace.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("netns thread panicked")
}

/// A `felixrs agent` process inside a netns; killed on drop.
pub struct Agent {
    child: Option<Child>,
    pub netns: String,
    pub health: SocketAddr,
    log: PathBuf,
}

impl Agent {
    pub fn start(netns: &str, etcd_url: &str, state_dir: &std::path::Path) -> Self {
        let port = free_port();
        let health: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let log = state_dir.with_extension(format!("agent-{port}.log"));
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                netns,
                env!("CARGO_BIN_EXE_felixrs"),
                "agent",
            ])
            .args(["--etcd-endpoints", etcd_url, "--node-name", "node-1"])
            .arg("--state-dir")
            .arg(state_dir)
            .args(["--health-listen", &health.to_string()])
            .args(["--iptables-backend", "nft", "--etcd-timeout", "1"])
            .args(["--log", "info"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("agent log file"))
            .spawn()
            .expect("spawn felixrs agent");
        let a = Agent {
            child: Some(child),
            netns: netns.to_string(),
            health,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while a.get("/liveness").is_err() {
            assert!(Instant::now() < deadline, "agent did not start serving");
            std::thread::sleep(Duration::from_millis(50));
        }
        a
    }

    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let (addr, path) = (self.health, path.to_string());
        in_netns(&self.netns, move || http_get(addr, &path))
    }

    pub fn status(&self) -> serde_json::Value {
        let (code, body) = self.get("/status").expect("GET /status");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("status json")
    }

    /// Waits until `applied_revision >= rev` (long poll), returning the status.
    pub fn wait_applied(&self, rev: i64) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, body) = self
                .get(&format!("/status?min_revision={rev}&timeout_ms=5000"))
                .expect("GET /status");
            let s: serde_json::Value = serde_json::from_str(&body).expect("status json");
            if s["applied_revision"].as_i64().unwrap_or(0) >= rev {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "applied_revision never reached {rev}: {s}"
            );
        }
    }

    pub fn signal(&mut self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// Waits for exit; returns the exit status.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.take().expect("agent running").wait().unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("---- agent log {} ----\n{log}", self.log.display());
        }
    }
}
