//! Conversion of datastore resources into the graph's inputs (Felix's update processors and
//! `ValidationFilter`): workload endpoint labels and addresses, host endpoint and network set
//! items, policies with their combined selectors and scanned rules.

use std::collections::BTreeMap;
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::model::{
    GlobalNetworkPolicy, HostEndpoint, Kind, NetworkPolicy, PolicySpec, PolicyType, Resource,
    ResourceKey, WorkloadEndpoint,
};
use crate::proto::{EndpointId, PolicyId, PolicyKind};

use super::error::GraphError;
use super::labels::{ItemData, NamedPort};
use super::remote::LABEL_CLUSTER;
use super::rules::{
    self, FailedSafeRule, LABEL_NAMESPACE, LABEL_ORCHESTRATOR, LABEL_SERVICE_ACCOUNT, NS_PREFIX,
    SA_PREFIX, ScannedRules,
};

/// Identity of a local endpoint: a workload endpoint, or a host endpoint (by resource name).
/// Workload endpoints sort first, so their outputs precede the host endpoints' in a batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum LocalId {
    Workload(EndpointId),
    Host(String),
}

/// An endpoint on this node: a workload endpoint, or a host endpoint with an `interfaceName`.
pub(crate) struct LocalEp {
    pub id: LocalId,
    pub interface_name: String,
    pub ipv4_nets: Vec<IpNet>,
    pub ipv6_nets: Vec<IpNet>,
    pub profiles: Vec<String>,
    pub allow_spoofed_source_prefixes: Vec<IpNet>,
}

/// A policy built from its resource, before its selector is registered.
pub(crate) struct PolicyDraft {
    pub id: PolicyId,
    pub selector: crate::selector::Selector,
    pub order: Option<f64>,
    pub ingress: bool,
    pub egress: bool,
    pub untracked: bool,
    pub pre_dnat: bool,
    pub apply_on_forward: bool,
    pub rules: Arc<ScannedRules>,
}

/// The graph's ValidationFilter: the body must match the key and validate.
pub(crate) fn check(key: &ResourceKey, r: &Resource) -> Result<(), GraphError> {
    // Compare in place: building the body's key would clone its namespace and name for every
    // update of the initial sync.
    let meta = r.metadata();
    let kind = r.kind();
    let body_ns = meta.namespace.as_deref().filter(|_| kind.is_namespaced());
    if kind != key.kind || meta.name != key.name || body_ns != key.namespace.as_deref() {
        return Err(GraphError::KeyMismatch {
            key: key.clone(),
            body: r.key(),
        });
    }
    r.validate().map_err(GraphError::Invalid)
}

pub(crate) fn build_policy(
    key: &ResourceKey,
    r: Resource,
) -> Result<(PolicyDraft, Vec<FailedSafeRule>), GraphError> {
    let (kind, spec) = match r {
        Resource::NetworkPolicy(NetworkPolicy { spec, .. }) => (PolicyKind::NetworkPolicy, spec),
        Resource::GlobalNetworkPolicy(GlobalNetworkPolicy { spec, .. }) => {
            (PolicyKind::GlobalNetworkPolicy, spec)
        }
        other => return Err(GraphError::NotAPolicy(other.kind())),
    };
    build_policy_spec(key, kind, spec)
}

