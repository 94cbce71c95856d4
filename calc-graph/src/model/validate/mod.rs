//! Semantic validation of decoded resources, following libcalico-go's v3 validator
//! (`libcalico-go/lib/validator/v3/validator.go`).
//!
//! Every check reports into one list, so a caller sees all the problems of a resource at once;
//! each error carries the resource (`networkpolicies/prod/web`) and the JSON path of the field
//! (`spec.ingress[2].destination.ports[0]`).
//!
//! Principle: never be stricter than Calico where that would change behaviour. The graph treats
//! an invalid resource as missing, so rejecting a policy Calico accepts would silently remove its
//! rules. The one deliberate extra is a safety check: rule annotation values (rendered as
//! iptables comments) must not contain control characters.
//!
//! Checked here: metadata (names per kind, namespace presence, labels, annotations), policies
//! (tier, order, selectors, types, performance hints, global-policy flag combinations, staged
//! `Delete` specs), tiers (name, default action, built-in orders), network sets; rules are in
//! [`rule`], endpoints in [`endpoint`], IP pools in [`ippool`].

mod endpoint;
mod ippool;
mod rule;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use super::key::Kind;
use super::names::{
    NameError, validate_global_network_policy_name, validate_label_key, validate_label_value,
    validate_name, validate_namespace, validate_network_policy_name, validate_tier_name,
};
use super::policy::{PolicySpec, PolicyType, StagedAction, StagedPolicySpec};
use super::primitives::Action;
use super::resource::Resource;
use super::tier::{Tier, TierSpec};
use super::{Metadata, ValidationError};
use rule::{Direction, Owner};

/// Kubernetes' (and Calico's) limit on the total size of an annotation map.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// A field path, built only when an error is actually reported (validating a valid resource
/// formats no paths).
trait FieldPath {
    fn build(self) -> String;
}

impl FieldPath for &str {
    fn build(self) -> String {
        self.to_string()
    }
}

impl FieldPath for String {
    fn build(self) -> String {
        self
    }
}

struct LazyPath<F>(F);

impl<F: FnOnce() -> String> FieldPath for LazyPath<F> {
    fn build(self) -> String {
        (self.0)()
    }
}

/// `at!("{p}.selector")`: a lazily formatted [`FieldPath`].
macro_rules! at {
    ($($fmt:tt)*) => {
        LazyPath(|| format!($($fmt)*))
    };
}
use at;

/// Collects the errors of one resource. The resource's name (`networkpolicies/prod/web`) is
/// formatted on the first error only: validating a valid resource allocates nothing for it.
struct Ctx<'r> {
    subject: &'r Resource,
    resource: Option<String>,
    errors: Vec<ValidationError>,
}

impl Ctx<'_> {
    fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        let subject = self.subject;
        let resource = self
            .resource
            .get_or_insert_with(|| subject.key().to_string())
            .clone();
        self.errors.push(ValidationError {
            resource,
            path: path.into(),
            message: message.into(),
        });
    }

    fn check(&mut self, path: impl FieldPath, result: Result<(), NameError>) {
        if let Err(e) = result {
            self.err(path.build(), e.to_string());
        }
    }

    /// Parses a selector field; with `no_global`, `global()` (only meaningful in a rule's
    /// namespaceSelector) is rejected too.
    fn selector(&mut self, path: impl FieldPath, selector: Option<&str>, no_global: bool) {
        let Some(s) = selector else { return };
        let result = crate::selector::parse(s)
            .map(|_| ())
            .map_err(|e| format!("invalid selector {s:?}: {e}"));
        match result {
            Err(e) => self.err(path.build(), e),
            Ok(()) if no_global && s.contains("global()") => self.err(
                path.build(),
                "global() can only be used in a rule's namespaceSelector",
            ),
            Ok(()) => {}
        }
    }
}

