//! Kubernetes name/label validation and the LabelSelector → Calico selector rendering of
//! `k8sSelectorToCalico` (felix-reference §9.2), byte for byte.
//!
//! Validation is what keeps names, labels and selector strings safe: a valid label value cannot contain
//! a quote, so the `key == 'value'` strings built here always parse back to the same meaning.

use crate::validate::FieldError;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// The orchestrator clause every converted pod selector starts with.
pub const ORCHESTRATOR_CLAUSE: &str = "projectcalico.org/orchestrator == 'k8s'";

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// A Kubernetes name, label or port name the API server would reject (the offending text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{0:?} is not a valid DNS label")]
    DnsLabel(String),
    #[error("{0:?} is not a valid DNS subdomain")]
    DnsSubdomain(String),
    #[error("label key {0:?} has an invalid prefix")]
    LabelKeyPrefix(String),
    #[error("label key {0:?} is invalid")]
    LabelKey(String),
    #[error("label value {0:?} is invalid")]
    LabelValue(String),
    #[error("{0:?} is not a valid port name")]
    PortName(String),
}

/// RFC 1123 label: lowercase alphanumerics and `-`, starting and ending alphanumeric, at most 63.
pub fn validate_dns_label(s: &str) -> Result<(), NameError> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(NameError::DnsLabel(s.to_string()))
    }
}

/// RFC 1123 subdomain: dot-separated DNS labels, at most 253 characters.
pub fn validate_dns_subdomain(s: &str) -> Result<(), NameError> {
    let ok = !s.is_empty() && s.len() <= 253 && s.split('.').all(|p| validate_dns_label(p).is_ok());
    if ok {
        Ok(())
    } else {
        Err(NameError::DnsSubdomain(s.to_string()))
    }
}

/// A label name segment (or value): at most 63 of `[A-Za-z0-9_.-]`, alphanumeric at both ends.
fn validate_label_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| is_alnum(c) || matches!(c, '-' | '_' | '.'))
        && s.starts_with(is_alnum)
        && s.ends_with(is_alnum)
}

/// A label key: `[prefix/]name` with a DNS-subdomain prefix.
pub fn validate_label_key(k: &str) -> Result<(), NameError> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        validate_dns_subdomain(p).map_err(|_| NameError::LabelKeyPrefix(k.to_string()))?;
    }
    if !validate_label_segment(name) {
        return Err(NameError::LabelKey(k.to_string()));
    }
    Ok(())
}

/// A label value: empty, or a label segment.
pub fn validate_label_value(v: &str) -> Result<(), NameError> {
    if v.is_empty() || validate_label_segment(v) {
        Ok(())
    } else {
        Err(NameError::LabelValue(v.to_string()))
    }
}

/// Checks every key and value of an object's labels; the error's field is
/// `metadata.labels.<key>`.
pub fn validate_metadata_labels(labels: &BTreeMap<String, String>) -> Result<(), FieldError> {
    for (k, v) in labels {
        let err = |e: NameError| FieldError::new(format!("metadata.labels.{k}"), e);
        validate_label_key(k).map_err(err)?;
        validate_label_value(v).map_err(err)?;
    }
    Ok(())
}

