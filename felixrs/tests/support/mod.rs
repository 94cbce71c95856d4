//! Test support only felixrs's tests use: the Calico key prefix, state dirs and the `felixrs agent`
//! process wrapper; [`trace`], the offline tools' fixture. Namespaces, etcd, HTTP and free ports
//! come from `felixrs-test-support`; every resource is released on drop (also on panic).
#![allow(dead_code)]

pub mod trace;

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::{Netns, in_netns};
use felixrs_test_support::node::{Pod, add_pod, exec};
use felixrs_test_support::{free_port, http};
use serde_json::json;

pub const PREFIX: &str = "/calico/resources/v3/projectcalico.org/";

/// Stores `v` at `PREFIX + key`; returns the revision.
pub fn put_json(etcd: &Etcd, key: &str, v: serde_json::Value) -> i64 {
    etcd.put(&format!("{PREFIX}{key}"), &v.to_string())
}

/// The default tier.
pub fn put_default_tier(etcd: &Etcd) -> i64 {
    put_json(
        etcd,
        "tiers/default",
        json!({"apiVersion":"projectcalico.org/v3","kind":"Tier",
               "metadata":{"name":"default"},"spec":{"order":1000000}}),
    )
}

/// Pod `ns1/web` (app=web, 10.70.0.1) on node-1 behind `iface`, naming `profiles`.
pub fn put_web_endpoint(etcd: &Etcd, iface: &str, profiles: &[&str]) -> i64 {
    put_json(
        etcd,
        "workloadendpoints/ns1/node--1-k8s-web-eth0",
        json!({"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint",
               "metadata":{"name":"node--1-k8s-web-eth0","namespace":"ns1",
                           "labels":{"app":"web","projectcalico.org/namespace":"ns1",
                                     "projectcalico.org/orchestrator":"k8s"}},
               "spec":{"orchestrator":"k8s","node":"node-1","pod":"web","endpoint":"eth0",
                       "interfaceName":iface,"ipNetworks":["10.70.0.1/32"],
                       "profiles":profiles}}),
    )
}

/// Profile `kns.ns1`, the `ns1` pods' namespace profile: everything allowed both ways.
pub fn put_ns1_profile(etcd: &Etcd) -> i64 {
    put_json(
        etcd,
        "profiles/kns.ns1",
        json!({"apiVersion":"projectcalico.org/v3","kind":"Profile",
               "metadata":{"name":"kns.ns1"},
               "spec":{"ingress":[{"action":"Allow"}],"egress":[{"action":"Allow"}]}}),
    )
}

/// The node of the agent's one-pod tests: a new namespace with etcd in it holding the default
/// tier, [`put_ns1_profile`], pod `ns1/web` behind `cali0000000001` ([`put_web_endpoint`]) and
/// the pod's policy. Fields drop in order: etcd before the namespace.
pub struct WebNode {
    pub etcd: Etcd,
    pub ns: Netns,
    /// The revision of the policy, written last.
    pub rev: i64,
}

/// The interface of pod `ns1/web` ([`put_web_endpoint`]'s 10.70.0.1).
pub const WEB_IFACE: &str = "cali0000000001";

