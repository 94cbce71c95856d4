//! Semantic validation of decoded resources, in the spirit of libcalico-go's validator.
//!
//! Every check reports into one list, so a caller sees all the problems of a resource at once;
//! each error carries the resource (`networkpolicies/prod/web`) and the JSON path of the field
//! (`spec.ingress[2].destination.ports[0]`). Checked:
//! * metadata: name (DNS-1123 subdomain; a DNS label for tiers), namespace present exactly for
//!   namespaced kinds, label keys and values, annotation keys and total size;
//! * policies: tier name, order, selectors, duplicate types, performance hints, the host-endpoint
//!   flag combinations of global policies;
//! * rules: selectors, ports (range order, named-port syntax, only with TCP/UDP/SCTP/UDPLite),
//!   ICMP (only with ICMP/ICMPv6, code needs type), IP version against ICMP flavour and nets,
//!   services and HTTP constraints, rule annotations (no control characters);
//! * endpoints, tiers, profiles and network sets: their own fields.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::endpoint::{EndpointPort, HostEndpointSpec, WorkloadEndpointSpec};
use super::key::Kind;
use super::names;
use super::policy::{GlobalNetworkPolicySpec, NetworkPolicySpec, PolicyType};
use super::primitives::{Action, IpVersion, Port, Protocol};
use super::resource::Resource;
use super::rule::{EntityRule, Rule};
use super::{Metadata, ValidationError};

use super::names::{
    validate_interface_name, validate_label_key, validate_label_value, validate_name,
    validate_named_port, validate_namespace, validate_tier_name,
};

/// Kubernetes' limit on the total size of a resource's annotations.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// Collects the errors of one resource.
struct Ctx {
    resource: String,
    errors: Vec<ValidationError>,
}

impl Ctx {
    fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ValidationError {
            resource: self.resource.clone(),
            path: path.into(),
            message: message.into(),
        });
    }

    fn check(&mut self, path: impl Into<String>, result: Result<(), String>) {
        if let Err(message) = result {
            self.err(path, message);
        }
    }

    fn selector(&mut self, path: impl Into<String>, selector: Option<&str>) {
        if let Some(s) = selector {
            self.check(path, check_selector(s));
        }
    }
}

/// Parses a selector with the crate's selector language; the error carries the byte offset.
fn check_selector(s: &str) -> Result<(), String> {
    crate::selector::parse(s)
        .map(|_| ())
        .map_err(|e| format!("invalid selector {s:?}: {e}"))
}

pub(super) fn validate_resource(r: &Resource) -> Result<(), Vec<ValidationError>> {
    let mut ctx = Ctx {
        resource: r.key().to_string(),
        errors: Vec::new(),
    };
    metadata(&mut ctx, r.kind(), r.metadata());
    match r {
        Resource::NetworkPolicy(p) => network_policy(&mut ctx, &p.spec, "spec"),
        Resource::GlobalNetworkPolicy(p) => global_policy(&mut ctx, &p.spec, "spec"),
        Resource::StagedNetworkPolicy(p) => network_policy(&mut ctx, &p.spec.policy, "spec"),
        Resource::StagedGlobalNetworkPolicy(p) => global_policy(&mut ctx, &p.spec.policy, "spec"),
        Resource::StagedKubernetesNetworkPolicy(_) => {}
        Resource::Tier(t) => {
            order(&mut ctx, "spec.order", t.spec.order);
            if let Some(a) = t.spec.default_action
                && !matches!(a, Action::Deny | Action::Pass)
            {
                ctx.err(
                    "spec.defaultAction",
                    format!("default action must be Deny or Pass, got {a:?}"),
                );
            }
        }
        Resource::Profile(p) => {
            rules(&mut ctx, "spec.ingress", &p.spec.ingress);
            rules(&mut ctx, "spec.egress", &p.spec.egress);
            labels(&mut ctx, "spec.labelsToApply", &p.spec.labels_to_apply);
        }
        Resource::WorkloadEndpoint(w) => workload_endpoint(&mut ctx, &w.spec),
        Resource::HostEndpoint(h) => host_endpoint(&mut ctx, &h.spec),
        // Nets were checked when decoding; only metadata is left.
        Resource::NetworkSet(_) | Resource::GlobalNetworkSet(_) => {}
    }
    if ctx.errors.is_empty() {
        Ok(())
    } else {
        Err(ctx.errors)
    }
}

