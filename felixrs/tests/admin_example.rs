//! `felixrs render` and `trace` on examples/admin-policy: what the README says about it holds.

use std::path::PathBuf;
use std::process::Command;

fn felixrs(args: &[&str]) -> (bool, String, String) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/admin-policy");
    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(args)
        .args(["--node-name", "node-1", "--manifests"])
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The verdict line and the "allowed by"/"dropped by" lines of a trace.
fn trace(args: &str) -> (String, String) {
    let mut argv = vec!["trace"];
    argv.extend(args.split_whitespace());
    let (ok, text, err) = felixrs(&argv);
    assert!(ok, "{err}");
    let verdict = text
        .lines()
        .find_map(|l| l.strip_prefix("verdict: "))
        .unwrap_or_else(|| panic!("no verdict in:\n{text}"))
        .to_string();
    let deciders = text
        .lines()
        .filter(|l| l.contains("allowed by") || l.contains("dropped by"))
        .collect::<Vec<_>>()
        .join("\n");
    (verdict, deciders)
}

#[test]
fn every_document_converts_and_the_tiers_render_in_calicos_order() {
    let (ok, text, err) = felixrs(&["render"]);
    assert!(ok, "{err}");
    assert!(!err.contains("skipped"), "a document was skipped: {err}");
    let pos = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in the render"))
    };
    let admin = pos("Start of tier kube-admin");
    let default = pos("Start of tier default");
    let baseline = pos("Start of tier kube-baseline");
    assert!(admin < default && default < baseline);
    assert!(
        text.contains("name=deny-from-sandbox"),
        "rule names are comments"
    );
}

#[test]
fn the_readme_traces() {
    let (v, by) = trace("--from sandbox/dev-0 --to shop/web-0 --protocol tcp --port 8080");
    assert_eq!(v, "DROP");
    assert!(
        by.contains(
            "dropped by ingress of GlobalNetworkPolicy kanp.adminnetworkpolicy.sandbox-isolation"
        ),
        "{by}"
    );
    let (v, by) =
        trace("--from monitoring/prometheus-0 --to shop/web-0 --protocol tcp --port 8080");
    assert!(v.starts_with("ACCEPT"), "{v}");
    assert!(by.contains("kanp.adminnetworkpolicy.sre-scrape"), "{by}");
    let (v, by) =
        trace("--from monitoring/prometheus-0 --to shop/web-0 --protocol tcp --port 9090");
    assert_eq!(v, "DROP");
    assert!(
        by.contains("kbanp.baselineadminnetworkpolicy.default"),
        "{by}"
    );
    let (v, by) = trace("--from monitoring/prometheus-0 --to shop/db-0 --protocol tcp --port 5432");
    assert_eq!(v, "DROP");
    assert!(by.contains("shop/node--1-k8s-db--0-eth0"), "{by}");
    let (v, by) = trace("--from shop/web-0 --to shop/db-0 --protocol tcp --port 5432");
    assert!(v.starts_with("ACCEPT"), "{v}");
    assert!(
        by.contains("NetworkPolicy shop/knp.default.db-from-web"),
        "{by}"
    );
}
