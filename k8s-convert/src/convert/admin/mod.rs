//! Cluster-scoped admin policy (kubernetes-sigs/network-policy-api v0.2.0) → Calico
//! GlobalNetworkPolicies in the built-in admin tiers, as Calico maps it
//! (libcalico-go `K8sAdminNetworkPolicyToCalico`, `K8sBaselineAdminNetworkPolicyToCalico`,
//! `K8sClusterNetworkPolicyToCalico`):
//!
//! | source | GlobalNetworkPolicy | tier (order, default action) | order |
//! |---|---|---|---|
//! | AdminNetworkPolicy `x` | `kanp.adminnetworkpolicy.x` | `kube-admin` (1 000, Pass) | `spec.priority` |
//! | ClusterNetworkPolicy `x`, tier Admin | `kcnp.x` | `kube-admin` | `spec.priority` |
//! | BaselineAdminNetworkPolicy `default` | `kbanp.baselineadminnetworkpolicy.default` | `kube-baseline` (10 000 000, Pass) | 1000 |
//! | ClusterNetworkPolicy `x`, tier Baseline | `kcnp.x` | `kube-baseline` | `spec.priority` |
//!
//! Kubernetes NetworkPolicies sit between them in `default` (1 000 000, Deny). Both admin tiers default
//! to Pass, so a policy that selects a pod but matches none of its rules leaves the decision to the next
//! tier, and a Pass rule skips the rest of its tier.
//!
//! Semantics:
//! * subject `namespaces` → `namespaceSelector` + the orchestrator clause as `selector`; `pods` → both
//!   selectors; the same for `namespaces` and `pods` peers (a `namespaces` peer also gets the orchestrator
//!   clause, unlike Calico's conversion, so it never matches anything but pods);
//! * rules keep their order; each expands into one Calico rule per (protocol × peer), protocols sorted,
//!   peers in order (a `networks` peer gives one rule per address family); the rule's `name` becomes the
//!   annotation `name`;
//! * ports: `portNumber`/`portRange` (protocol default TCP), and `namedPort`, which names a container
//!   port of any protocol, so it joins the TCP, UDP and SCTP rules (Calico up to v3.31 ignored it and
//!   matched every port: we do not copy that);
//! * `types` lists only the directions that have rules;
//! * `nodes` peers (egress) select the nodes' network sets `knode.<node>` (the addresses in each Node's
//!   status, see [`super::node_to_network_set`]), which are stored only while some policy uses them;
//! * `domainNames` peers (egress, experimental in both API versions: AdminNetworkPolicy v1alpha1 and
//!   ClusterNetworkPolicy v1alpha2; BaselineAdminNetworkPolicy has none) become Calico's
//!   `destination.domains` (names normalised by `calc_graph::model::DomainPattern`: lowercase, no
//!   trailing dot, one leading `*.` label at most), one Calico rule per peer like every other peer.
//!   As upstream says, only in Allow (ANP) / Accept (CNP) rules, and, as NPEP-133 scopes it, only in the
//!   admin tier (a Baseline CNP could allow what no NetworkPolicy can take back); 1-25 names, no named
//!   ports. Anything else with `domainNames` fails closed (below), reported with the field;
//! * a rule that cannot be converted (a bad CIDR, port, selector or domain name, a `domainNames` peer
//!   where the API does not allow one) fails closed, as the API asks: a Deny or Pass rule becomes
//!   "Deny everything", an Allow/Accept rule is dropped; each is reported with its field;
//! * an invalid policy-level field (subject, priority, name) skips the object, keeping any stored
//!   version (fail closed).

mod ports;
mod types;

use crate::validate::FieldError;
use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::de::DeserializeOwned;

use ports::{anp_ports, cnp_ports};
pub use types::{
    AdminNetworkPolicy, BaselineAdminNetworkPolicy, ClusterNetworkPolicy, GROUP, LabelSelector,
};
use types::{AnpRule, AnpSpec, CnpRule, CnpSpec, Peer, Subject};

