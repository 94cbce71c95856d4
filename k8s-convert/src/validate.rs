//! Every resource is validated by the shared model before it is stored.
//!
//! Conversions build `calc_graph::model` resources directly; [`checked`] validates each with the
//! model (names, labels, selectors, ports, protocols, nets), once, where it is converted, so nothing
//! reaches etcd that the agent's model would reject, and the agent's tools take the result as
//! [`Validated`] without checking it again. What is stored is the model's canonical JSON
//! (`Resource::to_json`), encoded when it is written. `projectcalico.org/v3` documents are decoded
//! strictly by [`decode`] (the model's schema): an unknown field outside a rule fails the resource;
//! a rule with an unknown field is kept as written (the canonical form could not carry the field),
//! so the agent sees it and fails that rule safe; see [`failed_safe_reports`].

use calc_graph::model::{Action, ModelError, Resource, Rule, Validated};

use crate::convert::{CalicoResource, Converted, ObjectRef, SkipReport, etcd_key};

/// A problem at one field of a source object: the field's JSON path (relative to the part being
/// converted until a caller puts it [`under`](FieldError::under) its own) and what is wrong. The
/// object is named by the [`SkipReport`] it becomes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl std::fmt::Display) -> Self {
        FieldError {
            field: field.into(),
            message: message.to_string(),
        }
    }

    /// The skip report of this error on `obj`.
    pub fn report(self, obj: &ObjectRef) -> SkipReport {
        SkipReport::new(obj, self.field, self.message)
    }

    /// The same error with `prefix` (e.g. `spec.ingress[0].`) put before its field.
    pub fn under(self, prefix: impl std::fmt::Display) -> Self {
        FieldError {
            field: format!("{prefix}{}", self.field),
            ..self
        }
    }
}

/// Decodes one `projectcalico.org/v3` document with the model; the error is the field and message
/// of the skip report.
pub fn decode(json: &str) -> Result<Resource, FieldError> {
    Resource::from_json(json.as_bytes()).map_err(|e| match e {
        ModelError::Decode { path, message, .. } => FieldError::new(path, message),
        ModelError::UnknownFields { paths, .. } => {
            let all = paths
                .iter()
                .map(|p| format!("{p}: unknown field"))
                .collect::<Vec<_>>()
                .join("; ");
            FieldError::new(paths.first().cloned().unwrap_or_default(), all)
        }
        other => FieldError::new(String::new(), other),
    })
}

/// Whether a decoded document must be stored as written: one of its rules carries a field the
/// model does not know.
pub fn needs_as_written(res: &Resource) -> bool {
    rules_of(res).any(|(_, rule)| !rule.unknown_fields.is_empty())
}

fn first_and_all(errs: Vec<calc_graph::model::ValidationError>) -> FieldError {
    let field = errs.first().map(|e| e.path.clone()).unwrap_or_default();
    let message = errs
        .iter()
        .map(|e| format!("{}: {}", e.path, e.message))
        .collect::<Vec<_>>()
        .join("; ");
    FieldError::new(field, message)
}

/// `(spec.ingress[i], rule)` for every rule of a policy or profile.
fn rules_of(res: &Resource) -> impl Iterator<Item = (String, &Rule)> {
    let (ingress, egress): (&[Rule], &[Rule]) = match res {
        Resource::NetworkPolicy(p) => (&p.spec.ingress, &p.spec.egress),
        Resource::GlobalNetworkPolicy(p) => (&p.spec.ingress, &p.spec.egress),
        Resource::Profile(p) => (&p.spec.ingress, &p.spec.egress),
        _ => (&[], &[]),
    };
    let ing = ingress
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("spec.ingress[{i}]"), r));
    let eg = egress
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("spec.egress[{i}]"), r));
    ing.chain(eg)
}

/// One report per rule field the agent will not enforce (unknown, or known but unenforced):
/// the resource is stored, and the agent fails that rule safe.
pub fn failed_safe_reports(r: &CalicoResource) -> Vec<SkipReport> {
    let Some(res) = r.resource() else {
        return Vec::new();
    };
    let obj = ObjectRef::new(&r.kind, r.namespace.as_deref(), &r.name);
    let mut out = Vec::new();
    for (at, rule) in rules_of(res) {
        let effect = match rule.action {
            Action::Deny | Action::Log => {
                "the agent renders the rule with only its enforced matches"
            }
            Action::Allow | Action::Pass => "the agent does not render the rule",
        };
        for f in &rule.unknown_fields {
            out.push(SkipReport::new(
                &obj,
                format!("{at}.{f}"),
                format!("unknown field; {effect}"),
            ));
        }
        for f in rule.unenforced_fields() {
            out.push(SkipReport::new(
                &obj,
                format!("{at}.{f}"),
                format!("not enforced by this dataplane; {effect}"),
            ));
        }
        // `destination.domains` outside an enforced use (FQDN policy: egress Allow rules).
        for (f, reason) in rule.rejected_domain_fields(at.starts_with("spec.egress")) {
            out.push(SkipReport::new(
                &obj,
                format!("{at}.{f}"),
                format!("{reason}; {effect}"),
            ));
        }
    }
    out
}

