//! Selector benchmark with fixed inputs: parse, canonicalise + unique id, evaluate.
//!
//! Run: `cargo run --release -p calc-graph --example selector_bench`
//!
//! Floors: parsing is compared with one pass over the same bytes (counting quote characters, the
//! least any parser must do), and `unique_id` with SHA-224 of the canonical string alone.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use calc_graph::selector::{Selector, parse};
use sha2::{Digest, Sha224};

/// Runs `f` until at least `min` has passed (and at least 3 times); returns time per call.
fn time_per_call(min: Duration, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut n = 0u32;
    while n < 3 || start.elapsed() < min {
        f();
        n += 1;
    }
    start.elapsed() / n
}

fn fmt(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.2} µs", ns as f64 / 1e3)
    } else {
        format!("{ns} ns")
    }
}

fn scan_floor(text: &str) -> usize {
    text.bytes().filter(|&b| b == b'\'' || b == b'"').count()
}

fn main() {
    let budget = Duration::from_millis(300);
    let typical = "(projectcalico.org/namespace == 'prod') && (projectcalico.org/orchestrator == 'k8s' \
                   && app == 'api' && tier in { 'backend', 'cache' } && !has(legacy))";
    let clause = "app == 'web' && ";
    let mut long_and = clause.repeat((1 << 20) / clause.len());
    long_and.push_str("has(x)");
    let items: Vec<String> = (0..100_000).map(|i| format!("'{i}'")).collect();
    let big_set = format!("v in {{{}}}", items.join(","));

    println!(
        "{:<28} {:>10} {:>12} {:>12} {:>8}",
        "input", "bytes", "parse", "floor scan", "ratio"
    );
    for (name, text) in [
        ("typical k8s NP", typical),
        ("1 MiB && chain", long_and.as_str()),
        ("1 MiB set literal", big_set.as_str()),
    ] {
        let parse_t = time_per_call(budget, || {
            black_box(parse(black_box(text)).unwrap());
        });
        let scan_t = time_per_call(budget, || {
            black_box(scan_floor(black_box(text)));
        });
        println!(
            "{name:<28} {:>10} {:>12} {:>12} {:>7.1}x",
            text.len(),
            fmt(parse_t),
            fmt(scan_t),
            parse_t.as_secs_f64() / scan_t.as_secs_f64()
        );
    }

    let sel = parse(typical).unwrap();
    let canonical = sel.canonical();
    let id_t = time_per_call(budget, || {
        black_box(black_box(&sel).unique_id());
    });
    let sha_t = time_per_call(budget, || {
        let mut h = Sha224::new();
        h.update(b"s:");
        h.update(black_box(canonical.as_bytes()));
        black_box(h.finalize());
    });
    println!(
        "\ncanonical + unique_id (typical): {} vs SHA-224 alone {} ({:.1}x)",
        fmt(id_t),
        fmt(sha_t),
        id_t.as_secs_f64() / sha_t.as_secs_f64()
    );

    let labels: BTreeMap<String, String> = [
        ("projectcalico.org/namespace", "prod"),
        ("projectcalico.org/orchestrator", "k8s"),
        ("app", "api"),
        ("tier", "cache"),
        ("pod-template-hash", "5d8f7c9b6"),
        ("pcns.projectcalico.org/name", "prod"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert!(sel.matches(&labels));
    let eval_t = time_per_call(budget, || {
        black_box(black_box(&sel).matches(black_box(&labels)));
    });
    println!("matches (typical, 6 labels, true): {}", fmt(eval_t));
    let big = Selector::from_expr(parse(&long_and).unwrap().expr().clone());
    let mut big_labels = BTreeMap::new();
    big_labels.insert("app".to_string(), "web".to_string());
    big_labels.insert("x".to_string(), String::new());
    let eval_big = time_per_call(budget, || {
        black_box(black_box(&big).matches(black_box(&big_labels)));
    });
    println!(
        "matches (1 MiB && chain, 65k clauses, true): {}",
        fmt(eval_big)
    );
}
