//! Validation of rules (`validateRule`, `validateEntityRule`, `validateICMPFields`,
//! `validatePort`, `validateHTTPRule` and the per-direction service/HTTP checks of the policy
//! validators in libcalico-go).

use std::fmt;

use ipnet::IpNet;

use super::super::names::{validate_name, validate_named_port, validate_namespace};
use super::super::primitives::{Action, IpVersion, Port, Protocol};
use super::super::rule::{EntityRule, Rule};
use super::{Ctx, LazyPath, annotations, at};

/// What holds the rules: some checks apply only to policies, some only to global ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    Profile,
    NamespacedPolicy,
    GlobalPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    Ingress,
    Egress,
}

/// The path of one rule (`spec.ingress[2]`), formatted only when an error names it.
struct RulePath<'a> {
    list: &'a str,
    index: usize,
}

impl fmt::Display for RulePath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.list, self.index)
    }
}

/// The path of one side of a rule (`spec.ingress[2].source`), formatted lazily too.
struct SidePath<'a> {
    rule: &'a RulePath<'a>,
    side: &'static str,
}

impl fmt::Display for SidePath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.rule, self.side)
    }
}

pub(super) fn rules(ctx: &mut Ctx, path: &str, rules: &[Rule], owner: Owner, dir: Direction) {
    for (index, r) in rules.iter().enumerate() {
        rule(ctx, &RulePath { list: path, index }, r, owner, dir);
    }
}

fn family(net: &IpNet) -> IpVersion {
    match net {
        IpNet::V4(_) => IpVersion::V4,
        IpNet::V6(_) => IpVersion::V6,
    }
}

fn is_icmp(p: Option<Protocol>) -> bool {
    matches!(p, Some(Protocol::Icmp | Protocol::Number(1)))
}

fn is_icmpv6(p: Option<Protocol>) -> bool {
    matches!(p, Some(Protocol::IcmpV6 | Protocol::Number(58)))
}

fn rule(ctx: &mut Ctx, p: &RulePath<'_>, r: &Rule, owner: Owner, dir: Direction) {
    for (field, proto) in [("protocol", r.protocol), ("notProtocol", r.not_protocol)] {
        if proto == Some(Protocol::Number(0)) {
            ctx.err(format!("{p}.{field}"), "protocol number 0 is invalid");
        }
    }
    icmp(ctx, p, r);
    nets(ctx, p, r);
    for (side, e) in [("source", &r.source), ("destination", &r.destination)] {
        entity(ctx, &SidePath { rule: p, side }, e, r.protocol);
    }
    services(ctx, p, r, owner, dir);
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
                "http match is only valid with protocol TCP or no protocol",
            );
        }
        if owner != Owner::Profile && dir == Direction::Egress {
            ctx.err(
                format!("{p}.http"),
                "http match is not allowed in egress rules",
            );
        }
        for (i, m) in http.methods.iter().enumerate() {
            if http.methods[..i].contains(m) {
                ctx.err(
                    format!("{p}.http.methods[{i}]"),
                    format!("method {m:?} is listed more than once"),
                );
            }
        }
        for (i, path) in http.paths.iter().enumerate() {
            let v = match (&path.exact, &path.prefix) {
                (Some(v), None) | (None, Some(v)) => v,
                _ => {
                    ctx.err(
                        format!("{p}.http.paths[{i}]"),
                        "exactly one of exact or prefix must be set",
                    );
                    continue;
                }
            };
            if !v.starts_with('/') || v.contains(['?', ' ', '#']) {
                ctx.err(
                    format!("{p}.http.paths[{i}]"),
                    format!(
                        "invalid path {v:?}: must start with '/' and not contain '?', '#' or spaces"
                    ),
                );
            }
        }
    }
    for (k, v) in r.annotations() {
        if v.chars().any(char::is_control) {
            ctx.err(
                format!("{p}.metadata.annotations[{k:?}]"),
                "annotation value must not contain control characters",
            );
        }
    }
    if let Some(m) = &r.metadata {
        annotations(ctx, &format!("{p}.metadata.annotations"), &m.annotations);
    }
}