/// Renders a k8s LabelSelector the way `k8sSelectorToCalico` does.
///
/// * `pod == true`: starts with the orchestrator clause; `None` or `{}` gives just that clause.
/// * `pod == false` (namespace selectors): `{}` gives `all()`.
///
/// Then ` && k == 'v'` per matchLabels entry (keys sorted) and the matchExpressions in order. The error
/// is `(field, message)` relative to the selector.
pub fn selector_from_label_selector(
    sel: Option<&LabelSelector>,
    pod: bool,
) -> Result<String, FieldError> {
    let mut parts: Vec<String> = Vec::new();
    if pod {
        parts.push(ORCHESTRATOR_CLAUSE.to_string());
    }
    let Some(sel) = sel else {
        return Ok(parts.join(" && "));
    };
    let labels = sel.match_labels.clone().unwrap_or_default();
    let exprs = sel.match_expressions.clone().unwrap_or_default();
    if !pod && labels.is_empty() && exprs.is_empty() {
        return Ok("all()".to_string());
    }
    for (k, v) in &labels {
        let field = format!("matchLabels.{k}");
        validate_label_key(k).map_err(|e| FieldError::new(field.clone(), e))?;
        validate_label_value(v).map_err(|e| FieldError::new(field.clone(), e))?;
        parts.push(format!("{k} == '{v}'"));
    }
    for (i, e) in exprs.iter().enumerate() {
        let field = format!("matchExpressions[{i}]");
        validate_label_key(&e.key).map_err(|m| FieldError::new(format!("{field}.key"), m))?;
        let values = e.values.clone().unwrap_or_default();
        for v in &values {
            validate_label_value(v).map_err(|m| FieldError::new(format!("{field}.values"), m))?;
        }
        let list = values.join("', '");
        if !matches!(
            e.operator.as_str(),
            "In" | "NotIn" | "Exists" | "DoesNotExist"
        ) {
            return Err(FieldError::new(
                format!("{field}.operator"),
                format!("unknown operator {:?}", e.operator),
            ));
        }
        let needs_values = matches!(e.operator.as_str(), "In" | "NotIn");
        if needs_values && values.is_empty() {
            return Err(FieldError::new(
                format!("{field}.values"),
                format!("operator {} needs at least one value", e.operator),
            ));
        }
        if !needs_values && !values.is_empty() {
            return Err(FieldError::new(
                format!("{field}.values"),
                format!("operator {} takes no values", e.operator),
            ));
        }
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in {{ '{list}' }}", e.key),
            "NotIn" => format!("{} not in {{ '{list}' }}", e.key),
            "Exists" => format!("has({})", e.key),
            _ => format!("! has({})", e.key),
        });
    }
    Ok(parts.join(" && "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn mk_req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: if values.is_empty() {
                None
            } else {
                Some(values.iter().map(|s| s.to_string()).collect())
            },
        }
    }

    #[test]
    fn renders_like_calico() {
        let sel = LabelSelector {
            match_labels: Some([("b".into(), "2".into()), ("a".into(), "1".into())].into()),
            match_expressions: Some(vec![
                mk_req("t", "In", &["x", "y"]),
                mk_req("u", "NotIn", &["z"]),
                mk_req("v", "Exists", &[]),
                mk_req("w", "DoesNotExist", &[]),
            ]),
        };
        assert_eq!(
            selector_from_label_selector(Some(&sel), true).unwrap(),
            "projectcalico.org/orchestrator == 'k8s' && a == '1' && b == '2' && t in { 'x', 'y' } \
             && u not in { 'z' } && has(v) && ! has(w)"
        );
        let empty = LabelSelector::default();
        assert_eq!(
            selector_from_label_selector(Some(&empty), true).unwrap(),
            ORCHESTRATOR_CLAUSE
        );
        assert_eq!(
            selector_from_label_selector(Some(&empty), false).unwrap(),
            "all()"
        );
        assert_eq!(
            selector_from_label_selector(None, true).unwrap(),
            ORCHESTRATOR_CLAUSE
        );
    }

    #[test]
    fn rejects_quotes_and_bad_operators() {
        let sel = LabelSelector {
            match_labels: Some([("a".into(), "x' || all() || '".into())].into()),
            match_expressions: None,
        };
        let FieldError { field, .. } = selector_from_label_selector(Some(&sel), true).unwrap_err();
        assert_eq!(field, "matchLabels.a");
        let sel = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![mk_req("a", "Near", &["x"])]),
        };
        let FieldError { field, .. } = selector_from_label_selector(Some(&sel), true).unwrap_err();
        assert_eq!(field, "matchExpressions[0].operator");
        let sel = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![mk_req("a", "In", &[])]),
        };
        assert!(selector_from_label_selector(Some(&sel), true).is_err());
    }

    fn sel(labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_labels: Some(
                (labels.iter())
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            match_expressions: Some(exprs),
        }
    }

    /// The text built here parses to the tree Calico parses from `k8sSelectorToCalico`'s text
    /// (these cases were calc-graph's `selector/k8s.rs`, a second translation, now gone).
    #[test]
    fn parses_to_the_tree_calico_parses_from_its_text() {
        use calc_graph::selector::parse;
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
            let text = selector_from_label_selector(Some(&sel(&labels, exprs)), false).unwrap();
            assert_eq!(parse(&text).unwrap(), parse(calico_text).unwrap(), "{text}");
        }
        // A pod selector: the orchestrator clause and the terms, one flat `&&`.
        let text =
            selector_from_label_selector(Some(&sel(&[("app", "db")], vec![])), true).unwrap();
        let tree = parse(&text).unwrap();
        assert_eq!(
            tree,
            parse("projectcalico.org/orchestrator == 'k8s' && app == 'db'").unwrap()
        );
        assert_eq!(
            tree.canonical(),
            r#"(projectcalico.org/orchestrator == "k8s" && app == "db")"#
        );
        let text = selector_from_label_selector(
            Some(&sel(
                &[],
                vec![mk_req("app.kubernetes.io/name", "In", &["a-b_c.d"])],
            )),
            false,
        )
        .unwrap();
        assert_eq!(
            parse(&text).unwrap().canonical(),
            r#"app.kubernetes.io/name in {"a-b_c.d"}"#
        );
    }

    /// What the API server rejects is rejected, naming the field (cases from calc-graph's
    /// `selector/k8s.rs`).
    #[test]
    fn rejects_what_the_api_server_rejects() {
        let cases = [
            (
                mk_req("a", "Equals", &["x"]),
                "matchExpressions[0].operator",
            ),
            (mk_req("a", "in", &["x"]), "matchExpressions[0].operator"),
            (mk_req("a", "In", &[]), "matchExpressions[0].values"),
            (mk_req("a", "NotIn", &[]), "matchExpressions[0].values"),
            (mk_req("a", "Exists", &["x"]), "matchExpressions[0].values"),
            (mk_req("", "Exists", &[]), "matchExpressions[0].key"),
            (mk_req("a b", "Exists", &[]), "matchExpressions[0].key"),
            (
                mk_req("Bad_Prefix/a", "Exists", &[]),
                "matchExpressions[0].key",
            ),
            (mk_req("a/b/c", "Exists", &[]), "matchExpressions[0].key"),
            (mk_req("a", "In", &["it's"]), "matchExpressions[0].values"),
            (
                mk_req(&"k".repeat(64), "Exists", &[]),
                "matchExpressions[0].key",
            ),
        ];
        for (req, want) in cases {
            for pod in [true, false] {
                let s = sel(&[], vec![req.clone()]);
                let FieldError { field, .. } =
                    selector_from_label_selector(Some(&s), pod).unwrap_err();
                assert_eq!(field, want, "{req:?}");
            }
        }
        let FieldError { field, .. } =
            selector_from_label_selector(Some(&sel(&[("app", "a\"b")], vec![])), false)
                .unwrap_err();
        assert_eq!(field, "matchLabels.app");
        let FieldError { field, .. } =
            selector_from_label_selector(Some(&sel(&[("-app", "x")], vec![])), false).unwrap_err();
        assert_eq!(field, "matchLabels.-app");
    }

    #[test]
    fn names_and_labels() {
        assert!(validate_dns_label("prod-1").is_ok());
        assert!(validate_dns_label("Prod").is_err());
        assert!(validate_dns_label("a/b").is_err());
        assert!(validate_dns_subdomain("web.v1").is_ok());
        assert!(validate_dns_subdomain("web..v1").is_err());
        assert!(validate_label_key("app.kubernetes.io/name").is_ok());
        assert!(validate_label_key("bad key").is_err());
        assert!(validate_label_value("").is_ok());
        assert!(validate_label_value("-x").is_err());
    }
}

