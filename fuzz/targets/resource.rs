//! Fuzz target for the agent's decoding of etcd values (`calc_graph::model::Resource::from_etcd`):
//! everything the agent reads from etcd is untrusted text.
//!
//! Input: the first line is the etcd key, the rest the value. Properties: decoding never panics,
//! nor does validating what decoded; a rule with an unknown field fails safe (such a resource is
//! stored as written and never re-encoded: the canonical form cannot carry the field); any other
//! decoded resource encodes (`to_json`) to a value that decodes under the same key to the same
//! resource, and encodes to the same bytes again.
//!
//! Shared by the cargo-fuzz target (`fuzz/fuzz_targets/resource.rs`, nightly, coverage guided) and
//! the bounded stable run in CI (`tests/tests/fuzz_stable.rs`, `scripts/fuzz-stable.sh`).
use calc_graph::model::{Resource, Rule};

/// The rules the agent enforces (policies and profiles); unknown fields elsewhere fail decoding.
fn enforced_rules(r: &Resource) -> Vec<&Rule> {
    let (ingress, egress): (&[Rule], &[Rule]) = match r {
        Resource::NetworkPolicy(p) => (&p.spec.ingress, &p.spec.egress),
        Resource::GlobalNetworkPolicy(p) => (&p.spec.ingress, &p.spec.egress),
        Resource::Profile(p) => (&p.spec.ingress, &p.spec.egress),
        _ => (&[], &[]),
    };
    ingress.iter().chain(egress).collect()
}

/// Checks the properties on one input; panics when one does not hold.
pub fn run(data: &[u8]) {
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let key = String::from_utf8_lossy(&data[..split]);
    let value = data.get(split + 1..).unwrap_or(&[]);
    let Ok((rk, resource)) = Resource::from_etcd(&key, value) else {
        return;
    };
    let _ = resource.validate();
    let rules = enforced_rules(&resource);
    if rules.iter().any(|r| !r.unknown_fields.is_empty()) {
        for r in rules.iter().filter(|r| !r.unknown_fields.is_empty()) {
            assert!(
                r.fails_safe(),
                "{key}: a rule with unknown fields is enforced"
            );
        }
        return;
    }
    let json = resource.to_json();
    let (rk2, again) = Resource::from_etcd(&key, json.as_bytes())
        .unwrap_or_else(|e| panic!("re-encoded {key} does not decode: {e}\n{json}"));
    assert_eq!(rk2, rk, "key changed for {key}");
    assert_eq!(again, resource, "round trip changed {key}");
    assert_eq!(again.to_json(), json, "encoding not stable for {key}");
}
