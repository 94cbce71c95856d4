//! Selector rewriting on the way to Felix (libcalico-go `updateprocessors/rules.go`,
//! `parseSelectorAttachPrefix`; felix-reference §9.3).
//!
//! Calico rewrites by text: parse, prefix the keys with a visitor, print `String()`, replace
//! `all()`/`global()` in the printed text, and later Felix parses the result again. We rewrite the
//! tree instead and then apply [`Expr::reparsed`], which gives exactly the tree Felix's second
//! parse produces (for instance `!global()` becomes `!!has(projectcalico.org/namespace)` as text,
//! which Felix reads as `has(projectcalico.org/namespace)`). One deliberate difference: Calico's
//! textual replacement also rewrites `all()` or `global()` inside a quoted value
//! (`pcns.x == "all()"`); we leave values alone.

use super::Selector;
use super::ast::Expr;

/// Label Calico puts on every namespaced endpoint (`apiv3.LabelNamespace`).
pub const LABEL_NAMESPACE: &str = "projectcalico.org/namespace";
/// Label holding a workload's service account name (`apiv3.LabelServiceAccount`).
pub const LABEL_SERVICE_ACCOUNT: &str = "projectcalico.org/serviceaccount";
/// Prefix of namespace labels inherited through the `kns.<ns>` profile.
pub const NAMESPACE_LABEL_PREFIX: &str = "pcns.";
/// Prefix of service-account labels inherited through the `ksa.<ns>.<sa>` profile.
pub const SERVICE_ACCOUNT_LABEL_PREFIX: &str = "pcsa.";

// === impl Selector ===

impl Selector {
    /// Every key gets `prefix`, then the tree is normalised as Felix will see it after the
    /// string round trip (`parseSelectorAttachPrefix` followed by Felix's parse). `all()` and
    /// `global()` are untouched.
    pub fn with_key_prefix(&self, prefix: &str) -> Selector {
        Selector::from_expr(self.expr().map_keys(&|k| format!("{prefix}{k}")).reparsed())
    }

    /// A rule's or GlobalNetworkPolicy's `namespaceSelector` as an endpoint selector: keys get
    /// `pcns.`, `all()` becomes `has(projectcalico.org/namespace)` (every namespaced endpoint) and
    /// `global()` becomes `!has(projectcalico.org/namespace)` (only non-namespaced endpoints:
    /// host endpoints, global network sets).
    pub fn rewrite_namespace_selector(&self) -> Selector {
        let prefixed = self
            .expr()
            .map_keys(&|k| format!("{NAMESPACE_LABEL_PREFIX}{k}"));
        Selector::from_expr(replace_all_and_global(prefixed).reparsed())
    }

    /// A `serviceAccounts.selector` as an endpoint selector: keys get `pcsa.` (no `all()` or
    /// `global()` replacement, as in Calico).
    pub fn rewrite_service_account_selector(&self) -> Selector {
        self.with_key_prefix(SERVICE_ACCOUNT_LABEL_PREFIX)
    }
}

fn replace_all_and_global(e: Expr) -> Expr {
    e.map_leaves(&|leaf| match leaf {
        Expr::All => Expr::Has(LABEL_NAMESPACE.to_string()),
        Expr::Global => Expr::Not(Box::new(Expr::Has(LABEL_NAMESPACE.to_string()))),
        leaf => leaf,
    })
}

#[cfg(test)]
mod tests {
    use crate::selector::parse;

    /// (namespaceSelector as written, the endpoint selector Felix ends up with, canonical).
    const NAMESPACE_CASES: &[(&str, &str)] = &[
        ("team == 'a'", r#"pcns.team == "a""#),
        ("all()", "has(projectcalico.org/namespace)"),
        ("", "has(projectcalico.org/namespace)"),
        ("global()", "!has(projectcalico.org/namespace)"),
        ("!global()", "has(projectcalico.org/namespace)"),
        ("!all()", "!has(projectcalico.org/namespace)"),
        (
            "all() && team == 'a'",
            r#"(has(projectcalico.org/namespace) && pcns.team == "a")"#,
        ),
        (
            "has(x) || global()",
            "(has(pcns.x) || !has(projectcalico.org/namespace))",
        ),
        ("!(!has(x))", "has(pcns.x)"),
        (
            "a in {'b'} && b not in {}",
            r#"(pcns.a in {"b"} && pcns.b not in {})"#,
        ),
        // Values are not rewritten (Calico's textual replace would touch them; we don't).
        ("x == 'all()'", r#"pcns.x == "all()""#),
    ];

    #[test]
    fn namespace_selectors_rewrite_like_calico() {
        for (input, want) in NAMESPACE_CASES {
            let got = parse(input).unwrap().rewrite_namespace_selector();
            assert_eq!(got.canonical(), *want, "{input:?}");
            // What Felix sees is the parse of that text: our tree must be exactly that.
            assert_eq!(got, parse(want).unwrap(), "{input:?}");
        }
    }

    #[test]
    fn namespace_rewrite_changes_what_matches() {
        let labels = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let pod = labels(&[("projectcalico.org/namespace", "prod"), ("pcns.team", "a")]);
        let host = labels(&[("team", "a")]);
        let global = parse("global()").unwrap().rewrite_namespace_selector();
        assert!(!global.matches(&pod));
        assert!(global.matches(&host));
        let all = parse("all()").unwrap().rewrite_namespace_selector();
        assert!(all.matches(&pod));
        assert!(!all.matches(&host));
        let team = parse("team == 'a'").unwrap().rewrite_namespace_selector();
        assert!(team.matches(&pod));
        assert!(!team.matches(&host));
    }

    #[test]
    fn service_account_selectors_get_pcsa_keys_only() {
        let cases = [
            ("role == 'x'", r#"pcsa.role == "x""#),
            ("all()", "all()"),
            ("global()", "global()"),
            ("!!has(a) && !(!has(b))", "(has(pcsa.a) && has(pcsa.b))"),
        ];
        for (input, want) in cases {
            let got = parse(input).unwrap().rewrite_service_account_selector();
            assert_eq!(got.canonical(), want, "{input:?}");
            assert_eq!(got, parse(want).unwrap(), "{input:?}");
        }
    }
}
