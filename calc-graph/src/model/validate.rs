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
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn mk_resource(v: Value) -> Resource {
        Resource::from_json(&serde_json::to_vec(&v).unwrap()).unwrap()
    }

    fn mk_np(ingress: Value) -> Resource {
        mk_resource(json!({
            "apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
            "metadata": {"name": "web", "namespace": "prod"},
            "spec": {"selector": "app == 'web'", "ingress": ingress}
        }))
    }

    fn errors(r: &Resource) -> Vec<String> {
        r.validate()
            .err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn reversed_port_range_names_resource_and_path() {
        let r = mk_np(json!([
            {"action": "Allow"},
            {"action": "Allow"},
            {"action": "Allow", "protocol": "TCP", "destination": {"ports": ["90:80"]}}
        ]));
        assert_eq!(
            errors(&r),
            vec![
                "networkpolicies/prod/web: spec.ingress[2].destination.ports[0]: port range 90:80 is reversed"
            ]
        );
    }

    #[test]
    fn valid_policy_passes() {
        let r = mk_np(json!([{
            "action": "Allow", "protocol": "TCP", "ipVersion": 4,
            "source": {"nets": ["10.0.0.0/8"], "selector": "role == 'fe'",
                       "serviceAccounts": {"names": ["api"]}},
            "destination": {"ports": [80, "8000:8080", "http"], "notPorts": [8001]},
            "http": {"methods": ["GET"], "paths": [{"prefix": "/api"}]},
            "metadata": {"annotations": {"owner": "team a"}}
        }, {
            "action": "Deny", "protocol": "ICMPv6", "icmp": {"type": 128, "code": 0},
            "destination": {"nets": ["fd00::/8"]}
        }]));
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn every_problem_is_reported() {
        let r = mk_np(json!([
            {"action": "Allow", "destination": {"ports": [80]}},
            {"action": "Allow", "protocol": "ICMP", "source": {"ports": [1]}},
            {"action": "Allow", "protocol": "UDP", "icmp": {"type": 8}},
            {"action": "Allow", "protocol": "ICMP", "icmp": {"code": 1}},
            {"action": "Allow", "protocol": "ICMP", "ipVersion": 6},
            {"action": "Allow", "ipVersion": 6, "source": {"notNets": ["10.0.0.0/8"]}},
            {"action": "Allow", "source": {"nets": ["10.0.0.0/8"]}, "destination": {"nets": ["fd00::/8"]}},
            {"action": "Allow", "protocol": "TCP", "destination": {"ports": ["Bad_Name"]}},
            {"action": "Deny", "protocol": "UDP", "http": {"methods": ["G E T"], "paths": [{}]}},
            {"action": "Allow", "source": {"services": {"name": "db"}, "selector": "a == 'b'"}},
            {"action": "Allow", "metadata": {"annotations": {"k": "line\nbreak"}}},
            {"action": "Allow", "protocol": "ICMP", "notICMP": {"type": 255}}
        ]));
        let want = [
            "spec.ingress[0].destination.ports: ports require protocol TCP, UDP, SCTP or UDPLite",
            "spec.ingress[1].source.ports: protocol ICMP does not support ports",
            "spec.ingress[2].icmp: icmp is only valid with protocol ICMP or ICMPv6",
            "spec.ingress[3].icmp.code: code requires type",
            "spec.ingress[4].protocol: protocol ICMP conflicts with ipVersion 6",
            "spec.ingress[5].source.notNets[0]: 10.0.0.0/8 is IPv4 but the rule is IPv6",
            "spec.ingress[6].destination.nets: source and destination nets are of different IP versions",
            "spec.ingress[7].destination.ports[0]: named port \"Bad_Name\"",
            "spec.ingress[8].http: http match is only valid on Allow rules",
            "spec.ingress[8].http: http match is only valid with protocol TCP",
            "spec.ingress[8].http.methods[0]: invalid HTTP method \"G E T\"",
            "spec.ingress[8].http.paths[0]: exactly one of exact or prefix must be set",
            "spec.ingress[9].source.services: services cannot be combined with nets",
            "spec.ingress[10].metadata.annotations[\"k\"]: annotation value must not contain control characters",
            "spec.ingress[11].notICMP.type: type must be 0-254, got 255",
        ];
        let got = errors(&r);
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for (g, w) in got.iter().zip(want) {
            assert!(
                g.starts_with(&format!("networkpolicies/prod/web: {w}")),
                "{g}\n  wanted {w}"
            );
        }
    }

    #[test]
    fn metadata_rules() {
        let r = mk_resource(json!({
            "kind": "NetworkPolicy",
            "metadata": {"name": "Web/x", "labels": {"ok": "v", "bad key": "v", "k": "bad value"},
                         "annotations": {"a/b/c": "x"}}
        }));
        let got = errors(&r);
        assert!(
            got[0].starts_with(
                "networkpolicies/Web/x: metadata.name: \"Web/x\" must not contain '/'"
            ),
            "{got:#?}"
        );
        assert!(got[1].contains("metadata.namespace: namespace is required for a NetworkPolicy"));
        assert!(got[2].contains(
            "metadata.labels[\"bad key\"]: label key \"bad key\" must not contain whitespace"
        ));
        assert!(got[3].contains("metadata.labels[\"k\"]: label value \"bad value\" contains ' '"));
        assert!(got[4].contains(
            "metadata.annotations[\"a/b/c\"]: label key \"a/b/c\" has more than one '/'"
        ));
        assert_eq!(got.len(), 5);

        let r = mk_resource(json!({
            "kind": "GlobalNetworkSet", "metadata": {"name": "g", "namespace": "x"}
        }));
        assert_eq!(
            errors(&r),
            vec![
                "globalnetworksets/g: metadata.namespace: a GlobalNetworkSet is cluster-scoped and cannot have a namespace (got \"x\")"
            ]
        );
    }

    #[test]
    fn global_policy_flags() {
        let r = mk_resource(json!({
            "kind": "GlobalNetworkPolicy", "metadata": {"name": "host"},
            "spec": {"tier": "Security.Tier", "doNotTrack": true, "preDNAT": true,
                     "types": ["Ingress", "Egress", "Ingress"], "egress": [{"action": "Deny"}],
                     "performanceHints": ["Fast"]}
        }));
        let got = errors(&r);
        let want = [
            "globalnetworkpolicies/host: spec.tier: tier name \"Security.Tier\" contains 'S'",
            "globalnetworkpolicies/host: spec.types[2]: Ingress is listed more than once",
            "globalnetworkpolicies/host: spec.performanceHints[0]: unknown performance hint \"Fast\"",
            "globalnetworkpolicies/host: spec.preDNAT: preDNAT and doNotTrack cannot both be true",
            "globalnetworkpolicies/host: spec.egress: a preDNAT policy cannot have egress rules",
            "globalnetworkpolicies/host: spec.types[1]: a preDNAT policy cannot have type Egress",
            "globalnetworkpolicies/host: spec.applyOnForward: applyOnForward must be true",
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for (g, w) in got.iter().zip(want) {
            assert!(g.starts_with(w), "{g}\n  wanted {w}");
        }
    }

    #[test]
    fn tier_and_profile() {
        let r = mk_resource(json!({
            "kind": "Tier", "metadata": {"name": "security.x"},
            "spec": {"order": 100, "defaultAction": "Allow"}
        }));
        let got = errors(&r);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(
            got[0].starts_with(
                "tiers/security.x: metadata.name: tier name \"security.x\" contains '.'"
            )
        );
        assert_eq!(
            got[1],
            "tiers/security.x: spec.defaultAction: default action must be Deny or Pass, got Allow"
        );

        let r = mk_resource(json!({
            "kind": "Profile", "metadata": {"name": "kns.prod"},
            "spec": {"labelsToApply": {"pcns.projectcalico.org/name": "prod", "x": "a b"},
                     "egress": [{"action": "Allow", "protocol": "TCP", "source": {"ports": ["5:1"]}}]}
        }));
        let got = errors(&r);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert_eq!(
            got[0],
            "profiles/kns.prod: spec.egress[0].source.ports[0]: port range 5:1 is reversed"
        );
        assert!(
            got[1].starts_with("profiles/kns.prod: spec.labelsToApply[\"x\"]: label value \"a b\"")
        );
    }

    #[test]
    fn endpoints() {
        let r = mk_resource(json!({
            "kind": "WorkloadEndpoint", "metadata": {"name": "n-k8s-p-eth0", "namespace": "ns"},
            "spec": {"node": "n", "pod": "p", "containerID": "abc def",
                     "ipNetworks": ["10.0.0.1"], "ipNATs": [{"internalIP": "10.0.0.2", "externalIP": "1.2.3.4"}],
                     "ipv4Gateway": "fe80::1", "profiles": ["kns.ns", "Bad"],
                     "interfaceName": "cali-this-is-too-long", "mac": "zz",
                     "ports": [{"name": "http", "protocol": "ICMP", "port": 0, "hostIP": "x"}]}
        }));
        let got = errors(&r);
        let want = [
            "spec.containerID: \"abc def\" must not contain whitespace",
            "spec.ipNATs[0].internalIP: 10.0.0.2 is not in the endpoint's ipNetworks",
            "spec.ipv4Gateway: invalid IPv4 address \"fe80::1\"",
            "spec.profiles[1]: name \"Bad\" contains 'B'",
            "spec.interfaceName: interface name \"cali-this-is-too-long\" is 21 characters long",
            "spec.mac: invalid MAC address \"zz\"",
            "spec.ports[0].protocol: protocol must be TCP, UDP or SCTP, got ICMP",
            "spec.ports[0].port: port must be 1-65535, got 0",
            "spec.ports[0].hostIP: invalid IP address \"x\"",
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for (g, w) in got.iter().zip(want) {
            assert!(
                g.starts_with(&format!("workloadendpoints/ns/n-k8s-p-eth0: {w}")),
                "{g}\n  wanted {w}"
            );
        }

        let r = mk_resource(
            json!({"kind": "HostEndpoint", "metadata": {"name": "h"}, "spec": {"node": "n"}}),
        );
        assert_eq!(
            errors(&r),
            vec![
                "hostendpoints/h: spec: a host endpoint must have an interfaceName or expectedIPs"
            ]
        );
        let r = mk_resource(json!({"kind": "HostEndpoint", "metadata": {"name": "h"},
                                   "spec": {"node": "n", "interfaceName": "*"}}));
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn staged_policies_validate_their_policy_spec() {
        let r = mk_resource(json!({
            "kind": "StagedNetworkPolicy", "metadata": {"name": "s", "namespace": "n"},
            "spec": {"stagedAction": "Set", "ingress": [{"action": "Allow", "icmp": {"type": 1}}]}
        }));
        assert_eq!(
            errors(&r),
            vec![
                "stagednetworkpolicies/n/s: spec.ingress[0].icmp: icmp is only valid with protocol ICMP or ICMPv6"
            ]
        );
    }
}
