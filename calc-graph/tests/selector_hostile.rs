//! Hostile selector input: deep nesting, megabyte inputs, unbalanced quotes and parentheses.
//! Everything runs on a thread with a 2 MiB stack (Rust's default for spawned threads) so a
//! recursion that is not bounded by `MAX_DEPTH` would overflow here rather than in production.

use std::collections::BTreeMap;
use std::thread;

use calc_graph::selector::{Expr, MAX_DEPTH, Selector, parse};

const STACK: usize = 2 * 1024 * 1024;
const MEGABYTE: usize = 1024 * 1024;

fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .expect("spawn test thread")
        .join()
        .expect("test thread panicked (stack overflow would abort instead)")
}

fn mk_labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `depth` nested groups, each adding an Or and a Not node (the deepest tree the list-depth
/// limit allows): `has(a) || !(has(a) || !( … has(c) … ))`.
fn mk_deepest(depth: usize) -> String {
    let mut s = String::new();
    for _ in 0..depth {
        s.push_str("has(a) || !(");
    }
    s.push_str("has(c)");
    s.push_str(&")".repeat(depth));
    s
}

fn tree_depth(e: &Expr) -> usize {
    match e {
        Expr::Not(inner) => 1 + tree_depth(inner),
        Expr::And(ops) | Expr::Or(ops) => 1 + ops.iter().map(tree_depth).max().unwrap_or(0),
        _ => 1,
    }
}

#[test]
fn nesting_is_bounded_with_an_error_at_the_offending_paren() {
    on_small_stack(|| {
        let ok = format!("{}has(a){}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
        assert_eq!(parse(&ok).unwrap().expr(), &Expr::Has("a".into()));
        let too_deep = format!(
            "{}has(a){}",
            "(".repeat(MAX_DEPTH + 1),
            ")".repeat(MAX_DEPTH + 1)
        );
        let err = parse(&too_deep).unwrap_err();
        assert_eq!(err.offset, MAX_DEPTH);
        assert!(err.message.contains("nested too deeply"), "{err}");
    });
}

#[test]
fn max_depth_tree_evaluates_canonicalises_and_drops_on_a_small_stack() {
    on_small_stack(|| {
        let text = mk_deepest(MAX_DEPTH);
        let sel = parse(&text).unwrap();
        assert!(
            tree_depth(sel.expr()) > 2 * MAX_DEPTH,
            "{}",
            tree_depth(sel.expr())
        );
        // has(a) short-circuits the outer Or; otherwise evaluation walks every level.
        assert!(sel.matches(&mk_labels(&[("a", "")])));
        let innermost = !sel.matches(&mk_labels(&[("c", "")]));
        assert_eq!(
            innermost,
            MAX_DEPTH % 2 == 1,
            "parity of the nested negations"
        );
        let canonical = sel.canonical();
        let back = parse(&canonical).unwrap();
        assert_eq!(back, sel);
        assert_eq!(back.unique_id(), sel.unique_id());
        let rewritten = sel.rewrite_namespace_selector();
        assert!(rewritten.canonical().contains("has(pcns.c)"));
        let cloned = sel.clone();
        assert_eq!(cloned, sel);
        drop(cloned);
        drop(back);
        assert!(Selector::try_from_expr(sel.expr().clone()).is_ok());
        assert!(parse(&mk_deepest(MAX_DEPTH + 1)).is_err());
        // Two lists per parenthesis: within the parenthesis limit, beyond the list limit.
        let mut two_per_level = String::new();
        for _ in 0..MAX_DEPTH {
            two_per_level.push_str("has(a) || has(b) && (");
        }
        two_per_level.push_str("has(c)");
        two_per_level.push_str(&")".repeat(MAX_DEPTH));
        let err = parse(&two_per_level).unwrap_err();
        assert!(err.message.contains("levels of && and ||"), "{err}");
    });
}

#[test]
fn megabyte_inputs_parse_or_fail_cleanly() {
    on_small_stack(|| {
        // A long flat conjunction: one And with ~87k operands.
        let clause = "app == 'web' && ";
        let mut long_and = clause.repeat(MEGABYTE / clause.len());
        long_and.push_str("has(x)");
        let sel = parse(&long_and).unwrap();
        match sel.expr() {
            Expr::And(ops) => assert_eq!(ops.len(), MEGABYTE / clause.len() + 1),
            other => panic!("expected And, got {other:?}"),
        }
        assert!(sel.matches(&mk_labels(&[("app", "web"), ("x", "")])));
        assert_eq!(parse(&sel.canonical()).unwrap(), sel);

        // A long disjunction of different values.
        let long_or: Vec<String> = (0..60_000).map(|i| format!("v == '{i}'")).collect();
        let sel = parse(&long_or.join(" || ")).unwrap();
        assert!(sel.matches(&mk_labels(&[("v", "59999")])));
        assert!(!sel.matches(&mk_labels(&[("v", "60000")])));

        // One huge set literal.
        let items: Vec<String> = (0..100_000).map(|i| format!("'{i}'")).collect();
        let sel = parse(&format!("v in {{{}}}", items.join(","))).unwrap();
        assert!(sel.matches(&mk_labels(&[("v", "99999")])));

        // A megabyte string literal.
        let big = "x".repeat(MEGABYTE);
        let sel = parse(&format!("v == '{big}'")).unwrap();
        assert_eq!(sel.canonical().len(), MEGABYTE + 7);

        // A megabyte of `!` collapses without recursion.
        let bangs = format!("{}has(a)", "!".repeat(MEGABYTE));
        assert_eq!(parse(&bangs).unwrap().expr(), &Expr::Has("a".into()));

        // Failures: a megabyte of '(' stops at the depth limit; a megabyte label is too long; an
        // unterminated megabyte string; a megabyte of whitespace before garbage.
        assert_eq!(parse(&"(".repeat(MEGABYTE)).unwrap_err().offset, MAX_DEPTH);
        let err = parse(&format!("{} == 'x'", "k".repeat(MEGABYTE))).unwrap_err();
        assert!(err.message.contains("longer than 512"), "{err}");
        assert!(
            err.message.len() < 200,
            "error message must not echo the whole input"
        );
        let err = parse(&format!("v == '{big}")).unwrap_err();
        assert_eq!(err.offset, 5);
        let err = parse(&format!("{}%", " ".repeat(MEGABYTE))).unwrap_err();
        assert_eq!(err.offset, MEGABYTE);
        let err = parse(&format!("{long_and} &&")).unwrap_err();
        assert_eq!(err.offset, long_and.len() + 3);
    });
}

#[test]
fn unbalanced_input_reports_the_byte_offset() {
    let cases = [
        ("(has(a)", 7, "'(' at byte 0"),
        ("has(a))", 6, "unexpected ')'"),
        ("((has(a))", 9, "'(' at byte 0"),
        ("a == 'x", 5, "unterminated string"),
        ("a == \"x'", 5, "unterminated string"),
        ("a in {'x'", 9, "'}'"),
        ("a in 'x'}", 5, "'{'"),
        ("has(a", 5, "')'"),
    ];
    for (input, offset, text) in cases {
        let err = parse(input).unwrap_err();
        assert_eq!(err.offset, offset, "{input:?}: {err}");
        assert!(err.message.contains(text), "{input:?}: {err}");
    }
}