use super::labels::{ORCHESTRATOR_CLAUSE, selector_from_label_selector};
use super::networkpolicy::{ProtoPorts, rules_per_protocol_and_peer};
use super::{
    CalicoResource, ConvertOptions, Converted, ObjectRef, SkipReport, etcd_key, metadata, non_empty,
};
use calc_graph::model::{
    Action, DomainPattern, EntityRule, GlobalNetworkPolicy, K8S_ADMIN_POLICY_PREFIXES,
    KUBE_ADMIN_TIER, KUBE_BASELINE_TIER, PolicySpec, PolicyType, Port, Rule, RuleMetadata, Tier,
    Validated,
};

/// GlobalNetworkPolicy name prefix of a converted AdminNetworkPolicy (Calico's
/// `K8sAdminNetworkPolicyNamePrefix`).
pub const ANP_PREFIX: &str = K8S_ADMIN_POLICY_PREFIXES[0];
/// GlobalNetworkPolicy name prefix of a converted BaselineAdminNetworkPolicy.
pub const BANP_PREFIX: &str = K8S_ADMIN_POLICY_PREFIXES[1];
/// GlobalNetworkPolicy name prefix of a converted ClusterNetworkPolicy (Felix's `kcnp.` legacy key).
pub const CNP_PREFIX: &str = K8S_ADMIN_POLICY_PREFIXES[2];
/// The order of the BaselineAdminNetworkPolicy in its tier (Calico's fixed 1000).
pub const BANP_ORDER: f64 = 1000.0;
/// The only name a BaselineAdminNetworkPolicy may have.
pub const BANP_NAME: &str = "default";
/// Rule annotation carrying the source rule's `name` (Calico's `AdminPolicyRuleNameLabel`).
pub const RULE_NAME_ANNOTATION: &str = "name";

/// The most names one `domainNames` peer may list (the API's `MaxItems`).
pub const MAX_DOMAIN_NAMES: usize = 25;

/// A rule action the source kind does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported action {action:?}: want {want}")]
pub struct UnsupportedAction {
    pub action: String,
    pub want: &'static str,
}

/// The three source kinds, as named in reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Anp,
    Banp,
    Cnp,
}

impl Source {
    fn kind(self) -> &'static str {
        match self {
            Source::Anp => "AdminNetworkPolicy",
            Source::Banp => "BaselineAdminNetworkPolicy",
            Source::Cnp => "ClusterNetworkPolicy",
        }
    }

    /// The Calico action of a source action, or why not.
    fn action(self, a: &str) -> Result<Action, UnsupportedAction> {
        match (self, a) {
            (Source::Anp | Source::Banp, "Allow") | (Source::Cnp, "Accept") => Ok(Action::Allow),
            (_, "Deny") => Ok(Action::Deny),
            (Source::Anp | Source::Cnp, "Pass") => Ok(Action::Pass),
            _ => Err(UnsupportedAction {
                action: a.to_string(),
                want: match self {
                    Source::Anp => "Allow, Deny or Pass",
                    Source::Banp => "Allow or Deny",
                    Source::Cnp => "Accept, Deny or Pass",
                },
            }),
        }
    }

    fn max_rules(self) -> usize {
        match self {
            Source::Anp | Source::Banp => 100,
            Source::Cnp => 25,
        }
    }
}

/// Converts an AdminNetworkPolicy into `kanp.adminnetworkpolicy.<name>` in tier `kube-admin`.
pub fn admin_network_policy_to_calico(o: &AdminNetworkPolicy, _opts: &ConvertOptions) -> Converted {
    convert(Source::Anp, &o.metadata, &o.spec)
}

/// Converts the BaselineAdminNetworkPolicy into `kbanp.baselineadminnetworkpolicy.default` in tier
/// `kube-baseline`.
pub fn baseline_admin_network_policy_to_calico(
    o: &BaselineAdminNetworkPolicy,
    _opts: &ConvertOptions,
) -> Converted {
    convert(Source::Banp, &o.metadata, &o.spec)
}

/// Converts a ClusterNetworkPolicy into `kcnp.<name>` in tier `kube-admin` or `kube-baseline`.
pub fn cluster_network_policy_to_calico(
    o: &ClusterNetworkPolicy,
    _opts: &ConvertOptions,
) -> Converted {
    convert(Source::Cnp, &o.metadata, &o.spec)
}

