//! Ports of the admin-policy kinds → Calico rule ports, grouped by protocol: v1alpha1 `ports`
//! (`portNumber`, `portRange`, `namedPort`) and v1alpha2 `protocols` (`tcp`/`udp`/`sctp` with a
//! `destinationPort` number or range, `destinationNamedPort`). Errors are `(field, message)` with the
//! full field path.

use crate::validate::FieldError;

use super::super::networkpolicy::{ProtoPorts, add_port, validate_port_name};
use super::types::{AnpPort, CnpProtocol};
use calc_graph::model::Port;

/// Protocol ("" = none) → ports (`None` = every port of the protocol).
/// The protocols a named port may be of: it matches the container port of that name, whatever its
/// protocol, and the named-port IP sets carry the protocol.
const NAMED_PORT_PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];

fn l4_protocol(p: Option<&str>, field: &str) -> Result<&'static str, FieldError> {
    match p.unwrap_or("TCP") {
        "TCP" => Ok("TCP"),
        "UDP" => Ok("UDP"),
        "SCTP" => Ok("SCTP"),
        other => Err(FieldError::new(
            format!("{field}.protocol"),
            format!("unsupported protocol {other:?}: want TCP, UDP or SCTP"),
        )),
    }
}

fn port_number(n: i64, field: String) -> Result<u16, FieldError> {
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| FieldError::new(field, format!("port {n} is out of range 1-65535")))
}

fn port_range(start: i64, end: i64, field: &str, strict: bool) -> Result<Port, FieldError> {
    let a = port_number(start, format!("{field}.start"))?;
    let b = port_number(end, format!("{field}.end"))?;
    if b < a || (strict && b == a) {
        return Err(FieldError::new(
            format!("{field}.end"),
            format!(
                "end {b} must be {} start {a}",
                if strict { "above" } else { "at least" }
            ),
        ));
    }
    Ok(if a == b {
        Port::Number(a)
    } else {
        Port::Range(a, b)
    })
}

fn named_port(map: &mut ProtoPorts, name: &str, field: String) -> Result<(), FieldError> {
    validate_port_name(name).map_err(|m| FieldError::new(field, m))?;
    for proto in NAMED_PORT_PROTOCOLS {
        add_port(map, proto, Some(Port::Named(name.to_string())));
    }
    Ok(())
}

pub(super) fn anp_ports(ports: Option<&[AnpPort]>, field: &str) -> Result<ProtoPorts, FieldError> {
    let mut map = ProtoPorts::new();
    let ports = ports.unwrap_or_default();
    if ports.is_empty() {
        map.insert(String::new(), None);
        return Ok(map);
    }
    for (k, p) in ports.iter().enumerate() {
        let f = format!("{field}.ports[{k}]");
        let set = [
            p.port_number.is_some(),
            p.named_port.is_some(),
            p.port_range.is_some(),
        ];
        if set.iter().filter(|s| **s).count() != 1 {
            return Err(FieldError::new(
                f,
                "exactly one of portNumber, namedPort and portRange must be set",
            ));
        }
        if let Some(n) = &p.port_number {
            let f = format!("{f}.portNumber");
            let proto = l4_protocol(n.protocol.as_deref(), &f)?;
            let port = port_number(n.port, format!("{f}.port"))?;
            add_port(&mut map, proto, Some(Port::Number(port)));
        } else if let Some(r) = &p.port_range {
            let f = format!("{f}.portRange");
            let proto = l4_protocol(r.protocol.as_deref(), &f)?;
            let range = port_range(r.start, r.end, &f, false)?;
            add_port(&mut map, proto, Some(range));
        } else if let Some(n) = &p.named_port {
            named_port(&mut map, n, format!("{f}.namedPort"))?;
        }
    }
    Ok(map)
}

pub(super) fn cnp_ports(
    protocols: Option<&[CnpProtocol]>,
    field: &str,
) -> Result<ProtoPorts, FieldError> {
    let mut map = ProtoPorts::new();
    let protocols = protocols.unwrap_or_default();
    if protocols.is_empty() {
        map.insert(String::new(), None);
        return Ok(map);
    }
    for (k, p) in protocols.iter().enumerate() {
        let f = format!("{field}.protocols[{k}]");
        let l4 = [
            ("tcp", "TCP", &p.tcp),
            ("udp", "UDP", &p.udp),
            ("sctp", "SCTP", &p.sctp),
        ];
        let set = l4.iter().filter(|(_, _, x)| x.is_some()).count()
            + usize::from(p.destination_named_port.is_some());
        if set != 1 {
            return Err(FieldError::new(
                f,
                "exactly one of tcp, udp, sctp and destinationNamedPort must be set",
            ));
        }
        if let Some(n) = &p.destination_named_port {
            named_port(&mut map, n, format!("{f}.destinationNamedPort"))?;
            continue;
        }
        for (key, proto, x) in l4 {
            let Some(x) = x else { continue };
            let f = format!("{f}.{key}.destinationPort");
            let port = match &x.destination_port {
                // `tcp: {}`: every port of the protocol.
                None => None,
                Some(dp) => match (dp.number, &dp.range) {
                    (Some(n), None) => Some(Port::Number(port_number(n, format!("{f}.number"))?)),
                    (None, Some(r)) => {
                        Some(port_range(r.start, r.end, &format!("{f}.range"), true)?)
                    }
                    _ => {
                        return Err(FieldError::new(
                            f,
                            "exactly one of number and range must be set",
                        ));
                    }
                },
            };
            add_port(&mut map, proto, port);
        }
    }
    Ok(map)
}
