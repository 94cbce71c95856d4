//! Property tests for the selector language: canonical round trip over generated trees, parsing
//! of randomly formatted text, and the fuzz target's property over arbitrary input (so CI covers
//! it without nightly).

use std::collections::{BTreeMap, BTreeSet};

use calc_graph::selector::{Expr, Selector, parse, parse_bytes};
use proptest::prelude::*;

const KEYS: &[&str] = &[
    "a",
    "b",
    "app",
    "k8s.io/role",
    "x-y_z",
    "in",
    "has",
    "not",
    "all",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(KEYS).prop_map(str::to_string),
        1 => "[a-zA-Z0-9_./-]{1,16}",
    ]
}

/// Any text a quoted literal can hold: never both quote characters.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(&["", "v", "web", "prod", "a b"][..]).prop_map(str::to_string),
        1 => "[^\"]{0,8}",
        1 => "[^']{0,8}",
    ]
}

fn leaf() -> impl Strategy<Value = Expr> {
    prop_oneof![
        Just(Expr::All),
        Just(Expr::Global),
        key().prop_map(Expr::Has),
        (key(), value()).prop_map(|(k, v)| Expr::Eq(k, v)),
        (key(), value()).prop_map(|(k, v)| Expr::Ne(k, v)),
        (key(), proptest::collection::btree_set(value(), 0..4)).prop_map(|(k, s)| Expr::In(k, s)),
        (key(), proptest::collection::btree_set(value(), 0..4))
            .prop_map(|(k, s)| Expr::NotIn(k, s)),
        (key(), value()).prop_map(|(k, v)| Expr::Contains(k, v)),
        (key(), value()).prop_map(|(k, v)| Expr::StartsWith(k, v)),
        (key(), value()).prop_map(|(k, v)| Expr::EndsWith(k, v)),
    ]
}

/// Trees with well-formed lists (two or more operands), possibly with `!(!x)`.
fn expr() -> impl Strategy<Value = Expr> {
    leaf().prop_recursive(6, 48, 4, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| Expr::Not(Box::new(e))),
            proptest::collection::vec(inner.clone(), 2..4).prop_map(Expr::And),
            proptest::collection::vec(inner, 2..4).prop_map(Expr::Or),
        ]
    })
}

fn has_double_negation(e: &Expr) -> bool {
    match e {
        Expr::Not(inner) => matches!(**inner, Expr::Not(_)) || has_double_negation(inner),
        Expr::And(ops) | Expr::Or(ops) => ops.iter().any(has_double_negation),
        _ => false,
    }
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(key(), value(), 0..5)
}

/// Choices that drive [`render_messy`].
struct Dice(Vec<u8>, usize);

impl Dice {
    fn roll(&mut self, n: u8) -> u8 {
        let v = self
            .0
            .get(self.1 % self.0.len().max(1))
            .copied()
            .unwrap_or(0);
        self.1 += 1;
        v % n
    }
    fn ws(&mut self) -> &'static str {
        ["", " ", "\t", "  "][self.roll(4) as usize]
    }
    fn ws1(&mut self) -> &'static str {
        [" ", "\t", " \t "][self.roll(3) as usize]
    }
    fn quote(&mut self, v: &str) -> String {
        let single_ok = !v.contains('\'');
        let double_ok = !v.contains('"');
        let q = match (single_ok, double_ok) {
            (true, true) => ['\'', '"'][self.roll(2) as usize],
            (true, false) => '\'',
            _ => '"',
        };
        format!("{q}{v}{q}")
    }
}

