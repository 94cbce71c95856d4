//! Network namespaces owned by a test.
//!
//! A [`Netns`] is created with `ip netns add` under a unique name `fxt-<pid>-[<tag>]<n>` (the pid keeps
//! concurrent test binaries apart, the counter the tests of one binary), gets its loopback up, and is
//! always deleted on drop, also when the test panics; processes still running inside are killed first so
//! the namespace really goes away. Sockets join a namespace per thread with `setns(2)`
//! ([`in_netns`], [`Netns::in_thread`], [`enter`]): only that thread moves, never the test process.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::tools::{require_root, require_tools, run_checked};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The common prefix of every namespace the tests create (`ip netns list | grep fxt-` finds leftovers).
pub const PREFIX: &str = "fxt-";

/// A fresh name `fxt-<pid>-<tag><n>`, unique within this machine while this process lives.
pub fn unique_name(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    format!("{PREFIX}{}-{tag}{n}", std::process::id())
}

/// Where iproute2 keeps the namespace called `name`.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(format!("/var/run/netns/{name}"))
}

/// Moves the calling thread (only it) into namespace `name`; sockets it creates afterwards live there.
pub fn enter(name: &str) -> io::Result<()> {
    let p = path(name);
    let f = File::open(&p)
        .map_err(|e| io::Error::new(e.kind(), format!("open netns {}: {e}", p.display())))?;
    // SAFETY: setns on a valid namespace fd changes only the calling thread's network namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("setns into {}: {e}", p.display()),
        ));
    }
    Ok(())
}

/// Runs `f` on a fresh thread inside namespace `name` and returns its result; a panic in `f` (or a
/// failed `setns`) is re-raised in the caller.
pub fn in_netns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let name = name.to_string();
    let joined = std::thread::spawn(move || {
        enter(&name).unwrap_or_else(|e| panic!("{e}"));
        f()
    })
    .join();
    match joined {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// A network namespace that exists exactly as long as this value.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// A fresh namespace `fxt-<pid>-<n>` with loopback up. Panics (naming the problem) when not root
    /// or when `ip` is missing.
    pub fn new() -> Netns {
        Netns::with_tag("")
    }

    /// Like [`Netns::new`] with `tag` in the name (`fxt-<pid>-<tag><n>`), to tell namespaces apart in
    /// logs.
    pub fn with_tag(tag: &str) -> Netns {
        let name = unique_name(tag);
        Netns::create(name.clone()).unwrap_or_else(|e| panic!("create netns {name}: {e}"))
    }

    /// Creates the namespace `name` with loopback up. Panics when not root or `ip` is missing (setup
    /// errors); other failures are returned.
    pub fn create(name: impl Into<String>) -> io::Result<Netns> {
        require_root();
        require_tools(&["ip"]);
        let name = name.into();
        run_checked(Command::new("ip").args(["netns", "add", &name]))?;
        // From here on the guard deletes it, also if bringing loopback up fails.
        let ns = Netns { name };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip netns exec <name> <program>`: add arguments, stdio and spawn.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Runs `argv` inside the namespace; an error carrying its stderr when it fails.
    pub fn exec(&self, argv: &[&str]) -> io::Result<Output> {
        let (program, args) = argv.split_first().expect("exec needs a program");
        run_checked(self.command(program).args(args))
    }

    /// Runs `argv` inside the namespace and returns its output whatever the exit status.
    pub fn exec_unchecked(&self, argv: &[&str]) -> io::Result<Output> {
        let (program, args) = argv.split_first().expect("exec needs a program");
        self.command(program).args(args).output()
    }

    /// Runs a command inside the namespace and returns its output whatever the exit status; panics only
    /// when it cannot be started.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {program} in {}: {e}", self.name))
    }

    /// Runs a command inside the namespace and returns its stdout; panics with its stderr on failure.
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

    /// Feeds `stdin` to a command inside the namespace and returns its stdout; panics with its stderr
    /// and the input on failure.
    pub fn feed(&self, program: &str, args: &[&str], stdin: &str) -> String {
        let mut child = self
            .command(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {program} in {}: {e}", self.name));
        // A command that exits early closes its stdin; its exit status tells what went wrong.
        let _ = child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(stdin.as_bytes());
        let out = child.wait_with_output().expect("wait for command");
        assert!(
            out.status.success(),
            "{program} {args:?} in {} failed: {}\ninput:\n{stdin}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `sysctl -w key=value` inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> io::Result<()> {
        self.exec(&["sysctl", "-qw", &format!("{key}={value}")])
            .map(drop)
    }

    /// Runs `f` on a thread that has joined this namespace (see [`in_netns`]).
    pub fn in_thread<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        in_netns(&self.name, f)
    }
}

impl Default for Netns {
    fn default() -> Self {
        Netns::new()
    }
}

/// Whether the named namespace is the one of pid 1 or of this process (by inode): then its
/// "pids" are the host's processes, which a guard must never kill.
pub fn shares_a_host_namespace(name: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ino = |p: &str| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    let Some(named) = ino(&format!("/run/netns/{name}")) else {
        return false;
    };
    [ino("/proc/1/ns/net"), ino("/proc/self/ns/net")]
        .into_iter()
        .any(|host| host == Some(named))
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Kill what still runs inside (agents, etcd) so the namespace can go away; never ourselves.
        let me = std::process::id().to_string();
        if shares_a_host_namespace(&self.name) {
            // `ip netns pids` would list every process of the host (the lead's shell was killed
            // this way once, when a name was bound to the host's namespace): kill nothing.
            eprintln!(
                "warning: netns {} is the host's or this process's namespace; killing nothing",
                self.name
            );
        } else if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if pid != me {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
        }
        match Command::new("ip")
            .args(["netns", "del", &self.name])
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "warning: ip netns del {} failed: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => eprintln!("warning: ip netns del {}: {e}", self.name),
        }
    }
}

/// Joins `a` and `b` with a veth pair named `a_name` (in `a`) / `b_name` (in `b`), both up. Panics on
/// failure.
pub fn veth(a: &Netns, a_name: &str, b: &Netns, b_name: &str) {
    run_checked(Command::new("ip").args([
        "link", "add", a_name, "netns", &a.name, "type", "veth", "peer", "name", b_name, "netns",
        &b.name,
    ]))
    .unwrap_or_else(|e| panic!("veth {a_name}/{b_name}: {e}"));
    a.ok("ip", &["link", "set", a_name, "up"]);
    b.ok("ip", &["link", "set", b_name, "up"]);
}

/// Two fresh namespaces joined by a veth pair (`fxv-a` in `a` with [`VethPair::ADDR_A`]/24, `fxv-b` in
/// `b` with [`VethPair::ADDR_B`]/24), for traffic between exactly two parties.
pub struct VethPair {
    pub a: Netns,
    pub b: Netns,
}

impl VethPair {
    pub const ADDR_A: &str = "10.99.0.1";
    pub const ADDR_B: &str = "10.99.0.2";

    pub fn new() -> VethPair {
        let a = Netns::new();
        let b = Netns::new();
        veth(&a, "fxv-a", &b, "fxv-b");
        a.ok(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", Self::ADDR_A),
                "dev",
                "fxv-a",
            ],
        );
        b.ok(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", Self::ADDR_B),
                "dev",
                "fxv-b",
            ],
        );
        VethPair { a, b }
    }
}

impl Default for VethPair {
    fn default() -> Self {
        VethPair::new()
    }
}