fn metadata(ctx: &mut Ctx, kind: Kind, meta: &Metadata) {
    let name_check = if kind == Kind::Tier {
        validate_tier_name(&meta.name)
    } else {
        validate_name(&meta.name)
    };
    ctx.check("metadata.name", name_check);
    match (&meta.namespace, kind.is_namespaced()) {
        (Some(ns), true) => ctx.check("metadata.namespace", validate_namespace(ns)),
        (None, true) => ctx.err(
            "metadata.namespace",
            format!("namespace is required for a {kind}"),
        ),
        (Some(ns), false) => ctx.err(
            "metadata.namespace",
            format!("a {kind} is cluster-scoped and cannot have a namespace (got {ns:?})"),
        ),
        (None, false) => {}
    }
    labels(ctx, "metadata.labels", &meta.labels);
    let mut size = 0;
    for (k, v) in &meta.annotations {
        ctx.check(
            format!("metadata.annotations[{k:?}]"),
            validate_label_key(k),
        );
        size += k.len() + v.len();
    }
    if size > MAX_ANNOTATIONS_BYTES {
        ctx.err(
            "metadata.annotations",
            format!("annotations total {size} bytes, more than {MAX_ANNOTATIONS_BYTES}"),
        );
    }
}

fn labels(ctx: &mut Ctx, path: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        ctx.check(format!("{path}[{k:?}]"), validate_label_key(k));
        ctx.check(format!("{path}[{k:?}]"), validate_label_value(v));
    }
}

fn order(ctx: &mut Ctx, path: &str, order: Option<f64>) {
    if let Some(o) = order
        && !o.is_finite()
    {
        ctx.err(path, format!("order must be a finite number, got {o}"));
    }
}

/// The fields both policy kinds share.
#[allow(clippy::too_many_arguments)]
fn policy_common(
    ctx: &mut Ctx,
    p: &str,
    tier: Option<&str>,
    ord: Option<f64>,
    selector: Option<&str>,
    sa_selector: Option<&str>,
    types: &[PolicyType],
    ingress: &[Rule],
    egress: &[Rule],
    hints: &[String],
) {
    if let Some(t) = tier {
        ctx.check(format!("{p}.tier"), validate_tier_name(t));
    }
    order(ctx, &format!("{p}.order"), ord);
    ctx.selector(format!("{p}.selector"), selector);
    ctx.selector(format!("{p}.serviceAccountSelector"), sa_selector);
    for (i, t) in types.iter().enumerate() {
        if types[..i].contains(t) {
            ctx.err(
                format!("{p}.types[{i}]"),
                format!("{t:?} is listed more than once"),
            );
        }
    }
    for (i, h) in hints.iter().enumerate() {
        if h != "AssumeNeededOnEveryNode" {
            ctx.err(
                format!("{p}.performanceHints[{i}]"),
                format!("unknown performance hint {h:?} (known: AssumeNeededOnEveryNode)"),
            );
        }
    }
    rules(ctx, &format!("{p}.ingress"), ingress);
    rules(ctx, &format!("{p}.egress"), egress);
}

fn network_policy(ctx: &mut Ctx, s: &NetworkPolicySpec, p: &str) {
    policy_common(
        ctx,
        p,
        s.tier.as_deref(),
        s.order,
        s.selector.as_deref(),
        s.service_account_selector.as_deref(),
        &s.types,
        &s.ingress,
        &s.egress,
        &s.performance_hints,
    );
}

fn global_policy(ctx: &mut Ctx, s: &GlobalNetworkPolicySpec, p: &str) {
    ctx.selector(
        format!("{p}.namespaceSelector"),
        s.namespace_selector.as_deref(),
    );
    policy_common(
        ctx,
        p,
        s.tier.as_deref(),
        s.order,
        s.selector.as_deref(),
        s.service_account_selector.as_deref(),
        &s.types,
        &s.ingress,
        &s.egress,
        &s.performance_hints,
    );
    if s.do_not_track && s.pre_dnat {
        ctx.err(
            format!("{p}.preDNAT"),
            "preDNAT and doNotTrack cannot both be true",
        );
    }
    if s.pre_dnat {
        if !s.egress.is_empty() {
            ctx.err(
                format!("{p}.egress"),
                "a preDNAT policy cannot have egress rules",
            );
        }
        if let Some(i) = s.types.iter().position(|t| *t == PolicyType::Egress) {
            ctx.err(
                format!("{p}.types[{i}]"),
                "a preDNAT policy cannot have type Egress",
            );
        }
    }
    if (s.do_not_track || s.pre_dnat) && !s.apply_on_forward {
        ctx.err(
            format!("{p}.applyOnForward"),
            "applyOnForward must be true when doNotTrack or preDNAT is true",
        );
    }
}

