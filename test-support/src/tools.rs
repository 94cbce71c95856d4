//! Preconditions (root, tools on PATH) and running commands whose failure is a test failure.

use std::io;
use std::process::{Command, Output};

/// Panics unless the test runs as root: namespaces, iptables and ipset need it, and CI runs as root, so a
/// non-root run is a setup error, not a reason to skip.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (network namespaces, iptables, ipset): run it as root like CI does (scripts/test.sh)"
    );
}

/// Panics naming every tool in `tools` that is not an executable file on PATH (or an absolute path that
/// does not exist).
pub fn require_tools(tools: &[&str]) {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|tool| !on_path(tool))
        .collect();
    assert!(
        missing.is_empty(),
        "this test needs {missing:?} on PATH (scripts/debian-packages.txt lists what to install: iproute2, iptables, ipset, etcd-server, etcd-client, openssl)"
    );
}

fn on_path(tool: &str) -> bool {
    if tool.contains('/') {
        return std::path::Path::new(tool).is_file();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

/// Runs `cmd` and returns its output; an error (naming the command and carrying its stderr) if it cannot
/// start or exits non-zero.
pub fn run_checked(cmd: &mut Command) -> io::Result<Output> {
    let out = cmd
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run {cmd:?}: {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out)
}
