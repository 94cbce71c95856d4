//! Which keys are the controller's (see the module docs of [`super`]): by name pattern, by
//! label (automatic host endpoints) and by ownership marker.

use calc_graph::model::EtcdPrefix;
use serde_json::Value;

use super::OWNER_MARKER_PREFIX;
use crate::convert::{CREATED_BY_LABEL, CREATED_BY_VALUE, RESOURCE_PREFIX};

/// Whether a key belongs to the controller by its name pattern.
pub fn owned_by_pattern(key: &str) -> bool {
    let Some(rest) = key.strip_prefix(RESOURCE_PREFIX) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        ["networkpolicies", _ns, name] => name.starts_with("knp.default."),
        ["profiles", name] => name.starts_with("kns.") || name.starts_with("ksa."),
        ["globalnetworkpolicies", _name] => crate::convert::admin::is_admin_policy_key(key),
        ["globalnetworksets", name] => name.starts_with(crate::convert::KNODE_PREFIX),
        ["workloadendpoints", _ns, _name] => true,
        _ => false,
    }
}

/// Whether a stored resource belongs to the controller by its content: a host endpoint labelled
/// [`CREATED_BY_LABEL`]` = `[`CREATED_BY_VALUE`] (an automatic host endpoint, ours or one calico
/// kube-controllers made before us, which is how kube-controllers itself recognises them).
pub fn owned_by_label(key: &str, json: &[u8]) -> bool {
    let is_hep = key
        .strip_prefix(RESOURCE_PREFIX)
        .is_some_and(|r| r.starts_with("hostendpoints/"));
    is_hep
        && serde_json::from_slice::<Value>(json).is_ok_and(|v| {
            v.pointer("/metadata/labels")
                .and_then(|l| l.get(CREATED_BY_LABEL))
                .and_then(Value::as_str)
                == Some(CREATED_BY_VALUE)
        })
}

/// The ownership marker of canonical key `key`, for the cluster at `p`.
pub(super) fn marker_key(p: &EtcdPrefix, key: &str) -> String {
    format!("{}{key}", p.private_key(OWNER_MARKER_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_patterns() {
        let p = RESOURCE_PREFIX;
        assert!(owned_by_pattern(&format!(
            "{p}networkpolicies/prod/knp.default.a"
        )));
        assert!(!owned_by_pattern(&format!("{p}networkpolicies/prod/mine")));
        assert!(owned_by_pattern(&format!("{p}profiles/kns.prod")));
        assert!(owned_by_pattern(&format!("{p}profiles/ksa.prod.default")));
        assert!(!owned_by_pattern(&format!(
            "{p}profiles/projectcalico-default-allow"
        )));
        assert!(owned_by_pattern(&format!(
            "{p}workloadendpoints/prod/n-k8s-p-eth0"
        )));
        assert!(!owned_by_pattern(&format!("{p}globalnetworkpolicies/x")));
        assert!(owned_by_pattern(&format!(
            "{p}globalnetworkpolicies/kanp.adminnetworkpolicy.x"
        )));
        assert!(owned_by_pattern(&format!(
            "{p}globalnetworkpolicies/kcnp.x"
        )));
        assert!(!owned_by_pattern("/other/profiles/kns.prod"));
    }
}
