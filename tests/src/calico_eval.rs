//! The Calico side of the independent evaluator: Tiers and GlobalNetworkPolicies (projectcalico.org/v3)
//! read straight from the case's YAML, written from Calico's documentation and nothing else of
//! felixrs. It models what the cases use, and refuses (`Err`) anything else, so a case never gets a
//! verdict from a half-understood policy:
//!
//! * Tier: `order` (default tier 1 000 000), `defaultAction` Deny (default) or Pass.
//! * GlobalNetworkPolicy: `tier` (default `default`), `order` (none sorts last, ties by name),
//!   `selector`, `types` (default Ingress, plus Egress when there are egress rules), rules.
//! * Rule: `action` Allow/Deny/Pass/Log (Log never decides), `protocol`/`notProtocol` (name or
//!   number), `icmp`/`notICMP` `{type, code}`, `ipVersion`, and `source`/`destination` with `nets`,
//!   `notNets`, `selector`, `namespaceSelector`, `ports` (numbers and ranges).
//! * Selectors: `all()`, `has(k)`, `k == 'v'`, `k != 'v'` joined by `&&`. An endpoint carries its
//!   pod labels plus `projectcalico.org/namespace` and `projectcalico.org/orchestrator: k8s`; a
//!   namespaceSelector sees the namespace's labels.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use crate::traffic::{Probe, Proto};

/// A rule's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Allow,
    Deny,
    Pass,
    Log,
}

#[derive(Debug, Clone)]
pub struct Tier {
    pub name: String,
    pub order: f64,
    pub pass_default: bool,
}

/// The other end of a packet, or the endpoint a policy selects.
pub struct Endpoint<'a> {
    pub namespace: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub ns_labels: &'a BTreeMap<String, String>,
    pub ip: IpAddr,
}

#[derive(Debug, Clone)]
pub struct Gnp {
    pub name: String,
    pub tier: String,
    pub order: Option<f64>,
    selector: Selector,
    ingress_type: bool,
    egress_type: bool,
    ingress: Vec<Rule>,
    egress: Vec<Rule>,
}

#[derive(Debug, Clone)]
struct Rule {
    action: Act,
    protocol: Option<u8>,
    not_protocol: Option<u8>,
    icmp: Option<(u8, Option<u8>)>,
    not_icmp: Option<(u8, Option<u8>)>,
    ip_version: Option<u8>,
    source: Entity,
    destination: Entity,
}

#[derive(Debug, Clone, Default)]
struct Entity {
    nets: Vec<IpNet>,
    not_nets: Vec<IpNet>,
    selector: Option<Selector>,
    namespace_selector: Option<Selector>,
    ports: Vec<(u16, u16)>,
}

/// `a && b && ...` of simple terms.
#[derive(Debug, Clone)]
struct Selector(Vec<Term>);

#[derive(Debug, Clone)]
enum Term {
    All,
    Has(String),
    Eq(String, String),
    Ne(String, String),
}

impl Selector {
    fn parse(s: &str) -> Result<Selector, String> {
        let mut terms = Vec::new();
        for part in s.split("&&") {
            let t = part.trim();
            let unquote = |v: &str| -> Result<String, String> {
                let v = v.trim();
                let inner = v
                    .strip_prefix('\'')
                    .and_then(|v| v.strip_suffix('\''))
                    .or_else(|| v.strip_prefix('"').and_then(|v| v.strip_suffix('"')))
                    .ok_or_else(|| format!("unquoted value in selector {s:?}"))?;
                Ok(inner.to_string())
            };
            terms.push(if t == "all()" {
                Term::All
            } else if let Some(k) = t.strip_prefix("has(").and_then(|t| t.strip_suffix(')')) {
                Term::Has(k.trim().to_string())
            } else if let Some((k, v)) = t.split_once("==") {
                Term::Eq(k.trim().to_string(), unquote(v)?)
            } else if let Some((k, v)) = t.split_once("!=") {
                Term::Ne(k.trim().to_string(), unquote(v)?)
            } else {
                return Err(format!("selector {s:?} is beyond this evaluator"));
            });
        }
        Ok(Selector(terms))
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|t| match t {
            Term::All => true,
            Term::Has(k) => labels.contains_key(k),
            Term::Eq(k, v) => labels.get(k) == Some(v),
            Term::Ne(k, v) => labels.get(k) != Some(v),
        })
    }
}

