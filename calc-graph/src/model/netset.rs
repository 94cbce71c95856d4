//! NetworkSet (namespaced) and GlobalNetworkSet: labelled lists of CIDRs that selectors match.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::metadata::{Metadata, nets};

/// `projectcalico.org/v3` NetworkSet (namespaced).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkSet {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: NetworkSetSpec,
}

/// `projectcalico.org/v3` GlobalNetworkSet (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GlobalNetworkSet {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: NetworkSetSpec,
}

/// The spec of both network set kinds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSetSpec {
    /// CIDRs; bare addresses are read as host networks.
    #[serde(default, with = "nets", skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<IpNet>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn network_set_round_trips() {
        let v = json!({"metadata": {"name": "external", "namespace": "ns1", "labels": {"role": "db"}},
                       "spec": {"nets": ["198.51.100.0/28", "203.0.113.0/24"]}});
        let s: NetworkSet = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(s.spec.nets.len(), 2);
        assert_eq!(serde_json::to_value(&s).unwrap(), v);
        let err = serde_json::from_value::<GlobalNetworkSet>(
            json!({"metadata": {"name": "g"}, "spec": {"nets": ["10.0.0.0/8", "nope"]}}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("invalid CIDR \"nope\""), "{err}");
    }
}
