//! networking.k8s.io/v1 NetworkPolicy → Calico NetworkPolicy `knp.default.<name>`
//! (felix-reference §9.2, `K8sNetworkPolicyToCalico`).
//!
//! Each ingress/egress item expands into one rule per (protocol × peer), protocols sorted, peers in
//! order. An absent or empty `from`/`to` is one unconstrained peer; an absent or empty `ports` is no
//! protocol and no ports. A port without a protocol is TCP (the API server's default); a port without a
//! number allows every port of its protocol and wins over numbered ports of that protocol.

use crate::validate::FieldError;
use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha1::{Digest, Sha1};

use calc_graph::model::{
    Action, EntityRule, NetworkPolicy as CalicoNetworkPolicy, PolicySpec, PolicyType, Port,
    Protocol, Rule,
};

use super::labels::{NameError, selector_from_label_selector};
use super::{ConvertOptions, Converted, ObjectRef, SkipReport, etcd_key, metadata, non_empty};

/// Name prefix of converted policies in etcd mode.
pub const KNP_PREFIX: &str = "knp.default.";

/// The Calico name of Kubernetes NetworkPolicy `name`: `knp.default.<name>`, as Calico's converter
/// names it. Kubernetes allows 253 characters, and so does Calico, so a name longer than 241 would
/// not fit after the prefix and the policy would go unenforced (fail open); such a name becomes a
/// prefix of itself, `-` and 16 hex digits of SHA-1 of the whole name, exactly 253 characters, so
/// every valid NetworkPolicy is stored, under a name that is still unique and deterministic.
pub fn calico_policy_name(name: &str) -> String {
    const MAX: usize = 253;
    let full = format!("{KNP_PREFIX}{name}");
    if full.len() <= MAX {
        return full;
    }
    let hash = hex::encode(&Sha1::digest(name.as_bytes())[..8]);
    let keep = MAX - KNP_PREFIX.len() - 1 - hash.len();
    // `name` is validated later as a DNS subdomain: ASCII, so slicing at a byte index is safe
    // for valid names; anything else is cut at a char boundary and rejected by validation.
    let mut end = keep.min(name.len());
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let head = name[..end].trim_end_matches(['.', '-']);
    format!("{KNP_PREFIX}{head}-{hash}")
}

/// Converts one NetworkPolicy. Invalid rules are dropped and reported; an invalid policy-level field
/// skips the whole policy (its previous stored version is retained).
pub fn network_policy_to_calico(np: &NetworkPolicy, _opts: &ConvertOptions) -> Converted {
    let ns = np.metadata.namespace.as_deref().unwrap_or("default");
    let name = np.metadata.name.as_deref().unwrap_or("");
    let obj = ObjectRef::new("NetworkPolicy", Some(ns), name);
    // A name that needs shortening must first be one Kubernetes accepts (at most 253 characters).
    if KNP_PREFIX.len() + name.len() > 253
        && let Err(e) = calc_graph::model::validate_name(name)
    {
        return Converted::skipped(
            SkipReport::new(&obj, "metadata.name", format!("invalid name: {e}")),
            None,
        );
    }
    let calico_name = calico_policy_name(name);
    let key = match etcd_key("NetworkPolicy", Some(ns), &calico_name) {
        Ok(k) => k,
        Err(e) => return Converted::skipped(SkipReport::new(&obj, "metadata", e), None),
    };
    let skip = |e: FieldError| Converted::skipped(e.report(&obj), Some(key.clone()));
    let Some(spec) = np.spec.as_ref() else {
        return skip(FieldError::new("spec", "missing spec"));
    };
    let selector = match selector_from_label_selector(spec.pod_selector.as_ref(), true) {
        Ok(s) => s,
        Err(e) => return skip(e.under("spec.podSelector.")),
    };

    let ingress_items = spec.ingress.clone().unwrap_or_default();
    let egress_items = spec.egress.clone().unwrap_or_default();
    let mut skips = Vec::new();
    // Rule item `i` of `dir` → Calico rules; an item that does not convert is reported (and dropped).
    let mut convert = |dir: &str, i: usize, peers: &Option<Vec<_>>, ports: &Option<Vec<_>>| {
        let (peers, ports) = (peers.as_deref(), ports.as_deref());
        let ingress = dir == "ingress";
        let peer_field = if ingress { "from" } else { "to" };
        rule_to_calico(
            peers.unwrap_or_default(),
            ports.unwrap_or_default(),
            ingress,
            peer_field,
        )
        .unwrap_or_else(|e| {
            skips.push(e.under(format!("spec.{dir}[{i}].")).report(&obj));
            Vec::new()
        })
    };
    let ingress: Vec<Rule> = (ingress_items.iter().enumerate())
        .flat_map(|(i, r)| convert("ingress", i, &r.from, &r.ports))
        .collect();
    let egress: Vec<Rule> = (egress_items.iter().enumerate())
        .flat_map(|(i, r)| convert("egress", i, &r.to, &r.ports))
        .collect();

    // policyTypes, defaulted as the API server does: Ingress always, Egress when egress rules exist.
    let listed = spec.policy_types.clone().unwrap_or_default();
    let (mut has_ingress, mut has_egress) = (false, false);
    if listed.is_empty() {
        has_ingress = true;
        has_egress = !egress_items.is_empty();
    }
    for (i, t) in listed.iter().enumerate() {
        match t.as_str() {
            "Ingress" => has_ingress = true,
            "Egress" => has_egress = true,
            other => {
                return skip(FieldError::new(
                    format!("spec.policyTypes[{i}]"),
                    format!("unknown policy type {other:?}"),
                ));
            }
        }
    }
    let mut types = Vec::new();
    if has_ingress {
        types.push(PolicyType::Ingress);
    }
    if has_egress {
        types.push(PolicyType::Egress);
    }

    let policy = CalicoNetworkPolicy {
        metadata: metadata(calico_name, Some(ns), &np.metadata),
        spec: PolicySpec {
            tier: Some(calc_graph::model::DEFAULT_TIER.to_string()),
            order: Some(1000.0),
            ingress,
            egress,
            selector: non_empty(selector),
            types,
            ..PolicySpec::default()
        },
    };
    Converted::ok(policy, skips)
}

