//! Pod → WorkloadEndpoint (felix-reference §9.5, §5.5).
//!
//! Only a scheduled, running, pod-networked pod with an IP gets an endpoint; a pod that stops being one
//! (finishes, loses its IP) simply produces nothing, so the writer deletes its endpoint. `pcns.*` and
//! `pcsa.*` labels on the pod itself are stripped so a pod cannot claim another namespace's or service
//! account's labels (felix-reference §8.2).

use crate::validate::FieldError;
use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Container, Pod};
use sha1::{Digest, Sha1};

use calc_graph::model::{EndpointPort, Protocol, WorkloadEndpoint, WorkloadEndpointSpec};
use ipnet::IpNet;

use super::labels::validate_metadata_labels;
use super::namespace::{KNS_PREFIX, KSA_PREFIX};
use super::networkpolicy::validate_port_name;
use super::{ConvertOptions, Converted, ObjectRef, SkipReport, etcd_key, metadata, non_empty};

/// The host-side veth name: prefix + first 11 hex characters of SHA-1(`<ns>.<pod>`).
pub fn interface_name(prefix: &str, namespace: &str, pod: &str) -> String {
    let digest = Sha1::digest(format!("{namespace}.{pod}").as_bytes());
    format!("{prefix}{}", &hex::encode(digest)[..11])
}

/// `<node>-k8s-<pod>-eth0`, with every `-` inside a segment doubled.
pub fn workload_endpoint_name(node: &str, pod: &str) -> String {
    let esc = |s: &str| s.replace('-', "--");
    format!("{}-k8s-{}-eth0", esc(node), esc(pod))
}

/// Converts one pod. `Converted::none()` when the pod has no endpoint.
pub fn pod_to_workload_endpoint(pod: &Pod, opts: &ConvertOptions) -> Converted {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let obj = ObjectRef::new("Pod", Some(ns), name);
    let fail = |field: &str, msg: String, key: Option<String>| {
        Converted::skipped(SkipReport::new(&obj, field, msg), key)
    };
    if let Err(e) = super::validate_dns_label(ns) {
        return fail("metadata.namespace", e.to_string(), None);
    }
    if let Err(e) = super::validate_dns_subdomain(name) {
        return fail("metadata.name", e.to_string(), None);
    }
    let Some(spec) = pod.spec.as_ref() else {
        return Converted::none();
    };
    if spec.host_network == Some(true) {
        return Converted::none();
    }
    let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) else {
        return Converted::none();
    };
    if let Err(e) = super::validate_dns_subdomain(node) {
        return fail("spec.nodeName", e.to_string(), None);
    }
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return Converted::none();
    }
    let wep_name = workload_endpoint_name(node, name);
    let key = match etcd_key("WorkloadEndpoint", Some(ns), &wep_name) {
        Ok(k) => k,
        Err(e) => return fail("metadata.name", e.to_string(), None),
    };

    // IPs: status.podIPs, else status.podIP.
    let mut raw_ips: Vec<String> = status
        .and_then(|s| s.pod_ips.as_ref())
        .map(|ips| ips.iter().map(|i| i.ip.clone()).collect())
        .unwrap_or_default();
    if raw_ips.is_empty() {
        raw_ips.extend(status.and_then(|s| s.pod_ip.clone()));
    }
    let mut ip_networks = Vec::new();
    for (i, ip) in raw_ips.iter().enumerate() {
        match ip.parse::<IpAddr>() {
            Ok(a) => ip_networks.push(IpNet::from(a)),
            Err(_) => {
                return fail(
                    &format!("status.podIPs[{i}]"),
                    format!("invalid IP {ip:?}"),
                    Some(key),
                );
            }
        }
    }
    if ip_networks.is_empty() {
        return Converted::none();
    }

    let sa = spec
        .service_account_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    if let Err(e) = super::validate_dns_subdomain(sa) {
        return fail("spec.serviceAccountName", e.to_string(), Some(key));
    }

    let mut labels: BTreeMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("pcns.") && !k.starts_with("pcsa."))
        .collect();
    if let Err(e) = validate_metadata_labels(&labels) {
        return fail(&e.field, e.message, Some(key));
    }
    labels.insert("projectcalico.org/namespace".into(), ns.to_string());
    labels.insert("projectcalico.org/orchestrator".into(), "k8s".into());
    labels.insert("projectcalico.org/serviceaccount".into(), sa.to_string());

    let init = spec.init_containers.iter().flatten().enumerate();
    let containers = init
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), c)),
        );
    let ports = match endpoint_ports(containers) {
        Ok(p) => p,
        Err(e) => return fail(&e.field, e.message, Some(key)),
    };

    let annotation = |name: &str| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(name))
            .filter(|s| !s.is_empty())
    };
    let container_id = annotation("cni.projectcalico.org/containerID").cloned();
    let allow_spoofed_source_prefixes = match annotation(ALLOWED_SOURCE_PREFIXES)
        .map(|a| parse_allowed_source_prefixes(a))
        .transpose()
    {
        Ok(p) => p.unwrap_or_default(),
        Err(e) => {
            return fail(
                &format!("metadata.annotations[{ALLOWED_SOURCE_PREFIXES}]"),
                e.to_string(),
                Some(key),
            );
        }
    };

    let mut meta = metadata(wep_name, Some(ns), &pod.metadata);
    meta.labels = labels;
    let o = WorkloadEndpoint {
        metadata: meta,
        spec: WorkloadEndpointSpec {
            orchestrator: Some("k8s".to_string()),
            node: Some(node.to_string()),
            container_id,
            pod: non_empty(name.to_string()),
            endpoint: Some("eth0".to_string()),
            service_account_name: Some(sa.to_string()),
            ip_networks,
            profiles: vec![
                format!("{KNS_PREFIX}{ns}"),
                format!("{KSA_PREFIX}{ns}.{sa}"),
            ],
            interface_name: Some(interface_name(&opts.interface_prefix, ns, name)),
            ports,
            allow_spoofed_source_prefixes,
            ..WorkloadEndpointSpec::default()
        },
    };
    Converted::ok(o, Vec::new())
}