/// The built-in Tier resources the admin policies live in (written with them): `kube-admin` and
/// `kube-baseline`, as [`Tier::builtin`] defines them.
pub fn admin_tiers() -> Vec<CalicoResource> {
    (Tier::builtin().into_iter())
        .filter(|t| [KUBE_ADMIN_TIER, KUBE_BASELINE_TIER].contains(&t.metadata.name.as_str()))
        .map(|t| {
            let valid = Validated::of(t.into()).expect("the built-in tiers are valid");
            CalicoResource::new(valid, None)
        })
        .collect()
}

/// Whether an etcd key is that of a converted admin policy (which needs [`admin_tiers`]).
pub fn is_admin_policy_key(key: &str) -> bool {
    key.rsplit_once("/globalnetworkpolicies/")
        .is_some_and(|(_, name)| {
            K8S_ADMIN_POLICY_PREFIXES
                .iter()
                .any(|p| name.starts_with(p))
        })
}

/// Completes a desired key → value map for the admin policies in it: adds the admin Tier resources
/// when it holds an admin policy and does not define the tier itself (a tier from a manifest wins), and
/// keeps the nodes' network sets only while an admin policy has a `nodes` peer (otherwise node
/// addresses would become members of every `all()`-like rule selector of other Calico policies).
pub fn add_admin_tiers<V>(
    resources: &mut BTreeMap<String, V>,
    json: impl Fn(&V) -> std::borrow::Cow<'_, str>,
    value: impl Fn(CalicoResource) -> V,
) {
    let node_sets_used = resources
        .iter()
        .any(|(k, v)| is_admin_policy_key(k) && uses_node_sets(&json(v)));
    if !node_sets_used {
        resources.retain(|k, _| {
            !k.rsplit_once("/globalnetworksets/")
                .is_some_and(|(_, n)| n.starts_with(super::KNODE_PREFIX))
        });
    }
    if !resources.keys().any(|k| is_admin_policy_key(k)) {
        return;
    }
    for t in admin_tiers() {
        if let Ok(k) = t.etcd_key() {
            resources.entry(k).or_insert_with(|| value(t));
        }
    }
}

/// Strict decode of a spec; the error path is relative to `spec`.
fn decode<T: DeserializeOwned>(spec: &serde_json::Value) -> Result<T, FieldError> {
    let e = match serde_path_to_error::deserialize::<_, T>(spec) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let path = e.path().to_string();
    let field = if path == "." {
        "spec".to_string()
    } else {
        format!("spec.{path}")
    };
    Err(FieldError::new(
        field,
        format!("cannot decode: {}", e.into_inner()),
    ))
}

/// A rule of any kind, normalised: action checked, peers and ports still to convert.
struct SourceRule<'a> {
    field: String,
    name: Option<&'a str>,
    action: Result<Action, UnsupportedAction>,
    /// The raw action, for the fail-closed choice when the action itself is bad.
    peers: &'a [Peer],
    peer_field: &'static str,
    ports: Result<ProtoPorts, FieldError>,
    /// Whether a `domainNames` peer may appear in this rule, or why not.
    domains: Result<(), &'static str>,
}