/// Any text that must parse to exactly `e`: random whitespace, quote styles, operator spellings,
/// redundant parentheses and `!!` pairs, set order, duplicates and trailing commas.
fn render_messy(e: &Expr, d: &mut Dice) -> String {
    let core = match e {
        Expr::All => format!("all({})", d.ws()),
        Expr::Global => format!("global({})", d.ws()),
        Expr::Has(k) => format!("has({}{k}{})", d.ws(), d.ws()),
        Expr::Eq(k, v) => format!("{k}{}=={}{}", d.ws(), d.ws(), d.quote(v)),
        Expr::Ne(k, v) => format!("{k}{}!={}{}", d.ws(), d.ws(), d.quote(v)),
        Expr::Contains(k, v) => format!("{k}{}contains{}{}", d.ws1(), d.ws(), d.quote(v)),
        Expr::StartsWith(k, v) => {
            format!("{k}{}starts{}with{}{}", d.ws1(), d.ws(), d.ws(), d.quote(v))
        }
        Expr::EndsWith(k, v) => format!("{k}{}ends{}with{}{}", d.ws1(), d.ws(), d.ws(), d.quote(v)),
        Expr::In(k, s) => format!("{k}{}in{}{}", d.ws1(), d.ws(), render_set(s, d)),
        Expr::NotIn(k, s) => format!(
            "{k}{}not{}in{}{}",
            d.ws1(),
            d.ws(),
            d.ws(),
            render_set(s, d)
        ),
        Expr::Not(inner) => {
            let bangs = if d.roll(3) == 0 { "!!!" } else { "!" };
            let body = render_messy(inner, d);
            // `!!x` would collapse, and `!a && b` would bind the `!` to `a` only.
            let needs_parens = matches!(**inner, Expr::Not(_) | Expr::And(_) | Expr::Or(_));
            if needs_parens || d.roll(4) == 0 {
                format!("{bangs}{}({}{body}{})", d.ws(), d.ws(), d.ws())
            } else {
                format!("{bangs}{}{body}", d.ws())
            }
        }
        Expr::And(ops) => join(ops, "&&", d, |op| matches!(op, Expr::And(_) | Expr::Or(_))),
        Expr::Or(ops) => join(ops, "||", d, |op| matches!(op, Expr::Or(_))),
    };
    if d.roll(6) == 0 {
        format!("({}{core}{})", d.ws(), d.ws())
    } else {
        core
    }
}

fn join(ops: &[Expr], sep: &str, d: &mut Dice, must_paren: fn(&Expr) -> bool) -> String {
    let mut out = String::new();
    for (i, op) in ops.iter().enumerate() {
        if i > 0 {
            out.push_str(d.ws());
            out.push_str(sep);
            out.push_str(d.ws());
        }
        let body = render_messy(op, d);
        if must_paren(op) {
            out.push_str(&format!("({body})"));
        } else {
            out.push_str(&body);
        }
    }
    out
}

fn render_set(s: &BTreeSet<String>, d: &mut Dice) -> String {
    let mut items: Vec<&String> = s.iter().collect();
    if d.roll(2) == 0 {
        items.reverse();
    }
    if let Some(first) = items.first().copied()
        && d.roll(3) == 0
    {
        items.push(first);
    }
    let body: Vec<String> = items.iter().map(|v| d.quote(v)).collect();
    let sep = format!("{},{}", d.ws(), d.ws());
    let trailing = if !body.is_empty() && d.roll(3) == 0 {
        ","
    } else {
        ""
    };
    format!("{{{}{}{trailing}{}}}", d.ws(), body.join(&sep), d.ws())
}

/// Token soup: fragments of the grammar glued at random, to reach deep into the error paths.
fn soup() -> impl Strategy<Value = String> {
    let frag = proptest::sample::select(
        &[
            "a", "k8s.io/x", " ", "\t", "\n", "==", "!=", "!", "=", "&&", "&", "||", "|", "(", ")",
            "{", "}", ",", "'", "\"", "'v'", "\"v\"", "in", "not", "not in", "contains", "starts",
            "with", "ends", "has(", "has(a)", "all()", "global()", "all(", "é", "%", "\\", "a == ",
            "'\"'", "\"'\"", "a in {", "'x', ",
        ][..],
    );
    proptest::collection::vec(frag, 0..24).prop_map(|v| v.concat())
}