/// The pod annotation with the extra source prefixes a pod may send from (honoured only where the
/// agent allows workload source spoofing).
pub const ALLOWED_SOURCE_PREFIXES: &str = "cni.projectcalico.org/allowedSourcePrefixes";

/// Parses the allowedSourcePrefixes annotation, as Calico does: a JSON list of CIDRs, each
/// normalised to its network address (`10.0.0.5/24` -> `10.0.0.0/24`). A plain address is
/// refused, as by Calico's `ParseCIDR`.
fn parse_allowed_source_prefixes(annotation: &str) -> Result<Vec<IpNet>, PrefixAnnotationError> {
    let list: Vec<String> =
        serde_json::from_str(annotation).map_err(|source| PrefixAnnotationError::NotAList {
            annotation: annotation.to_string(),
            source,
        })?;
    list.iter()
        .map(|p| {
            p.parse::<ipnet::IpNet>()
                .map(|n| n.trunc())
                .map_err(|_| PrefixAnnotationError::NotACidr(p.clone()))
        })
        .collect()
}

/// Why the allowedSourcePrefixes annotation was refused.
#[derive(Debug, thiserror::Error)]
pub enum PrefixAnnotationError {
    #[error("{annotation:?} is not a JSON list of CIDR strings: {source}")]
    NotAList {
        annotation: String,
        source: serde_json::Error,
    },
    #[error("{0:?} is not a CIDR (want e.g. \"10.0.0.0/24\")")]
    NotACidr(String),
}

/// Named container ports (init containers first, as the pod spec lists them).
fn endpoint_ports<'a>(
    containers: impl Iterator<Item = (String, &'a Container)>,
) -> Result<Vec<EndpointPort>, FieldError> {
    let mut out = Vec::new();
    for (path, c) in containers {
        for (j, p) in c.ports.iter().flatten().enumerate() {
            let Some(pname) = p.name.as_deref().filter(|n| !n.is_empty()) else {
                continue;
            };
            let field = format!("{path}.ports[{j}]");
            validate_port_name(pname).map_err(|m| FieldError::new(format!("{field}.name"), m))?;
            let protocol = match p.protocol.as_deref() {
                None | Some("" | "TCP") => Protocol::Tcp,
                Some("UDP") => Protocol::Udp,
                Some("SCTP") => Protocol::Sctp,
                Some(other) => {
                    return Err(FieldError::new(
                        format!("{field}.protocol"),
                        format!("unsupported protocol {other:?}: want TCP, UDP or SCTP"),
                    ));
                }
            };
            let port = u16::try_from(p.container_port)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    FieldError::new(
                        format!("{field}.containerPort"),
                        format!("port {} is out of range 1-65535", p.container_port),
                    )
                })?;
            let host_port = p
                .host_port
                .and_then(|h| u16::try_from(h).ok())
                .filter(|h| *h != 0);
            out.push(EndpointPort {
                name: pname.to_string(),
                protocol,
                port,
                host_port,
                host_ip: p.host_ip.clone().and_then(non_empty),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_pod(ports: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n", "containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x", "ports": ports}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1"},
        }))
        .unwrap()
    }

    #[test]
    fn bad_container_port_is_reported_with_its_path() {
        let opts = ConvertOptions::default();
        let c = pod_to_workload_endpoint(
            &mk_pod(serde_json::json!([{"name": "x", "containerPort": 80, "protocol": "ICMP"}])),
            &opts,
        );
        assert!(c.resource.is_none());
        assert_eq!(c.skips[0].field, "spec.containers[1].ports[0].protocol");
        assert!(c.retain_key.is_some());
        let c = pod_to_workload_endpoint(
            &mk_pod(serde_json::json!([{"name": "Bad_Name", "containerPort": 80}])),
            &opts,
        );
        assert_eq!(c.skips[0].field, "spec.containers[1].ports[0].name");
        let c = pod_to_workload_endpoint(
            &mk_pod(serde_json::json!([{"name": "web", "containerPort": 80}])),
            &opts,
        );
        assert!(c.skips.is_empty());
        assert!(c.resource.unwrap().to_json().contains("\"web\""));
    }

    #[test]
    fn veth_and_wep_names_match_calico() {
        assert_eq!(
            interface_name("cali", "default", "nginx"),
            "calic440f455693"
        );
        assert_eq!(
            workload_endpoint_name("node-1", "web-0"),
            "node--1-k8s-web--0-eth0"
        );
    }
}
