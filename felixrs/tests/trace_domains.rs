//! `felixrs trace` with a domain rule: the learned DNS map (`--dns-learned FILE`, or the state
//! dir's `dns-learned.json`) fills the domain set as the agent's was filled, so a learned address
//! is allowed "by domain rule api.example.com (learned 12 s ago, TTL 60 s)", and an address never
//! learned (or expired) is not.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use support::trace::verdict;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The demo cluster plus a GlobalNetworkPolicy letting web reach api.example.com and
/// *.cdn.example.net on 443.
fn manifests(dir: &Path) -> Vec<PathBuf> {
    let gnp = dir.join("domains.yaml");
    std::fs::write(
        &gnp,
        r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: web-to-api}
spec:
  order: 1
  selector: app == 'web'
  types: [Egress]
  egress:
  - action: Allow
    protocol: TCP
    destination: {domains: [api.example.com, "*.cdn.example.net"], ports: [443]}
"#,
    )
    .unwrap();
    vec![
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-cluster"),
        gnp,
    ]
}

fn learned_file(dir: &Path) -> PathBuf {
    let now = now_ms();
    let path = dir.join("dns-learned.json");
    let row = |name: &str, addr: &str, ago: u64, ttl: u64| {
        format!(
            r#"{{"name":"{name}","addr":"{addr}","learned_at_ms":{},"ttl_secs":{ttl},"expires_at_ms":{}}}"#,
            now - ago * 1000,
            now - ago * 1000 + ttl * 1000
        )
    };
    let rows = [
        row("api.example.com", "192.0.2.1", 12, 60),
        row("img.cdn.example.net", "192.0.2.5", 3, 300),
        // Expired: the address is not allowed any more.
        row("api.example.com", "192.0.2.9", 100, 60),
    ];
    std::fs::write(
        &path,
        format!(r#"{{"version":1,"entries":[{}]}}"#, rows.join(",")),
    )
    .unwrap();
    path
}

fn trace(manifests: &[PathBuf], extra: &[&str], to: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["trace", "--node-name", "node-1", "--manifests"])
        .args(manifests)
        .args(["--from", "shop/web-0", "--to", to, "--port", "443"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_learned_address_is_allowed_by_its_domain_rule_with_age_and_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let m = manifests(dir.path());
    let file = learned_file(dir.path());
    let file = file.to_str().unwrap();
    let text = trace(&m, &["--dns-learned", file], "192.0.2.1");
    assert!(verdict(&text).starts_with("ACCEPT"), "{text}");
    // The age is whole seconds since learning: 12, or 13 on a slow machine.
    let line = text
        .lines()
        .find(|l| l.contains("allowed by domain rule api.example.com (learned "))
        .unwrap_or_else(|| panic!("no domain line in:\n{text}"));
    assert!(
        line.ends_with("(learned 12 s ago, TTL 60 s)")
            || line.ends_with("(learned 13 s ago, TTL 60 s)"),
        "{line}"
    );
    // A wildcard names the learned name too.
    let text = trace(&m, &["--dns-learned", file], "192.0.2.5");
    assert!(verdict(&text).starts_with("ACCEPT"), "{text}");
    assert!(
        text.contains("allowed by domain rule *.cdn.example.net (img.cdn.example.net learned "),
        "{text}"
    );
    // Never learned, and expired: the domain rule does not match, the default tier drops.
    for to in ["192.0.2.2", "192.0.2.9"] {
        let text = trace(&m, &["--dns-learned", file], to);
        assert_eq!(verdict(&text), "DROP", "{to}:\n{text}");
        assert!(!text.contains("domain rule"), "{text}");
    }
    // Without a learned map nothing is allowed by the domain rule.
    let text = trace(&m, &[], "192.0.2.1");
    assert_eq!(verdict(&text), "DROP", "{text}");
}

#[test]
fn a_missing_learned_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let m = manifests(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["trace", "--node-name", "node-1", "--manifests"])
        .args(&m)
        .args(["--from", "shop/web-0", "--to", "192.0.2.1", "--port", "443"])
        .args(["--dns-learned", "/nonexistent/dns-learned.json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/dns-learned.json"), "{err}");
}

/// On the node: `--state-dir` reads the agent's snapshot and its `dns-learned.json` beside it.
#[test]
fn the_state_dir_brings_its_learned_map() {
    use felixrs::agent::snapshot::{Snapshot, SnapshotStore};
    let dir = tempfile::tempdir().unwrap();
    let m = manifests(dir.path());
    let set = k8s_convert::load_manifests(&m, &k8s_convert::ConvertOptions::default()).unwrap();
    let state = dir.path().join("state");
    let kvs = set
        .resources
        .into_iter()
        .map(|(k, r)| (k.as_str().into(), r.to_json().as_bytes().into()))
        .collect();
    SnapshotStore::new(&state)
        .save(&Snapshot { revision: 7, kvs })
        .unwrap();
    std::fs::copy(learned_file(dir.path()), state.join("dns-learned.json")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["trace", "--node-name", "node-1", "--state-dir"])
        .arg(&state)
        .args(["--from", "shop/web-0", "--to", "192.0.2.1", "--port", "443"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(verdict(&text).starts_with("ACCEPT"), "{text}");
    assert!(
        text.contains("allowed by domain rule api.example.com (learned "),
        "{text}"
    );
}
