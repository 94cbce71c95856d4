//! Rule scanning: Calico rules → [`ParsedRule`]s whose selectors and named ports are IP set ids.
//!
//! This folds together what Felix does in two places:
//! * the update processors (`updateprocessors/rules.go`, `networkpolicyprocessor.go`,
//!   `globalnetworkpolicyprocessor.go`), which build one selector per rule side out of
//!   `selector`, `namespaceSelector` (`pcns.` prefix), `serviceAccounts` (`pcsa.` prefix and
//!   `projectcalico.org/serviceaccount in {...}`) and the policy's namespace, and the policy's own
//!   selector out of `selector`, the namespace, `namespaceSelector` and `serviceAccountSelector`;
//! * the `RuleScanner` (`felix/calc/rule_scanner.go`), which folds `notSelector` into the positive
//!   selector when there is one, splits numeric from named ports, and names the IP sets.
//!
//! The combined selectors are composed as text exactly as Felix composes them and parsed again,
//! so their canonical strings (and so the IP set names) are Felix's. Every component is parsed
//! and re-printed in canonical form first, which keeps a component inside its parentheses.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use crate::model::{
    Action, DomainPattern, EntityRule, PolicySpec, Port, Protocol, Rule, ServiceAccountMatch,
};
use crate::proto::{IpSetId, IpSetKind, ParsedRule, PortRange};
use crate::selector::{self, Expr, Selector, make_unique_id};

pub(crate) use crate::selector::{
    LABEL_NAMESPACE, LABEL_SERVICE_ACCOUNT, NAMESPACE_LABEL_PREFIX as NS_PREFIX,
    SERVICE_ACCOUNT_LABEL_PREFIX as SA_PREFIX,
};
/// Label set on workload endpoints by their orchestrator.
pub(crate) const LABEL_ORCHESTRATOR: &str = "projectcalico.org/orchestrator";

/// An IP set some active rule needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IpSetSpec {
    pub id: IpSetId,
    pub selector: Selector,
    /// `Some((protocol, port name))` for a named-port set.
    pub named_port: Option<(Protocol, String)>,
}

impl IpSetSpec {
    pub(crate) fn kind(&self) -> IpSetKind {
        if self.named_port.is_some() {
            IpSetKind::IpPort
        } else {
            IpSetKind::Net
        }
    }

    fn selector_set(selector: Selector) -> IpSetSpec {
        IpSetSpec {
            id: selector.unique_id(),
            selector,
            named_port: None,
        }
    }

    fn named_port_set(selector: Selector, protocol: Protocol, name: &str) -> IpSetSpec {
        IpSetSpec {
            id: named_port_set_id(&selector, protocol, name),
            selector,
            named_port: Some((protocol, name.to_string())),
        }
    }
}

/// A domain set some active rule needs: the patterns of one rule's `destination.domains`,
/// normalised, sorted and deduplicated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DomainSetSpec {
    pub id: IpSetId,
    pub patterns: Arc<[DomainPattern]>,
}

impl DomainSetSpec {
    fn new(mut patterns: Vec<DomainPattern>) -> DomainSetSpec {
        patterns.sort();
        patterns.dedup();
        DomainSetSpec {
            id: domain_set_id(&patterns),
            patterns: patterns.into(),
        }
    }
}

/// A domain set's id: `d:` + base64url(SHA-224("d:" + the patterns joined by `,`)), in the
/// hashing style of the selector and named-port sets. `patterns` are sorted and deduplicated.
pub fn domain_set_id(patterns: &[DomainPattern]) -> IpSetId {
    let text: Vec<&str> = patterns.iter().map(DomainPattern::as_str).collect();
    make_unique_id("d", &text.join(","))
}

/// Felix's named-port set id: `n:` + base64url(SHA-224("n:" + selectorUID + "," + proto + "," +
/// portName)), `proto` being `tcp`, `udp` or `sctp`.
pub fn named_port_set_id(selector: &Selector, protocol: Protocol, port_name: &str) -> IpSetId {
    let proto = match protocol {
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
        _ => "tcp",
    };
    make_unique_id(
        "n",
        &format!("{},{proto},{port_name}", selector.unique_id()),
    )
}

/// The rules of a policy or profile, scanned.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ScannedRules {
    pub inbound: Vec<ParsedRule>,
    pub outbound: Vec<ParsedRule>,
    /// Every IP set the rules reference, without duplicates.
    pub sets: Vec<IpSetSpec>,
    /// Every domain set the rules reference, without duplicates.
    pub domain_sets: Vec<DomainSetSpec>,
    /// Rules with a field the agent does not enforce (or does not know), and what was done.
    pub failed_safe: Vec<FailedSafeRule>,
}

