//! Kubernetes `LabelSelector` → Calico selector (libcalico-go `k8sSelectorToCalico`).
//!
//! Calico joins one clause per term with ` && `: `matchLabels` first, keys sorted, as
//! `k == 'v'`; then `matchExpressions` in order: `In` → `k in {…}`, `NotIn` → `k not in {…}`,
//! `Exists` → `has(k)`, `DoesNotExist` → `!has(k)`. We build the same tree directly. Plain types
//! keep calc-graph free of k8s-openapi.
//!
//! Validation follows the API server (`ValidateLabelSelector`): qualified-name keys, label-value
//! values, a known operator, values present for `In`/`NotIn` and absent for
//! `Exists`/`DoesNotExist`. Calico itself skips unknown operators silently; we refuse them,
//! because dropping a term would widen the selector.

use std::collections::{BTreeMap, BTreeSet};

use super::ast::Expr;
use super::lexer::excerpt;
use super::{Selector, SelectorError};

/// One `matchExpressions` entry (`metav1.LabelSelectorRequirement`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelectorRequirement {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist` (case-sensitive, as in Kubernetes).
    pub operator: String,
    pub values: Vec<String>,
}

/// Converts a Kubernetes LabelSelector. An empty selector (no labels, no expressions) is
/// `all()`; one term is that term; more are one flat `And`.
pub fn from_label_selector(
    match_labels: &BTreeMap<String, String>,
    match_expressions: &[LabelSelectorRequirement],
) -> Result<Selector, SelectorError> {
    Ok(Selector::all_of(label_selector_terms(
        match_labels,
        match_expressions,
    )?))
}

/// The clauses of a LabelSelector in Calico's order, for callers that put their own clauses in
/// front, e.g. the pod-selector conversion: `Selector::all_of([orchestrator == 'k8s', terms…])`
/// is the tree Calico parses from `projectcalico.org/orchestrator == 'k8s' && …`.
pub fn label_selector_terms(
    match_labels: &BTreeMap<String, String>,
    match_expressions: &[LabelSelectorRequirement],
) -> Result<Vec<Expr>, SelectorError> {
    let mut terms = Vec::with_capacity(match_labels.len() + match_expressions.len());
    for (key, value) in match_labels {
        validate_qualified_name(key)
            .map_err(|m| field_error(format!("matchLabels key {}", excerpt(key)), m))?;
        validate_label_value(value).map_err(|m| {
            field_error(
                format!("matchLabels[{}] value {}", excerpt(key), excerpt(value)),
                m,
            )
        })?;
        terms.push(Expr::Eq(key.clone(), value.clone()));
    }
    for (i, req) in match_expressions.iter().enumerate() {
        terms.push(requirement_term(i, req)?);
    }
    Ok(terms)
}

fn requirement_term(i: usize, req: &LabelSelectorRequirement) -> Result<Expr, SelectorError> {
    let field = |name: &str| format!("matchExpressions[{i}].{name}");
    validate_qualified_name(&req.key)
        .map_err(|m| field_error(format!("{} {}", field("key"), excerpt(&req.key)), m))?;
    let needs_values = match req.operator.as_str() {
        "In" | "NotIn" => true,
        "Exists" | "DoesNotExist" => false,
        other => {
            return Err(field_error(
                field("operator"),
                format!(
                    "unknown operator {} (expected In, NotIn, Exists or DoesNotExist)",
                    excerpt(other)
                ),
            ));
        }
    };
    if needs_values && req.values.is_empty() {
        return Err(field_error(
            field("values"),
            format!("must be specified when operator is {}", req.operator),
        ));
    }
    if !needs_values && !req.values.is_empty() {
        return Err(field_error(
            field("values"),
            format!("may not be specified when operator is {}", req.operator),
        ));
    }
    for (j, value) in req.values.iter().enumerate() {
        validate_label_value(value)
            .map_err(|m| field_error(format!("{}[{j}] {}", field("values"), excerpt(value)), m))?;
    }
    let key = req.key.clone();
    let values: BTreeSet<String> = req.values.iter().cloned().collect();
    Ok(match req.operator.as_str() {
        "In" => Expr::In(key, values),
        "NotIn" => Expr::NotIn(key, values),
        "Exists" => Expr::Has(key),
        _ => Expr::Not(Box::new(Expr::Has(key))),
    })
}

fn field_error(field: String, message: String) -> SelectorError {
    SelectorError::new(0, format!("label selector {field}: {message}"))
}

/// Kubernetes `IsQualifiedName`: `[dns-subdomain "/"] name`.
fn validate_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        validate_dns_subdomain(prefix).map_err(|m| format!("prefix {m}"))?;
    }
    if name.is_empty() {
        return Err("name part must not be empty".into());
    }
    validate_name_part(name).map_err(|m| format!("name part {m}"))
}

/// Kubernetes `IsValidLabelValue`: empty, or a name part.
fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    validate_name_part(value)
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters.
fn validate_name_part(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err("must be no more than 63 characters".into());
    }
    let b = s.as_bytes();
    let edge_ok = |c: u8| c.is_ascii_alphanumeric();
    let inner_ok = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    let valid = match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => edge_ok(f) && edge_ok(l) && b.iter().all(|&c| inner_ok(c)),
        _ => false,
    };
    if valid {
        Ok(())
    } else {
        Err("must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric".into())
    }
}