/// `k8sRuleToCalico`: one k8s rule item → Calico rules.
fn rule_to_calico(
    peers: &[NetworkPolicyPeer],
    ports: &[NetworkPolicyPort],
    ingress: bool,
    peer_field: &str,
) -> Result<Vec<Rule>, FieldError> {
    let mut by_protocol = ProtoPorts::new();
    if ports.is_empty() {
        by_protocol.insert(String::new(), None);
    }
    for (j, p) in ports.iter().enumerate() {
        let (proto, port) = port_to_calico(p).map_err(|e| e.under(format!("ports[{j}]")))?;
        add_port(&mut by_protocol, &proto, port);
    }
    let mut calico_peers = Vec::new();
    for (j, peer) in peers.iter().enumerate() {
        calico_peers
            .push(peer_to_calico(peer).map_err(|e| e.under(format!("{peer_field}[{j}].")))?);
    }
    if calico_peers.is_empty() {
        calico_peers.push(EntityRule::default());
    }
    let allow = Rule::new(Action::Allow);
    Ok(rules_per_protocol_and_peer(
        &allow,
        by_protocol,
        &calico_peers,
        ingress,
    ))
}

/// Protocol (`""` = none) → its ports (`None` = all ports of the protocol).
pub(crate) type ProtoPorts = BTreeMap<String, Option<Vec<Port>>>;

/// Adds `port` of `proto` (`None`: all its ports, which absorbs every single port).
pub(crate) fn add_port(map: &mut ProtoPorts, proto: &str, port: Option<Port>) {
    match (map.get_mut(proto), port) {
        (None, port) => {
            map.insert(proto.to_string(), port.map(|p| vec![p]));
        }
        (Some(entry), None) => *entry = None,
        (Some(Some(list)), Some(p)) => list.push(p),
        (Some(None), Some(_)) => {}
    }
}

/// `k8sRuleToCalico`'s cross product: one copy of `template` (action, metadata) per protocol and
/// peer, with the peer on the remote side and the protocol's ports (simplified) on the destination.
pub(crate) fn rules_per_protocol_and_peer(
    template: &Rule,
    by_protocol: ProtoPorts,
    peers: &[EntityRule],
    ingress: bool,
) -> Vec<Rule> {
    let mut rules = Vec::new();
    for (proto, ports) in by_protocol {
        let ports = simplify_ports(ports.unwrap_or_default());
        // "" (no protocol) does not parse.
        let protocol = proto.parse::<Protocol>().ok();
        for peer in peers {
            let mut rule = template.clone();
            rule.protocol = protocol;
            if ingress {
                rule.source = peer.clone();
                rule.destination.ports = ports.clone();
            } else {
                rule.destination = EntityRule {
                    ports: ports.clone(),
                    ..peer.clone()
                };
            }
            rules.push(rule);
        }
    }
    rules
}

