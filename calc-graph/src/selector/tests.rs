//! Table-driven tests: Calico's own parser/tokenizer test cases plus the semantics corners.

use std::collections::{BTreeMap, HashMap};

use super::*;

fn mk_labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn mk_sel(s: &str) -> Selector {
    parse(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
}

/// (selector, labels, expected match). Calico's `selectorTests` plus semantics corners.
type LabelPairs = &'static [(&'static str, &'static str)];

const MATCH_CASES: &[(&str, LabelPairs, bool)] = &[
    (r#"a == "b""#, &[("a", "b")], true),
    (r#"a == "b""#, &[("a", "b"), ("c", "d")], true),
    (r#"a == "b""#, &[], false),
    (r#"a == "b""#, &[("a", "c")], false),
    (r#"a == "b""#, &[("c", "d")], false),
    (r#"a == "b" && c == "d""#, &[("a", "b"), ("c", "d")], true),
    (r#"a == "b" && c == "d""#, &[("a", "b"), ("c", "e")], false),
    (r#"a == "b" && c == "d""#, &[("a", "b")], false),
    (r#"a == "b" || c == "d""#, &[("c", "d")], true),
    (r#"a == "b" || c == "d""#, &[("a", "e"), ("c", "e")], false),
    (r#"a in {"'", '"', "c"}"#, &[("a", "\"")], true),
    (r#"a in {"'", '"', "c"}"#, &[("a", "'")], true),
    (r#"a in {"'", '"', "c"}"#, &[("a", "e")], false),
    (r#"a in {"'", '"', "c"}"#, &[], false),
    (r#"a not in {"'", '"', "c"}"#, &[], true),
    (r#"a not in {"'", '"', "c"}"#, &[("a", "e")], true),
    (r#"a not in {"'", '"', "c"}"#, &[("a", "c")], false),
    // != and not in are true when the label is missing (Calico semantics).
    (r#"a != "b""#, &[], true),
    (r#"a != "a""#, &[("a", "a")], false),
    (r#"a != "b""#, &[("a", "a")], true),
    (r#"a not in {"d"}"#, &[], true),
    // contains / starts with / ends with are false when missing.
    (r#"a contains "a""#, &[("a", "bab")], true),
    (r#"a contains "a""#, &[("a", "b")], false),
    (r#"a contains "a""#, &[("b", "aaa")], false),
    (r#"a contains """#, &[("a", "")], true),
    (r#"a contains """#, &[], false),
    (r#"a starts with "a""#, &[("a", "abb")], true),
    (r#"a starts with "a""#, &[("a", "baa")], false),
    (r#"a starts with "a""#, &[], false),
    (r#"a ends with "a""#, &[("a", "bba")], true),
    (r#"a ends with "a""#, &[("a", "aab")], false),
    (r#"a ends with "a""#, &[], false),
    // in {} never matches; not in {} matches everything.
    ("a in {}", &[("a", "")], false),
    ("a not in {}", &[("a", "x")], true),
    ("a not in {}", &[], true),
    // has() is true for an empty value.
    ("has(a)", &[("a", "")], true),
    ("has(a)", &[("b", "a")], false),
    ("!has(a)", &[("b", "b")], true),
    ("!has(a)", &[("a", "b")], false),
    ("!!has(b)", &[("a", "b")], false),
    ("!!! has(a)", &[("a", "b")], false),
    ("!! ! has(a)", &[("a", "b")], false),
    ("! !!has(a)", &[("a", "b")], false),
    ("", &[], true),
    (" ", &[("a", "b")], true),
    ("all()", &[], true),
    (" global()", &[("a", "b")], true),
    (
        "global()",
        &[("projectcalico.org/namespace", "default")],
        true,
    ),
    // Precedence: ! binds tightest, then &&, then ||.
    (
        "!a == 'a1' && b == 'b1'",
        &[("a", "a1"), ("b", "b1")],
        false,
    ),
    (
        "a != 'a1' && !b == 'b1'",
        &[("a", "a1"), ("b", "b1")],
        false,
    ),
    ("!(!has(a) || has(b))", &[("a", "a")], true),
    ("!(has(b) || !has(a))", &[("a", "a")], true),
    ("a == 'a1' || b != 'b1'", &[("a", "a1"), ("b", "b1")], true),
    ("a != 'a1' || b != 'b1'", &[("a", "a1"), ("b", "b1")], false),
    (
        "! a == 'a1' || ! b == 'b1'",
        &[("a", "a1"), ("b", "b1")],
        false,
    ),
    ("has(x) || has(y) && has(z)", &[("x", "")], true),
    ("has(x) || has(y) && has(z)", &[("y", "")], false),
    ("(has(x) || has(y)) && has(z)", &[("x", "")], false),
    ("!a in {\"a\"}", &[("a", "b")], true),
    // Values are compared byte for byte: case-sensitive, no trimming, any UTF-8.
    ("a == 'B'", &[("a", "b")], false),
    ("a == ' b '", &[("a", " b ")], true),
    ("a == 'ünï'", &[("a", "ünï")], true),
    ("a == 'x\ny'", &[("a", "x\ny")], true),
];

#[test]
fn evaluates_like_calico() {
    for (text, labels, want) in MATCH_CASES {
        let sel = mk_sel(text);
        let labels = mk_labels(labels);
        assert_eq!(sel.matches(&labels), *want, "{text:?} against {labels:?}");
        // Same answer after canonicalising (Calico's "should match after canonicalising").
        let again = mk_sel(&sel.canonical());
        assert_eq!(
            again.matches(&labels),
            *want,
            "canonical {:?} against {labels:?}",
            sel.canonical()
        );
        // And through a HashMap.
        let hashed: HashMap<String, String> = labels.clone().into_iter().collect();
        assert_eq!(
            sel.matches(&hashed),
            *want,
            "{text:?} against HashMap {labels:?}"
        );
    }
}

/// (input, canonical, unique id or ""). From Calico's `canonicalisationTests` and the reference.
const CANONICAL_CASES: &[(&str, &str, &str)] = &[
    ("", "all()", "s:5y5I3VdRZfDU01O--xXAPx2yxCQQqMf0M6IWug"),
    (
        " all() ",
        "all()",
        "s:5y5I3VdRZfDU01O--xXAPx2yxCQQqMf0M6IWug",
    ),
    (
        " (all() )",
        "all()",
        "s:5y5I3VdRZfDU01O--xXAPx2yxCQQqMf0M6IWug",
    ),
    (
        "! (has( b)||! has(a ))",
        "!(has(b) || !has(a))",
        "s:Iss0uCleLYv1GSv_pNm7hAO58kE9jAx1NKyG3Q",
    ),
    (
        r#"! (a == "b"&&! c != "d")"#,
        r#"!(a == "b" && !c != "d")"#,
        "s:lh3haoY1ikTRkd4UZu0nWSaIBknYLPJLX16d-w",
    ),
    (r#"a == "'""#, r#"a == "'""#, ""),
    (r#"a == '"'"#, r#"a == '"'"#, ""),
    (r#"a contains '"'"#, r#"a contains '"'"#, ""),
    (r#"a contains "'""#, r#"a contains "'""#, ""),
    (r#"a startswith '"'"#, r#"a starts with '"'"#, ""),
    (r#"a endswith "'""#, r#"a ends with "'""#, ""),
    (r#"a!='"'"#, r#"a != '"'"#, ""),
    (r#"a in {"d"}"#, r#"a in {"d"}"#, ""),
    (r#"a in {"d", "a", "b"}"#, r#"a in {"a", "b", "d"}"#, ""),
    (
        r#"a in {"z", "z", "x", "y", "x", "a"}"#,
        r#"a in {"a", "x", "y", "z"}"#,
        "",
    ),
    (r#"a in {'"', "'"}"#, r#"a in {'"', "'"}"#, ""),
    ("a not in {}", "a not in {}", ""),
    ("a in {'x',}", r#"a in {"x"}"#, ""),
    (
        "projectcalico.org/namespace == 'default' && app == 'web'",
        r#"(projectcalico.org/namespace == "default" && app == "web")"#,
        "",
    ),
    (
        "a == 'x' && b == 'y' && c == 'z'",
        r#"(a == "x" && b == "y" && c == "z")"#,
        "",
    ),
    (
        "(a == 'x' && b == 'y') && c == 'z'",
        r#"((a == "x" && b == "y") && c == "z")"#,
        "",
    ),
    (
        "has(a) || has(b) && has(c)",
        "(has(a) || (has(b) && has(c)))",
        "",
    ),
    ("!!has(a)", "has(a)", ""),
    ("!(k == 'v')", r#"!k == "v""#, ""),
    // Parentheses stop the collapse of `!`: Calico prints the double negation as-is.
    ("!(!has(a))", "!!has(a)", ""),
    ("a notin{'x'}", r#"a not in {"x"}"#, ""),
    ("\tglobal( )", "global()", ""),
    (
        "!(!(k == 'v' && has(t) || all()) && (a in {'b', 'c'}))",
        r#"!(!((k == "v" && has(t)) || all()) && a in {"b", "c"})"#,
        "",
    ),
];

#[test]
fn canonical_form_and_unique_id_match_calico() {
    for (input, want, want_id) in CANONICAL_CASES {
        let sel = mk_sel(input);
        assert_eq!(sel.canonical(), *want, "canonical of {input:?}");
        assert_eq!(sel.to_string(), *want, "Display of {input:?}");
        let again = mk_sel(want);
        assert_eq!(again.expr(), &sel.expr().reparsed(), "re-parsing {want:?}");
        if !want.contains("!!") {
            assert_eq!(again.canonical(), *want, "re-canonicalising {want:?}");
        }
        let id = sel.unique_id();
        assert!(id.starts_with("s:") && id.len() == 40, "{id}");
        if !want_id.is_empty() {
            assert_eq!(id, *want_id, "unique id of {input:?}");
        }
    }
}

#[test]
fn calico_visitor_examples_prefix_keys() {
    let cases = [
        ("k == 'v'", r#"visited/k == "v""#),
        ("k != 'v'", r#"visited/k != "v""#),
        ("k contains 'v'", r#"visited/k contains "v""#),
        ("k starts with 'v'", r#"visited/k starts with "v""#),
        ("k ends with 'v'", r#"visited/k ends with "v""#),
        (
            "k == 'v' && x == 'y'",
            r#"(visited/k == "v" && visited/x == "y")"#,
        ),
        (
            "k == 'v' || has(x)",
            r#"(visited/k == "v" || has(visited/x))"#,
        ),
        ("!(k == 'v')", r#"!visited/k == "v""#),
        ("k in {'v'}", r#"visited/k in {"v"}"#),
        ("k not in {'v'}", r#"visited/k not in {"v"}"#),
        (
            "!(!(k == 'v' && has(t) || all()) && (a in {'b', 'c'}))",
            r#"!(!((visited/k == "v" && has(visited/t)) || all()) && visited/a in {"b", "c"})"#,
        ),
    ];
    for (input, want) in cases {
        let sel = mk_sel(input).map_keys(|k| format!("visited/{k}"));
        assert_eq!(sel.canonical(), want, "{input:?}");
        assert_eq!(
            mk_sel(input).with_key_prefix("visited/").canonical(),
            want,
            "{input:?}"
        );
    }
}

/// (input, byte offset of the error). Calico's `badSelectors` plus more.
const BAD_CASES: &[(&str, usize)] = &[
    ("b == b", 5),
    ("b contains b", 11),
    // Calico trims the space after "with" before checking for a word boundary, so the label
    // that follows makes the operator itself unrecognisable.
    ("b starts with b", 2),
    ("b ends with b", 2),
    ("'b1' == b", 0),
    ("b", 1),
    ("a b", 2),
    ("!", 1),
    (r#"foo == "bar" &"#, 13),
    (r#"foo == "bar" |"#, 13),
    ("foo != ||", 7),
    (r#"foo in {"", ||"#, 12),
    (r#"foo in """#, 7),
    (r#""FOO"#, 0),
    (r#""FOO'"#, 0),
    ("'FOO", 0),
    ("(", 1),
    (r#"(a == "foo""#, 11),
    (")", 0),
    ("()", 1),
    ("%", 0),
    (r#"a == "b" && %"#, 12),
    (r#"a == "b" || %"#, 12),
    ("a ", 2),
    ("has(foo) &&", 11),
    // More: operators need word boundaries; whitespace is only space and tab.
    ("a containsx 'v'", 2),
    ("a == 'v'\n", 8),
    ("a\n== 'v'", 1),
    ("has (a)", 4),
    ("has()", 4),
    ("has(a", 5),
    ("all(x)", 4),
    ("a in {'x' 'y'}", 10),
    ("a in {,}", 6),
    ("a in 'x'", 5),
    ("a = 'x'", 2),
    ("a == 'x' b", 9),
    ("a == 'x')", 8),
    ("== 'x'", 0),
    ("a == 'x' && (b == 'y'", 21),
    ("é == 'x'", 0),
];

#[test]
fn rejects_bad_selectors_with_offsets() {
    let mut wrong = Vec::new();
    for (input, offset) in BAD_CASES {
        let err = parse(input).expect_err(input);
        if err.offset != *offset {
            wrong.push(format!("{input:?}: want {offset}, got {err}"));
        }
        assert!(
            err.to_string()
                .starts_with(&format!("at byte {}: ", err.offset)),
            "{err}"
        );
        assert!(!err.message.ends_with('.'), "{err}");
    }
    assert!(wrong.is_empty(), "wrong offsets:\n{}", wrong.join("\n"));
}

#[test]
fn label_keys_are_limited_to_512_bytes() {
    let ok = "k".repeat(MAX_LABEL_LENGTH);
    assert_eq!(mk_sel(&format!("has({ok})")).expr(), &Expr::Has(ok.clone()));
    let long = "k".repeat(MAX_LABEL_LENGTH + 1);
    let err = parse(&format!("{long} == 'x'")).unwrap_err();
    assert!(err.message.contains("longer than 512"), "{err}");
    assert!(parse(&format!("has( {long})")).is_err());
}

#[test]
fn unterminated_quote_error_points_at_the_quote() {
    let err = parse("a == 'b' && c == \"d").unwrap_err();
    assert_eq!(err.offset, 17);
    assert!(err.message.contains("unterminated string"), "{err}");
}

#[test]
fn parenthesis_error_names_the_opening_paren() {
    let err = parse("a == 'x' && (b == 'y'").unwrap_err();
    assert!(err.message.contains("'(' at byte 12"), "{err}");
}

#[test]
fn tokenizer_word_operators_follow_calico() {
    let cases = [
        (
            "contains contains 'contains'",
            Expr::Contains("contains".into(), "contains".into()),
        ),
        (
            "label contains\"value\"",
            Expr::Contains("label".into(), "value".into()),
        ),
        (
            "startswith starts with 'v'",
            Expr::StartsWith("startswith".into(), "v".into()),
        ),
        (
            "endswith ends  with 'v'",
            Expr::EndsWith("endswith".into(), "v".into()),
        ),
        ("a notin{}", Expr::NotIn("a".into(), Default::default())),
        ("has == 'x'", Expr::Eq("has".into(), "x".into())),
        ("all == 'x'", Expr::Eq("all".into(), "x".into())),
        (
            "in in {'in'}",
            Expr::In("in".into(), ["in".to_string()].into()),
        ),
        (
            "calico/k8s_NS-.1/role == 'x'",
            Expr::Eq("calico/k8s_NS-.1/role".into(), "x".into()),
        ),
        ("has(\tcalico/k8s_ns )", Expr::Has("calico/k8s_ns".into())),
        ("a==\"b\"", Expr::Eq("a".into(), "b".into())),
    ];
    for (input, want) in cases {
        assert_eq!(mk_sel(input).expr(), &want, "{input:?}");
    }
    for bad in [
        "label starts foo 'v'",
        "label ends foo 'v'",
        "label squiggles 'v'",
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn strings_have_no_escapes() {
    // A backslash is an ordinary character; the next matching quote ends the string.
    assert_eq!(
        mk_sel(r"a == 'x\'").expr(),
        &Expr::Eq("a".into(), r"x\".into())
    );
    assert!(parse(r"a == 'x\'y'").is_err());
    assert_eq!(mk_sel(r#"a == "it's""#).canonical(), r#"a == "it's""#);
}

#[test]
fn and_builds_what_calico_parses_from_joined_text() {
    let a = mk_sel("projectcalico.org/namespace == 'prod'");
    let b = mk_sel("projectcalico.org/orchestrator == 'k8s' && app == 'api'");
    let joined = mk_sel(&format!(
        "({}) && ({})",
        "projectcalico.org/namespace == 'prod'",
        "projectcalico.org/orchestrator == 'k8s' && app == 'api'"
    ));
    assert_eq!(a.clone().and(b.clone()), joined);
    assert_eq!(
        a.and(b).canonical(),
        r#"(projectcalico.org/namespace == "prod" && (projectcalico.org/orchestrator == "k8s" && app == "api"))"#
    );
    // Double negation inside an operand survives, as it does in Calico's text.
    let neg = mk_sel("!(!has(x))");
    assert_eq!(
        mk_sel("has(a)").and(neg).canonical(),
        "(has(a) && !!has(x))"
    );
}

#[test]
fn from_expr_removes_degenerate_lists() {
    assert_eq!(Selector::from_expr(Expr::And(vec![])), Selector::all());
    assert_eq!(Selector::from_expr(Expr::Or(vec![])).canonical(), "!all()");
    assert!(!Selector::from_expr(Expr::Or(vec![])).matches(&mk_labels(&[])));
    assert_eq!(
        Selector::from_expr(Expr::Not(Box::new(Expr::And(vec![Expr::Has("a".into())]))))
            .canonical(),
        "!has(a)"
    );
    assert_eq!(
        Selector::all_of(vec![Expr::Has("a".into())]).canonical(),
        "has(a)"
    );
}

#[test]
fn try_from_expr_rejects_unprintable_trees() {
    assert!(Selector::try_from_expr(Expr::Has(String::new())).is_err());
    assert!(Selector::try_from_expr(Expr::Has("a b".into())).is_err());
    assert!(Selector::try_from_expr(Expr::Eq("a".into(), "'\"".into())).is_err());
    let mut deep = Expr::Has("a".into());
    for _ in 0..=MAX_DEPTH {
        deep = Expr::And(vec![deep, Expr::All]);
    }
    assert!(Selector::try_from_expr(deep).is_err());
    assert!(Selector::try_from_expr(Expr::Eq("a".into(), "\"".into())).is_ok());
}

#[test]
fn parse_bytes_rejects_invalid_utf8_at_the_bad_byte() {
    let err = parse_bytes(b"a == 'x\xff'").unwrap_err();
    assert_eq!(err.offset, 7);
    assert_eq!(parse_bytes(b"has(a)").unwrap(), mk_sel("has(a)"));
}

#[test]
fn from_str_and_serde_use_canonical_text() {
    let sel: Selector = "a == 'b'".parse().unwrap();
    assert_eq!(serde_json::to_string(&sel).unwrap(), r#""a == \"b\"""#);
    let back: Selector = serde_json::from_str(r#""a == 'b'""#).unwrap();
    assert_eq!(back, sel);
    let err = serde_json::from_str::<Selector>(r#""a =""#).unwrap_err();
    assert!(err.to_string().contains("invalid selector"), "{err}");
}

#[test]
fn make_unique_id_matches_calico_format() {
    let id = make_unique_id("s", "all()");
    assert_eq!(id, "s:5y5I3VdRZfDU01O--xXAPx2yxCQQqMf0M6IWug");
    assert_eq!(make_unique_id("test", "content").len(), "test:".len() + 38);
}

/// The felix-reference §9.3 worked example, built with the API the graph uses, must be exactly the
/// tree Felix parses from the rewritten text (and so name the same IP sets). (The controller's
/// LabelSelector text is checked to parse to these trees in k8s-convert's `convert/labels.rs`.)
#[test]
fn worked_example_from_the_reference_builds_felixs_trees() {
    let orchestrator = || Expr::Eq("projectcalico.org/orchestrator".into(), "k8s".into());
    let pod_selector =
        |app: &str| Selector::all_of(vec![orchestrator(), Expr::Eq("app".into(), app.into())]);
    let namespace = mk_sel("projectcalico.org/namespace == 'prod'");

    let policy = pod_selector("db").and(namespace.clone());
    let felix_policy = mk_sel(
        "(projectcalico.org/orchestrator == 'k8s' && app == 'db') && projectcalico.org/namespace == 'prod'",
    );
    assert_eq!(policy, felix_policy);

    let rule1 = namespace.and(pod_selector("api"));
    let felix_rule1 = mk_sel(
        "(projectcalico.org/namespace == 'prod') && (projectcalico.org/orchestrator == 'k8s' && app == 'api')",
    );
    assert_eq!(rule1, felix_rule1);
    assert_eq!(
        rule1.canonical(),
        r#"(projectcalico.org/namespace == "prod" && (projectcalico.org/orchestrator == "k8s" && app == "api"))"#
    );

    let ns_selector = mk_sel("team == 'ops'");
    let rule2 = ns_selector
        .rewrite_namespace_selector()
        .and(Selector::all_of(vec![orchestrator()]));
    let felix_rule2 =
        mk_sel(r#"(pcns.team == "ops") && (projectcalico.org/orchestrator == 'k8s')"#);
    assert_eq!(rule2, felix_rule2);
    assert_eq!(rule2.unique_id(), felix_rule2.unique_id());
    assert_eq!(
        rule2.canonical(),
        r#"(pcns.team == "ops" && projectcalico.org/orchestrator == "k8s")"#
    );

    // An empty namespaceSelector ({}) is all(), i.e. every namespaced endpoint.
    let any_ns = mk_sel("all()");
    assert_eq!(
        any_ns.rewrite_namespace_selector().canonical(),
        "has(projectcalico.org/namespace)"
    );
}