fn rules(ctx: &mut Ctx, path: &str, rules: &[Rule]) {
    for (i, r) in rules.iter().enumerate() {
        rule(ctx, &format!("{path}[{i}]"), r);
    }
}

fn family(net: &IpNet) -> IpVersion {
    match net {
        IpNet::V4(_) => IpVersion::V4,
        IpNet::V6(_) => IpVersion::V6,
    }
}

fn rule(ctx: &mut Ctx, p: &str, r: &Rule) {
    let icmp_version = match r.protocol {
        Some(Protocol::Icmp | Protocol::Number(1)) => Some(IpVersion::V4),
        Some(Protocol::IcmpV6 | Protocol::Number(58)) => Some(IpVersion::V6),
        _ => None,
    };
    for (field, icmp) in [("icmp", &r.icmp), ("notICMP", &r.not_icmp)] {
        let Some(icmp) = icmp else { continue };
        if icmp_version.is_none() {
            ctx.err(
                format!("{p}.{field}"),
                format!("{field} is only valid with protocol ICMP or ICMPv6"),
            );
        }
        if icmp.code.is_some() && icmp.type_.is_none() {
            ctx.err(format!("{p}.{field}.code"), "code requires type");
        }
        if icmp.type_ == Some(255) {
            ctx.err(format!("{p}.{field}.type"), "type must be 0-254, got 255");
        }
    }
    if let (Some(v), Some(iv)) = (r.ip_version, icmp_version)
        && v != iv
    {
        ctx.err(
            format!("{p}.protocol"),
            format!(
                "protocol {} conflicts with ipVersion {}",
                r.protocol.map(|p| p.to_string()).unwrap_or_default(),
                v.number()
            ),
        );
    }
    let version = r.ip_version.or(icmp_version);
    let mut side_families = Vec::new();
    for (side, e) in [("source", &r.source), ("destination", &r.destination)] {
        let sp = format!("{p}.{side}");
        entity(ctx, &sp, e, r.protocol);
        for (field, list) in [("nets", &e.nets), ("notNets", &e.not_nets)] {
            for (j, net) in list.iter().enumerate() {
                if let Some(v) = version
                    && family(net) != v
                {
                    ctx.err(
                        format!("{sp}.{field}[{j}]"),
                        format!(
                            "{net} is IPv{} but the rule is IPv{}",
                            family(net).number(),
                            v.number()
                        ),
                    );
                }
            }
        }
        let fams: Vec<IpVersion> = e.nets.iter().map(family).collect();
        side_families.push(fams);
    }
    if version.is_none()
        && !side_families[0].is_empty()
        && !side_families[1].is_empty()
        && !side_families[0]
            .iter()
            .any(|f| side_families[1].contains(f))
    {
        ctx.err(
            format!("{p}.destination.nets"),
            "source and destination nets are of different IP versions, so the rule can never match",
        );
    }
    if let Some(http) = &r.http {
        if r.action != Action::Allow {
            ctx.err(
                format!("{p}.http"),
                "http match is only valid on Allow rules",
            );
        }
        if r.protocol.is_some_and(|p| p.number() != 6) {
            ctx.err(
                format!("{p}.http"),
                "http match is only valid with protocol TCP",
            );
        }
        for (i, m) in http.methods.iter().enumerate() {
            if m.is_empty() || !m.chars().all(|c| c.is_ascii_alphabetic()) {
                ctx.err(
                    format!("{p}.http.methods[{i}]"),
                    format!("invalid HTTP method {m:?}"),
                );
            }
        }
        for (i, path) in http.paths.iter().enumerate() {
            if path.exact.is_some() == path.prefix.is_some() {
                ctx.err(
                    format!("{p}.http.paths[{i}]"),
                    "exactly one of exact or prefix must be set",
                );
            }
        }
    }
    for (k, v) in r.annotations() {
        let ap = format!("{p}.metadata.annotations[{k:?}]");
        ctx.check(ap.clone(), validate_label_key(k));
        if v.chars().any(char::is_control) {
            ctx.err(ap, "annotation value must not contain control characters");
        }
    }
}