/// A rule that was not rendered as written because it has a field the dataplane does not
/// enforce (one of [`crate::model::UNENFORCED_RULE_FIELDS`]) or does not know: an Allow rule is
/// not rendered at all, a Deny or Log rule is rendered with its other matches, and a Pass rule
/// becomes a Deny of its other matches. (Dropping a Pass would let a later Allow of the same tier
/// take what the Pass sent on to a later tier's Deny: a wider rule. Denying is never wider.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedSafeRule {
    /// `spec.ingress[0]`.
    pub rule: String,
    pub action: Action,
    /// Unknown fields, relative to the rule (`source.selectr`).
    pub unknown: Vec<String>,
    /// Known but unenforced fields, relative to the rule (`http`).
    pub unenforced: Vec<&'static str>,
    /// Fields enforced only in some uses, used otherwise, each with the reason, relative to the
    /// rule: (`destination.domains[1]`, `invalid domain name "a..b": empty label`).
    pub rejected: Vec<(String, String)>,
}

impl FailedSafeRule {
    /// Whether the rule is rendered (without the fields): Deny and Log are, Pass is (as a Deny),
    /// Allow is not.
    pub fn rendered(&self) -> bool {
        matches!(self.action, Action::Deny | Action::Log | Action::Pass)
    }

    /// Every offending field with the rule's path: `spec.ingress[0].source.selectr`.
    pub fn fields(&self) -> impl Iterator<Item = String> + '_ {
        self.unknown
            .iter()
            .map(String::as_str)
            .chain(self.unenforced.iter().copied())
            .chain(self.rejected.iter().map(|(f, _)| f.as_str()))
            .map(|f| format!("{}.{f}", self.rule))
    }
}

impl fmt::Display for FailedSafeRule {
    /// `spec.ingress[0]: Allow rule not rendered: unknown field source.selectr`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = format!("{:?}", self.action);
        let effect = match self.action {
            Action::Allow => "not rendered",
            Action::Pass => "rendered as Deny with only its enforced matches",
            _ => "rendered with only its enforced matches",
        };
        write!(f, "{}: {action} rule {effect}:", self.rule)?;
        let mut sep = " ";
        for u in &self.unknown {
            write!(f, "{sep}unknown field {u}")?;
            sep = ", ";
        }
        for u in &self.unenforced {
            write!(f, "{sep}unenforced field {u}")?;
            sep = ", ";
        }
        for (field, reason) in &self.rejected {
            write!(f, "{sep}{field}: {reason}")?;
            sep = ", ";
        }
        Ok(())
    }
}

/// A field path for error messages (`spec.ingress[2].source.selector`), formatted only when an
/// error is reported: scanning the rules of a valid policy formats no paths.
type Field<'a> = &'a dyn fmt::Display;

/// `<parent>.<name>`.
struct Sub<'a>(Field<'a>, &'static str);

impl fmt::Display for Sub<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// `spec.<direction>[<index>]`.
struct RuleField(&'static str, usize);

impl fmt::Display for RuleField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spec.{}[{}]", self.0, self.1)
    }
}

/// A selector of a policy or profile that does not parse: names the field and the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: invalid selector {text:?}: {error}")]
pub struct SelectorFieldError {
    /// `spec.selector`, `spec.ingress[0].source.namespaceSelector`, ….
    pub field: String,
    pub text: String,
    pub error: selector::SelectorError,
}

fn parse_field(text: &str, field: Field<'_>) -> Result<Selector, SelectorFieldError> {
    selector::parse(text).map_err(|error| SelectorFieldError {
        field: field.to_string(),
        text: text.to_string(),
        error,
    })
}

/// Canonical text of `text` with every label key prefixed (`parseSelectorAttachPrefix`).
fn prefixed(text: &str, prefix: &str, field: Field<'_>) -> Result<String, SelectorFieldError> {
    Ok(parse_field(text, field)?
        .with_key_prefix(prefix)
        .canonical())
}

/// Replaces `all()` nodes of a whole policy selector, as the GlobalNetworkPolicy processor does
/// on its text (values are left alone).
fn replace_all(e: &Expr, all: &Expr) -> Expr {
    e.clone()
        .map_leaves(&|leaf| if leaf == Expr::All { all.clone() } else { leaf })
}

fn has(key: &str) -> Expr {
    Expr::Has(key.to_string())
}

fn canonical_of(e: Expr) -> String {
    Selector::from_expr(e).canonical()
}