/// Validates a converted resource with the model, once: the result carries it as [`Validated`],
/// with a report per rule that fails safe; an invalid resource becomes a skip that retains its key
/// (fail closed).
pub(crate) fn checked(
    res: Resource,
    as_written: Option<String>,
    mut skips: Vec<SkipReport>,
) -> Converted {
    let key = res.key();
    match Validated::of(res) {
        Ok(valid) => {
            let r = CalicoResource::new(valid, as_written);
            skips.extend(failed_safe_reports(&r));
            Converted {
                resource: Some(r),
                skips,
                retain_key: None,
            }
        }
        Err(errs) => {
            let (kind, ns) = (key.kind.kind_name(), key.namespace.as_deref());
            let FieldError { field, message } = first_and_all(errs);
            skips.push(SkipReport::new(
                &ObjectRef::new(kind, ns, &key.name),
                field,
                message,
            ));
            Converted {
                resource: None,
                skips,
                retain_key: etcd_key(kind, ns, &key.name).ok(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gnp(spec: serde_json::Value) -> Converted {
        crate::v3_passthrough::convert_v3(&json!({
            "apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
            "metadata": {"name": "g"}, "spec": spec
        }))
    }

    fn fields_and_messages(skips: &[SkipReport]) -> Vec<(&str, &str)> {
        (skips.iter())
            .map(|s| (s.field.as_str(), s.message.as_str()))
            .collect()
    }

    #[test]
    fn v3_rules_with_unknown_fields_are_stored_as_written_and_reported() {
        let c = gnp(json!({"selector": "all()", "types": ["Ingress"],
            "ingress": [{"action": "Allow", "source": {"selectr": "a == 'b'"}},
                        {"action": "Allow", "http": {"methods": ["GET"]}}]}));
        let stored = c.resource.expect("stored");
        let json = stored.to_json();
        assert!(json.contains("selectr"), "{json}");
        let fields = fields_and_messages(&c.skips);
        assert_eq!(
            fields,
            vec![
                (
                    "spec.ingress[0].source.selectr",
                    "unknown field; the agent does not render the rule"
                ),
                (
                    "spec.ingress[1].http",
                    "not enforced by this dataplane; the agent does not render the rule"
                ),
            ]
        );
        // Without unknown fields the canonical form is stored (selectr gone, keys ordered).
        let c = gnp(json!({"types": ["Ingress"], "selector": "all()"}));
        assert!(c.skips.is_empty());
        assert!(
            c.resource
                .unwrap()
                .to_json()
                .starts_with(r#"{"apiVersion""#)
        );
    }

    #[test]
    fn an_unknown_field_outside_rules_skips_and_retains_the_key() {
        let c = gnp(json!({"selectr": "all()", "ingress": [{"action": "Allow"}]}));
        assert!(c.resource.is_none());
        assert_eq!(
            c.retain_key.as_deref(),
            Some("/calico/resources/v3/projectcalico.org/globalnetworkpolicies/g")
        );
        assert_eq!(c.skips[0].field, "spec.selectr");
        assert_eq!(c.skips[0].message, "spec.selectr: unknown field");
    }

    /// FQDN policy: `destination.domains` is enforced in egress Allow rules (stored, nothing
    /// reported); every other use is stored and reported with the agent's reason.
    #[test]
    fn domain_rules_are_stored_and_misuses_reported_with_the_reason() {
        let c = gnp(json!({"selector": "all()", "types": ["Ingress", "Egress"],
            "ingress": [{"action": "Allow", "destination": {"domains": ["example.com"]}}],
            "egress": [{"action": "Allow", "destination": {"domains": ["*.example.com"]}},
                       {"action": "Allow", "destination": {"domains": ["ok.com", "a..b"]}},
                       {"action": "Deny", "destination": {"domains": ["example.com"]}}]}));
        assert!(c.resource.is_some(), "stored as written");
        let fields = fields_and_messages(&c.skips);
        assert_eq!(
            fields,
            vec![
                (
                    "spec.ingress[0].destination.domains",
                    "domains are enforced only in egress rules; the agent does not render the rule"
                ),
                (
                    "spec.egress[1].destination.domains[1]",
                    "invalid domain name \"a..b\": empty label; the agent does not render the rule"
                ),
                (
                    "spec.egress[2].destination.domains",
                    "domains are enforced only in Allow rules, not Deny; the agent renders the rule with only its enforced matches"
                ),
            ]
        );
    }
}
