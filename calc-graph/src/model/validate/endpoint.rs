//! Validation of WorkloadEndpoint and HostEndpoint specs (`validateWorkloadEndpointSpec`,
//! `validateHostEndpointSpec`, `validateIPNAT` and the endpoint-port validators).

use std::net::IpAddr;

use super::super::endpoint::{EndpointPort, HostEndpointSpec, WorkloadEndpointSpec};
use super::super::names::{
    validate_container_id, validate_identifier, validate_interface_name, validate_mac,
    validate_name, validate_named_port,
};
use super::{Ctx, LazyPath, at};

/// Endpoint ports: a protocol with ports, a non-zero port, a valid name (a workload port may
/// omit the name when it has a host port), a valid host IP.
fn ports(ctx: &mut Ctx, ports: &[EndpointPort], name_optional_with_host_port: bool) {
    for (i, port) in ports.iter().enumerate() {
        if port.name.is_empty() {
            if !(name_optional_with_host_port && port.host_port.is_some()) {
                ctx.err(
                    format!("spec.ports[{i}].name"),
                    if name_optional_with_host_port {
                        "name is required when no hostPort is set"
                    } else {
                        "name is required"
                    },
                );
            }
        } else {
            ctx.check(at!("spec.ports[{i}].name"), validate_named_port(&port.name));
        }
        if !port.protocol.supports_ports() {
            ctx.err(
                format!("spec.ports[{i}].protocol"),
                format!("protocol {} does not support ports", port.protocol),
            );
        }
        if port.port == 0 {
            ctx.err(
                format!("spec.ports[{i}].port"),
                "port must be 1-65535, got 0",
            );
        }
        if let Some(ip) = &port.host_ip
            && ip.parse::<IpAddr>().is_err()
        {
            ctx.err(
                format!("spec.ports[{i}].hostIP"),
                format!("invalid IP address {ip:?}"),
            );
        }
    }
}

fn profiles(ctx: &mut Ctx, profiles: &[String]) {
    for (i, p) in profiles.iter().enumerate() {
        ctx.check(at!("spec.profiles[{i}]"), validate_name(p));
    }
}

pub(super) fn workload_endpoint(ctx: &mut Ctx, s: &WorkloadEndpointSpec) {
    for (field, v) in [
        ("node", &s.node),
        ("pod", &s.pod),
        ("serviceAccountName", &s.service_account_name),
    ] {
        if let Some(v) = v {
            ctx.check(at!("spec.{field}"), validate_name(v));
        }
    }
    for (field, v) in [
        ("orchestrator", &s.orchestrator),
        ("workload", &s.workload),
        ("endpoint", &s.endpoint),
    ] {
        if let Some(v) = v {
            ctx.check(at!("spec.{field}"), validate_identifier(v));
        }
    }
    if let Some(c) = &s.container_id {
        ctx.check("spec.containerID", validate_container_id(c));
    }
    for (i, net) in s.ip_networks.iter().enumerate() {
        if net.prefix_len() != net.max_prefix_len() {
            ctx.err(
                format!("spec.ipNetworks[{i}]"),
                format!("{net} contains more than one address (use /32 or /128)"),
            );
        }
    }
    for (i, nat) in s.ip_nats.iter().enumerate() {
        if nat.internal_ip.is_ipv4() != nat.external_ip.is_ipv4() {
            ctx.err(
                format!("spec.ipNATs[{i}].externalIP"),
                format!(
                    "{} and internalIP {} are of different IP versions",
                    nat.external_ip, nat.internal_ip
                ),
            );
        }
        if !s.ip_networks.iter().any(|n| n.contains(&nat.internal_ip)) {
            ctx.err(
                format!("spec.ipNATs[{i}].internalIP"),
                format!("{} is not in the endpoint's ipNetworks", nat.internal_ip),
            );
        }
    }
    for (field, v, want_v4) in [
        ("ipv4Gateway", &s.ipv4_gateway, true),
        ("ipv6Gateway", &s.ipv6_gateway, false),
    ] {
        if let Some(g) = v {
            match g.parse::<IpAddr>() {
                Ok(ip) if ip.is_ipv4() == want_v4 => {}
                _ => ctx.err(
                    format!("spec.{field}"),
                    format!("invalid IPv{} address {g:?}", if want_v4 { 4 } else { 6 }),
                ),
            }
        }
    }
    profiles(ctx, &s.profiles);
    if let Some(i) = &s.interface_name {
        ctx.check("spec.interfaceName", validate_interface_name(i));
    }
    if let Some(m) = &s.mac {
        ctx.check("spec.mac", validate_mac(m));
    }
    ports(ctx, &s.ports, true);
}

pub(super) fn host_endpoint(ctx: &mut Ctx, s: &HostEndpointSpec) {
    match &s.node {
        Some(n) => ctx.check("spec.node", validate_name(n)),
        None => ctx.err("spec.node", "a host endpoint must name its node"),
    }
    match &s.interface_name {
        Some(i) if i != "*" => ctx.check("spec.interfaceName", validate_interface_name(i)),
        Some(_) => {}
        None if s.expected_ips.is_empty() => ctx.err(
            "spec",
            "a host endpoint must have an interfaceName or expectedIPs",
        ),
        None => {}
    }
    profiles(ctx, &s.profiles);
    ports(ctx, &s.ports, false);
}