/// `projectcalico.org/namespace == "<ns>"` in canonical form (no quoting issues whatever `ns` is).
fn namespace_clause(ns: &str) -> String {
    canonical_of(Expr::Eq(LABEL_NAMESPACE.to_string(), ns.to_string()))
}

/// `prefixAndAppendSelector`: `(<current>) && <prefixed new>`.
fn prefix_and_append(
    current: String,
    new: Option<&str>,
    prefix: &str,
    field: Field<'_>,
) -> Result<String, SelectorFieldError> {
    let Some(new) = new else { return Ok(current) };
    let p = prefixed(new, prefix, field)?;
    Ok(if current.is_empty() {
        p
    } else {
        format!("({current}) && {p}")
    })
}

/// A user-written selector, checked to parse on its own and then used as written (Felix splices
/// the raw text into `(...)`; a selector that parses alone stays one group inside parentheses).
/// Whitespace-only counts as absent.
fn checked_field(text: Option<&str>, field: Field<'_>) -> Result<String, SelectorFieldError> {
    match text {
        Some(t) if !t.trim().is_empty() => {
            parse_field(t, field)?;
            Ok(t.to_string())
        }
        _ => Ok(String::new()),
    }
}

/// The selector of a namespaced NetworkPolicy, scoped to its namespace.
pub(crate) fn network_policy_selector(
    spec: &PolicySpec,
    ns: &str,
) -> Result<Selector, SelectorFieldError> {
    let mut sel = checked_field(spec.selector.as_deref(), &"spec.selector")?;
    let ns_clause = namespace_clause(ns);
    sel = if sel.is_empty() {
        ns_clause
    } else {
        format!("({sel}) && {ns_clause}")
    };
    sel = prefix_and_append(
        sel,
        spec.service_account_selector.as_deref(),
        SA_PREFIX,
        &"spec.serviceAccountSelector",
    )?;
    parse_field(&sel, &"spec.selector")
}

/// The selector of a GlobalNetworkPolicy, with its namespace and service-account selectors.
pub(crate) fn global_policy_selector(spec: &PolicySpec) -> Result<Selector, SelectorFieldError> {
    let mut sel = checked_field(spec.selector.as_deref(), &"spec.selector")?;
    if let Some(nss) = spec.namespace_selector.as_deref() {
        sel = prefix_and_append(sel, Some(nss), NS_PREFIX, &"spec.namespaceSelector")?;
        let e = parse_field(&sel, &"spec.namespaceSelector")?;
        sel = canonical_of(replace_all(e.expr(), &has(LABEL_NAMESPACE)));
    }
    if let Some(sas) = spec.service_account_selector.as_deref() {
        sel = prefix_and_append(sel, Some(sas), SA_PREFIX, &"spec.serviceAccountSelector")?;
        let e = parse_field(&sel, &"spec.serviceAccountSelector")?;
        sel = canonical_of(replace_all(e.expr(), &has(LABEL_SERVICE_ACCOUNT)));
    }
    parse_field(&sel, &"spec.selector")
}

/// `parseServiceAccounts`.
fn service_accounts_selector(
    sam: &ServiceAccountMatch,
    field: Field<'_>,
) -> Result<String, SelectorFieldError> {
    let updated = match sam.selector.as_deref() {
        Some(s) => prefixed(s, SA_PREFIX, &Sub(field, "selector"))?,
        None => String::new(),
    };
    if sam.names.is_empty() {
        return Ok(updated);
    }
    let names: BTreeSet<String> = sam.names.iter().cloned().collect();
    let names = canonical_of(Expr::In(LABEL_SERVICE_ACCOUNT.to_string(), names));
    Ok(if updated.is_empty() {
        names
    } else {
        format!("({updated}) && ({names})")
    })
}

/// `GetEntityRuleSelector` / `getEndpointSelector`: the one selector of a rule side, or empty.
fn entity_selector(
    er: &EntityRule,
    ns: Option<&str>,
    field: Field<'_>,
) -> Result<String, SelectorFieldError> {
    let sa = match &er.service_accounts {
        Some(sam) => service_accounts_selector(sam, &Sub(field, "serviceAccounts"))?,
        None => String::new(),
    };
    let ns_sel = match (er.namespace_selector.as_deref(), ns) {
        (Some(nss), _) => parse_field(nss, &Sub(field, "namespaceSelector"))?
            .rewrite_namespace_selector()
            .canonical(),
        (None, Some(ns)) => namespace_clause(ns),
        (None, None) => String::new(),
    };
    let own = checked_field(er.selector.as_deref(), &Sub(field, "selector"))?;
    let parts: Vec<&String> = [&sa, &own].into_iter().filter(|s| !s.is_empty()).collect();
    let mut sel = match parts.as_slice() {
        [] => String::new(),
        [one] => (*one).clone(),
        many => format!(
            "({})",
            many.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(") && (")
        ),
    };
    if !ns_sel.is_empty()
        && (!sel.is_empty() || er.not_selector.is_some() || er.namespace_selector.is_some())
    {
        sel = if sel.is_empty() {
            ns_sel
        } else {
            format!("({ns_sel}) && ({sel})")
        };
    }
    Ok(sel)
}