fn entity(ctx: &mut Ctx, sp: &str, e: &EntityRule, protocol: Option<Protocol>) {
    ctx.selector(format!("{sp}.selector"), e.selector.as_deref());
    ctx.selector(format!("{sp}.notSelector"), e.not_selector.as_deref());
    ctx.selector(
        format!("{sp}.namespaceSelector"),
        e.namespace_selector.as_deref(),
    );
    for (field, ports) in [("ports", &e.ports), ("notPorts", &e.not_ports)] {
        if !ports.is_empty() {
            match protocol {
                None => ctx.err(
                    format!("{sp}.{field}"),
                    "ports require protocol TCP, UDP, SCTP or UDPLite",
                ),
                Some(proto) if !proto.supports_ports() => ctx.err(
                    format!("{sp}.{field}"),
                    format!("protocol {proto} does not support ports"),
                ),
                Some(_) => {}
            }
        }
        for (j, port) in ports.iter().enumerate() {
            let pp = format!("{sp}.{field}[{j}]");
            match port {
                Port::Range(a, b) if a > b => {
                    ctx.err(pp, format!("port range {a}:{b} is reversed"));
                }
                Port::Named(n) => ctx.check(pp, validate_named_port(n)),
                _ => {}
            }
        }
    }
    if let Some(sa) = &e.service_accounts {
        for (j, n) in sa.names.iter().enumerate() {
            ctx.check(format!("{sp}.serviceAccounts.names[{j}]"), validate_name(n));
        }
        ctx.selector(
            format!("{sp}.serviceAccounts.selector"),
            sa.selector.as_deref(),
        );
    }
    if let Some(svc) = &e.services {
        ctx.check(format!("{sp}.services.name"), validate_name(&svc.name));
        if let Some(ns) = &svc.namespace {
            ctx.check(format!("{sp}.services.namespace"), validate_namespace(ns));
        }
        if !e.nets.is_empty()
            || !e.not_nets.is_empty()
            || e.selector.is_some()
            || e.not_selector.is_some()
            || e.namespace_selector.is_some()
            || e.service_accounts.is_some()
        {
            ctx.err(
                format!("{sp}.services"),
                "services cannot be combined with nets, notNets, selector, notSelector, namespaceSelector or serviceAccounts",
            );
        }
        if sp.ends_with(".source") && (!e.ports.is_empty() || !e.not_ports.is_empty()) {
            ctx.err(
                format!("{sp}.services"),
                "source services cannot be combined with ports",
            );
        }
    }
}

fn endpoint_ports(ctx: &mut Ctx, path: &str, ports: &[EndpointPort]) {
    for (i, port) in ports.iter().enumerate() {
        let pp = format!("{path}[{i}]");
        ctx.check(format!("{pp}.name"), validate_named_port(&port.name));
        if !matches!(
            port.protocol,
            Protocol::Tcp | Protocol::Udp | Protocol::Sctp
        ) {
            ctx.err(
                format!("{pp}.protocol"),
                format!("protocol must be TCP, UDP or SCTP, got {}", port.protocol),
            );
        }
        if port.port == 0 {
            ctx.err(format!("{pp}.port"), "port must be 1-65535, got 0");
        }
        if let Some(ip) = &port.host_ip
            && ip.parse::<IpAddr>().is_err()
        {
            ctx.err(format!("{pp}.hostIP"), format!("invalid IP address {ip:?}"));
        }
    }
}

fn profiles(ctx: &mut Ctx, profiles: &[String]) {
    for (i, p) in profiles.iter().enumerate() {
        ctx.check(format!("spec.profiles[{i}]"), validate_name(p));
    }
}

fn workload_endpoint(ctx: &mut Ctx, s: &WorkloadEndpointSpec) {
    if let Some(n) = &s.node {
        ctx.check("spec.node", validate_name(n));
    }
    if let Some(p) = &s.pod {
        ctx.check("spec.pod", validate_name(p));
    }
    if let Some(sa) = &s.service_account_name {
        ctx.check("spec.serviceAccountName", validate_name(sa));
    }
    for (field, v) in [
        ("orchestrator", &s.orchestrator),
        ("workload", &s.workload),
        ("containerID", &s.container_id),
        ("endpoint", &s.endpoint),
    ] {
        if let Some(v) = v {
            ctx.check(format!("spec.{field}"), names::validate_identifier(v));
        }
    }
    for (i, nat) in s.ip_nats.iter().enumerate() {
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
        ctx.check("spec.mac", names::validate_mac(m));
    }
    endpoint_ports(ctx, "spec.ports", &s.ports);
}

fn host_endpoint(ctx: &mut Ctx, s: &HostEndpointSpec) {
    if let Some(n) = &s.node {
        ctx.check("spec.node", validate_name(n));
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
    endpoint_ports(ctx, "spec.ports", &s.ports);
}

#[cfg(test)]
mod tests;
