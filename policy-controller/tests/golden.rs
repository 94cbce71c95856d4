//! Golden conversion tests: `tests/golden/<case>.yaml` (k8s and v3 manifests) must convert to exactly
//! `tests/golden/<case>.json`: every etcd key with its stored JSON, and every skip report.
//!
//! `UPDATE_GOLDEN=1 cargo test -p policy-controller --test golden` rewrites the expected files; review
//! the diff before committing.

use std::path::{Path, PathBuf};

use policy_controller::{ConvertOptions, load_manifests};
use serde_json::{Value, json};

fn render(case: &Path) -> Value {
    let set = load_manifests(&[case.to_path_buf()], &ConvertOptions::default()).expect("load");
    let resources: serde_json::Map<String, Value> = set
        .resources
        .iter()
        .map(|(k, r)| {
            (
                k.clone(),
                serde_json::from_str(&r.to_json()).expect("stored JSON parses"),
            )
        })
        .collect();
    let skipped: Vec<Value> = set
        .skipped
        .iter()
        .map(|s| {
            json!({
                "document": s.document,
                "kind": s.report.kind,
                "namespace": s.report.namespace,
                "name": s.report.name,
                "field": s.report.field,
                "message": s.report.message,
            })
        })
        .collect();
    json!({ "resources": resources, "skipped": skipped, "retain": set.retain })
}

fn check(case: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let got = render(&dir.join(format!("{case}.yaml")));
    let expected_path = dir.join(format!("{case}.json"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let text = serde_json::to_string_pretty(&got).unwrap() + "\n";
        std::fs::write(&expected_path, text).unwrap();
    }
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", expected_path.display())),
    )
    .unwrap();
    pretty_assertions::assert_eq!(got, expected, "golden case {case}");
}

#[test]
fn networkpolicy() {
    check("networkpolicy");
}

#[test]
fn namespace_and_serviceaccount() {
    check("namespace");
}

#[test]
fn pod() {
    check("pod");
}

#[test]
fn invalid_objects_are_reported_and_the_rest_synced() {
    check("invalid");
}

#[test]
fn v3_resources_pass_through() {
    check("v3");
}

/// The stored JSON is exactly the model's canonical encoding (what the agent decodes).
#[test]
fn stored_values_are_model_canonical() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let set = load_manifests(&[dir], &ConvertOptions::default()).unwrap();
    assert!(set.resources.len() > 10);
    for (key, r) in &set.resources {
        let json = r.to_json();
        let (rk, res) = calc_graph::model::Validated::from_etcd(key, json.as_bytes())
            .unwrap_or_else(|e| panic!("{key}: {e}"))
            .into_parts();
        assert_eq!(&rk.etcd_key(), key);
        assert_eq!(res.to_json(), json, "{key} is not canonical");
    }
}

#[test]
fn admin_policies_every_field() {
    check("admin");
}

#[test]
fn admin_domain_names_become_calico_domains() {
    check("admin_domains");
}

#[test]
fn invalid_admin_policies_name_the_field_and_fail_closed() {
    check("admin_invalid");
}
