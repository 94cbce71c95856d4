//! Domain names in egress rules (`destination.domains`, Calico Enterprise's DNS policy).
//!
//! A pattern is an exact name (`api.example.com`) or one leading wildcard label
//! (`*.example.com`). As in Calico Enterprise, the wildcard stands for one or more labels:
//! `*.example.com` matches `www.example.com` and `a.b.example.com`, never `example.com` itself.
//! Names compare case-insensitively and without the root's trailing dot, so `API.Example.com.`
//! is `api.example.com`. Only letters, digits, `-` and `_` may appear in a label (no label
//! starts or ends with `-`), which keeps every pattern safe to show in a comment or log line.

use std::fmt;

/// The longest name DNS allows in presentation form (without the trailing dot).
const MAX_NAME: usize = 253;
/// The longest label DNS allows.
const MAX_LABEL: usize = 63;

/// A validated, normalised (lowercase, no trailing dot) domain pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainPattern {
    /// The normalised text: `example.com` or `*.example.com`.
    text: String,
}

/// Why a domain pattern is not valid; the message names the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid domain name {name:?}: {reason}")]
pub struct DomainError {
    pub name: String,
    pub reason: &'static str,
}

impl DomainPattern {
    /// Parses and normalises a pattern from a rule's `domains` list.
    pub fn parse(raw: &str) -> Result<DomainPattern, DomainError> {
        let err = |reason| DomainError {
            name: raw.to_string(),
            reason,
        };
        let lower = raw.to_ascii_lowercase();
        let name = lower.strip_suffix('.').unwrap_or(&lower);
        if name.is_empty() {
            return Err(err("empty name"));
        }
        if name.len() > MAX_NAME {
            return Err(err("longer than 253 characters"));
        }
        let (wildcard, rest) = match name.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, name),
        };
        if rest.is_empty() || name == "*" {
            return Err(err("a wildcard needs a name after \"*.\""));
        }
        for label in rest.split('.') {
            if label.is_empty() {
                return Err(err("empty label"));
            }
            if label == "*" || label.contains('*') {
                return Err(err("\"*\" is allowed only as the whole first label"));
            }
            if label.len() > MAX_LABEL {
                return Err(err("a label is longer than 63 characters"));
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(err(
                    "only letters, digits, '-' and '_' may appear in a label",
                ));
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(err("a label may not start or end with '-'"));
            }
        }
        if wildcard && !rest.contains('.') {
            // `*.com` would allow a whole top-level domain: almost surely a mistake.
            return Err(err("a wildcard needs at least two labels after \"*.\""));
        }
        Ok(DomainPattern {
            text: name.to_string(),
        })
    }

    /// The normalised pattern text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether this is a `*.` pattern.
    pub fn is_wildcard(&self) -> bool {
        self.text.starts_with("*.")
    }

    /// Whether a name from a DNS answer matches. `name` may carry any case and a trailing dot.
    pub fn matches(&self, name: &str) -> bool {
        let name = name.strip_suffix('.').unwrap_or(name);
        match self.text.strip_prefix("*.") {
            None => name.eq_ignore_ascii_case(&self.text),
            Some(suffix) => {
                // One or more labels, then `.suffix`.
                name.len() > suffix.len() + 1 && {
                    let (head, tail) = name.split_at(name.len() - suffix.len());
                    tail.eq_ignore_ascii_case(suffix)
                        && head.ends_with('.')
                        && head.len() > 1
                        && !head.starts_with('.')
                        && !head.contains("..")
                }
            }
        }
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> DomainPattern {
        DomainPattern::parse(s).unwrap()
    }

    #[test]
    fn exact_names_match_case_insensitively_with_or_without_the_root_dot() {
        let pat = p("API.Example.com.");
        assert_eq!(pat.as_str(), "api.example.com");
        assert!(pat.matches("api.example.com"));
        assert!(pat.matches("API.EXAMPLE.COM."));
        assert!(!pat.matches("www.api.example.com"));
        assert!(!pat.matches("example.com"));
        assert!(!pat.matches("api.example.co"));
    }

    #[test]
    fn a_wildcard_is_one_or_more_labels_never_the_apex() {
        let pat = p("*.s3.amazonaws.com");
        assert!(pat.is_wildcard());
        assert!(pat.matches("bucket.s3.amazonaws.com"));
        assert!(pat.matches("a.b.s3.amazonaws.com."));
        assert!(!pat.matches("s3.amazonaws.com"));
        assert!(!pat.matches(".s3.amazonaws.com"));
        assert!(!pat.matches("xs3.amazonaws.com"));
        assert!(!pat.matches("a..s3.amazonaws.com"));
    }

    #[test]
    fn bad_names_are_rejected_with_the_reason() {
        for (raw, reason) in [
            ("", "empty name"),
            (".", "empty name"),
            ("a..b", "empty label"),
            ("*", "a wildcard needs a name after \"*.\""),
            ("*.com", "a wildcard needs at least two labels after \"*.\""),
            (
                "www.*.com",
                "\"*\" is allowed only as the whole first label",
            ),
            (
                "*a.example.com",
                "\"*\" is allowed only as the whole first label",
            ),
            (
                "**.example.com",
                "\"*\" is allowed only as the whole first label",
            ),
            ("-a.example.com", "a label may not start or end with '-'"),
            (
                "a b.example.com",
                "only letters, digits, '-' and '_' may appear in a label",
            ),
            (
                "evil\".example.com",
                "only letters, digits, '-' and '_' may appear in a label",
            ),
            (
                "x\n-j ACCEPT.com",
                "only letters, digits, '-' and '_' may appear in a label",
            ),
        ] {
            let e = DomainPattern::parse(raw).unwrap_err();
            assert_eq!(e.reason, reason, "{raw:?}");
            assert!(e.to_string().contains(&format!("{raw:?}")), "{e}");
        }
        let long_label = format!("{}.com", "a".repeat(64));
        assert!(DomainPattern::parse(&long_label).is_err());
        let long_name = vec!["abcdefghi"; 26].join(".");
        assert!(long_name.len() > 253);
        assert!(DomainPattern::parse(&long_name).is_err());
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?"
    }

    proptest! {
        /// A wildcard matches exactly the names that end in `.suffix` with a non-empty head of
        /// whole labels; an exact pattern matches only itself.
        #[test]
        fn matching_agrees_with_label_arithmetic(
            suffix in prop::collection::vec(label(), 2..4),
            head in prop::collection::vec(label(), 0..3),
            upper in any::<bool>(),
        ) {
            let suffix = suffix.join(".");
            let mut name = head.clone();
            name.push(suffix.clone());
            let name = name.join(".");
            let shown = if upper { name.to_ascii_uppercase() } else { name.clone() };
            let wild = p(&format!("*.{suffix}"));
            prop_assert_eq!(wild.matches(&shown), !head.is_empty());
            let exact = p(&name);
            prop_assert!(exact.matches(&shown));
            prop_assert_eq!(p(&suffix).matches(&shown), head.is_empty());
            // Normalising is idempotent.
            prop_assert_eq!(p(exact.as_str()), exact);
        }
    }
}