/// A policy of `kind` (enforced or staged) from its Calico spec: namespaced kinds are scoped to
/// the key's namespace.
pub(crate) fn build_policy_spec(
    key: &ResourceKey,
    kind: PolicyKind,
    spec: PolicySpec,
) -> Result<(PolicyDraft, Vec<FailedSafeRule>), GraphError> {
    let namespace = match kind {
        PolicyKind::GlobalNetworkPolicy | PolicyKind::StagedGlobalNetworkPolicy => None,
        _ => Some(key.namespace.clone().unwrap_or_default()),
    };
    let selector = match &namespace {
        Some(ns) => rules::network_policy_selector(&spec, ns)?,
        None => rules::global_policy_selector(&spec)?,
    };
    let scanned = rules::scan_rules(&spec.ingress, &spec.egress, namespace.as_deref())?;
    let types = spec.effective_types();
    let warnings = scanned.failed_safe.clone();
    let namespaced = namespace.is_some();
    let draft = PolicyDraft {
        id: PolicyId {
            kind,
            tier: spec.tier_name().to_string(),
            namespace,
            name: key.name.clone(),
        },
        selector,
        order: spec.order,
        ingress: types.contains(&PolicyType::Ingress),
        egress: types.contains(&PolicyType::Egress),
        // A NetworkPolicy has none of the three flags (validation), and Felix's NetworkPolicy
        // processor always sets applyOnForward.
        untracked: spec.do_not_track,
        pre_dnat: spec.pre_dnat,
        apply_on_forward: spec.apply_on_forward || namespaced,
        rules: Arc::new(scanned),
    };
    Ok((draft, warnings))
}

/// An item's labels, borrowed from its resource.
pub(crate) type LabelPairs<'a> = Vec<(&'a str, &'a str)>;