/// The labels a Calico selector sees on a pod's endpoint.
fn endpoint_labels(ep: &Endpoint<'_>) -> BTreeMap<String, String> {
    let mut l = ep.labels.clone();
    l.insert(
        "projectcalico.org/namespace".into(),
        ep.namespace.to_string(),
    );
    l.insert("projectcalico.org/orchestrator".into(), "k8s".into());
    l
}

fn protocol(v: &Value) -> Result<u8, String> {
    if let Some(n) = v.as_u64() {
        return u8::try_from(n).map_err(|_| format!("protocol {n}"));
    }
    let s = v.as_str().ok_or("protocol is neither name nor number")?;
    Ok(match s.to_ascii_lowercase().as_str() {
        "tcp" => 6,
        "udp" => 17,
        "icmp" => 1,
        "icmpv6" => 58,
        "sctp" => 132,
        "udplite" => 136,
        other => other.parse().map_err(|_| format!("protocol {s:?}"))?,
    })
}

fn icmp(v: &Value) -> Result<(u8, Option<u8>), String> {
    let num = |k: &str| v.get(k).and_then(Value::as_u64).map(|n| n as u8);
    let t = num("type").ok_or("icmp without type is beyond this evaluator")?;
    Ok((t, num("code")))
}

fn known_keys(v: &Value, keys: &[&str], what: &str) -> Result<(), String> {
    if let Some(m) = v.as_object() {
        for k in m.keys() {
            if !keys.contains(&k.as_str()) {
                return Err(format!("{what} field {k:?} is beyond this evaluator"));
            }
        }
    }
    Ok(())
}

fn entity(v: Option<&Value>) -> Result<Entity, String> {
    let Some(v) = v else {
        return Ok(Entity::default());
    };
    known_keys(
        v,
        &["nets", "notNets", "selector", "namespaceSelector", "ports"],
        "entity",
    )?;
    let nets = |k: &str| -> Result<Vec<IpNet>, String> {
        v.get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|n| {
                let s = n.as_str().unwrap_or_default();
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("net {s:?}"))
            })
            .collect()
    };
    let sel = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .map(Selector::parse)
            .transpose()
    };
    let ports = v
        .get("ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| {
            if let Some(n) = p.as_u64() {
                return Ok((n as u16, n as u16));
            }
            let s = p.as_str().unwrap_or_default();
            let (a, b) = s.split_once(':').ok_or(format!("port {s:?}"))?;
            Ok((
                a.parse().map_err(|_| format!("port {s:?}"))?,
                b.parse().map_err(|_| format!("port {s:?}"))?,
            ))
        })
        .collect::<Result<_, String>>()?;
    Ok(Entity {
        nets: nets("nets")?,
        not_nets: nets("notNets")?,
        selector: sel("selector")?,
        namespace_selector: sel("namespaceSelector")?,
        ports,
    })
}

fn rule(v: &Value) -> Result<Rule, String> {
    known_keys(
        v,
        &[
            "action",
            "protocol",
            "notProtocol",
            "icmp",
            "notICMP",
            "ipVersion",
            "source",
            "destination",
        ],
        "rule",
    )?;
    let action = match v.get("action").and_then(Value::as_str) {
        Some("Allow") | None => Act::Allow,
        Some("Deny") => Act::Deny,
        Some("Pass") => Act::Pass,
        Some("Log") => Act::Log,
        Some(a) => return Err(format!("action {a:?}")),
    };
    Ok(Rule {
        action,
        protocol: v.get("protocol").map(protocol).transpose()?,
        not_protocol: v.get("notProtocol").map(protocol).transpose()?,
        icmp: v.get("icmp").map(icmp).transpose()?,
        not_icmp: v.get("notICMP").map(icmp).transpose()?,
        ip_version: v.get("ipVersion").and_then(Value::as_u64).map(|n| n as u8),
        source: entity(v.get("source"))?,
        destination: entity(v.get("destination"))?,
    })
}

