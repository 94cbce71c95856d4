//! WorkloadEndpoint (a pod's interface) and HostEndpoint (a host interface or address set).
//!
//! Both carry `profiles` (label inheritance and default rules) and `ports` (the named ports
//! rules may refer to). String fields that Calico leaves free-form are kept as strings;
//! validation checks their syntax.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize};

use super::metadata::{Metadata, empty_as_none, nets, null_as_default};
use super::primitives::Protocol;

/// `projectcalico.org/v3` WorkloadEndpoint (namespaced).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadEndpoint {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: WorkloadEndpointSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WorkloadEndpointSpec {
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub orchestrator: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub workload: Option<String>,
    /// The node the endpoint lives on; the graph keeps only endpoints of its own node.
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub node: Option<String>,
    #[serde(
        rename = "containerID",
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub pod: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub endpoint: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub service_account_name: Option<String>,
    /// The endpoint's addresses, normally /32 and /128; bare addresses are read as host networks.
    #[serde(with = "nets", skip_serializing_if = "Vec::is_empty")]
    pub ip_networks: Vec<IpNet>,
    #[serde(
        rename = "ipNATs",
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ip_nats: Vec<IpNat>,
    #[serde(
        rename = "ipv4Gateway",
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv4_gateway: Option<String>,
    #[serde(
        rename = "ipv6Gateway",
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv6_gateway: Option<String>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub profiles: Vec<String>,
    /// Host-side interface name (`cali` + 11 hex characters for k8s pods).
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub interface_name: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub mac: Option<String>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ports: Vec<EndpointPort>,
    #[serde(with = "nets", skip_serializing_if = "Vec::is_empty")]
    pub allow_spoofed_source_prefixes: Vec<IpNet>,
}

/// A 1:1 NAT (floating IP) of a workload endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpNat {
    #[serde(rename = "internalIP")]
    pub internal_ip: IpAddr,
    #[serde(rename = "externalIP")]
    pub external_ip: IpAddr,
}

/// A named (and/or host-mapped) port of an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPort {
    #[serde(default)]
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    /// `0` on input reads as absent, as in Go.
    #[serde(
        default,
        deserialize_with = "zero_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub host_port: Option<u16>,
    #[serde(
        rename = "hostIP",
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub host_ip: Option<String>,
}

fn zero_as_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    Ok(Option::<u16>::deserialize(d)?.filter(|p| *p != 0))
}

/// `projectcalico.org/v3` HostEndpoint (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostEndpoint {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: HostEndpointSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HostEndpointSpec {
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub node: Option<String>,
    /// A host interface, or `*` for all of the host's interfaces.
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub interface_name: Option<String>,
    #[serde(
        rename = "expectedIPs",
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub expected_ips: Vec<IpAddr>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub profiles: Vec<String>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ports: Vec<EndpointPort>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn workload_endpoint_round_trips() {
        let v = json!({
            "metadata": {"name": "node1-k8s-web--0-eth0", "namespace": "prod",
                         "labels": {"app": "web"}},
            "spec": {
                "orchestrator": "k8s", "node": "node1", "pod": "web-0", "endpoint": "eth0",
                "containerID": "abc123", "serviceAccountName": "default",
                "ipNetworks": ["10.65.0.2/32", "fd00::2/128"],
                "ipNATs": [{"internalIP": "10.65.0.2", "externalIP": "203.0.113.5"}],
                "ipv4Gateway": "169.254.1.1",
                "profiles": ["kns.prod", "ksa.prod.default"],
                "interfaceName": "cali0ef24b1", "mac": "ca:fe:1d:52:bb:e9",
                "ports": [{"name": "http", "protocol": "TCP", "port": 8080},
                          {"name": "dns", "protocol": "UDP", "port": 53, "hostPort": 5353, "hostIP": "0.0.0.0"}]
            }
        });
        let w: WorkloadEndpoint = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(w.spec.ports[1].host_port, Some(5353));
        assert_eq!(serde_json::to_value(&w).unwrap(), v);
    }

    #[test]
    fn zero_host_port_and_empty_strings_are_absent() {
        let p: EndpointPort = serde_json::from_value(
            json!({"name": "x", "protocol": "SCTP", "port": 9, "hostPort": 0, "hostIP": ""}),
        )
        .unwrap();
        assert_eq!(p.host_port, None);
        assert_eq!(p.host_ip, None);
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({"name": "x", "protocol": "SCTP", "port": 9})
        );
    }

    #[test]
    fn host_endpoint_round_trips() {
        let v = json!({"metadata": {"name": "node1-eth0", "labels": {"role": "ingress"}},
                       "spec": {"node": "node1", "interfaceName": "eth0",
                                "expectedIPs": ["192.168.0.1", "2001:db8::1"],
                                "profiles": ["projectcalico-default-allow"],
                                "ports": [{"name": "ssh", "protocol": "TCP", "port": 22}]}});
        let h: HostEndpoint = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&h).unwrap(), v);
    }
}
