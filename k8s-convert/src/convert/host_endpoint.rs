//! v1 Node → Calico's automatic host endpoint `<node>-auto-hep`, as calico kube-controllers' node
//! controller creates it with `hostEndpoint.autoCreate: Enabled` (its default host endpoint, no
//! templates):
//!
//! * labels: the node's labels plus [`CREATED_BY_LABEL`]` = `[`CREATED_BY_VALUE`], the marker by
//!   which kube-controllers (and the policy-controller's writer) know the host endpoints it owns;
//! * `spec.node`: the node's name; `interfaceName: "*"` (every interface of the host);
//!   `profiles: [projectcalico-default-allow]` (Calico's built-in allow-all profile, so an auto host
//!   endpoint that no policy selects stays open);
//! * `expectedIPs`: the addresses of the Calico Node that Calico derives from this Kubernetes Node, in
//!   kube-controllers' order: the BGP addresses (annotations `projectcalico.org/IPv4Address`,
//!   `projectcalico.org/IPv6Address`, CIDRs whose address is taken), the tunnel addresses (IPIP,
//!   VXLAN v4/v6, WireGuard v4/v6 annotations), then the `InternalIP`s of `status.addresses`
//!   (ExternalIP and Hostname are not host endpoint addresses), without duplicates. An annotation
//!   or address that does not parse is left out and reported.
//!
//! A name longer than a DNS subdomain allows (a node name over 244 characters) is hashed as
//! kube-controllers hashes it. Calico Node fields Kubernetes has no place for (`spec.interfaces`,
//! host-local IPAM's tunnel address from `spec.podCIDR`) do not contribute.

use std::net::IpAddr;

use base64::Engine;
use calc_graph::model::{DEFAULT_ALLOW_PROFILE, HostEndpoint, HostEndpointSpec, Metadata};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use sha2::{Digest, Sha256};

use super::labels::validate_metadata_labels;
use super::{ConvertOptions, Converted, ObjectRef, SkipReport, etcd_key};

/// The label kube-controllers puts on the host endpoints it creates.
pub const CREATED_BY_LABEL: &str = "projectcalico.org/created-by";
/// [`CREATED_BY_LABEL`]'s value.
pub const CREATED_BY_VALUE: &str = "calico-kube-controllers";
/// The suffix of an automatic host endpoint's name.
pub const AUTO_HEP_SUFFIX: &str = "auto-hep";
/// A Kubernetes name's (DNS subdomain's) maximum length.
const MAX_NAME_LEN: usize = 253;

/// The node annotations (Calico's Node fields in Kubernetes) whose addresses an auto host endpoint
/// expects, in kube-controllers' order, with the family each must have (`true`: IPv6).
pub const ADDRESS_ANNOTATIONS: [(&str, bool); 7] = [
    ("projectcalico.org/IPv4Address", false),
    ("projectcalico.org/IPv6Address", true),
    ("projectcalico.org/IPv4IPIPTunnelAddr", false),
    ("projectcalico.org/IPv4VXLANTunnelAddr", false),
    ("projectcalico.org/IPv6VXLANTunnelAddr", true),
    ("projectcalico.org/IPv4WireguardInterfaceAddr", false),
    ("projectcalico.org/IPv6WireguardInterfaceAddr", true),
];

/// The automatic host endpoint's name for a node: `<node>-auto-hep`, or, when that is longer than
/// 253 characters, kube-controllers' hashed form (SHA-256, unpadded URL-safe base64 without `-`,
/// `_` and `.`, lower-cased, then `-auto-hep`).
pub fn auto_host_endpoint_name(node: &str) -> String {
    let name = format!("{node}-{AUTO_HEP_SUFFIX}");
    if name.len() <= MAX_NAME_LEN {
        return name;
    }
    let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(&name));
    let hash: String = hash.chars().filter(|c| !"-_.".contains(*c)).collect();
    let mut name = format!("{hash}-{AUTO_HEP_SUFFIX}").to_lowercase();
    name.truncate(MAX_NAME_LEN);
    name
}

