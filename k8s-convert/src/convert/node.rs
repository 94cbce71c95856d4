//! v1 Node → GlobalNetworkSet `knode.<node>`: the node's addresses (`status.addresses` of type
//! InternalIP and ExternalIP, as host networks), labelled with the node's labels plus
//! [`NODE_MARKER_LABEL`]` = <node>`. The admin policies' `nodes` peers select these sets
//! (`has(felixrs.io/node) && <node selector>`), so a node peer matches exactly the addresses the
//! network-policy-api names: those in the node's status.
//!
//! Calico has no `nodes` peer; a network set per node is how it maps onto Calico resources.

use std::net::IpAddr;

use calc_graph::model::{GlobalNetworkSet, NetworkSetSpec};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use super::labels::validate_metadata_labels;
use super::{ConvertOptions, Converted, ObjectRef, SkipReport, etcd_key, metadata};

/// Name prefix of the per-node network sets.
pub const KNODE_PREFIX: &str = "knode.";
/// The label every node network set carries (its value: the node's name).
pub const NODE_MARKER_LABEL: &str = "felixrs.io/node";

/// Converts a Node into its network set. A node whose labels are invalid is skipped (its previous
/// set is kept); addresses that do not parse are left out and reported.
pub fn node_to_network_set(node: &Node, _opts: &ConvertOptions) -> Converted {
    let name = node.metadata.name.as_deref().unwrap_or("");
    let obj = ObjectRef::new("Node", None, name);
    let set_name = format!("{KNODE_PREFIX}{name}");
    let key = match etcd_key("GlobalNetworkSet", None, &set_name) {
        Ok(k) => k,
        Err(e) => return Converted::skipped(SkipReport::new(&obj, "metadata.name", e), None),
    };
    let mut labels = node.metadata.labels.clone().unwrap_or_default();
    labels.insert(NODE_MARKER_LABEL.to_string(), name.to_string());
    if let Err(e) = validate_metadata_labels(&labels) {
        return Converted::skipped(e.report(&obj), Some(key));
    }
    let mut skips = Vec::new();
    let mut nets: Vec<IpNet> = Vec::new();
    let addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default();
    for (i, a) in addresses.iter().enumerate() {
        if !matches!(a.type_.as_str(), "InternalIP" | "ExternalIP") {
            continue;
        }
        match a.address.parse::<IpAddr>() {
            Ok(ip) => {
                let net = IpNet::from(ip);
                if !nets.contains(&net) {
                    nets.push(net);
                }
            }
            Err(_) => skips.push(SkipReport::new(
                &obj,
                format!("status.addresses[{i}].address"),
                format!("{:?} is not an IP address (left out)", a.address),
            )),
        }
    }
    let mut meta = metadata(set_name, None, &node.metadata);
    meta.labels = labels;
    let o = GlobalNetworkSet {
        metadata: meta,
        spec: NetworkSetSpec { nets },
    };
    Converted::ok(o, skips)
}
