//! Network namespaces for root tests: each [`Netns`] is `fxt-<pid>-<n>`, created on construction
//! and deleted on drop (also when the test panics), so every test has its own iptables tables and
//! IP sets, isolated from the host and from the other tests.

#![allow(dead_code)]

use std::os::fd::AsRawFd;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use iptables::apply::ExecRunner;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Tools the kernel tests need; a missing one fails the test loudly (never a silent skip).
pub const REQUIRED_TOOLS: &[&str] = &[
    "ip",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-legacy-save",
    "ip6tables-nft-save",
    "ipset",
];

pub fn require_tools() {
    for tool in REQUIRED_TOOLS {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        assert!(
            found,
            "kernel tests need `{tool}` on PATH (install iptables, ipset, iproute2)"
        );
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "kernel tests create network namespaces and must run as root"
    );
}

/// A network namespace deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new() -> Netns {
        require_tools();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("fxt-{}-{n}", std::process::id());
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .expect("run ip netns add");
        assert!(
            out.status.success(),
            "ip netns add {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ns = Netns { name };
        ns.ok("ip", &["link", "set", "lo", "up"]);
        ns
    }

    pub fn runner(&self) -> ExecRunner {
        ExecRunner::in_netns(&self.name).expect("valid netns name")
    }

    /// Runs a command inside the namespace.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {program} in {}: {e}", self.name))
    }

    /// Runs a command inside the namespace and returns its stdout; panics on failure.
    pub fn ok(&self, program: &str, args: &[&str]) -> String {
        let out = self.run(program, args);
        assert!(
            out.status.success(),
            "{program} {args:?} in {} failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Feeds `stdin` to a command inside the namespace; panics on failure.
    pub fn feed(&self, program: &str, args: &[&str], stdin: &str) -> String {
        use iptables::apply::Runner;
        let out = self
            .runner()
            .run(program, args, Some(stdin.as_bytes()))
            .expect("spawn");
        assert!(
            out.status.success(),
            "{program} {args:?} in {} failed: {}\ninput:\n{stdin}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `f` on a thread that has joined this namespace (for sockets inside it).
    pub fn in_thread<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            // SAFETY: setns on a valid namespace fd only changes this thread's network namespace.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("netns thread panicked")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Two namespaces joined by a veth pair: `a` has 10.99.0.1/24, `b` has 10.99.0.2/24.
pub struct VethPair {
    pub a: Netns,
    pub b: Netns,
}

pub const ADDR_A: &str = "10.99.0.1";
pub const ADDR_B: &str = "10.99.0.2";

/// Joins `a` and `b` with a veth pair named `a_name` (in `a`) / `b_name` (in `b`), both up.
pub fn veth(a: &Netns, a_name: &str, b: &Netns, b_name: &str) {
    let out = Command::new("ip")
        .args([
            "link", "add", a_name, "netns", &a.name, "type", "veth", "peer", "name", b_name,
            "netns", &b.name,
        ])
        .output()
        .expect("ip link add");
    assert!(
        out.status.success(),
        "ip link add veth {a_name}/{b_name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    a.ok("ip", &["link", "set", a_name, "up"]);
    b.ok("ip", &["link", "set", b_name, "up"]);
}

impl VethPair {
    pub fn new() -> VethPair {
        let a = Netns::new();
        let b = Netns::new();
        veth(&a, "fxv-a", &b, "fxv-b");
        a.ok(
            "ip",
            &["addr", "add", &format!("{ADDR_A}/24"), "dev", "fxv-a"],
        );
        b.ok(
            "ip",
            &["addr", "add", &format!("{ADDR_B}/24"), "dev", "fxv-b"],
        );
        VethPair { a, b }
    }
}