pub(crate) fn str_pairs(m: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
    m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Labels of a workload endpoint as Felix sees them: its own labels without `pcns.`/`pcsa.`
/// ones (nor `projectcalico.org/cluster`: only federation sets it, so no endpoint can pose as
/// another cluster's), plus the namespace, orchestrator and service-account labels from its key and spec.
pub(crate) fn wep_labels<'a>(
    key: &'a ResourceKey,
    w: &'a WorkloadEndpoint,
) -> Vec<(&'a str, &'a str)> {
    let mut labels: Vec<(&str, &str)> = w
        .metadata
        .labels
        .iter()
        .filter(|(k, _)| {
            !k.starts_with(NS_PREFIX) && !k.starts_with(SA_PREFIX) && k.as_str() != LABEL_CLUSTER
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    labels.push((
        LABEL_NAMESPACE,
        key.namespace.as_deref().unwrap_or_default(),
    ));
    if let Some(o) = &w.spec.orchestrator {
        labels.push((LABEL_ORCHESTRATOR, o));
    }
    if let Some(sa) = &w.spec.service_account_name {
        labels.push((LABEL_SERVICE_ACCOUNT, sa));
    }
    labels
}

/// Parents, IP set data and (if on this node) local-endpoint data of a workload endpoint. The
/// profile list is moved out of `w` (the parents), not copied.
pub(crate) fn wep_item(
    key: &ResourceKey,
    w: &mut WorkloadEndpoint,
    node: &str,
) -> (Vec<String>, ItemData, Option<LocalEp>) {
    let ns = key.namespace.clone().unwrap_or_default();
    let nets: Vec<IpNet> = w.spec.ip_networks.iter().map(|n| n.trunc()).collect();
    let ports = endpoint_ports(&w.spec.ports);
    let parents = std::mem::take(&mut w.spec.profiles);
    let local = (w.spec.node.as_deref() == Some(node)).then(|| LocalEp {
        id: LocalId::Workload(EndpointId {
            namespace: ns,
            name: key.name.clone(),
        }),
        interface_name: w.spec.interface_name.clone().unwrap_or_default(),
        ipv4_nets: nets
            .iter()
            .filter(|n| matches!(n, IpNet::V4(_)))
            .copied()
            .collect(),
        ipv6_nets: nets
            .iter()
            .filter(|n| matches!(n, IpNet::V6(_)))
            .copied()
            .collect(),
        profiles: parents.clone(),
        allow_spoofed_source_prefixes: w
            .spec
            .allow_spoofed_source_prefixes
            .iter()
            .map(|n| n.trunc())
            .collect(),
    });
    (parents, ItemData { nets, ports }, local)
}

/// Parents, IP set data and (if on this node) local-endpoint data of a host endpoint. One without
/// `interfaceName` gets [`crate::proto::BY_EXPECTED_IPS`]: the dataplane applies it to the
/// interfaces that carry one of its `expectedIPs`, as Felix does.
pub(crate) fn hep_item(
    key: &ResourceKey,
    h: &HostEndpoint,
    node: &str,
) -> (Vec<String>, ItemData, Option<LocalEp>) {
    let nets: Vec<IpNet> = h
        .spec
        .expected_ips
        .iter()
        .map(|ip| IpNet::from(*ip))
        .collect();
    let local = match (&h.spec.node, &h.spec.interface_name) {
        (Some(n), iface) if n == node => Some(LocalEp {
            id: LocalId::Host(key.name.clone()),
            interface_name: iface.clone().unwrap_or_default(),
            ipv4_nets: nets
                .iter()
                .filter(|n| matches!(n, IpNet::V4(_)))
                .copied()
                .collect(),
            ipv6_nets: nets
                .iter()
                .filter(|n| matches!(n, IpNet::V6(_)))
                .copied()
                .collect(),
            profiles: h.spec.profiles.clone(),
            allow_spoofed_source_prefixes: Vec::new(),
        }),
        _ => None,
    };
    (
        h.spec.profiles.clone(),
        ItemData {
            nets,
            ports: endpoint_ports(&h.spec.ports),
        },
        local,
    )
}

/// A network set (or global network set) as an item: labels, parents and members. A namespaced
/// set also gets its namespace's label and profile (`kns.<ns>`). `None` when `r` is not a
/// network set of `key`'s kind.
pub(crate) fn net_set_item<'a>(
    key: &'a ResourceKey,
    r: &'a Resource,
) -> Option<(LabelPairs<'a>, Vec<String>, ItemData)> {
    let (meta, spec, ns) = match (key.kind, r) {
        (Kind::NetworkSet, Resource::NetworkSet(s)) => (
            &s.metadata,
            &s.spec,
            Some(key.namespace.as_deref().unwrap_or_default()),
        ),
        (Kind::GlobalNetworkSet, Resource::GlobalNetworkSet(s)) => (&s.metadata, &s.spec, None),
        _ => return None,
    };
    let mut labels = str_pairs(&meta.labels);
    let mut parents = Vec::new();
    if let Some(ns) = ns {
        labels.push((LABEL_NAMESPACE, ns));
        parents.push(format!("kns.{ns}"));
    }
    let data = ItemData {
        nets: split_nets(&spec.nets),
        ports: Vec::new(),
    };
    Some((labels, parents, data))
}

fn endpoint_ports(ports: &[crate::model::EndpointPort]) -> Vec<NamedPort> {
    ports
        .iter()
        .filter(|p| !p.name.is_empty())
        .map(|p| NamedPort {
            name: p.name.clone(),
            protocol: p.protocol,
            port: p.port,
        })
        .collect()
}

/// Network-set CIDRs as set members: masked, and a /0 split into two /1 (the kernel's `hash:net`
/// cannot hold a /0).
pub(crate) fn split_nets(nets: &[IpNet]) -> Vec<IpNet> {
    let mut out = Vec::with_capacity(nets.len());
    for n in nets {
        match n.trunc() {
            IpNet::V4(v) if v.prefix_len() == 0 => {
                out.push(IpNet::V4(
                    Ipv4Net::new([0, 0, 0, 0].into(), 1).expect("valid"),
                ));
                out.push(IpNet::V4(
                    Ipv4Net::new([128, 0, 0, 0].into(), 1).expect("valid"),
                ));
            }
            IpNet::V6(v) if v.prefix_len() == 0 => {
                out.push(IpNet::V6(Ipv6Net::new(0u128.into(), 1).expect("valid")));
                out.push(IpNet::V6(
                    Ipv6Net::new((1u128 << 127).into(), 1).expect("valid"),
                ));
            }
            other => out.push(other),
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}