#[cfg(test)]
mod proptests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    use proptest::prelude::*;

    use super::selector_from_label_selector;

    /// Kubernetes' own LabelSelector semantics.
    fn k8s_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
        let ml = sel.match_labels.clone().unwrap_or_default();
        ml.iter().all(|(k, v)| labels.get(k) == Some(v))
            && sel.match_expressions.iter().flatten().all(|e| {
                let vals = e.values.clone().unwrap_or_default();
                match e.operator.as_str() {
                    "In" => labels.get(&e.key).is_some_and(|v| vals.contains(v)),
                    "NotIn" => labels.get(&e.key).is_none_or(|v| !vals.contains(v)),
                    "Exists" => labels.contains_key(&e.key),
                    _ => !labels.contains_key(&e.key),
                }
            })
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("app"),
            Just("tier"),
            Just("example.com/role"),
            Just("x")
        ]
        .prop_map(String::from)
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![Just("a"), Just("b"), Just("web-1"), Just("v1.2")].prop_map(String::from)
    }

    fn requirement() -> impl Strategy<Value = LabelSelectorRequirement> {
        (
            key(),
            prop_oneof![
                Just("In"),
                Just("NotIn"),
                Just("Exists"),
                Just("DoesNotExist")
            ],
            proptest::collection::vec(value(), 1..3),
        )
            .prop_map(|(key, op, values)| LabelSelectorRequirement {
                key,
                operator: op.to_string(),
                values: matches!(op, "In" | "NotIn").then_some(values),
            })
    }

    proptest! {
        /// The rendered Calico selector parses, and on k8s pods (which carry the orchestrator label)
        /// selects exactly what the Kubernetes LabelSelector selects.
        #[test]
        fn rendered_selector_means_the_same(
            ml in proptest::collection::btree_map(key(), value(), 0..3),
            exprs in proptest::collection::vec(requirement(), 0..3),
            pod_labels in proptest::collection::btree_map(key(), value(), 0..4),
        ) {
            let sel = LabelSelector {
                match_labels: Some(ml),
                match_expressions: Some(exprs),
            };
            let rendered = selector_from_label_selector(Some(&sel), true).unwrap();
            let parsed = calc_graph::selector::parse(&rendered)
                .map_err(|e| TestCaseError::fail(format!("{rendered}: {e:?}")))?;
            let mut labels = pod_labels.clone();
            labels.insert("projectcalico.org/orchestrator".into(), "k8s".into());
            prop_assert_eq!(parsed.matches(&labels), k8s_matches(&sel, &pod_labels), "{}", rendered);
        }
    }
}
