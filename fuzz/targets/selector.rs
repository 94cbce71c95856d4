//! Fuzz target for the Calico selector parser.
//!
//! Properties: parsing never panics (raw bytes and lossily converted text); a selector that
//! parses round-trips through its canonical text to `expr().reparsed()` (Calico prints `!(!x)` as
//! `!!x`, which re-parses as `x`); canonicalisation is idempotent from then on; the round trip
//! never changes what the selector matches; every match satisfies `label_restrictions()`. The
//! same properties run as proptests in
//! `calc-graph/tests/selector_proptest.rs` so stable CI covers them too.
//!
//! Shared by the cargo-fuzz target (`fuzz/fuzz_targets/selector.rs`, nightly, coverage guided) and
//! the bounded stable run in CI (`tests/tests/fuzz_stable.rs`, `scripts/fuzz-stable.sh`).
use std::collections::BTreeMap;

use calc_graph::selector::{Expr, Selector, parse, parse_bytes};

fn collect_keys<'a>(e: &'a Expr, out: &mut Vec<&'a str>) {
    if let Some(k) = e.key() {
        out.push(k);
    }
    match e {
        Expr::Not(inner) => collect_keys(inner, out),
        Expr::And(ops) | Expr::Or(ops) => ops.iter().for_each(|op| collect_keys(op, out)),
        _ => {}
    }
}

/// A few label maps over the selector's own keys, so evaluation takes both branches.
fn label_sets(sel: &Selector, seed: &[u8]) -> Vec<BTreeMap<String, String>> {
    let mut keys = Vec::new();
    collect_keys(sel.expr(), &mut keys);
    let values = ["", "v", "web", "\"", "'"];
    let mut sets = vec![BTreeMap::new()];
    for round in 0..3usize {
        let mut labels = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            let pick = seed.get(i + round).copied().unwrap_or(0) as usize + round;
            if !pick.is_multiple_of(3) {
                labels.insert(k.to_string(), values[pick % values.len()].to_string());
            }
        }
        sets.push(labels);
    }
    sets
}

/// Checks the properties on one input; panics when one does not hold.
pub fn run(data: &[u8]) {
    let from_bytes = parse_bytes(data);
    if let Err(e) = &from_bytes {
        assert!(
            e.offset <= data.len(),
            "error offset {} beyond input {}",
            e.offset,
            data.len()
        );
    }
    let text = String::from_utf8_lossy(data);
    let Ok(sel) = parse(&text) else {
        assert!(
            from_bytes.is_err(),
            "valid UTF-8 parsed as bytes but not as text"
        );
        return;
    };
    let canonical = sel.canonical();
    let again = match parse(&canonical) {
        Ok(again) => again,
        Err(e) => panic!("canonical {canonical:?} of {text:?} does not parse: {e}"),
    };
    assert_eq!(
        again.expr(),
        &sel.expr().reparsed(),
        "{text:?} -> {canonical:?}"
    );
    let twice = parse(&again.canonical()).expect("re-canonical form parses");
    assert_eq!(twice, again, "canonicalisation not idempotent for {text:?}");
    assert_eq!(twice.canonical(), again.canonical());
    assert!(sel.unique_id().starts_with("s:"));
    let restrictions = sel.label_restrictions();
    for labels in label_sets(&sel, data) {
        let matched = sel.matches(&labels);
        assert_eq!(matched, again.matches(&labels), "{text:?} on {labels:?}");
        if !matched {
            continue;
        }
        for (key, r) in &restrictions {
            let have = labels.get(key);
            assert!(
                !r.must_be_present || have.is_some(),
                "{text:?} matched without {key}"
            );
            assert!(
                !r.must_be_absent || have.is_none(),
                "{text:?} matched with {key}"
            );
            if let (Some(values), Some(v)) = (&r.must_have_one_of, have) {
                assert!(
                    values.contains(v),
                    "{text:?} matched {key}={v:?} outside {values:?}"
                );
            }
        }
    }
}