/// The fuzz target's property: never panic; a selector that parses round-trips through its
/// canonical text to the tree Felix would see, and canonicalisation is then idempotent.
fn check_round_trip(text: &str) -> Result<(), TestCaseError> {
    let Ok(sel) = parse(text) else {
        return Ok(());
    };
    let canonical = sel.canonical();
    let again =
        parse(&canonical).map_err(|e| TestCaseError::fail(format!("{canonical:?}: {e}")))?;
    prop_assert_eq!(
        again.expr(),
        &sel.expr().reparsed(),
        "{:?} -> {:?}",
        text,
        canonical
    );
    prop_assert_eq!(parse(&again.canonical()).unwrap(), again.clone());
    prop_assert_eq!(
        again.unique_id(),
        Selector::from_expr(sel.expr().reparsed()).unique_id()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn canonical_round_trips_generated_trees(e in expr()) {
        let sel = Selector::from_expr(e.clone());
        prop_assert_eq!(sel.expr(), &e);
        let canonical = sel.canonical();
        let back = parse(&canonical).map_err(|err| TestCaseError::fail(format!("{canonical:?}: {err}")))?;
        prop_assert_eq!(back.expr(), &e.reparsed());
        if !has_double_negation(&e) {
            prop_assert_eq!(&back, &sel);
            prop_assert_eq!(back.unique_id(), sel.unique_id());
        }
        // Canonicalisation is idempotent from the first re-parse on.
        prop_assert_eq!(parse(&back.canonical()).unwrap().canonical(), back.canonical());
        prop_assert!(Selector::try_from_expr(e).is_ok());
    }

    #[test]
    fn round_trip_preserves_meaning(e in expr(), l in labels()) {
        let sel = Selector::from_expr(e);
        let back = parse(&sel.canonical()).unwrap();
        prop_assert_eq!(sel.matches(&l), back.matches(&l));
    }

    #[test]
    fn label_restrictions_are_sound(e in expr(), l in labels()) {
        let sel = Selector::from_expr(e);
        if sel.matches(&l) {
            for (key, r) in sel.label_restrictions() {
                let have = l.get(&key);
                prop_assert!(!r.must_be_present || have.is_some(), "{} needs {}", sel, key);
                prop_assert!(!r.must_be_absent || have.is_none(), "{} forbids {}", sel, key);
                if let (Some(values), Some(v)) = (&r.must_have_one_of, have) {
                    prop_assert!(values.contains(v), "{} restricts {} to {:?}", sel, key, values);
                }
            }
        }
    }

    #[test]
    fn messy_text_parses_to_the_tree(e in expr(), dice in proptest::collection::vec(any::<u8>(), 1..64)) {
        let text = render_messy(&e, &mut Dice(dice, 0));
        let sel = parse(&text).map_err(|err| TestCaseError::fail(format!("{text:?}: {err}")))?;
        prop_assert_eq!(sel.expr(), &e, "{:?}", text);
    }

    #[test]
    fn token_soup_never_panics_and_round_trips(text in soup()) {
        check_round_trip(&text)?;
    }

    #[test]
    fn arbitrary_text_never_panics_and_round_trips(text in "\\PC{0,40}") {
        check_round_trip(&text)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        match parse_bytes(&bytes) {
            Ok(sel) => check_round_trip(&String::from_utf8_lossy(&bytes))
                .and_then(|()| { prop_assert!(parse(&sel.canonical()).is_ok()); Ok(()) })?,
            Err(e) => prop_assert!(e.offset <= bytes.len()),
        }
    }

    #[test]
    fn error_offsets_are_inside_the_input(text in soup()) {
        if let Err(e) = parse(&text) {
            prop_assert!(e.offset <= text.len(), "{} > {}", e.offset, text.len());
            prop_assert!(text.is_char_boundary(e.offset));
        }
    }
}