fn convert(
    src: Source,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: &serde_json::Value,
) -> Converted {
    let name = meta.name.as_deref().unwrap_or("");
    let obj = ObjectRef::new(src.kind(), None, name);
    let anp_spec;
    let cnp_spec;
    let prefix = match src {
        Source::Anp => ANP_PREFIX,
        Source::Banp => BANP_PREFIX,
        Source::Cnp => CNP_PREFIX,
    };
    let calico_name = format!("{prefix}{name}");
    let key = match etcd_key("GlobalNetworkPolicy", None, &calico_name) {
        Ok(k) => k,
        Err(e) => return Converted::skipped(SkipReport::new(&obj, "metadata.name", e), None),
    };
    let skip = |e: FieldError| Converted::skipped(e.report(&obj), Some(key.clone()));
    if src == Source::Banp && name != BANP_NAME {
        return Converted::skipped(
            SkipReport::new(
                &obj,
                "metadata.name",
                format!("a BaselineAdminNetworkPolicy must be named {BANP_NAME:?}"),
            ),
            None,
        );
    }
    let (tier, order, subject, ingress, egress): (
        _,
        _,
        &Subject,
        Vec<SourceRule<'_>>,
        Vec<SourceRule<'_>>,
    ) = match src {
        Source::Anp | Source::Banp => {
            anp_spec = match decode::<AnpSpec>(spec) {
                Ok(s) => s,
                Err(e) => return skip(e),
            };
            let order = match (src, anp_spec.priority) {
                (Source::Banp, None) => BANP_ORDER,
                (Source::Banp, Some(_)) => {
                    return skip(FieldError::new(
                        "spec.priority",
                        "cannot decode: unknown field `priority`",
                    ));
                }
                (_, None) => {
                    return skip(FieldError::new("spec.priority", "priority is required"));
                }
                (_, Some(p)) => match priority(p) {
                    Ok(o) => o,
                    Err(e) => return skip(e),
                },
            };
            let tier = if src == Source::Anp {
                KUBE_ADMIN_TIER
            } else {
                KUBE_BASELINE_TIER
            };
            (
                tier,
                order,
                &anp_spec.subject,
                rules_of(anp_spec.ingress.as_deref(), true, |r, f| {
                    anp_rule(src, r, f, true)
                }),
                rules_of(anp_spec.egress.as_deref(), false, |r, f| {
                    anp_rule(src, r, f, false)
                }),
            )
        }
        Source::Cnp => {
            cnp_spec = match decode::<CnpSpec>(spec) {
                Ok(s) => s,
                Err(e) => return skip(e),
            };
            let tier = match cnp_spec.tier.as_str() {
                "Admin" => KUBE_ADMIN_TIER,
                "Baseline" => KUBE_BASELINE_TIER,
                other => {
                    return skip(FieldError::new(
                        "spec.tier",
                        format!("unknown tier {other:?}: want Admin or Baseline"),
                    ));
                }
            };
            let order = match priority(cnp_spec.priority) {
                Ok(o) => o,
                Err(e) => return skip(e),
            };
            let admin = tier == KUBE_ADMIN_TIER;
            (
                tier,
                order,
                &cnp_spec.subject,
                rules_of(cnp_spec.ingress.as_deref(), true, |r, f| {
                    cnp_rule(r, f, true, admin)
                }),
                rules_of(cnp_spec.egress.as_deref(), false, |r, f| {
                    cnp_rule(r, f, false, admin)
                }),
            )
        }
    };
    for (dir, list) in [("ingress", &ingress), ("egress", &egress)] {
        if list.len() > src.max_rules() {
            return skip(FieldError::new(
                format!("spec.{dir}"),
                format!(
                    "{} rules, more than the API's {}",
                    list.len(),
                    src.max_rules()
                ),
            ));
        }
    }
    let (namespace_selector, selector) = match subject_selectors(subject) {
        Ok(s) => s,
        Err(e) => return skip(e),
    };

    let mut skips = Vec::new();
    let mut convert_all = |list: Vec<SourceRule<'_>>, ingress: bool| -> Vec<Rule> {
        let mut out = Vec::new();
        for r in list {
            match source_rule_to_calico(&r, ingress) {
                Ok(rules) => out.extend(rules),
                Err(FieldError { field, message }) => {
                    // Fail closed (network-policy-api: "treat the rule as matching no traffic" for
                    // Allow, "as a Deny all rule" for Deny and Pass).
                    let deny = matches!(r.action, Ok(Action::Deny | Action::Pass));
                    let what = if deny {
                        "rule replaced by one that denies everything"
                    } else {
                        "rule dropped"
                    };
                    skips.push(SkipReport::new(&obj, field, format!("{message} ({what})")));
                    if deny {
                        out.push(Rule::new(Action::Deny));
                    }
                }
            }
        }
        out
    };
    let ingress = convert_all(ingress, true);
    let egress = convert_all(egress, false);
    let mut types = Vec::new();
    if !ingress.is_empty() {
        types.push(PolicyType::Ingress);
    }
    if !egress.is_empty() {
        types.push(PolicyType::Egress);
    }
    let gnp = GlobalNetworkPolicy {
        metadata: metadata(calico_name, None, meta),
        spec: PolicySpec {
            tier: Some(tier.to_string()),
            order: Some(order),
            ingress,
            egress,
            selector: non_empty(selector),
            types,
            namespace_selector: non_empty(namespace_selector),
            ..PolicySpec::default()
        },
    };
    Converted::ok(gnp, skips)
}

