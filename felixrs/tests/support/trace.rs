//! The offline tools' fixture: manifests in a temporary directory, `felixrs` run on them for
//! node-1 (as `trace` and `render` read a cluster without etcd), and the report's verdict.

use std::path::Path;
use std::process::Command;

/// A temporary directory holding `files` (file name, YAML text).
pub fn manifests(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

/// `felixrs ARGS --node-name node-1 --manifests DIR` (ARGS split at spaces): its output, asserting
/// that it succeeded.
pub fn felixrs(dir: impl AsRef<Path>, args: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(args.split_whitespace())
        .args(["--node-name", "node-1", "--manifests"])
        .arg(dir.as_ref())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "felixrs {args}: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The `verdict:` line of a `felixrs trace` report.
pub fn verdict(text: &str) -> &str {
    text.lines()
        .find_map(|l| l.strip_prefix("verdict: "))
        .unwrap_or_else(|| panic!("no verdict in:\n{text}"))
}

/// Asserts `text` contains each of `wants`, naming the first missing.
pub fn assert_contains(text: &str, wants: &[&str]) {
    for want in wants {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}