fn split_ports(ports: &[Port]) -> (Vec<PortRange>, Vec<String>) {
    let mut numeric = Vec::new();
    let mut named = Vec::new();
    for p in ports {
        match p {
            Port::Number(n) => numeric.push(PortRange {
                first: *n,
                last: *n,
            }),
            Port::Range(a, b) => numeric.push(PortRange {
                first: *a,
                last: *b,
            }),
            Port::Named(n) => named.push(n.clone()),
        }
    }
    (numeric, named)
}

/// The protocol a named port is looked up with: UDP or SCTP when the rule says so, else TCP
/// (Felix's `namedPortProto`).
fn named_port_protocol(p: Option<Protocol>) -> Protocol {
    match p {
        Some(Protocol::Udp | Protocol::Number(17)) => Protocol::Udp,
        Some(Protocol::Sctp | Protocol::Number(132)) => Protocol::Sctp,
        _ => Protocol::Tcp,
    }
}

struct Side {
    nets: Vec<ipnet::IpNet>,
    not_nets: Vec<ipnet::IpNet>,
    ports: Vec<PortRange>,
    not_ports: Vec<PortRange>,
    named: Vec<IpSetId>,
    not_named: Vec<IpSetId>,
    sets: Vec<IpSetId>,
    not_sets: Vec<IpSetId>,
}

fn push_set(sets: &mut Vec<IpSetSpec>, spec: IpSetSpec) -> IpSetId {
    let id = spec.id.clone();
    if !sets.iter().any(|s| s.id == id) {
        sets.push(spec);
    }
    id
}

fn scan_side(
    er: &EntityRule,
    ns: Option<&str>,
    protocol: Option<Protocol>,
    field: Field<'_>,
    sets: &mut Vec<IpSetSpec>,
) -> Result<Side, SelectorFieldError> {
    let mut pos = entity_selector(er, ns, field)?;
    let mut neg = checked_field(er.not_selector.as_deref(), &Sub(field, "notSelector"))?;
    // combineMatchesIfPossible
    if !pos.is_empty() && !neg.is_empty() {
        pos = format!("({pos}) && (!({neg}))");
        neg = String::new();
    }
    let pos = if pos.is_empty() {
        None
    } else {
        Some(parse_field(&pos, &Sub(field, "selector"))?)
    };
    let neg = if neg.is_empty() {
        None
    } else {
        Some(parse_field(&neg, &Sub(field, "notSelector"))?)
    };
    let (ports, named_ports) = split_ports(&er.ports);
    let (not_ports, not_named_ports) = split_ports(&er.not_ports);
    let proto = named_port_protocol(protocol);
    let base = pos.clone().unwrap_or_else(Selector::all);
    let named = named_ports
        .iter()
        .map(|n| push_set(sets, IpSetSpec::named_port_set(base.clone(), proto, n)))
        .collect();
    let not_named = not_named_ports
        .iter()
        .map(|n| push_set(sets, IpSetSpec::named_port_set(base.clone(), proto, n)))
        .collect();
    let mut sel_sets = Vec::new();
    if (!ports.is_empty() || named_ports.is_empty())
        && let Some(p) = pos
    {
        sel_sets.push(push_set(sets, IpSetSpec::selector_set(p)));
    }
    let not_sets = neg
        .map(|n| vec![push_set(sets, IpSetSpec::selector_set(n))])
        .unwrap_or_default();
    Ok(Side {
        nets: er.nets.iter().map(|n| n.trunc()).collect(),
        not_nets: er.not_nets.iter().map(|n| n.trunc()).collect(),
        ports,
        not_ports,
        named,
        not_named,
        sets: sel_sets,
        not_sets,
    })
}

