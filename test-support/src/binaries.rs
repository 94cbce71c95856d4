//! The workspace's built binaries for tests of another package (which `CARGO_BIN_EXE_*` does not
//! cover): `target/<profile>/<name>`, next to the test executable's `deps` directory.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The binary `name` built from the workspace crates `source_crates`. Panics, naming the fix, when it
/// is missing or older than a source file of those crates: `cargo test -p X` does not rebuild
/// another package's binaries, and a run that passes on a stale binary proves nothing.
pub fn workspace_binary(name: &str, source_crates: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace's binaries first (`cargo build --workspace --bins`)",
        path.display()
    );
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .expect("binary mtime");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    for krate in source_crates {
        if let Some((newest, file)) = newest_file(&root.join(krate).join("src"))
            && newest > built
        {
            panic!(
                "{} is older than {}: rebuild the binaries (`cargo build --workspace --bins`)",
                path.display(),
                file.display()
            );
        }
    }
    path
}

/// The most recently modified file under `dir` (recursively), with its time.
fn newest_file(dir: &Path) -> Option<(SystemTime, PathBuf)> {
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let p = entry.path();
        let candidate = if p.is_dir() {
            newest_file(&p)
        } else {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .map(|t| (t, p))
        };
        if let Some(c) = candidate
            && newest.as_ref().is_none_or(|n| c.0 > n.0)
        {
            newest = Some(c);
        }
    }
    newest
}