/// One NetworkPolicyPort → (protocol, Some(port) or None for "all ports"). Field suffixes start with `.`.
fn port_to_calico(p: &NetworkPolicyPort) -> Result<(String, Option<Port>), FieldError> {
    let proto = match p.protocol.as_deref() {
        None => "TCP".to_string(),
        Some(s) => match s {
            "TCP" | "UDP" | "SCTP" => s.to_string(),
            other => {
                return Err(FieldError::new(
                    ".protocol",
                    format!("unsupported protocol {other:?}: want TCP, UDP or SCTP"),
                ));
            }
        },
    };
    let port = match &p.port {
        None => {
            if p.end_port.is_some() {
                return Err(FieldError::new(".endPort", "endPort needs a numeric port"));
            }
            return Ok((proto, None));
        }
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(s)) => match s.parse::<i32>() {
            Ok(n) => Some(n),
            Err(_) => {
                if p.end_port.is_some() {
                    return Err(FieldError::new(".endPort", "endPort needs a numeric port"));
                }
                validate_port_name(s).map_err(|m| FieldError::new(".port", m))?;
                return Ok((proto, Some(Port::Named(s.clone()))));
            }
        },
    };
    let n = port.expect("numeric port set above");
    let start = u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| FieldError::new(".port", format!("port {n} is out of range 1-65535")))?;
    match p.end_port {
        None => Ok((proto, Some(Port::Number(start)))),
        Some(e) => {
            let end = u16::try_from(e).ok().filter(|e| *e > 0).ok_or_else(|| {
                FieldError::new(".endPort", format!("endPort {e} is out of range 1-65535"))
            })?;
            if end < start {
                return Err(FieldError::new(
                    ".endPort",
                    format!("endPort {end} is below port {start}"),
                ));
            }
            Ok((
                proto,
                Some(if end == start {
                    Port::Number(start)
                } else {
                    Port::Range(start, end)
                }),
            ))
        }
    }
}