fn scan_rule(
    rule: &Rule,
    ns: Option<&str>,
    field: Field<'_>,
    sets: &mut Vec<IpSetSpec>,
    domain_set: Option<IpSetId>,
) -> Result<ParsedRule, SelectorFieldError> {
    let src = scan_side(&rule.source, ns, rule.protocol, &Sub(field, "source"), sets)?;
    let dst = scan_side(
        &rule.destination,
        ns,
        rule.protocol,
        &Sub(field, "destination"),
        sets,
    )?;
    Ok(ParsedRule {
        action: Some(rule.action),
        ip_version: rule.ip_version,
        protocol: rule.protocol,
        not_protocol: rule.not_protocol,
        icmp: rule.icmp,
        not_icmp: rule.not_icmp,
        src_nets: src.nets,
        not_src_nets: src.not_nets,
        src_ports: src.ports,
        not_src_ports: src.not_ports,
        src_named_port_ip_set_ids: src.named,
        not_src_named_port_ip_set_ids: src.not_named,
        src_ip_set_ids: src.sets,
        not_src_ip_set_ids: src.not_sets,
        dst_nets: dst.nets,
        not_dst_nets: dst.not_nets,
        dst_ports: dst.ports,
        not_dst_ports: dst.not_ports,
        dst_named_port_ip_set_ids: dst.named,
        not_dst_named_port_ip_set_ids: dst.not_named,
        dst_ip_set_ids: dst.sets,
        not_dst_ip_set_ids: dst.not_sets,
        dst_domain_ip_set_ids: domain_set.into_iter().collect(),
        annotations: rule
            .annotations()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })
}

/// A rule's enforced `destination.domains` as a domain set (`Ok(None)` without domains), or why
/// it cannot be enforced as written ([`Rule::rejected_domain_fields`]).
fn scan_domains(rule: &Rule, egress: bool) -> Result<Option<DomainSetSpec>, Vec<(String, String)>> {
    let rejected = rule.rejected_domain_fields(egress);
    if !rejected.is_empty() {
        return Err(rejected);
    }
    let patterns: Vec<DomainPattern> = (rule.destination.domains.iter())
        .filter_map(|d| DomainPattern::parse(d).ok())
        .collect();
    Ok((!patterns.is_empty()).then(|| DomainSetSpec::new(patterns)))
}

/// Scans a policy's or profile's rules. `ns` is the namespace of a NetworkPolicy (`None` for
/// global policies and profiles). An error means the object is unusable (treated as deleted).
pub(crate) fn scan_rules(
    ingress: &[Rule],
    egress: &[Rule],
    ns: Option<&str>,
) -> Result<ScannedRules, SelectorFieldError> {
    let mut out = ScannedRules::default();
    for (dir, rules, parsed) in [
        ("ingress", ingress, &mut out.inbound),
        ("egress", egress, &mut out.outbound),
    ] {
        for (i, rule) in rules.iter().enumerate() {
            let field = RuleField(dir, i);
            let (domains, rejected) = match scan_domains(rule, dir == "egress") {
                Ok(d) => (d, Vec::new()),
                Err(rejected) => (None, rejected),
            };
            if rule.fails_safe() || !rejected.is_empty() {
                let note = FailedSafeRule {
                    rule: field.to_string(),
                    action: rule.action,
                    unknown: rule.unknown_fields.clone(),
                    unenforced: rule.unenforced_fields(),
                    rejected,
                };
                let rendered = note.rendered();
                out.failed_safe.push(note);
                if !rendered {
                    continue;
                }
                // Deny and Log keep their known matches: they deny (log) at least what was
                // written; scan_rule reads no unenforced field (nor the domains). Pass denies them.
                let mut scanned = scan_rule(rule, ns, &field, &mut out.sets, None)?;
                if rule.action == Action::Pass {
                    scanned.action = Some(Action::Deny);
                }
                parsed.push(scanned);
                continue;
            }
            let domain_set = domains.map(|spec| {
                let id = spec.id.clone();
                if !out.domain_sets.iter().any(|d| d.id == id) {
                    out.domain_sets.push(spec);
                }
                id
            });
            parsed.push(scan_rule(rule, ns, &field, &mut out.sets, domain_set)?);
        }
    }
    Ok(out)
}

/// Calico's built-in `projectcalico-default-allow` profile: one allow rule each way.
pub(crate) fn default_allow() -> ScannedRules {
    let allow = ParsedRule {
        action: Some(Action::Allow),
        ..ParsedRule::default()
    };
    ScannedRules {
        inbound: vec![allow.clone()],
        outbound: vec![allow],
        ..deny_all()
    }
}

/// Felix's `DummyDropRules`: what a referenced but missing profile becomes.
pub(crate) fn deny_all() -> ScannedRules {
    let deny = ParsedRule {
        action: Some(Action::Deny),
        ..ParsedRule::default()
    };
    ScannedRules {
        inbound: vec![deny.clone()],
        outbound: vec![deny],
        sets: Vec::new(),
        domain_sets: Vec::new(),
        failed_safe: Vec::new(),
    }
}
