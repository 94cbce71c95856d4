//! Calico selector language: parser, evaluator and canonical form.
//!
//! This is a port of libcalico-go's `lib/selector` (tokenizer, parser and AST). The grammar, the
//! evaluation rules and the canonical string ([`Selector::canonical`], Calico's `Selector.String()`)
//! follow Calico byte for byte, because the canonical string names IP sets
//! ([`Selector::unique_id`], `cali40s:<hash>`).
//!
//! ```
//! use std::collections::BTreeMap;
//! use calc_graph::selector::parse;
//!
//! let sel = parse("projectcalico.org/namespace == 'default' && app == 'web'").unwrap();
//! assert_eq!(sel.canonical(), r#"(projectcalico.org/namespace == "default" && app == "web")"#);
//! assert!(sel.unique_id().starts_with("s:"));
//! let labels: BTreeMap<String, String> =
//!     [("projectcalico.org/namespace", "default"), ("app", "web")]
//!         .into_iter()
//!         .map(|(k, v)| (k.to_string(), v.to_string()))
//!         .collect();
//! assert!(sel.matches(&labels));
//! // `!=` is true when the label is missing.
//! assert!(parse("tier != 'db'").unwrap().matches(&labels));
//! ```
//!
//! Grammar (precedence from tightest: `!`, `&&`, `||`):
//!
//! ```text
//! selector  := "" | or
//! or        := and ( "||" and )*
//! and       := op ( "&&" op )*
//! op        := "!"* ( "has(" key ")" | "all()" | "global()" | "(" or ")"
//!                   | key ("==" | "!=" | "contains" | "starts with" | "ends with") string
//!                   | key ("in" | "not in") "{" [ string ( "," string )* [","] ] "}" )
//! string    := '"' [^"]* '"' | "'" [^']* "'"      (no escapes: the next quote ends the string)
//! key       := [a-zA-Z0-9_./-]{1,512}
//! ```
//!
//! Whitespace is only space and tab. Leading `!`s collapse by parity (`!!a == 'b'` is
//! `a == "b"`); `(a && b) && c` keeps its nesting, and so does `!(!x)` (its canonical form is
//! `!!x`, exactly as in Calico, which re-parses as `x`: see [`Expr::reparsed`]).
//!
//! Invariants:
//! * [`parse`] never panics and never recurses deeper than [`MAX_DEPTH`] parentheses, and the
//!   trees it returns nest at most [`MAX_DEPTH`] `&&`/`||` lists; the input is lexed lazily in
//!   one pass, so time is linear in the input length.
//! * For every selector `s` from [`parse`], `parse(s.canonical()) == s.expr().reparsed()`, and
//!   for selectors without a directly nested `!(!…)` that is `s` itself.
//! * `global()` evaluates to true, as in Calico: it only has a meaning inside a
//!   namespaceSelector, where [`Selector::rewrite_namespace_selector`] turns it into
//!   `!has(projectcalico.org/namespace)`.

mod ast;
mod lexer;
mod parser;
mod restrictions;
mod rewrite;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::BuildHasher;
use std::str::FromStr;

use base64::Engine as _;
use sha2::{Digest, Sha224};

pub use ast::Expr;
pub use restrictions::LabelRestriction;
pub use rewrite::{
    LABEL_NAMESPACE, LABEL_SERVICE_ACCOUNT, NAMESPACE_LABEL_PREFIX, SERVICE_ACCOUNT_LABEL_PREFIX,
};

/// Deepest nesting [`parse`] accepts, both of parentheses in the text and of `&&`/`||` lists in
/// the tree (every list is parenthesised in the canonical text, so the second limit keeps
/// `parse(canonical(s))` within the first). Calico has no limit (Go stacks grow); we bound it so
/// that parsing, evaluation, canonicalisation and drop stay well inside a 2 MiB stack.
/// [`Selector::and`] adds one level per call and is not checked against this limit.
pub const MAX_DEPTH: usize = 128;

/// Longest label key the tokenizer accepts (Calico's `tokenizer.MaxLabelLength`).
pub const MAX_LABEL_LENGTH: usize = 512;

/// A selector that failed to parse or convert. `offset` is the byte offset in the selector text
/// where the problem was found (0 for errors that are not about a position in a text, such as a
/// Kubernetes LabelSelector field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte {offset}: {message}")]
pub struct SelectorError {
    pub offset: usize,
    pub message: String,
}

impl SelectorError {
    pub(crate) fn new(offset: usize, message: impl Into<String>) -> Self {
        Self {
            offset,
            message: message.into(),
        }
    }
}

