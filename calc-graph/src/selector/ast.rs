//! The selector syntax tree: evaluation, canonical text and tree rewrites.
//!
//! Node for node this is libcalico-go's `parser/ast.go`. Recursion here is bounded by the tree's
//! depth, which [`super::parse`] limits to about three nodes per [`super::MAX_DEPTH`] parenthesis.

use std::collections::BTreeSet;

use super::{Labels, MAX_DEPTH, SelectorError};

/// A selector expression. `And`/`Or` are n-ary like Calico's `AndNode`/`OrNode`: `a && b && c` is
/// one `And` with three operands, while `(a && b) && c` nests. Parsed trees never contain an
/// `And`/`Or` with fewer than two operands.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Expr {
    /// `all()`: always true.
    All,
    /// `global()`: always true when evaluated; see [`super::Selector::rewrite_namespace_selector`].
    Global,
    /// `has(k)`: the label exists (any value, including empty).
    Has(String),
    /// `k == "v"`: false when the label is missing.
    Eq(String, String),
    /// `k != "v"`: true when the label is missing.
    Ne(String, String),
    /// `k in {...}`: false when the label is missing; `in {}` never matches.
    In(String, BTreeSet<String>),
    /// `k not in {...}`: true when the label is missing.
    NotIn(String, BTreeSet<String>),
    /// `k contains "v"`: false when the label is missing.
    Contains(String, String),
    /// `k starts with "v"`: false when the label is missing.
    StartsWith(String, String),
    /// `k ends with "v"`: false when the label is missing.
    EndsWith(String, String),
    Not(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
}

// === impl Expr ===

