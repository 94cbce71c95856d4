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
/// to, packed refs); paths come from git, so linked worktrees work too. Only paths that exist are
/// named: cargo counts a missing one as changed on every build, which would rerun this script and
/// so recompile the whole package each time (a repository without `packed-refs` is common). A
/// branch without a loose ref (only in `packed-refs`) gets one on its next commit: its directory
/// is named instead, which cargo scans for changes.
fn track_head() {
    let mut paths = vec!["HEAD".to_string(), "packed-refs".to_string()];
    paths.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for path in paths {
        let Some(mut p) = git(&["rev-parse", "--git-path", &path]).map(PathBuf::from) else {
            continue;
        };
        if path.starts_with("refs/") {
            while !p.exists() && !p.ends_with("refs") && p.pop() {}
        }
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
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