/// Whether a host endpoint's labels mark it as created by kube-controllers (or by us in its place).
pub fn is_auto_host_endpoint(labels: &std::collections::BTreeMap<String, String>) -> bool {
    labels.get(CREATED_BY_LABEL).map(String::as_str) == Some(CREATED_BY_VALUE)
}

/// Converts a Node into its automatic host endpoint. A node whose labels are invalid is skipped (its
/// previous host endpoint is kept).
pub fn node_to_auto_host_endpoint(node: &Node, _opts: &ConvertOptions) -> Converted {
    let node_name = node.metadata.name.as_deref().unwrap_or("");
    let obj = ObjectRef::new("Node", None, node_name);
    let name = auto_host_endpoint_name(node_name);
    let key = match etcd_key("HostEndpoint", None, &name) {
        Ok(k) => k,
        Err(e) => return Converted::skipped(SkipReport::new(&obj, "metadata.name", e), None),
    };
    let mut labels = node.metadata.labels.clone().unwrap_or_default();
    labels.insert(CREATED_BY_LABEL.to_string(), CREATED_BY_VALUE.to_string());
    if let Err(e) = validate_metadata_labels(&labels) {
        return Converted::skipped(e.report(&obj), Some(key));
    }
    let mut skips = Vec::new();
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut add = |ip: IpAddr| {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    };
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    for (annotation, v6) in ADDRESS_ANNOTATIONS {
        let Some(value) = annotations.get(annotation).filter(|v| !v.is_empty()) else {
            continue;
        };
        match parse_ip_or_cidr(value) {
            Some(ip) if ip.is_ipv6() == v6 => add(ip),
            _ => skips.push(SkipReport::new(
                &obj,
                format!("metadata.annotations.{annotation}"),
                format!(
                    "{value:?} is not an IPv{} address or CIDR (left out of the host endpoint)",
                    if v6 { 6 } else { 4 }
                ),
            )),
        }
    }
    let addresses = (node.status.as_ref())
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    for (i, a) in addresses.iter().enumerate() {
        if a.type_ != "InternalIP" {
            continue;
        }
        match a.address.parse::<IpAddr>() {
            Ok(ip) => add(ip),
            Err(_) => skips.push(SkipReport::new(
                &obj,
                format!("status.addresses[{i}].address"),
                format!(
                    "{:?} is not an IP address (left out of the host endpoint)",
                    a.address
                ),
            )),
        }
    }
    let hep = HostEndpoint {
        metadata: Metadata {
            name,
            labels,
            ..Metadata::default()
        },
        spec: HostEndpointSpec {
            node: Some(node_name.to_string()),
            interface_name: Some("*".to_string()),
            expected_ips: ips,
            profiles: vec![DEFAULT_ALLOW_PROFILE.to_string()],
            ports: Vec::new(),
        },
    };
    Converted::ok(hep, skips)
}