impl Expr {
    /// Evaluates against an object's labels (Calico's `node.Evaluate`).
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        match self {
            Expr::All | Expr::Global => true,
            Expr::Has(k) => labels.label(k).is_some(),
            Expr::Eq(k, v) => labels.label(k) == Some(v.as_str()),
            Expr::Ne(k, v) => labels.label(k) != Some(v.as_str()),
            Expr::In(k, set) => labels.label(k).is_some_and(|have| set.contains(have)),
            Expr::NotIn(k, set) => labels.label(k).is_none_or(|have| !set.contains(have)),
            Expr::Contains(k, v) => labels
                .label(k)
                .is_some_and(|have| have.contains(v.as_str())),
            Expr::StartsWith(k, v) => labels
                .label(k)
                .is_some_and(|have| have.starts_with(v.as_str())),
            Expr::EndsWith(k, v) => labels
                .label(k)
                .is_some_and(|have| have.ends_with(v.as_str())),
            Expr::Not(inner) => !inner.matches(labels),
            Expr::And(ops) => ops.iter().all(|op| op.matches(labels)),
            Expr::Or(ops) => ops.iter().any(|op| op.matches(labels)),
        }
    }

    /// The label key this node tests, for the leaf kinds that test one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Expr::Has(k)
            | Expr::Eq(k, _)
            | Expr::Ne(k, _)
            | Expr::In(k, _)
            | Expr::NotIn(k, _)
            | Expr::Contains(k, _)
            | Expr::StartsWith(k, _)
            | Expr::EndsWith(k, _) => Some(k),
            Expr::All | Expr::Global | Expr::Not(_) | Expr::And(_) | Expr::Or(_) => None,
        }
    }

    /// Appends Calico's canonical text (`collectFragments`) to `out`.
    pub(crate) fn write_canonical(&self, out: &mut String) {
        match self {
            Expr::All => out.push_str("all()"),
            Expr::Global => out.push_str("global()"),
            Expr::Has(k) => {
                out.push_str("has(");
                out.push_str(k);
                out.push(')');
            }
            Expr::Eq(k, v) => write_label_op_value(out, k, " == ", v),
            Expr::Ne(k, v) => write_label_op_value(out, k, " != ", v),
            Expr::Contains(k, v) => write_label_op_value(out, k, " contains ", v),
            Expr::StartsWith(k, v) => write_label_op_value(out, k, " starts with ", v),
            Expr::EndsWith(k, v) => write_label_op_value(out, k, " ends with ", v),
            Expr::In(k, set) => write_set_op(out, k, " in {", set),
            Expr::NotIn(k, set) => write_set_op(out, k, " not in {", set),
            Expr::Not(inner) => {
                out.push('!');
                inner.write_canonical(out);
            }
            Expr::And(ops) => write_list(out, ops, " && "),
            Expr::Or(ops) => write_list(out, ops, " || "),
        }
    }

    /// Applies `f` to every label key (Calico's `PrefixVisitor` generalised).
    pub(crate) fn map_keys(&self, f: &dyn Fn(&str) -> String) -> Expr {
        match self {
            Expr::All => Expr::All,
            Expr::Global => Expr::Global,
            Expr::Has(k) => Expr::Has(f(k)),
            Expr::Eq(k, v) => Expr::Eq(f(k), v.clone()),
            Expr::Ne(k, v) => Expr::Ne(f(k), v.clone()),
            Expr::In(k, s) => Expr::In(f(k), s.clone()),
            Expr::NotIn(k, s) => Expr::NotIn(f(k), s.clone()),
            Expr::Contains(k, v) => Expr::Contains(f(k), v.clone()),
            Expr::StartsWith(k, v) => Expr::StartsWith(f(k), v.clone()),
            Expr::EndsWith(k, v) => Expr::EndsWith(f(k), v.clone()),
            Expr::Not(inner) => Expr::Not(Box::new(inner.map_keys(f))),
            Expr::And(ops) => Expr::And(ops.iter().map(|op| op.map_keys(f)).collect()),
            Expr::Or(ops) => Expr::Or(ops.iter().map(|op| op.map_keys(f)).collect()),
        }
    }

    /// The tree with every leaf (a node other than `Not`/`And`/`Or`) replaced by `f(leaf)`.
    pub(crate) fn map_leaves(self, f: &dyn Fn(Expr) -> Expr) -> Expr {
        match self {
            Expr::Not(inner) => Expr::Not(Box::new(inner.map_leaves(f))),
            Expr::And(ops) => Expr::And(ops.into_iter().map(|op| op.map_leaves(f)).collect()),
            Expr::Or(ops) => Expr::Or(ops.into_iter().map(|op| op.map_leaves(f)).collect()),
            leaf => f(leaf),
        }
    }

    /// The tree Calico's parser returns for this tree's canonical text: chains of `!` collapse by
    /// parity (`!!x` parses as `x`) and degenerate `And`/`Or` lists disappear. This is the form a
    /// selector takes once it has travelled through a string, as every rewritten selector does on
    /// its way to Felix (`parseSelectorAttachPrefix` returns `String()`, Felix parses it again).
    pub fn reparsed(&self) -> Expr {
        match self {
            Expr::Not(_) => {
                let mut negated = false;
                let mut cur = self;
                while let Expr::Not(inner) = cur {
                    negated = !negated;
                    cur = inner;
                }
                let base = cur.reparsed();
                if negated {
                    Expr::Not(Box::new(base))
                } else {
                    base
                }
            }
            Expr::And(ops) => {
                rebuild_list(ops.iter().map(Expr::reparsed).collect(), Expr::And, true)
            }
            Expr::Or(ops) => {
                rebuild_list(ops.iter().map(Expr::reparsed).collect(), Expr::Or, false)
            }
            leaf => leaf.clone(),
        }
    }

    /// Replaces `And`/`Or` lists of fewer than two operands by their meaning (used by
    /// [`super::Selector::from_expr`]; a parsed tree is unchanged).
    pub(crate) fn without_degenerate_lists(self) -> Expr {
        match self {
            Expr::Not(inner) => Expr::Not(Box::new(inner.without_degenerate_lists())),
            Expr::And(ops) => rebuild_list(
                ops.into_iter()
                    .map(Expr::without_degenerate_lists)
                    .collect(),
                Expr::And,
                true,
            ),
            Expr::Or(ops) => rebuild_list(
                ops.into_iter()
                    .map(Expr::without_degenerate_lists)
                    .collect(),
                Expr::Or,
                false,
            ),
            leaf => leaf,
        }
    }

    /// Checks that the canonical text of this tree parses back: valid keys, values that do not
    /// contain both quote characters, nesting within [`MAX_DEPTH`].
    pub(crate) fn validate(&self) -> Result<(), SelectorError> {
        self.validate_at(0)
    }

    fn validate_at(&self, depth: usize) -> Result<(), SelectorError> {
        // Each parenthesised group in the canonical text is one And/Or level.
        if depth > MAX_DEPTH {
            return Err(SelectorError::new(
                0,
                format!("selector nested too deeply (limit {MAX_DEPTH})"),
            ));
        }
        if let Some(k) = self.key() {
            validate_key(k)?;
        }
        match self {
            Expr::Eq(_, v)
            | Expr::Ne(_, v)
            | Expr::Contains(_, v)
            | Expr::StartsWith(_, v)
            | Expr::EndsWith(_, v) => validate_value(v),
            Expr::In(_, set) | Expr::NotIn(_, set) => {
                set.iter().try_for_each(|v| validate_value(v))
            }
            Expr::Not(inner) => inner.validate_at(depth),
            Expr::And(ops) | Expr::Or(ops) => {
                ops.iter().try_for_each(|op| op.validate_at(depth + 1))
            }
            Expr::All | Expr::Global | Expr::Has(_) => Ok(()),
        }
    }
}