fn priority(p: i64) -> Result<f64, FieldError> {
    if (0..=1000).contains(&p) {
        Ok(p as f64)
    } else {
        Err(FieldError::new(
            "spec.priority",
            format!("priority {p} is out of range 0-1000"),
        ))
    }
}

/// `(namespaceSelector, selector)` of the subject.
fn subject_selectors(s: &Subject) -> Result<(String, String), FieldError> {
    match (&s.namespaces, &s.pods) {
        (Some(ns), None) => {
            let nss = selector_from_label_selector(Some(&ns.to_k8s()), false)
                .map_err(|e| e.under("spec.subject.namespaces."))?;
            Ok((nss, ORCHESTRATOR_CLAUSE.to_string()))
        }
        (None, Some(p)) => {
            let nss = selector_from_label_selector(Some(&p.namespace_selector.to_k8s()), false)
                .map_err(|e| e.under("spec.subject.pods.namespaceSelector."))?;
            let ps = selector_from_label_selector(Some(&p.pod_selector.to_k8s()), true)
                .map_err(|e| e.under("spec.subject.pods.podSelector."))?;
            Ok((nss, ps))
        }
        _ => Err(FieldError::new(
            "spec.subject",
            "exactly one of namespaces and pods must be set",
        )),
    }
}

fn rule_name_check(name: Option<&str>, field: &str) -> Result<(), FieldError> {
    match name {
        Some(n) if n.chars().count() > 100 => Err(FieldError::new(
            format!("{field}.name"),
            "rule name is longer than 100 characters",
        )),
        Some(n) if n.chars().any(char::is_control) => Err(FieldError::new(
            format!("{field}.name"),
            "rule name contains control characters",
        )),
        _ => Ok(()),
    }
}

fn dir_name(ingress: bool) -> &'static str {
    if ingress { "ingress" } else { "egress" }
}

/// `spec.ingress` or `spec.egress`, each rule converted by `rule` with its field path.
fn rules_of<'a, R>(
    list: Option<&'a [R]>,
    ingress: bool,
    rule: impl Fn(&'a R, &str) -> SourceRule<'a>,
) -> Vec<SourceRule<'a>> {
    let dir = dir_name(ingress);
    list.unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, r)| rule(r, &format!("spec.{dir}[{i}]")))
        .collect()
}

/// The peers of the rule's direction (`from` in ingress, `to` in egress) and the field naming
/// them, and its ports from `ports`; a rule that names the other direction's peers has an error
/// in place of its ports (it is dropped).
fn peers_and_ports<'a>(
    (from, to): (Option<&'a [Peer]>, Option<&'a [Peer]>),
    field: &str,
    ingress: bool,
    ports: impl FnOnce() -> Result<ProtoPorts, FieldError>,
) -> (&'a [Peer], &'static str, Result<ProtoPorts, FieldError>) {
    let (peers, peer_field, wrong) = if ingress {
        (from, "from", to.map(|_| "to"))
    } else {
        (to, "to", from.map(|_| "from"))
    };
    let ports = match wrong {
        Some(w) => Err(FieldError::new(
            format!("{field}.{w}"),
            format!("an {} rule has no {w:?}", dir_name(ingress)),
        )),
        None => ports(),
    };
    (peers.unwrap_or_default(), peer_field, ports)
}

fn anp_rule<'a>(src: Source, r: &'a AnpRule, field: &str, ingress: bool) -> SourceRule<'a> {
    let (peers, peer_field, ports) =
        peers_and_ports((r.from.as_deref(), r.to.as_deref()), field, ingress, || {
            anp_ports(r.ports.as_deref(), field)
        });
    let action = src.action(&r.action);
    let domains = match (src, &action) {
        (Source::Banp, _) => Err("a BaselineAdminNetworkPolicy has no domainNames peers"),
        (_, Ok(Action::Allow)) => Ok(()),
        _ => Err("domainNames peers are allowed only in Allow rules"),
    };
    SourceRule {
        field: field.to_string(),
        name: r.name.as_deref(),
        action,
        peers,
        peer_field,
        ports,
        domains,
    }
}