impl WebNode {
    /// The node with NetworkPolicy `ns1/<policy>` of v3 spec `spec`.
    pub fn start(policy: &str, spec: serde_json::Value) -> Self {
        let ns = Netns::new();
        let etcd = Etcd::start_in(ns.name());
        put_default_tier(&etcd);
        put_ns1_profile(&etcd);
        put_web_endpoint(&etcd, WEB_IFACE, &["kns.ns1"]);
        let rev = put_json(
            &etcd,
            &format!("networkpolicies/ns1/{policy}"),
            json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
                   "metadata":{"name":policy,"namespace":"ns1"},"spec":spec}),
        );
        WebNode { etcd, ns, rev }
    }

    /// Wires pod `ns1/web` (10.70.0.1, fd70::1) behind its veth and makes the node answer it on
    /// `host` (a /32 on lo). Proxy ARP answers for the pod's gateway 169.254.1.1 only on a
    /// forwarding node that routes it elsewhere: a default route out of a veth pair of its own
    /// (nothing is sent there).
    pub fn add_web_pod(&self, host: &str) -> Pod {
        let ns = &self.ns;
        exec(
            ns,
            &["ip", "addr", "add", &format!("{host}/32"), "dev", "lo"],
        );
        for argv in [
            "ip link set lo up",
            "ip link add up0 type veth peer name up1",
            "ip addr add 10.70.254.1/24 dev up0",
            "ip link set up0 up",
            "ip link set up1 up",
            "ip route add default via 10.70.254.2",
        ] {
            exec(ns, &argv.split(' ').collect::<Vec<_>>());
        }
        ns.sysctl("net.ipv4.ip_forward", "1").unwrap();
        ns.sysctl("net.ipv4.conf.all.rp_filter", "0").unwrap();
        ns.sysctl("net.ipv4.conf.default.rp_filter", "0").unwrap();
        add_pod(ns, WEB_IFACE, "10.70.0.1", "fd70::1")
    }
}

/// A temp directory path that lives as long as the returned guard.
pub fn state_dir() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("state");
    (d, p)
}

/// The agent binary: this build's, or `FELIXRS_AGENT_BIN` (benchmarks compare two builds in
/// alternating runs).
pub fn agent_bin() -> String {
    std::env::var("FELIXRS_AGENT_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_felixrs").into())
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
        Self::start_with(netns, etcd_url, state_dir, &[] as &[&str])
    }

    /// Like [`Agent::start`] with extra command-line arguments (e.g. the etcd TLS flags).
    pub fn start_with(
        netns: &str,
        etcd_url: &str,
        state_dir: &std::path::Path,
        extra: &[impl AsRef<OsStr>],
    ) -> Self {
        let a = Self::spawn(netns, etcd_url, state_dir, extra, &[]);
        // Polled often: the restart benchmark times from the spawn to "programmed" through this.
        let deadline = Instant::now() + Duration::from_secs(20);
        while a.get("/liveness").is_err() {
            assert!(Instant::now() < deadline, "agent did not start serving");
            std::thread::sleep(Duration::from_millis(5));
        }
        a
    }

    /// Starts the process with extra arguments and environment variables, without waiting for it
    /// to serve.
    pub fn spawn(
        netns: &str,
        etcd_url: &str,
        state_dir: &std::path::Path,
        extra: &[impl AsRef<OsStr>],
        env: &[(&str, &str)],
    ) -> Self {
        let port = free_port();
        let health: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let log = state_dir.with_extension(format!("agent-{port}.log"));
        let child = Command::new("ip")
            .args(["netns", "exec", netns, &agent_bin(), "agent"])
            .args(["--etcd-endpoints", etcd_url, "--node-name", "node-1"])
            .arg("--state-dir")
            .arg(state_dir)
            .args(["--health-listen", &health.to_string()])
            .args(["--etcd-timeout", "1"])
            // nft unless the test chose.
            .args(
                match extra.iter().any(|a| a.as_ref() == "--iptables-backend") {
                    true => &[][..],
                    false => &["--iptables-backend", "nft"][..],
                },
            )
            // No `--log`: its default (info) leaves FelixConfiguration's logSeverityScreen in force.
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("agent log file"))
            .spawn()
            .expect("spawn felixrs agent");
        Agent {
            child: Some(child),
            netns: netns.to_string(),
            health,
            log,
        }
    }

    /// Waits up to `timeout` for the process to exit by itself; its exit status, if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().expect("agent running");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait agent") {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let (addr, path) = (self.health, path.to_string());
        in_netns(&self.netns, move || http::get(addr, &path))
    }

    /// What the agent has logged so far (stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
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

    /// Polls `/status` until `done` holds or `timeout` passes; returns the last status.
    pub fn poll_status(
        &self,
        timeout: Duration,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.status();
            if done(&s) || Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn signal(&mut self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// The agent's process id while it runs (`ip netns exec` execs the agent in its place).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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