/// A Calico document of a case: a Tier, a GlobalNetworkPolicy, or an error naming what this
/// evaluator does not model.
pub enum Doc {
    Tier(Tier),
    Gnp(Gnp),
}

pub fn parse(doc: &str) -> Result<Doc, String> {
    let v: Value = serde_yaml::from_str(doc).map_err(|e| e.to_string())?;
    let name = v["metadata"]["name"]
        .as_str()
        .ok_or("no metadata.name")?
        .to_string();
    let spec = &v["spec"];
    match v["kind"].as_str() {
        Some("Tier") => Ok(Doc::Tier(Tier {
            name,
            order: spec["order"].as_f64().unwrap_or(f64::INFINITY),
            pass_default: spec["defaultAction"].as_str() == Some("Pass"),
        })),
        Some("GlobalNetworkPolicy") => {
            known_keys(
                spec,
                &["tier", "order", "selector", "types", "ingress", "egress"],
                "GlobalNetworkPolicy spec",
            )?;
            let rules = |k: &str| -> Result<Vec<Rule>, String> {
                spec[k].as_array().into_iter().flatten().map(rule).collect()
            };
            let (ingress, egress) = (rules("ingress")?, rules("egress")?);
            let types: Vec<&str> = spec["types"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let (ingress_type, egress_type) = if types.is_empty() {
                (true, !egress.is_empty())
            } else {
                (types.contains(&"Ingress"), types.contains(&"Egress"))
            };
            Ok(Doc::Gnp(Gnp {
                name,
                tier: spec["tier"].as_str().unwrap_or("default").to_string(),
                order: spec["order"].as_f64(),
                selector: Selector::parse(spec["selector"].as_str().unwrap_or("all()"))?,
                ingress_type,
                egress_type,
                ingress,
                egress,
            }))
        }
        other => Err(format!("kind {other:?} is beyond this evaluator")),
    }
}

/// The packet as Calico rules see it: protocol number, destination port, ICMP type and code.
pub struct Packet {
    pub proto: u8,
    pub dport: Option<u16>,
    pub icmp: Option<(u8, u8)>,
    pub v6: bool,
}

impl Packet {
    pub fn of(probe: Probe, v6: bool) -> Packet {
        match probe.proto {
            Proto::Tcp => Packet {
                proto: 6,
                dport: Some(probe.port),
                icmp: None,
                v6,
            },
            Proto::Udp => Packet {
                proto: 17,
                dport: Some(probe.port),
                icmp: None,
                v6,
            },
            // An echo request; the probe's port is its code.
            Proto::Icmp => Packet {
                proto: if v6 { 58 } else { 1 },
                dport: None,
                icmp: Some((if v6 { 128 } else { 8 }, probe.port as u8)),
                v6,
            },
            Proto::Ip => Packet {
                proto: probe.port as u8,
                dport: None,
                icmp: None,
                v6,
            },
        }
    }
}

fn icmp_hit(f: (u8, Option<u8>), pkt: &Packet) -> bool {
    pkt.icmp
        .is_some_and(|(t, c)| t == f.0 && f.1.is_none_or(|fc| fc == c))
}

fn entity_matches(e: &Entity, ep: &Endpoint<'_>, port: Option<u16>) -> bool {
    (e.nets.is_empty() || e.nets.iter().any(|n| n.contains(&ep.ip)))
        && !e.not_nets.iter().any(|n| n.contains(&ep.ip))
        && e.selector
            .as_ref()
            .is_none_or(|s| s.matches(&endpoint_labels(ep)))
        && e.namespace_selector
            .as_ref()
            .is_none_or(|s| s.matches(ep.ns_labels))
        && (e.ports.is_empty()
            || port.is_some_and(|p| e.ports.iter().any(|(a, b)| *a <= p && p <= *b)))
}

impl Gnp {
    /// Whether the policy applies to `subject` in this direction.
    pub fn selects(&self, subject: &Endpoint<'_>, ingress: bool) -> bool {
        (if ingress {
            self.ingress_type
        } else {
            self.egress_type
        }) && self.selector.matches(&endpoint_labels(subject))
    }

    /// The action of the first rule (Log aside) matching the packet, if any.
    pub fn verdict(
        &self,
        ingress: bool,
        src: &Endpoint<'_>,
        dst: &Endpoint<'_>,
        pkt: &Packet,
    ) -> Option<Act> {
        let rules = if ingress { &self.ingress } else { &self.egress };
        rules
            .iter()
            .find(|r| {
                r.action != Act::Log
                    && r.ip_version.is_none_or(|v| v == if pkt.v6 { 6 } else { 4 })
                    && r.protocol.is_none_or(|p| p == pkt.proto)
                    && r.not_protocol.is_none_or(|p| p != pkt.proto)
                    && r.icmp.is_none_or(|f| icmp_hit(f, pkt))
                    && r.not_icmp.is_none_or(|f| !icmp_hit(f, pkt))
                    && entity_matches(&r.source, src, None)
                    && entity_matches(&r.destination, dst, pkt.dport)
            })
            .map(|r| r.action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_of_the_subset() {
        let l = labels(&[("pod", "a"), ("ns", "x")]);
        for (sel, want) in [
            ("all()", true),
            ("pod == 'a'", true),
            ("pod == \"a\" && ns != 'y'", true),
            ("pod == 'a' && ns == 'y'", false),
            ("has(pod)", true),
            ("has(team)", false),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
        assert!(Selector::parse("pod in {'a'}").is_err());
        assert!(Selector::parse("pod == a").is_err());
    }

    #[test]
    fn unknown_fields_are_refused_not_ignored() {
        let doc = "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: p}\nspec:\n  ingress: [{action: Allow, http: {methods: [GET]}}]\n";
        assert!(parse(doc).is_err());
        let doc = "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: p}\nspec: {doNotTrack: true}\n";
        assert!(parse(doc).is_err());
    }

    #[test]
    fn icmp_type_code_and_protocol_numbers() {
        let doc = "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: p}\nspec:\n  ingress:\n  - {action: Deny, protocol: ICMPv6, notICMP: {type: 128, code: 3}}\n  - {action: Pass, protocol: 253}\n";
        let Ok(Doc::Gnp(g)) = parse(doc) else {
            panic!("parses")
        };
        let (l, n) = (labels(&[]), labels(&[]));
        let ep = Endpoint {
            namespace: "x",
            labels: &l,
            ns_labels: &n,
            ip: "fd00::1".parse().unwrap(),
        };
        let ping = |code| {
            Packet::of(
                Probe {
                    port: code,
                    proto: Proto::Icmp,
                },
                true,
            )
        };
        assert_eq!(g.verdict(true, &ep, &ep, &ping(0)), Some(Act::Deny));
        assert_eq!(g.verdict(true, &ep, &ep, &ping(3)), None);
        let raw = Packet::of(
            Probe {
                port: 253,
                proto: Proto::Ip,
            },
            true,
        );
        assert_eq!(g.verdict(true, &ep, &ep, &raw), Some(Act::Pass));
        let v4 = Packet::of(
            Probe {
                port: 0,
                proto: Proto::Icmp,
            },
            false,
        );
        assert_eq!(g.verdict(true, &ep, &ep, &v4), None, "ICMPv6 is not ICMP");
    }
}
