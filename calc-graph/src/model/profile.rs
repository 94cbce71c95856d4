//! Profile: rules and labels attached to endpoints by name (`kns.<ns>`, `ksa.<ns>.<sa>`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::metadata::{Metadata, null_as_default};
use super::rule::Rule;

/// Name of Calico's built-in allow-all profile (used by automatic host endpoints).
pub const DEFAULT_ALLOW_PROFILE: &str = "projectcalico-default-allow";

/// `projectcalico.org/v3` Profile (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: ProfileSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProfileSpec {
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ingress: Vec<Rule>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub egress: Vec<Rule>,
    /// Labels that endpoints naming this profile inherit (their own labels win).
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels_to_apply: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn profile_round_trips() {
        let v = json!({"metadata": {"name": "kns.prod"},
                       "spec": {"ingress": [{"action": "Allow"}], "egress": [{"action": "Allow"}],
                                "labelsToApply": {"pcns.projectcalico.org/name": "prod"}}});
        let p: Profile = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(
            p.spec.labels_to_apply["pcns.projectcalico.org/name"],
            "prod"
        );
        assert_eq!(serde_json::to_value(&p).unwrap(), v);
    }
}
