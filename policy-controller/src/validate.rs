//! Validation of every resource before it is written.
//!
//! Every produced resource, converted or passed through, goes through [`validate_resource`], so nothing
//! reaches etcd that the agent's model would reject. Errors are `(field, message)`.

use std::str::FromStr;

use calc_graph::model::primitives::{Action, Port, Protocol};
use serde_json::Value;

use crate::convert::{CalicoResource, Converted, ObjectRef, SkipReport};

type FieldError = (String, String);

/// Validates a resource's whole JSON document.
pub fn validate_resource(r: &CalicoResource) -> Result<(), FieldError> {
    let v: Value = serde_json::from_str(&r.json)
        .map_err(|e| ("".to_string(), format!("invalid JSON: {e}")))?;
    let spec = v.get("spec").cloned().unwrap_or(Value::Null);
    validate_v3(&r.kind, &spec)
}

/// Runs [`validate_resource`] on a conversion's output, turning a failure into a skip that retains
/// the key.
pub fn checked(mut c: Converted) -> Converted {
    if let Some(r) = &c.resource
        && let Err((field, msg)) = validate_resource(r)
    {
        let obj = ObjectRef::new(&r.kind, r.namespace.as_deref(), &r.name);
        let key = r.etcd_key().ok();
        c.skips.push(SkipReport::new(&obj, field, msg));
        c.resource = None;
        c.retain_key = key;
    }
    c
}

/// Validates a v3 spec by kind.
pub fn validate_v3(kind: &str, spec: &Value) -> Result<(), FieldError> {
    for dir in ["ingress", "egress"] {
        if let Some(rules) = spec.get(dir) {
            let rules = rules
                .as_array()
                .ok_or_else(|| (format!("spec.{dir}"), "must be a list".to_string()))?;
            for (i, r) in rules.iter().enumerate() {
                validate_rule(r).map_err(|(f, m)| (format!("spec.{dir}[{i}]{f}"), m))?;
            }
        }
    }
    for field in ["selector", "namespaceSelector", "serviceAccountSelector"] {
        if let Some(s) = spec.get(field) {
            validate_selector(s).map_err(|m| (format!("spec.{field}"), m))?;
        }
    }
    if let Some(order) = spec.get("order")
        && !order.is_number()
    {
        return Err(("spec.order".into(), "order must be a number".into()));
    }
    if kind == "Tier"
        && let Some(a) = spec.get("defaultAction")
        && !matches!(a.as_str(), Some("Deny" | "Pass"))
    {
        return Err((
            "spec.defaultAction".into(),
            format!("invalid tier default action {a}"),
        ));
    }
    Ok(())
}

fn validate_selector(s: &Value) -> Result<(), String> {
    let s = s.as_str().ok_or("selector must be a string")?;
    crate::selector_check::check(s)
}

fn validate_rule(r: &Value) -> Result<(), FieldError> {
    let action = r.get("action").and_then(Value::as_str).unwrap_or("");
    serde_json::from_value::<Action>(Value::String(action.to_string()))
        .map_err(|_| (".action".to_string(), format!("invalid action {action:?}")))?;
    let mut proto = None;
    for f in ["protocol", "notProtocol"] {
        if let Some(p) = r.get(f) {
            let parsed = serde_json::from_value::<Protocol>(p.clone())
                .map_err(|e| (format!(".{f}"), e.to_string()))?;
            if f == "protocol" {
                proto = Some(parsed);
            }
        }
    }
    for side in ["source", "destination"] {
        if let Some(e) = r.get(side) {
            validate_entity(e, proto).map_err(|(f, m)| (format!(".{side}{f}"), m))?;
        }
    }
    Ok(())
}

fn validate_entity(e: &Value, proto: Option<Protocol>) -> Result<(), FieldError> {
    for f in ["nets", "notNets"] {
        for (i, n) in e
            .get(f)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let s = n.as_str().unwrap_or("");
            ipnet::IpNet::from_str(s)
                .or_else(|_| std::net::IpAddr::from_str(s).map(ipnet::IpNet::from))
                .map_err(|_| (format!(".{f}[{i}]"), format!("invalid CIDR {n}")))?;
        }
    }
    for f in ["ports", "notPorts"] {
        let Some(ports) = e.get(f).and_then(Value::as_array) else {
            continue;
        };
        if !ports.is_empty() && !proto.is_some_and(Protocol::supports_ports) {
            return Err((
                format!(".{f}"),
                "ports need protocol TCP, UDP, SCTP or UDPLite".into(),
            ));
        }
        for (i, p) in ports.iter().enumerate() {
            let port = serde_json::from_value::<Port>(p.clone())
                .map_err(|m| (format!(".{f}[{i}]"), m.to_string()))?;
            if let Port::Range(a, b) = port
                && a > b
            {
                return Err((
                    format!(".{f}[{i}]"),
                    format!("port range {a}:{b} is reversed"),
                ));
            }
        }
    }
    for f in ["selector", "notSelector", "namespaceSelector"] {
        if let Some(s) = e.get(f) {
            validate_selector(s).map_err(|m| (format!(".{f}"), m))?;
        }
    }
    Ok(())
}