/// RFC 1123 subdomain: dot-separated lowercase labels `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most
/// 253 characters.
fn validate_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 253 {
        return Err("must be no more than 253 characters".into());
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        !b.is_empty()
            && b.first().is_some_and(edge)
            && b.last().is_some_and(edge)
            && b.iter().all(|c| edge(c) || *c == b'-')
    };
    if s.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("must be a lowercase RFC 1123 subdomain".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::parse;

    fn mk_req(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    fn mk_match_labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn converts_to_the_tree_calico_parses_from_its_text() {
        // (matchLabels, matchExpressions, the text Calico's k8sSelectorToCalico produces).
        type Case<'a> = (
            Vec<(&'a str, &'a str)>,
            Vec<LabelSelectorRequirement>,
            &'a str,
        );
        let cases: Vec<Case<'_>> = vec![
            (vec![], vec![], "all()"),
            (vec![("app", "web")], vec![], "app == 'web'"),
            (
                vec![("tier", "db"), ("app", "web")],
                vec![],
                "app == 'web' && tier == 'db'",
            ),
            (
                vec![("app", "web")],
                vec![
                    mk_req("env", "In", &["prod", "dev", "prod"]),
                    mk_req("team", "NotIn", &["x"]),
                    mk_req("k8s.io/role", "Exists", &[]),
                    mk_req("legacy", "DoesNotExist", &[]),
                ],
                "app == 'web' && env in { 'prod', 'dev', 'prod' } && team not in { 'x' } && \
                 has(k8s.io/role) && ! has(legacy)",
            ),
            (vec![], vec![mk_req("a", "Exists", &[])], "has(a)"),
            (vec![("a", "")], vec![], "a == ''"),
        ];
        for (labels, exprs, calico_text) in cases {
            let got = from_label_selector(&mk_match_labels(&labels), &exprs).unwrap();
            assert_eq!(got, parse(calico_text).unwrap(), "{calico_text}");
        }
    }

    #[test]
    fn pod_selector_terms_join_flat_with_the_orchestrator_clause() {
        let mut terms = vec![Expr::Eq(
            "projectcalico.org/orchestrator".into(),
            "k8s".into(),
        )];
        terms.extend(label_selector_terms(&mk_match_labels(&[("app", "db")]), &[]).unwrap());
        let sel = Selector::all_of(terms);
        assert_eq!(
            sel,
            parse("projectcalico.org/orchestrator == 'k8s' && app == 'db'").unwrap()
        );
        assert_eq!(
            sel.canonical(),
            r#"(projectcalico.org/orchestrator == "k8s" && app == "db")"#
        );
    }

    #[test]
    fn rejects_what_the_api_server_rejects() {
        let none = BTreeMap::new();
        // (requirements, text the error must contain).
        let cases = [
            (
                mk_req("a", "Equals", &["x"]),
                "matchExpressions[0].operator: unknown operator \"Equals\"",
            ),
            (mk_req("a", "in", &["x"]), "unknown operator \"in\""),
            (
                mk_req("a", "In", &[]),
                "matchExpressions[0].values: must be specified when operator is In",
            ),
            (
                mk_req("a", "NotIn", &[]),
                "must be specified when operator is NotIn",
            ),
            (
                mk_req("a", "Exists", &["x"]),
                "may not be specified when operator is Exists",
            ),
            (mk_req("", "Exists", &[]), "matchExpressions[0].key"),
            (mk_req("a b", "Exists", &[]), "name part must consist of"),
            (
                mk_req("Bad_Prefix/a", "Exists", &[]),
                "prefix must be a lowercase RFC 1123 subdomain",
            ),
            (mk_req("a/b/c", "Exists", &[]), "name part"),
            (
                mk_req("a", "In", &["it's"]),
                "matchExpressions[0].values[0]",
            ),
            (
                mk_req(&"k".repeat(64), "Exists", &[]),
                "no more than 63 characters",
            ),
        ];
        for (req, want) in cases {
            let err = from_label_selector(&none, std::slice::from_ref(&req)).unwrap_err();
            assert!(err.message.contains(want), "{req:?}: {err}");
        }
        let err = from_label_selector(&mk_match_labels(&[("app", "a\"b")]), &[]).unwrap_err();
        assert!(err.message.contains("matchLabels[\"app\"] value"), "{err}");
        let err = from_label_selector(&mk_match_labels(&[("-app", "x")]), &[]).unwrap_err();
        assert!(err.message.contains("matchLabels key \"-app\""), "{err}");
    }

    #[test]
    fn accepts_qualified_keys() {
        let exprs = [mk_req("app.kubernetes.io/name", "In", &["a-b_c.d"])];
        let sel = from_label_selector(&BTreeMap::new(), &exprs).unwrap();
        assert_eq!(sel.canonical(), r#"app.kubernetes.io/name in {"a-b_c.d"}"#);
    }
}