pub(super) fn validate_resource(r: &Resource) -> Result<(), Vec<ValidationError>> {
    let mut ctx = Ctx {
        subject: r,
        resource: None,
        errors: Vec::new(),
    };
    metadata(&mut ctx, r.kind(), r.metadata());
    match r {
        Resource::NetworkPolicy(p) => network_policy(&mut ctx, &p.spec),
        Resource::GlobalNetworkPolicy(p) => global_policy(&mut ctx, &p.spec),
        Resource::StagedNetworkPolicy(p) => staged(&mut ctx, &p.spec, network_policy),
        Resource::StagedGlobalNetworkPolicy(p) => staged(&mut ctx, &p.spec, global_policy),
        Resource::StagedKubernetesNetworkPolicy(p) => {
            if p.spec.staged_action == Some(StagedAction::Delete) {
                staged_delete(&mut ctx, p.spec.rest.is_empty());
            }
        }
        Resource::Tier(t) => tier(&mut ctx, &t.metadata.name, &t.spec),
        Resource::Profile(p) => {
            rule::rules(
                &mut ctx,
                "spec.ingress",
                &p.spec.ingress,
                Owner::Profile,
                Direction::Ingress,
            );
            rule::rules(
                &mut ctx,
                "spec.egress",
                &p.spec.egress,
                Owner::Profile,
                Direction::Egress,
            );
            labels(&mut ctx, "spec.labelsToApply", &p.spec.labels_to_apply);
        }
        Resource::WorkloadEndpoint(w) => endpoint::workload_endpoint(&mut ctx, &w.spec),
        Resource::IpPool(p) => ippool::ip_pool(&mut ctx, &p.spec),
        Resource::HostEndpoint(h) => endpoint::host_endpoint(&mut ctx, &h.spec),
        // Nets were checked when decoding; only the reserved label is left.
        Resource::NetworkSet(_) | Resource::GlobalNetworkSet(_) => {
            if r.metadata()
                .labels
                .contains_key(crate::selector::LABEL_NAMESPACE)
            {
                ctx.err(
                    format!("metadata.labels[{:?}]", crate::selector::LABEL_NAMESPACE),
                    "projectcalico.org/namespace is reserved and cannot be set on a network set",
                );
            }
        }
    }
    if ctx.errors.is_empty() {
        Ok(())
    } else {
        Err(ctx.errors)
    }
}

/// A staged Calico policy: with stagedAction Delete its spec may hold only its tier
/// (`tier_only`); otherwise it is checked as the policy it stages.
fn staged(ctx: &mut Ctx<'_>, s: &StagedPolicySpec, policy: fn(&mut Ctx<'_>, &PolicySpec)) {
    if s.staged_action == Some(StagedAction::Delete) {
        let tier_only = PolicySpec {
            tier: s.policy.tier.clone(),
            ..PolicySpec::default()
        };
        staged_delete(ctx, s.policy == tier_only);
    } else {
        policy(ctx, &s.policy);
    }
}

fn staged_delete(ctx: &mut Ctx<'_>, spec_is_empty: bool) {
    if !spec_is_empty {
        ctx.err(
            "spec",
            "with stagedAction Delete every spec field except tier must be empty",
        );
    }
}

fn metadata(ctx: &mut Ctx<'_>, kind: Kind, meta: &Metadata) {
    let name_check = match kind {
        Kind::Tier => validate_tier_name(&meta.name),
        Kind::NetworkPolicy | Kind::StagedNetworkPolicy => validate_network_policy_name(&meta.name),
        Kind::GlobalNetworkPolicy | Kind::StagedGlobalNetworkPolicy => {
            validate_global_network_policy_name(&meta.name)
        }
        _ => validate_name(&meta.name),
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
    annotations(ctx, "metadata.annotations", &meta.annotations);
}

fn labels(ctx: &mut Ctx<'_>, path: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        ctx.check(at!("{path}[{k:?}]"), validate_label_key(k));
        ctx.check(at!("{path}[{k:?}]"), validate_label_value(v));
    }
}

