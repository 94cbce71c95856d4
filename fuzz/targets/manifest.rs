//! Fuzz target for the controller's conversion of Kubernetes objects
//! (`policy_controller::manifests::convert_value`, which validates what it converts, as the
//! manifest loader and the watchers run it), fed from YAML/JSON text as a manifest file
//! or the API server would give it.
//!
//! Properties: parsing and conversion never panic; every resource the controller would store has
//! a valid etcd key and is decoded by the agent (`Validated::from_etcd`) under that key,
//! so whatever a hostile object holds, the agent reads exactly what the controller wrote.
//!
//! Shared by the cargo-fuzz target (`fuzz/fuzz_targets/manifest.rs`, nightly, coverage guided) and
//! the bounded stable run in CI (`tests/tests/fuzz_stable.rs`, `scripts/fuzz-stable.sh`).
use calc_graph::model::Validated;
use policy_controller::ConvertOptions;
use policy_controller::manifests::convert_value;

/// Checks the properties on one input; panics when one does not hold.
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(value) = serde_yaml::from_str::<serde_json::Value>(&text) else {
        return;
    };
    let opts = ConvertOptions {
        interface_prefix: "cali".to_string(),
    };
    let converted = convert_value(&value, &opts);
    let Some(res) = converted.resource else {
        return;
    };
    let json = res.to_json();
    let key = res
        .etcd_key()
        .unwrap_or_else(|e| panic!("stored resource without a key: {e}\n{json}"));
    if let Err(e) = Validated::from_etcd(&key, json.as_bytes()) {
        panic!("the agent rejects what the controller stores at {key}: {e}\n{json}");
    }
}