fn cnp_rule<'a>(r: &'a CnpRule, field: &str, ingress: bool, admin: bool) -> SourceRule<'a> {
    let (peers, peer_field, ports) =
        peers_and_ports((r.from.as_deref(), r.to.as_deref()), field, ingress, || {
            cnp_ports(r.protocols.as_deref(), field)
        });
    let action = Source::Cnp.action(&r.action);
    let domains = match (admin, &action) {
        (false, _) => Err("domainNames peers are allowed only in the Admin tier"),
        (true, Ok(Action::Allow)) => Ok(()),
        _ => Err("domainNames peers are allowed only in Accept rules"),
    };
    SourceRule {
        field: field.to_string(),
        name: r.name.as_deref(),
        action,
        peers,
        peer_field,
        ports,
        domains,
    }
}

/// One peer → the Calico entity rules it matches (OR). `networks` splits by address family,
/// because one Calico rule cannot mix them.
fn peer_to_entities(
    peer: &Peer,
    ingress: bool,
    has_named: bool,
    domains: Result<(), &'static str>,
) -> Result<Vec<EntityRule>, FieldError> {
    let set: Vec<&str> = [
        ("namespaces", peer.namespaces.is_some()),
        ("pods", peer.pods.is_some()),
        ("nodes", peer.nodes.is_some()),
        ("networks", peer.networks.is_some()),
        ("domainNames", peer.domain_names.is_some()),
    ]
    .into_iter()
    .filter_map(|(n, s)| s.then_some(n))
    .collect();
    let [which] = set.as_slice() else {
        return Err(FieldError::new(
            String::new(),
            format!(
                "exactly one of namespaces, pods{} must be set",
                if ingress {
                    ""
                } else {
                    ", nodes, networks and domainNames"
                }
            ),
        ));
    };
    if ingress && !matches!(*which, "namespaces" | "pods") {
        return Err(FieldError::new(
            format!(".{which}"),
            format!("{which} is not an ingress peer: want namespaces or pods"),
        ));
    }
    match *which {
        "namespaces" => {
            let sel = peer.namespaces.as_ref().expect("checked").to_k8s();
            let nss = selector_from_label_selector(Some(&sel), false)
                .map_err(|e| e.under(".namespaces."))?;
            // The orchestrator clause keeps the peer to pods: a negative namespace selector
            // (`NotIn`, `DoesNotExist`) alone would also match host endpoints and global network
            // sets, which have no namespace labels (Calico's conversion leaves that gap open).
            Ok(vec![EntityRule {
                selector: Some(ORCHESTRATOR_CLAUSE.to_string()),
                namespace_selector: non_empty(nss),
                ..EntityRule::default()
            }])
        }
        "pods" => {
            let p = peer.pods.as_ref().expect("checked");
            let nss = selector_from_label_selector(Some(&p.namespace_selector.to_k8s()), false)
                .map_err(|e| e.under(".pods.namespaceSelector."))?;
            let ps = selector_from_label_selector(Some(&p.pod_selector.to_k8s()), true)
                .map_err(|e| e.under(".pods.podSelector."))?;
            Ok(vec![EntityRule {
                selector: non_empty(ps),
                namespace_selector: non_empty(nss),
                ..EntityRule::default()
            }])
        }
        "networks" => {
            if has_named {
                return Err(FieldError::new(
                    ".networks",
                    "a networks peer cannot be used with named ports",
                ));
            }
            let nets = peer.networks.as_deref().expect("checked");
            if nets.is_empty() || nets.len() > 25 {
                return Err(FieldError::new(
                    ".networks",
                    format!("{} networks: want 1-25", nets.len()),
                ));
            }
            let (mut v4, mut v6) = (Vec::new(), Vec::new());
            for (k, n) in nets.iter().enumerate() {
                let net: IpNet = n.parse().map_err(|_| {
                    FieldError::new(format!(".networks[{k}]"), format!("invalid CIDR {n:?}"))
                })?;
                let s = net.trunc();
                match net {
                    IpNet::V4(_) => v4.push(s),
                    IpNet::V6(_) => v6.push(s),
                }
            }
            Ok([v4, v6]
                .into_iter()
                .filter(|n| !n.is_empty())
                .map(|nets| EntityRule {
                    nets,
                    ..EntityRule::default()
                })
                .collect())
        }
        "nodes" => {
            if has_named {
                return Err(FieldError::new(
                    ".nodes",
                    "a nodes peer cannot be used with named ports",
                ));
            }
            let sel = peer.nodes.as_ref().expect("checked").to_k8s();
            let labels =
                selector_from_label_selector(Some(&sel), false).map_err(|e| e.under(".nodes."))?;
            Ok(vec![EntityRule {
                selector: Some(node_selector(&labels)),
                ..EntityRule::default()
            }])
        }
        _ => {
            let names = peer.domain_names.as_deref().expect("checked");
            Ok(vec![EntityRule {
                domains: domain_names(names, has_named, domains)?,
                ..EntityRule::default()
            }])
        }
    }
}

