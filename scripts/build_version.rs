// The commit part of the version string `felixrs --version` and `policy-controller --version`
// print, made at build time by each binary's package build script (`felixrs/build.rs`,
// `policy-controller/build.rs` include this file) as FELIXRS_BUILD_COMMIT; the binaries'
// `main.rs` put it together with the package version (`scripts/version_string.rs`):
// `<package version> (<commit>)`.
//
// Release builds (what the image ships) carry the git commit and are rebuilt when HEAD moves; the
// commit comes from FELIXRS_GIT_COMMIT when set (a build without .git, e.g. from a source tarball),
// else from `git`, else "unknown commit". Debug builds say "debug build" instead: tracking HEAD
// there would recompile the whole package on every commit of the edit-test loop.
//
// The optional `+<extra>` suffix (FELIXRS_VERSION_EXTRA, e.g. the upgrade test's `-next` image) is
// not read here: whatever a build script reads reaches every unit of its package, so the `-next`
// image would rebuild both packages' libraries; `main.rs` reads it with `option_env!`, which only
// the binaries' units track, so only they recompile.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// Reruns this build script when the commit HEAD names changes (HEAD itself, the branch it points
/// to, packed refs); paths come from git, so linked worktrees work too.
fn track_head() {
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={}", PathBuf::from(p).display());
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &branch])
    {
        println!("cargo:rerun-if-changed={}", PathBuf::from(p).display());
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FELIXRS_GIT_COMMIT");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let commit = if !release {
        "debug build".to_string()
    } else if let Some(c) = std::env::var("FELIXRS_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        format!("commit {c}")
    } else {
        track_head();
        git(&["rev-parse", "--short=12", "HEAD"])
            .map(|c| format!("commit {c}"))
            .unwrap_or_else(|| "unknown commit".to_string())
    };
    println!("cargo:rustc-env=FELIXRS_BUILD_COMMIT={commit}");
}