/// Read access to an object's labels, for [`Selector::matches`].
pub trait Labels {
    /// The value of label `key`, or `None` when the object does not have that label.
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl<S: BuildHasher> Labels for HashMap<String, String, S> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl<L: Labels + ?Sized> Labels for &L {
    fn label(&self, key: &str) -> Option<&str> {
        (**self).label(key)
    }
}

/// A parsed selector. Equality, ordering and hashing are structural (on the [`Expr`]); two
/// selectors with the same canonical string name the same IP set.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    expr: Expr,
}

/// Parses a selector in Calico's syntax. The empty (or all-whitespace) selector is `all()`.
pub fn parse(s: &str) -> Result<Selector, SelectorError> {
    parser::parse(s).map(|expr| Selector { expr })
}

/// Parses a selector given as raw bytes: invalid UTF-8 is an error at the first bad byte.
pub fn parse_bytes(s: &[u8]) -> Result<Selector, SelectorError> {
    match std::str::from_utf8(s) {
        Ok(text) => parse(text),
        Err(e) => Err(SelectorError::new(
            e.valid_up_to(),
            "invalid utf-8 in selector",
        )),
    }
}

impl FromStr for Selector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

// === impl Selector ===

impl Selector {
    /// `all()`: matches everything.
    pub fn all() -> Selector {
        Selector { expr: Expr::All }
    }

    /// The syntax tree (for indexing; see [`Expr`]).
    pub fn expr(&self) -> &Expr {
        &self.expr
    }

    /// Wraps a syntax tree built in code. `And`/`Or` with fewer than two operands are replaced by
    /// what their canonical form would re-parse to (`And([])` is `all()`, `Or([])` is `!all()`,
    /// one operand is that operand). Keys and values are not checked: use
    /// [`Selector::try_from_expr`] for trees built from untrusted data.
    pub fn from_expr(e: Expr) -> Selector {
        Selector {
            expr: e.without_degenerate_lists(),
        }
    }

    /// Like [`Selector::from_expr`], but rejects a tree whose canonical string would not parse
    /// back: bad label keys, values containing both quote characters, or nesting deeper than
    /// [`MAX_DEPTH`].
    pub fn try_from_expr(e: Expr) -> Result<Selector, SelectorError> {
        e.validate()?;
        Ok(Self::from_expr(e))
    }

    /// Conjunction of all `terms`, flat, as Calico builds it from a list of clauses joined with
    /// ` && ` (no terms is `all()`, one term is itself).
    pub fn all_of(terms: Vec<Expr>) -> Selector {
        Self::from_expr(Expr::And(terms))
    }

    /// Evaluates the selector against an object's labels.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        self.expr.matches(labels)
    }

    /// Calico's canonical string (`Selector.String()`), e.g.
    /// `(projectcalico.org/namespace == "default" && app == "web")`.
    pub fn canonical(&self) -> String {
        let mut out = String::new();
        self.expr.write_canonical(&mut out);
        out
    }

    /// Calico's `UniqueID()`: `"s:" + base64url_nopad(SHA-224("s:" + canonical))`; the IP set
    /// name is `cali40` + this id, cut to 31 characters.
    pub fn unique_id(&self) -> String {
        make_unique_id("s", &self.canonical())
    }

    /// `(self) && (other)`: exactly what Calico gets by parsing the two selectors' texts joined
    /// as `"(" + a + ") && (" + b + ")"`, i.e. a two-operand `And` with no flattening. Callers
    /// skip absent (empty) selectors first, as Calico does.
    pub fn and(self, other: Selector) -> Selector {
        Selector {
            expr: Expr::And(vec![self.expr, other.expr]),
        }
    }

    /// Renames every label key (Calico's visitor pattern). No re-normalisation: see
    /// [`Selector::with_key_prefix`] for the form Felix ends up with.
    pub fn map_keys(&self, f: impl Fn(&str) -> String) -> Selector {
        Selector {
            expr: self.expr.map_keys(&f),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl Default for Selector {
    fn default() -> Self {
        Selector::all()
    }
}

impl serde::Serialize for Selector {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.canonical())
    }
}

impl<'de> serde::Deserialize<'de> for Selector {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        parse(&text).map_err(|e| serde::de::Error::custom(format!("invalid selector: {e}")))
    }
}

/// libcalico-go `hash.MakeUniqueID`: `prefix + ":" + base64url_nopad(SHA-224(prefix + ":" + content))`.
pub fn make_unique_id(prefix: &str, content: &str) -> String {
    let mut hasher = Sha224::new();
    hasher.update(prefix.as_bytes());
    hasher.update(b":");
    hasher.update(content.as_bytes());
    let digest = hasher.finalize();
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest);
    format!("{prefix}:{encoded}")
}
