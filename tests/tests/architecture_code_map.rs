//! ARCHITECTURE.md's "Code map" must name only paths that exist: a file moved or deleted without
//! updating the map fails here, naming each stale path. Pure: reads files only.
//!
//! The rule, kept simple on purpose:
//! - Only the "## Code map" section is read, bullet by bullet (a line starting with `- ` and the
//!   indented lines after it).
//! - A backticked token is a path when it contains a `/` or ends in `.rs`, `.md` or `.toml`, and
//!   holds only path characters (letters, digits, `_ - . /`). Tokens starting with `/` (etcd keys)
//!   or containing a glob `*` or a placeholder `<…>` are not paths, nor are label keys whose first
//!   segment is a domain (`projectcalico.org/cluster`).
//! - A path resolves when it exists relative to the repository root, or relative to an "anchor"
//!   of its bullet or that anchor's `src/`. The anchors are the directories of the bullet's paths
//!   that resolve (a file anchors its directory) and all their ancestors, grown until nothing new
//!   resolves. So in the bullet of `calc-graph/src/model/`, `resource.rs` means
//!   `calc-graph/src/model/resource.rs`; in the bullet of `felixrs/src/dns/`, `tests/dns_support/`
//!   means `felixrs/tests/dns_support/`; in the bullet of `tests/`, `cases.rs` means
//!   `tests/src/cases.rs`; `engine/` then `read_kernel.rs` means `…/engine/read_kernel.rs`.
//! - [`NOT_IN_GIT`] lists the few names the map gives for things that are generated or git-ignored.

use std::path::{Path, PathBuf};

/// Named in the map, but not files of the repository: generated at run time or git-ignored.
const NOT_IN_GIT: &[&str] = &[
    // deploy/overlays/*/certs/: the git-ignored PEM files scripts/etcd-certs.sh makes.
    "certs/",
    // Build output of scripts/build-image.sh (the staged binaries and the cached base), there
    // only after an image build: the map names them, a plain `cargo test` has not made them.
    "target/image/",
    "target/image-base/",
];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The bullets of the "## Code map" section, each as one string.
fn code_map_bullets(architecture: &str) -> Vec<String> {
    let start = architecture
        .find("\n## Code map")
        .expect("ARCHITECTURE.md has a \"## Code map\" section");
    let body = &architecture[start + "\n## Code map".len()..];
    let body = body.find("\n## ").map_or(body, |end| &body[..end]);
    let mut bullets: Vec<String> = Vec::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("- ") {
            bullets.push(rest.to_string());
        } else if let Some(last) = bullets.last_mut() {
            last.push(' ');
            last.push_str(line.trim());
        }
    }
    bullets
}

/// The backticked tokens of `text` that the rule above calls paths.
fn paths_in(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| {
            (t.contains('/') || [".rs", ".md", ".toml"].iter().any(|e| t.ends_with(e)))
                && !t.starts_with('/')
                && !is_label_key(t)
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
        })
        .collect()
}

/// Where `p` resolves: relative to the root, or to an anchor or the anchor's `src/`.
fn resolve(root: &Path, anchors: &[PathBuf], p: &str) -> Option<PathBuf> {
    std::iter::once(root.join(p))
        .chain(
            anchors
                .iter()
                .flat_map(|a| [a.join(p), a.join("src").join(p)]),
        )
        .find(|c| c.exists())
}

/// A label key such as `projectcalico.org/cluster`: its first segment is a domain name.
fn is_label_key(t: &str) -> bool {
    let first = t.split('/').next().unwrap_or("");
    !first.starts_with('.')
        && first.contains('.')
        && first
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-".contains(c))
        && ![".rs", ".md", ".toml"].iter().any(|e| t.ends_with(e))
}

/// The paths named in the code map that do not exist, each with the start of its bullet.
fn stale_paths(root: &Path, architecture: &str) -> Vec<String> {
    let mut stale = Vec::new();
    for bullet in code_map_bullets(architecture) {
        let paths = paths_in(&bullet);
        // Anchors grow until nothing new resolves: `engine/` under `iptables/src/apply/` anchors
        // `read_kernel.rs`.
        let mut anchors: Vec<PathBuf> = Vec::new();
        loop {
            let before = anchors.len();
            for p in &paths {
                let Some(full) = resolve(root, &anchors, p) else {
                    continue;
                };
                let dir = if full.is_dir() {
                    full
                } else {
                    full.parent().unwrap().to_path_buf()
                };
                let mut d = dir.as_path();
                while d.starts_with(root) && d != root {
                    if !anchors.iter().any(|a| a == d) {
                        anchors.push(d.to_path_buf());
                    }
                    d = d.parent().unwrap();
                }
            }
            if anchors.len() == before {
                break;
            }
        }
        for p in paths {
            if resolve(root, &anchors, p).is_none() && !NOT_IN_GIT.contains(&p) {
                let head: String = bullet.chars().take(60).collect();
                stale.push(format!("`{p}` (in the bullet \"{head}…\")"));
            }
        }
    }
    stale
}

#[test]
fn every_path_in_the_code_map_exists() {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let bullets = code_map_bullets(&text);
    assert!(
        bullets.len() >= 10,
        "only {} code map bullets",
        bullets.len()
    );
    let named: usize = bullets.iter().map(|b| paths_in(b).len()).sum();
    assert!(named >= 100, "only {named} paths in the code map");
    let stale = stale_paths(&root, &text);
    assert!(
        stale.is_empty(),
        "ARCHITECTURE.md's code map names {} path(s) that do not exist; update the map:\n{}",
        stale.len(),
        stale.join("\n")
    );
}

#[test]
fn a_missing_path_is_reported_and_a_relative_one_resolves() {
    let root = repo_root();
    let text = "# A\n\n## Code map\n\n- `tests/src/`: `lib.rs`, `gone.rs`, `tests/cases_vs_trace.rs`\n  and `no/such/dir/`.\n\n## Next\n\n- `not/checked.rs`\n";
    let stale = stale_paths(&root, text);
    assert_eq!(stale.len(), 2, "{stale:?}");
    assert!(stale[0].starts_with("`gone.rs`"), "{stale:?}");
    assert!(stale[1].starts_with("`no/such/dir/`"), "{stale:?}");
}