/// ICMP fields need protocol ICMP/ICMPv6, a code needs a type, and the ICMP flavour fixes the
/// IP version.
fn icmp(ctx: &mut Ctx, p: &RulePath<'_>, r: &Rule) {
    let icmp_protocol = is_icmp(r.protocol) || is_icmpv6(r.protocol);
    for (field, icmp) in [("icmp", &r.icmp), ("notICMP", &r.not_icmp)] {
        let Some(icmp) = icmp else { continue };
        if !icmp_protocol {
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
    for (field, proto) in [("protocol", r.protocol), ("notProtocol", r.not_protocol)] {
        let need = if is_icmp(proto) {
            IpVersion::V4
        } else if is_icmpv6(proto) {
            IpVersion::V6
        } else {
            continue;
        };
        if let Some(v) = r.ip_version
            && v != need
        {
            ctx.err(
                format!("{p}.ipVersion"),
                format!(
                    "ipVersion must be {} with {field} {}",
                    need.number(),
                    proto.map(|p| p.to_string()).unwrap_or_default()
                ),
            );
        }
    }
}

/// Every CIDR must match `ipVersion`, and one rule cannot mix IPv4 and IPv6 CIDRs.
fn nets(ctx: &mut Ctx, p: &RulePath<'_>, r: &Rule) {
    let (mut seen_v4, mut seen_v6) = (false, false);
    for (field, list) in [
        ("source.nets", &r.source.nets),
        ("source.notNets", &r.source.not_nets),
        ("destination.nets", &r.destination.nets),
        ("destination.notNets", &r.destination.not_nets),
    ] {
        let (mut v4, mut v6) = (false, false);
        for (j, net) in list.iter().enumerate() {
            let f = family(net);
            v4 |= f == IpVersion::V4;
            v6 |= f == IpVersion::V6;
            if let Some(v) = r.ip_version
                && f != v
            {
                ctx.err(
                    format!("{p}.{field}[{j}]"),
                    format!(
                        "{net} is IPv{} but the rule has ipVersion {}",
                        f.number(),
                        v.number()
                    ),
                );
            }
        }
        if (v4 && (v6 || seen_v6)) || (v6 && seen_v4) {
            ctx.err(
                format!("{p}.{field}"),
                "rule contains both IPv4 and IPv6 CIDRs",
            );
        }
        seen_v4 |= v4;
        seen_v6 |= v6;
    }
}

fn entity(ctx: &mut Ctx, sp: &SidePath<'_>, e: &EntityRule, protocol: Option<Protocol>) {
    ctx.selector(at!("{sp}.selector"), e.selector.as_deref(), true);
    ctx.selector(at!("{sp}.notSelector"), e.not_selector.as_deref(), false);
    ctx.selector(
        at!("{sp}.namespaceSelector"),
        e.namespace_selector.as_deref(),
        false,
    );
    if let Some(ns) = &e.namespace_selector
        && ns.contains("global(")
        && ns.trim() != "global()"
    {
        ctx.err(
            format!("{sp}.namespaceSelector"),
            "global() cannot be combined with other selectors",
        );
    }
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
            match port {
                Port::Range(a, b) if a > b => {
                    ctx.err(
                        format!("{sp}.{field}[{j}]"),
                        format!("port range {a}:{b} is reversed"),
                    );
                }
                Port::Number(0) | Port::Range(0, _) | Port::Range(_, 0) => {
                    ctx.err(
                        format!("{sp}.{field}[{j}]"),
                        format!("port {port} is invalid: port numbers must be 1-65535"),
                    );
                }
                Port::Named(n) => ctx.check(at!("{sp}.{field}[{j}]"), validate_named_port(n)),
                _ => {}
            }
        }
    }
    if let Some(sa) = &e.service_accounts {
        for (j, n) in sa.names.iter().enumerate() {
            ctx.check(at!("{sp}.serviceAccounts.names[{j}]"), validate_name(n));
        }
        ctx.selector(
            at!("{sp}.serviceAccounts.selector"),
            sa.selector.as_deref(),
            true,
        );
    }
    if let Some(svc) = &e.services {
        if svc.name.is_empty() {
            ctx.err(format!("{sp}.services.name"), "a service name is required");
        } else {
            ctx.check(at!("{sp}.services.name"), validate_name(&svc.name));
        }
        if let Some(ns) = &svc.namespace {
            ctx.check(at!("{sp}.services.namespace"), validate_namespace(ns));
        }
        let conflicts = [
            ("namespaceSelector", e.namespace_selector.is_some()),
            (
                "selector/notSelector",
                e.selector.is_some() || e.not_selector.is_some(),
            ),
            ("serviceAccounts", e.service_accounts.is_some()),
            ("nets/notNets", !e.nets.is_empty() || !e.not_nets.is_empty()),
        ];
        for (what, set) in conflicts {
            if set {
                ctx.err(
                    format!("{sp}.services"),
                    format!("services cannot be combined with {what}"),
                );
            }
        }
    }
}

/// Services go in the source of ingress rules and the destination of egress rules; a destination
/// service takes its ports from the service; global policies must name the service's namespace.
fn services(ctx: &mut Ctx, p: &RulePath<'_>, r: &Rule, owner: Owner, dir: Direction) {
    if r.destination.services.is_some()
        && (!r.destination.ports.is_empty() || !r.destination.not_ports.is_empty())
    {
        ctx.err(
            format!("{p}.destination.services"),
            "destination ports and notPorts cannot be combined with services",
        );
    }
    if owner == Owner::Profile {
        return;
    }
    let (wrong_side, right_side) = match dir {
        Direction::Ingress => ("destination", &r.source),
        Direction::Egress => ("source", &r.destination),
    };
    let wrong = match dir {
        Direction::Ingress => &r.destination,
        Direction::Egress => &r.source,
    };
    if wrong.services.is_some() {
        ctx.err(
            format!("{p}.{wrong_side}.services"),
            format!(
                "services are not allowed in the {wrong_side} of an {} rule",
                if dir == Direction::Ingress {
                    "ingress"
                } else {
                    "egress"
                }
            ),
        );
    }
    if owner == Owner::GlobalPolicy
        && let Some(svc) = &right_side.services
        && svc.namespace.is_none()
    {
        let side = if dir == Direction::Ingress {
            "source"
        } else {
            "destination"
        };
        ctx.err(
            format!("{p}.{side}.services.namespace"),
            "a global policy must give the service's namespace",
        );
    }
}
