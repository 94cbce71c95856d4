//! What a selector requires of individual labels, for indexing (libcalico-go
//! `LabelRestrictions`, which Felix's label index uses to avoid scanning every endpoint).
//!
//! Invariant (sound, not complete): if a selector matches a label set, that label set satisfies
//! every restriction returned. A selector with no restrictions (`all()`, `a != 'b'`, most `!`)
//! has to be evaluated against everything.

use std::collections::{BTreeMap, BTreeSet};

use super::Selector;
use super::ast::Expr;

/// The constraint a selector puts on one label.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelRestriction {
    /// The label must exist (`has(k)`, `k == 'v'`, `k in {…}`, `k contains …`).
    pub must_be_present: bool,
    /// The label must not exist (`!has(k)`).
    pub must_be_absent: bool,
    /// When set, the label's value must be one of these. An empty set means the selector can
    /// never match (`a == 'x' && a == 'y'`).
    pub must_have_one_of: Option<BTreeSet<String>>,
}

impl Selector {
    /// Per-label requirements every matching label set satisfies (see the module docs).
    pub fn label_restrictions(&self) -> BTreeMap<String, LabelRestriction> {
        restrictions(self.expr())
    }
}

fn present(values: Option<BTreeSet<String>>) -> LabelRestriction {
    LabelRestriction {
        must_be_present: true,
        must_be_absent: false,
        must_have_one_of: values,
    }
}

fn single(key: &str, r: LabelRestriction) -> BTreeMap<String, LabelRestriction> {
    BTreeMap::from([(key.to_string(), r)])
}

fn restrictions(e: &Expr) -> BTreeMap<String, LabelRestriction> {
    match e {
        Expr::Eq(k, v) => single(k, present(Some(BTreeSet::from([v.clone()])))),
        Expr::In(k, set) => single(k, present(Some(set.clone()))),
        Expr::Has(k) | Expr::Contains(k, _) | Expr::StartsWith(k, _) | Expr::EndsWith(k, _) => {
            single(k, present(None))
        }
        Expr::Not(inner) => match &**inner {
            Expr::Has(k) => single(
                k,
                LabelRestriction {
                    must_be_absent: true,
                    ..LabelRestriction::default()
                },
            ),
            // !(a == 'b') does not require the absence of a, and so on.
            _ => BTreeMap::new(),
        },
        Expr::And(ops) => {
            let mut acc: BTreeMap<String, LabelRestriction> = BTreeMap::new();
            for op in ops {
                for (key, r) in restrictions(op) {
                    let base = acc.entry(key).or_default();
                    base.must_be_present |= r.must_be_present;
                    base.must_be_absent |= r.must_be_absent;
                    base.must_have_one_of = match (base.must_have_one_of.take(), r.must_have_one_of)
                    {
                        (Some(a), Some(b)) => Some(a.intersection(&b).cloned().collect()),
                        (a, b) => a.or(b),
                    };
                }
            }
            acc
        }
        Expr::Or(ops) => {
            let Some((first, rest)) = ops.split_first() else {
                return BTreeMap::new();
            };
            let mut acc = restrictions(first);
            for op in rest {
                let other = restrictions(op);
                acc = acc
                    .into_iter()
                    .filter_map(|(key, r)| {
                        let o = other.get(&key).cloned().unwrap_or_default();
                        let must_be_present = r.must_be_present && o.must_be_present;
                        let must_have_one_of =
                            match (must_be_present, r.must_have_one_of, o.must_have_one_of) {
                                (true, Some(a), Some(b)) => Some(a.union(&b).cloned().collect()),
                                _ => None,
                            };
                        let must_be_absent = r.must_be_absent && o.must_be_absent;
                        (must_be_present || must_be_absent).then_some((
                            key,
                            LabelRestriction {
                                must_be_present,
                                must_be_absent,
                                must_have_one_of,
                            },
                        ))
                    })
                    .collect();
            }
            acc
        }
        Expr::All | Expr::Global | Expr::Ne(..) | Expr::NotIn(..) => BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::parse;

    fn mk_values(vs: &[&str]) -> Option<BTreeSet<String>> {
        Some(vs.iter().map(|v| v.to_string()).collect())
    }

    #[test]
    fn restrictions_follow_calico() {
        let r = parse("a == 'x' && b in {'1', '2'} && !has(c) && d != 'y'")
            .unwrap()
            .label_restrictions();
        assert_eq!(r.len(), 3);
        assert_eq!(r["a"], present(mk_values(&["x"])));
        assert_eq!(r["b"], present(mk_values(&["1", "2"])));
        assert!(r["c"].must_be_absent && !r["c"].must_be_present);

        let r = parse("a == 'x' && a == 'y'").unwrap().label_restrictions();
        assert_eq!(r["a"].must_have_one_of, mk_values(&[]));

        let r = parse("a == 'x' || a in {'y'}")
            .unwrap()
            .label_restrictions();
        assert_eq!(r["a"], present(mk_values(&["x", "y"])));
        let r = parse("a == 'x' || has(a)").unwrap().label_restrictions();
        assert_eq!(r["a"], present(None));
        let r = parse("a == 'x' || b == 'y'").unwrap().label_restrictions();
        assert!(r.is_empty());
        let r = parse("!has(a) || !has(a) && has(b)")
            .unwrap()
            .label_restrictions();
        assert!(r["a"].must_be_absent);

        for unrestricted in [
            "all()",
            "global()",
            "a != 'b'",
            "a not in {'b'}",
            "!(a == 'b')",
        ] {
            assert!(
                parse(unrestricted).unwrap().label_restrictions().is_empty(),
                "{unrestricted}"
            );
        }
    }
}