/// A `domainNames` peer's names, validated and normalised (duplicates after normalisation dropped,
/// order kept), or the first problem with its field (`.domainNames` or `.domainNames[k]`).
fn domain_names(
    names: &[String],
    has_named: bool,
    allowed: Result<(), &'static str>,
) -> Result<Vec<String>, FieldError> {
    allowed.map_err(|m| FieldError::new(".domainNames", m))?;
    if has_named {
        return Err(FieldError::new(
            ".domainNames",
            "a domainNames peer cannot be used with named ports",
        ));
    }
    if names.is_empty() || names.len() > MAX_DOMAIN_NAMES {
        return Err(FieldError::new(
            ".domainNames",
            format!("{} domain names: want 1-{MAX_DOMAIN_NAMES}", names.len()),
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for (k, n) in names.iter().enumerate() {
        let p = DomainPattern::parse(n)
            .map_err(|e| FieldError::new(format!(".domainNames[{k}]"), e))?;
        if !out.iter().any(|o| o == p.as_str()) {
            out.push(p.as_str().to_string());
        }
    }
    Ok(out)
}

/// The selector of a `nodes` peer: the nodes' network sets (see [`super::node_to_network_set`]) whose
/// labels match, and never an endpoint or a namespaced set, whatever labels those carry.
fn node_selector(labels: &str) -> String {
    let base = format!(
        "has({}) && !has(projectcalico.org/orchestrator) && !has(projectcalico.org/namespace)",
        super::NODE_MARKER_LABEL
    );
    if labels == "all()" {
        base
    } else {
        format!("{base} && {labels}")
    }
}

/// Whether a converted admin policy (its stored JSON) has a `nodes` peer.
pub fn uses_node_sets(json: &str) -> bool {
    json.contains(&format!("has({})", super::NODE_MARKER_LABEL))
}

fn source_rule_to_calico(r: &SourceRule<'_>, ingress: bool) -> Result<Vec<Rule>, FieldError> {
    let action = r
        .action
        .clone()
        .map_err(|m| FieldError::new(format!("{}.action", r.field), m))?;
    rule_name_check(r.name, &r.field)?;
    let ports = r.ports.clone()?;
    let has_named = ports
        .values()
        .flatten()
        .flatten()
        .any(|p| matches!(p, Port::Named(_)));
    if r.peers.is_empty() || r.peers.len() > 100 {
        return Err(FieldError::new(
            format!("{}.{}", r.field, r.peer_field),
            format!("{} peers: want 1-100", r.peers.len()),
        ));
    }
    let mut peers = Vec::new();
    for (j, p) in r.peers.iter().enumerate() {
        let entities = peer_to_entities(p, ingress, has_named, r.domains)
            .map_err(|e| e.under(format!("{}.{}[{j}]", r.field, r.peer_field)))?;
        peers.extend(entities);
    }
    let metadata = r.name.filter(|n| !n.is_empty()).map(|n| RuleMetadata {
        annotations: BTreeMap::from([(RULE_NAME_ANNOTATION.to_string(), n.to_string())]),
    });
    let template = Rule {
        metadata,
        ..Rule::new(action)
    };
    Ok(rules_per_protocol_and_peer(
        &template, ports, &peers, ingress,
    ))
}