/// Annotation keys are qualified names compared case-insensitively (as Calico lower-cases them
/// before checking); the whole map is at most 256 KiB.
fn annotations(ctx: &mut Ctx<'_>, path: &str, annotations: &BTreeMap<String, String>) {
    let mut size = 0;
    for (k, v) in annotations {
        ctx.check(
            at!("{path}[{k:?}]"),
            validate_label_key(&k.to_ascii_lowercase()),
        );
        size += k.len() + v.len();
    }
    if size > MAX_ANNOTATIONS_BYTES {
        ctx.err(
            path,
            format!("annotations total {size} bytes, more than {MAX_ANNOTATIONS_BYTES}"),
        );
    }
}

fn order(ctx: &mut Ctx<'_>, path: &str, order: Option<f64>) {
    if let Some(o) = order
        && !o.is_finite()
    {
        ctx.err(path, format!("order must be a finite number, got {o}"));
    }
}

fn tier(ctx: &mut Ctx<'_>, name: &str, spec: &TierSpec) {
    order(ctx, "spec.order", spec.order);
    if let Some(a) = spec.default_action
        && !matches!(a, Action::Deny | Action::Pass)
    {
        ctx.err(
            "spec.defaultAction",
            format!("default action must be Deny or Pass, got {a:?}"),
        );
    }
    let fixed = (Tier::builtin().into_iter())
        .find(|t| t.metadata.name == name)
        .and_then(|t| t.spec.order);
    if let Some(want) = fixed
        && spec.order != Some(want)
    {
        ctx.err(
            "spec.order",
            format!("the built-in tier {name} must have order {want}"),
        );
    }
}

/// The fields both policy kinds share.
fn policy_common(ctx: &mut Ctx<'_>, s: &PolicySpec, owner: Owner) {
    if let Some(t) = &s.tier {
        ctx.check("spec.tier", validate_tier_name(t));
    }
    order(ctx, "spec.order", s.order);
    ctx.selector("spec.selector", s.selector.as_deref(), true);
    ctx.selector(
        "spec.serviceAccountSelector",
        s.service_account_selector.as_deref(),
        true,
    );
    for (i, t) in s.types.iter().enumerate() {
        if s.types[..i].contains(t) {
            ctx.err(
                format!("spec.types[{i}]"),
                format!("{t:?} is listed more than once"),
            );
        }
    }
    for (i, h) in s.performance_hints.iter().enumerate() {
        if h != "AssumeNeededOnEveryNode" {
            ctx.err(
                format!("spec.performanceHints[{i}]"),
                format!("unknown performance hint {h:?} (known: AssumeNeededOnEveryNode)"),
            );
        }
    }
    rule::rules(ctx, "spec.ingress", &s.ingress, owner, Direction::Ingress);
    rule::rules(ctx, "spec.egress", &s.egress, owner, Direction::Egress);
}

fn network_policy(ctx: &mut Ctx<'_>, s: &PolicySpec) {
    policy_common(ctx, s, Owner::NamespacedPolicy);
    for (field, set) in [
        ("spec.doNotTrack", s.do_not_track),
        ("spec.preDNAT", s.pre_dnat),
        ("spec.applyOnForward", s.apply_on_forward),
        ("spec.namespaceSelector", s.namespace_selector.is_some()),
    ] {
        if set {
            ctx.err(field, "only a GlobalNetworkPolicy has this field");
        }
    }
}

fn global_policy(ctx: &mut Ctx<'_>, s: &PolicySpec) {
    ctx.selector(
        "spec.namespaceSelector",
        s.namespace_selector.as_deref(),
        true,
    );
    policy_common(ctx, s, Owner::GlobalPolicy);
    if s.do_not_track && s.pre_dnat {
        ctx.err("spec.preDNAT", "preDNAT and doNotTrack cannot both be true");
    }
    if s.pre_dnat {
        if !s.egress.is_empty() {
            ctx.err("spec.egress", "a preDNAT policy cannot have egress rules");
        }
        if let Some(i) = s.types.iter().position(|t| *t == PolicyType::Egress) {
            ctx.err(
                format!("spec.types[{i}]"),
                "a preDNAT policy cannot have type Egress",
            );
        }
    }
    if (s.do_not_track || s.pre_dnat) && !s.apply_on_forward {
        ctx.err(
            "spec.applyOnForward",
            "applyOnForward must be true when doNotTrack or preDNAT is true",
        );
    }
}
