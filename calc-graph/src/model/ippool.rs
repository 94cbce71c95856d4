//! IPPool: a block of workload addresses and what the dataplane does with traffic from it
//! (`api/pkg/apis/projectcalico/v3/ippool.go`).
//!
//! felixrs enforces what Felix's iptables dataplane does with a pool: `cidr` and `natOutgoing`
//! (the nat table's `cali-nat-outgoing`, felix-reference §2.8) and `allowedUses` (a pool only for
//! `LoadBalancer` addresses is not a pod network, so it is left out of the all-pools set). Every
//! other upstream field is decoded and validated so that Calico's own pools read as written, but
//! has no dataplane effect here: `disabled` only stops IPAM from allocating new addresses (a
//! disabled pool keeps masquerading the addresses it already gave out, as in Calico),
//! `blockSize`/`nodeSelector`/`namespaceSelector`/`assignmentMode` steer IPAM, `ipipMode`/
//! `vxlanMode`/`disableBGPExport` are routing (no tunnels or BGP in this dataplane). Unknown
//! fields are an error naming the field (the schema in [`super::schema`]).

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::metadata::Metadata;

/// `projectcalico.org/v3` IPPool (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IpPool {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: IpPoolSpec,
    /// Written by Calico's controllers (`conditions`); kept opaque, never read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// Tunnel mode of a pool (`ipipMode`, `vxlanMode`). Calico also stores the empty string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EncapMode {
    Never,
    Always,
    CrossSubnet,
    #[serde(rename = "")]
    Unset,
}

/// What a pool's addresses may be used for (`allowedUses`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllowedUse {
    Workload,
    Tunnel,
    LoadBalancer,
}

/// How IPAM assigns from the pool (`assignmentMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AssignmentMode {
    Automatic,
    Manual,
}

/// The deprecated v1-compatible `ipip` block (`{enabled, mode}`), still accepted by Calico.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpipConfiguration {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IpPoolSpec {
    /// The pool's CIDR as written; [`IpPoolSpec::cidr`] parses it (validation rejects a bad one).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cidr: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vxlan_mode: Option<EncapMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipip_mode: Option<EncapMode>,
    /// Masquerade traffic from this pool to destinations outside every pool.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub nat_outgoing: bool,
    /// IPAM allocates no new addresses from the pool; existing ones keep working (and NAT).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    #[serde(
        rename = "disableBGPExport",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub disable_bgp_export: bool,
    /// 0 (absent) means the default: 26 for IPv4, 122 for IPv6.
    #[serde(skip_serializing_if = "is_zero")]
    pub block_size: u8,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub node_selector: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace_selector: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_uses: Vec<AllowedUse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assignment_mode: Option<AssignmentMode>,
    /// Deprecated (v1 API compatibility): `ipip: {enabled, mode}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipip: Option<IpipConfiguration>,
    /// Deprecated (v1 API compatibility) spelling of `natOutgoing`; Calico's v3→v1 conversion
    /// reads only `natOutgoing`, and so does felixrs.
    #[serde(rename = "nat-outgoing", skip_serializing_if = "std::ops::Not::not")]
    pub nat_outgoing_v1: bool,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

impl IpPoolSpec {
    /// The parsed CIDR, `None` if it does not parse.
    pub fn cidr(&self) -> Option<IpNet> {
        self.cidr.parse().ok()
    }

    /// A pool only for LoadBalancer addresses holds no pod addresses (Felix's
    /// `isLoadBalancerOnly`): it is not in the all-pools set.
    pub fn is_load_balancer_only(&self) -> bool {
        self.allowed_uses == [AllowedUse::LoadBalancer]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ip_pool_round_trips_every_upstream_field() {
        let v = json!({"metadata": {"name": "default-ipv4-ippool"},
            "spec": {"cidr": "10.244.0.0/16", "vxlanMode": "CrossSubnet", "ipipMode": "Never",
                     "natOutgoing": true, "disabled": true, "disableBGPExport": true,
                     "blockSize": 26, "nodeSelector": "all()", "namespaceSelector": "a == 'b'",
                     "allowedUses": ["Workload", "Tunnel"], "assignmentMode": "Automatic",
                     "ipip": {"enabled": true, "mode": "always"}, "nat-outgoing": true},
            "status": {"conditions": [{"type": "Allocatable", "status": "True"}]}});
        let p: IpPool = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(p.spec.cidr(), Some("10.244.0.0/16".parse().unwrap()));
        assert!(p.spec.nat_outgoing && p.spec.disabled);
        assert_eq!(serde_json::to_value(&p).unwrap(), v);
        let empty_mode: IpPool =
            serde_json::from_value(json!({"spec": {"cidr": "fd00::/64", "ipipMode": ""}})).unwrap();
        assert_eq!(empty_mode.spec.ipip_mode, Some(EncapMode::Unset));
    }

    #[test]
    fn unknown_spec_fields_and_bad_enums_are_errors() {
        let err = crate::model::Resource::from_value(json!({"kind": "IPPool",
            "metadata": {"name": "p"}, "spec": {"cidr": "10.0.0.0/8", "natOutgoin": true}}))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("ippools/p") && err.contains("spec.natOutgoin"),
            "{err}"
        );
        let err = serde_json::from_value::<IpPool>(json!({"spec": {"allowedUses": ["Pods"]}}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `Pods`"), "{err}");
    }

    #[test]
    fn load_balancer_only() {
        let mut s = IpPoolSpec::default();
        assert!(!s.is_load_balancer_only());
        s.allowed_uses = vec![AllowedUse::LoadBalancer];
        assert!(s.is_load_balancer_only());
        s.allowed_uses.push(AllowedUse::Workload);
        assert!(!s.is_load_balancer_only());
    }
}
