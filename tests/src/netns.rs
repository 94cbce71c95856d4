//! Network namespaces owned by a test: created with `ip netns add`, always deleted on drop (also when the
//! test panics), and entered per thread with `setns(2)` so probes and servers run in-process.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique name prefix for this test process: `fxe<pid>` plus a per-call counter keeps parallel
/// tests and concurrent CI runs apart, and makes leftovers easy to find (`ip netns list | grep fxe`).
pub fn unique_name(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Interface and namespace names are short-lived; keep them within IFNAMSIZ-friendly lengths.
    format!("fxe{}{}{}", std::process::id() % 100_000, tag, n)
}

/// A network namespace that exists for as long as this value lives.
pub struct Netns {
    name: String,
}

impl Netns {
    pub fn create(name: impl Into<String>) -> Result<Netns> {
        let name = name.into();
        run("ip", &["netns", "add", &name]).with_context(|| format!("creating netns {name}"))?;
        let ns = Netns { name };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs a command inside the namespace and fails with its stderr if it fails.
    pub fn exec(&self, argv: &[&str]) -> Result<Output> {
        let mut args = vec!["netns", "exec", &self.name];
        args.extend_from_slice(argv);
        run("ip", &args)
    }

    /// Runs a command inside the namespace and returns its output whatever the exit status.
    pub fn exec_unchecked(&self, argv: &[&str]) -> Result<Output> {
        let mut args = vec!["netns", "exec", &self.name];
        args.extend_from_slice(argv);
        Command::new("ip")
            .args(&args)
            .output()
            .with_context(|| format!("running {argv:?} in {}", self.name))
    }

    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.exec(&["sysctl", "-qw", &format!("{key}={value}")])?;
        Ok(())
    }

    /// Moves the calling thread into this namespace. Only the network namespace of this one thread
    /// changes; sockets created afterwards live in the namespace for their whole life.
    pub fn enter_current_thread(&self) -> Result<()> {
        let f = File::open(format!("/var/run/netns/{}", self.name))
            .with_context(|| format!("opening netns {}", self.name))?;
        // SAFETY: setns on a valid namespace fd affects only the calling thread's network namespace.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            bail!(
                "setns into {} failed: {}",
                self.name,
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Runs `f` on a fresh thread inside this namespace and returns its result.
    pub fn run_in<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            enter(&path)?;
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("thread in netns panicked"))?
    }
}

/// Enters the namespace at `path` (a `/var/run/netns/<name>` file) on the calling thread.
pub fn enter(path: &str) -> Result<()> {
    let f = File::open(path).with_context(|| format!("opening {path}"))?;
    // SAFETY: see `Netns::enter_current_thread`.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        bail!(
            "setns into {path} failed: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Kill anything still running inside (agents, etcd) so the namespace can go away.
        let _ = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .map(|o| {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            });
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs a program and fails with its stderr when it exits non-zero.
pub fn run(program: &str, args: &[&str]) -> Result<Output> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} (is it installed?)"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Fails loudly, never skips, when not root: the kernel datapath tests are part of CI, which is root.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "end-to-end tests need root (network namespaces, iptables): run scripts/test.sh as root"
    );
}