/// IANA service name: 1-15 of lowercase alphanumerics and `-`, at least one letter, no `--`, no `-` at
/// either end.
pub(crate) fn validate_port_name(s: &str) -> Result<(), NameError> {
    let ok = !s.is_empty()
        && s.len() <= 15
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.chars().any(|c| c.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--");
    if ok {
        Ok(())
    } else {
        Err(NameError::PortName(s.to_string()))
    }
}

/// `k8sPeerToCalicoFields`.
fn peer_to_calico(peer: &NetworkPolicyPeer) -> Result<EntityRule, FieldError> {
    if let Some(block) = &peer.ip_block {
        if peer.pod_selector.is_some() || peer.namespace_selector.is_some() {
            return Err(FieldError::new(
                "ipBlock",
                "ipBlock cannot be combined with podSelector or namespaceSelector",
            ));
        }
        let cidr: IpNet = block.cidr.parse().map_err(|_| {
            FieldError::new("ipBlock.cidr", format!("invalid CIDR {:?}", block.cidr))
        })?;
        let mut not_nets = Vec::new();
        for (k, e) in block.except.clone().unwrap_or_default().iter().enumerate() {
            let ex: IpNet = e.parse().map_err(|_| {
                FieldError::new(
                    format!("ipBlock.except[{k}]"),
                    format!("invalid CIDR {e:?}"),
                )
            })?;
            if !cidr.contains(&ex) {
                return Err(FieldError::new(
                    format!("ipBlock.except[{k}]"),
                    format!("{e} is not inside {}", block.cidr),
                ));
            }
            not_nets.push(ex.trunc());
        }
        return Ok(EntityRule {
            nets: vec![cidr.trunc()],
            not_nets,
            ..EntityRule::default()
        });
    }
    let selector = selector_from_label_selector(peer.pod_selector.as_ref(), true)
        .map_err(|e| e.under("podSelector."))?;
    let namespace_selector = match &peer.namespace_selector {
        None => None,
        Some(s) => selector_from_label_selector(Some(s), false)
            .map(non_empty)
            .map_err(|e| e.under("namespaceSelector."))?,
    };
    Ok(EntityRule {
        selector: non_empty(selector),
        namespace_selector,
        ..EntityRule::default()
    })
}

/// `SimplifyPorts`: named ports first (in order), then numeric ports merged into minimal ranges.
pub(crate) fn simplify_ports(ports: Vec<Port>) -> Vec<Port> {
    if ports.len() <= 1 {
        return ports;
    }
    let mut out = Vec::new();
    let mut ranges: Vec<(u16, u16)> = Vec::new();
    for p in ports {
        match p {
            Port::Named(_) => out.push(p),
            Port::Number(n) => ranges.push((n, n)),
            Port::Range(a, b) => ranges.push((a, b)),
        }
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u16, u16)> = Vec::new();
    for (a, b) in ranges {
        match merged.last_mut() {
            Some(last) if u32::from(a) <= u32::from(last.1) + 1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    out.extend(merged.into_iter().map(|(a, b)| {
        if a == b {
            Port::Number(a)
        } else {
            Port::Range(a, b)
        }
    }));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_at_the_kubernetes_limit_are_shortened_not_dropped() {
        use super::calico_policy_name;
        assert_eq!(calico_policy_name("allow-db"), "knp.default.allow-db");
        let at_limit = "a".repeat(241);
        assert_eq!(
            calico_policy_name(&at_limit),
            format!("knp.default.{at_limit}")
        );
        // 253 characters (the Kubernetes maximum), and one that would end in a separator.
        let long = format!(
            "{}.{}.{}.{}",
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(63),
            "e".repeat(61)
        );
        assert_eq!(long.len(), 253);
        let dotted = format!("{}.{}", "f".repeat(223), "g".repeat(29));
        for name in [long.as_str(), dotted.as_str()] {
            let c = calico_policy_name(name);
            assert!(c.len() <= 253, "{c}");
            calc_graph::model::validate_network_policy_name(&c)
                .unwrap_or_else(|e| panic!("{c}: {e}"));
        }
        // Deterministic, and distinct for names that share the kept prefix.
        let other = format!("{}x", &long[..252]);
        assert_eq!(calico_policy_name(&long), calico_policy_name(&long));
        assert_ne!(calico_policy_name(&long), calico_policy_name(&other));
    }

    #[test]
    fn a_name_longer_than_kubernetes_allows_is_still_rejected() {
        let np = |name: &str| NetworkPolicy {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some("ns".to_string()),
                ..Default::default()
            },
            spec: Some(Default::default()),
        };
        let opts = ConvertOptions {
            interface_prefix: "cali".into(),
        };
        let ok = "a".repeat(253);
        assert!(network_policy_to_calico(&np(&ok), &opts).resource.is_some());
        let too_long = "a".repeat(254);
        let c = network_policy_to_calico(&np(&too_long), &opts);
        assert!(c.resource.is_none());
        assert_eq!(c.skips[0].field, "metadata.name");
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn simplify_merges_runs_and_keeps_names_first() {
        let got = simplify_ports(vec![
            Port::Number(82),
            Port::Named("http".into()),
            Port::Number(80),
            Port::Number(81),
            Port::Range(90, 95),
            Port::Number(96),
        ]);
        assert_eq!(
            got,
            vec![
                Port::Named("http".into()),
                Port::Range(80, 82),
                Port::Range(90, 96)
            ]
        );
    }

    #[test]
    fn port_names() {
        assert!(validate_port_name("http").is_ok());
        assert!(validate_port_name("web-80").is_ok());
        assert!(validate_port_name("80").is_err());
        assert!(validate_port_name("a--b").is_err());
        assert!(validate_port_name("this-is-too-long-name").is_err());
    }

    fn covered(ports: &[Port]) -> std::collections::BTreeSet<u16> {
        let mut s = std::collections::BTreeSet::new();
        for p in ports {
            match p {
                Port::Number(n) => {
                    s.insert(*n);
                }
                Port::Range(a, b) => s.extend(*a..=*b),
                Port::Named(_) => {}
            }
        }
        s
    }

    proptest! {
        /// Simplification never changes which ports are covered, and leaves no two ranges that touch.
        #[test]
        fn simplify_preserves_coverage(raw in proptest::collection::vec((1u16..400, 0u16..20), 0..12)) {
            let ports: Vec<Port> = raw.iter().map(|(a, w)| {
                if *w == 0 { Port::Number(*a) } else { Port::Range(*a, a + w) }
            }).collect();
            let out = simplify_ports(ports.clone());
            prop_assert_eq!(covered(&out), covered(&ports));
            if ports.len() > 1 {
                for w in out.windows(2) {
                    let end = match &w[0] { Port::Number(n) => *n, Port::Range(_, b) => *b, Port::Named(_) => 0 };
                    let start = match &w[1] { Port::Number(n) => *n, Port::Range(a, _) => *a, Port::Named(_) => u16::MAX };
                    prop_assert!(u32::from(start) > u32::from(end) + 1);
                }
            }
        }
    }
}