/// Whether `c` may appear in a label key (Calico's `identifierChar`).
pub(crate) fn is_key_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'/' | b'-')
}

/// Checks that `key` is a label key the selector tokenizer accepts.
pub(crate) fn validate_key(key: &str) -> Result<(), SelectorError> {
    if key.is_empty() {
        return Err(SelectorError::new(0, "empty label key"));
    }
    if key.len() > super::MAX_LABEL_LENGTH {
        return Err(SelectorError::new(
            0,
            format!("label key longer than {} bytes", super::MAX_LABEL_LENGTH),
        ));
    }
    if let Some(bad) = key.bytes().position(|c| !is_key_byte(c)) {
        return Err(SelectorError::new(
            0,
            format!("label key {key:?} has an invalid character at byte {bad}"),
        ));
    }
    Ok(())
}

fn validate_value(value: &str) -> Result<(), SelectorError> {
    if value.contains('"') && value.contains('\'') {
        return Err(SelectorError::new(
            0,
            format!("value {value:?} contains both quote characters and cannot be quoted"),
        ));
    }
    Ok(())
}

fn rebuild_list(mut ops: Vec<Expr>, make: fn(Vec<Expr>) -> Expr, is_and: bool) -> Expr {
    match ops.len() {
        0 if is_and => Expr::All,
        0 => Expr::Not(Box::new(Expr::All)),
        1 => ops.pop().unwrap_or(Expr::All),
        _ => make(ops),
    }
}

/// Calico quotes with `"` unless the value contains `"`, then with `'`.
fn quote_for(value: &str) -> char {
    if value.contains('"') { '\'' } else { '"' }
}

fn write_label_op_value(out: &mut String, key: &str, op: &str, value: &str) {
    let q = quote_for(value);
    out.push_str(key);
    out.push_str(op);
    out.push(q);
    out.push_str(value);
    out.push(q);
}

fn write_set_op(out: &mut String, key: &str, op: &str, set: &BTreeSet<String>) {
    out.push_str(key);
    out.push_str(op);
    for (i, value) in set.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let q = quote_for(value);
        out.push(q);
        out.push_str(value);
        out.push(q);
    }
    out.push('}');
}

fn write_list(out: &mut String, ops: &[Expr], sep: &str) {
    out.push('(');
    for (i, op) in ops.iter().enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        op.write_canonical(out);
    }
    out.push(')');
}