/// An address, or the address of a CIDR (`10.0.0.1/24` → `10.0.0.1`).
fn parse_ip_or_cidr(s: &str) -> Option<IpAddr> {
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| s.parse::<IpNet>().ok().map(|n| n.addr()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    fn convert(v: serde_json::Value) -> Converted {
        node_to_auto_host_endpoint(&node(v), &ConvertOptions::default())
    }

    #[test]
    fn a_node_becomes_kube_controllers_auto_host_endpoint() {
        let c = convert(json!({
            "metadata": {"name": "node-1", "uid": "u-1",
                         "labels": {"kubernetes.io/hostname": "node-1", "zone": "a"},
                         "annotations": {
                             "projectcalico.org/IPv4Address": "192.0.2.10/24",
                             "projectcalico.org/IPv6Address": "2001:db8::10/64",
                             "projectcalico.org/IPv4IPIPTunnelAddr": "10.244.1.1",
                             "projectcalico.org/IPv4VXLANTunnelAddr": "10.244.1.2",
                             "projectcalico.org/IPv6VXLANTunnelAddr": "fd00:244::2",
                             "projectcalico.org/IPv4WireguardInterfaceAddr": "10.244.1.3",
                             "projectcalico.org/IPv6WireguardInterfaceAddr": "fd00:244::3",
                             "unrelated": "x"}},
            "status": {"addresses": [
                {"type": "Hostname", "address": "node-1"},
                {"type": "ExternalIP", "address": "203.0.113.7"},
                {"type": "InternalIP", "address": "192.0.2.10"},
                {"type": "InternalIP", "address": "192.0.2.11"}]},
        }));
        assert_eq!(c.skips, vec![]);
        let r = c.resource.unwrap();
        assert_eq!(
            r.etcd_key().unwrap(),
            "/calico/resources/v3/projectcalico.org/hostendpoints/node-1-auto-hep"
        );
        let stored: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(
            stored,
            json!({
                "apiVersion": "projectcalico.org/v3", "kind": "HostEndpoint",
                "metadata": {"name": "node-1-auto-hep", "labels": {
                    "kubernetes.io/hostname": "node-1", "zone": "a",
                    "projectcalico.org/created-by": "calico-kube-controllers"}},
                "spec": {"node": "node-1", "interfaceName": "*",
                         "expectedIPs": ["192.0.2.10", "2001:db8::10", "10.244.1.1", "10.244.1.2",
                                         "fd00:244::2", "10.244.1.3", "fd00:244::3", "192.0.2.11"],
                         "profiles": ["projectcalico-default-allow"]}
            })
        );
    }

    #[test]
    fn a_plain_node_expects_its_internal_ips_only() {
        let c = convert(json!({
            "metadata": {"name": "n"},
            "status": {"addresses": [{"type": "ExternalIP", "address": "203.0.113.7"},
                                     {"type": "InternalIP", "address": "fd00::1"}]},
        }));
        let r = c.resource.unwrap();
        let hep = match r.resource().unwrap() {
            calc_graph::model::Resource::HostEndpoint(h) => h.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            hep.spec.expected_ips,
            vec!["fd00::1".parse::<IpAddr>().unwrap()]
        );
        assert!(is_auto_host_endpoint(&hep.metadata.labels));
        // No addresses at all: still valid, '*' names the interfaces.
        let c = convert(json!({"metadata": {"name": "bare"}}));
        assert!(c.resource.is_some(), "{:?}", c.skips);
    }

    #[test]
    fn bad_addresses_are_left_out_and_named() {
        let c = convert(json!({
            "metadata": {"name": "n", "annotations": {
                "projectcalico.org/IPv4Address": "2001:db8::1/64",
                "projectcalico.org/IPv4VXLANTunnelAddr": "nope"}},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.300"},
                                     {"type": "InternalIP", "address": "10.0.0.3"}]},
        }));
        let fields: Vec<&str> = c.skips.iter().map(|s| s.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "metadata.annotations.projectcalico.org/IPv4Address",
                "metadata.annotations.projectcalico.org/IPv4VXLANTunnelAddr",
                "status.addresses[0].address"
            ]
        );
        assert!(c.skips[0].message.contains("not an IPv4 address"));
        assert!(
            c.resource
                .unwrap()
                .to_json()
                .contains(r#""expectedIPs":["10.0.0.3"]"#)
        );
    }

    #[test]
    fn invalid_labels_skip_the_node_and_keep_its_endpoint() {
        let c = convert(json!({"metadata": {"name": "n", "labels": {"bad key!": "x"}}}));
        assert!(c.resource.is_none());
        assert_eq!(
            c.retain_key.as_deref(),
            Some("/calico/resources/v3/projectcalico.org/hostendpoints/n-auto-hep")
        );
        assert_eq!(c.skips[0].field, "metadata.labels.bad key!");
    }

    #[test]
    fn an_overlong_name_is_hashed_as_kube_controllers_does() {
        let short = "a".repeat(244);
        assert_eq!(auto_host_endpoint_name(&short), format!("{short}-auto-hep"));
        let long = "a".repeat(245);
        let name = auto_host_endpoint_name(&long);
        assert!(name.ends_with("-auto-hep") && name.len() < 64, "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        assert_eq!(name, auto_host_endpoint_name(&long), "stable");
        assert_ne!(name, auto_host_endpoint_name(&"b".repeat(245)));
    }
}
