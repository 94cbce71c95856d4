//! Golden tests for the resource model, driven by the fixtures in `tests/golden/`:
//!
//! * `valid/*.json`: Calico documentation examples (and what kube-controllers / the CNI plugin
//!   write in etcd mode). Each must decode, validate, re-encode to the same JSON value, decode
//!   again to the same resource, and come back through `from_etcd` under its own key.
//! * `canonical/<name>.in.json` -> `<name>.out.json`: inputs in non-canonical but accepted form
//!   (Go's `null`s and empty structs, bare IPs, string ports, unknown fields) and their canonical
//!   encoding, which must itself be a fixed point.
//! * `invalid/<name>.json` + `<name>.errors`: the exact error lines, one per line (a decode error
//!   is one line; validation errors are all listed in order).
//!
//! `GOLDEN_BLESS=1 cargo test -p calc-graph --test model_golden` rewrites the `.errors` files;
//! review the diff before committing.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use calc_graph::model::{Kind, Resource};
use pretty_assertions::assert_eq;
use serde_json::Value;

fn golden_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(sub)
}

/// The `.json` files of a fixture directory, sorted.
fn fixtures(sub: &str, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(golden_dir(sub))
        .unwrap_or_else(|e| panic!("cannot read tests/golden/{sub}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in tests/golden/{sub}");
    files
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn as_value(json: &[u8], what: &str) -> Value {
    serde_json::from_slice(json).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"))
}

#[test]
fn valid_fixtures_round_trip_exactly() {
    let mut kinds = BTreeSet::new();
    for path in fixtures("valid", ".json") {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let bytes = read(&path);
        let r = Resource::from_json(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        kinds.insert(r.kind());
        if let Err(errs) = r.validate() {
            panic!("{name}: unexpected validation errors: {errs:#?}");
        }
        let out = r.to_json();
        assert_eq!(
            as_value(out.as_bytes(), &name),
            as_value(&bytes, &name),
            "{name}: re-encoding differs"
        );
        assert_eq!(
            Resource::from_json(out.as_bytes()).unwrap(),
            r,
            "{name}: decode(encode(r)) != r"
        );
        let key = r.key();
        let (k2, r2) = Resource::from_etcd(&key.etcd_key(), &bytes)
            .unwrap_or_else(|e| panic!("{name}: from_etcd under {}: {e}", key.etcd_key()));
        assert_eq!(k2, key, "{name}");
        assert_eq!(r2, r, "{name}");
        // The file name starts with the kind, so a fixture cannot silently test the wrong kind.
        assert!(
            name.starts_with(&r.kind().kind_name().to_ascii_lowercase()),
            "{name}: fixture holds a {}",
            r.kind()
        );
    }
    let missing: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| !kinds.contains(k))
        .collect();
    assert!(missing.is_empty(), "no valid fixture for {missing:?}");
}

#[test]
fn canonical_fixtures_normalise() {
    for input in fixtures("canonical", ".in.json") {
        let name = input.file_name().unwrap().to_string_lossy().to_string();
        let output = input.with_file_name(name.replace(".in.json", ".out.json"));
        let r = Resource::from_json(&read(&input)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.validate(), Ok(()), "{name}");
        let out = r.to_json();
        assert_eq!(
            as_value(out.as_bytes(), &name),
            as_value(&read(&output), &name),
            "{name}: canonical form differs"
        );
        let again = Resource::from_json(out.as_bytes()).unwrap();
        assert_eq!(
            again.to_json(),
            out,
            "{name}: canonical form is not a fixed point"
        );
    }
}

/// What a caller (graph, controller) sees for a document: a decode error or the validation errors.
fn error_lines(bytes: &[u8]) -> Vec<String> {
    match Resource::from_json(bytes) {
        Err(e) => vec![e.to_string()],
        Ok(r) => match r.validate() {
            Ok(()) => vec![],
            Err(errs) => errs.iter().map(ToString::to_string).collect(),
        },
    }
}

#[test]
fn invalid_fixtures_give_the_expected_errors() {
    let bless = std::env::var_os("GOLDEN_BLESS").is_some();
    for path in fixtures("invalid", ".json") {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let got = error_lines(&read(&path));
        assert!(
            !got.is_empty(),
            "{name}: an invalid fixture decoded and validated"
        );
        let errors_path = path.with_extension("errors");
        if bless {
            fs::write(&errors_path, got.join("\n") + "\n").unwrap();
            continue;
        }
        let want = String::from_utf8(read(&errors_path)).unwrap();
        let want: Vec<&str> = want.lines().collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn invalid_documents_never_stop_the_others() {
    // A batch as the graph would see it: good and bad documents interleaved; every good one
    // still decodes and every bad one is reported on its own.
    let mut good = 0;
    let mut bad = 0;
    for path in fixtures("invalid", ".json")
        .into_iter()
        .chain(fixtures("valid", ".json"))
    {
        match Resource::from_json(&read(&path)).map(|r| r.validate()) {
            Ok(Ok(())) => good += 1,
            _ => bad += 1,
        }
    }
    assert_eq!(good, fixtures("valid", ".json").len());
    assert_eq!(bad, fixtures("invalid", ".json").len());
}
