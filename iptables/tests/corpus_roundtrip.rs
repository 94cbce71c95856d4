//! Round trip over the shared iptables-save corpus (`testdata/iptables-corpus`, see its SOURCES.md):
//! every `*.kernel.txt` (what iptables-save 1.8.9 printed) must parse and render back byte for byte;
//! every raw input file must parse, except the ones SOURCES.md marks as not loadable as given, which
//! must fail with the line and column of the offending text.

use std::path::PathBuf;

use iptables::parse::{
    parse_save, parse_save_lenient, roundtrip_save, roundtrip_save_lenient, roundtrip_save_parts,
};

fn corpus_dir() -> PathBuf {
    let dir = felixrs_test_support::iptables_corpus_dir();
    assert!(
        dir.join("SOURCES.md").is_file(),
        "iptables corpus missing at {}",
        dir.display()
    );
    dir
}

fn corpus_files(kernel: bool) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(corpus_dir())
        .expect("read corpus dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.ends_with(".txt") && n.ends_with(".kernel.txt") == kernel
        })
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let text = String::from_utf8(std::fs::read(&p).expect("read corpus file"))
                .expect("utf-8 corpus file");
            (name, text)
        })
        .collect();
    out.sort();
    out
}

fn first_diff(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}:\n  want {x:?}\n  got  {y:?}", i + 1);
        }
    }
    format!(
        "line counts differ: want {} got {}",
        a.lines().count(),
        b.lines().count()
    )
}

#[test]
fn kernel_dumps_round_trip_exactly() {
    let files = corpus_files(true);
    assert_eq!(files.len(), 46, "expected the 46 kernel re-saves");
    let mut failures = Vec::new();
    for (name, text) in &files {
        match parse_save(text) {
            Ok(rs) => {
                let out = rs.render();
                if &out != text {
                    failures.push(format!(
                        "{name}: render differs at {}",
                        first_diff(text, &out)
                    ));
                }
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} kernel dumps fail:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

/// Raw files SOURCES.md marks "does not load unchanged", with the error we give (line, column,
/// message part). 017 (built-in chains without counters: only `iptables-restore -c` refuses it) and
/// 028 (an unresolvable host name: needs DNS, not syntax) are loadable text for a parser and parse.
/// (line, column, part of the message).
type ExpectedError = (usize, usize, &'static str);

const NOT_LOADABLE: &[(&str, Option<ExpectedError>)] = &[
    ("006-", Some((1, 65, "carriage return"))),
    ("008-", Some((1, 64, "carriage return"))),
    ("013-", Some((46, 1, "whitespace-only line"))),
    (
        "016-",
        Some((12, 55, "unknown option \"--something-else\"")),
    ),
    ("017-", None),
    (
        "021-",
        Some((1696, 50, "invalid MAC address \"XX:XX:XX:XX:XX:XX\"")),
    ),
    ("022-", Some((2487, 73, "invalid MAC address"))),
    ("023-", Some((52, 45, "old negation syntax `-d ! X`"))),
    ("024-", Some((71, 50, "old negation syntax `-d ! X`"))),
    ("025-", Some((71, 39, "old negation syntax `-d ! X`"))),
    ("028-", None),
];

#[test]
fn raw_inputs_parse_or_fail_with_position() {
    let files = corpus_files(false);
    assert_eq!(files.len(), 46, "expected the 46 raw dumps");
    let sources =
        std::fs::read_to_string(corpus_dir().join("SOURCES.md")).expect("read SOURCES.md");
    let mut failures = Vec::new();
    for (name, text) in &files {
        // Keep the expectation table honest against SOURCES.md.
        let header = format!("### {name}");
        let section = sources
            .split("\n### ")
            .find(|s| format!("### {s}").starts_with(&header))
            .expect("file in SOURCES.md");
        let sources_says_unloadable = section.contains("does **not** load unchanged");
        let expected = NOT_LOADABLE.iter().find(|(p, _)| name.starts_with(p));
        assert_eq!(
            sources_says_unloadable,
            expected.is_some(),
            "{name}: NOT_LOADABLE disagrees with SOURCES.md"
        );
        match (parse_save(text), expected.and_then(|(_, e)| *e)) {
            (Ok(rs), None) => {
                // Whatever the input spelling, our rendering is a fixed point.
                let once = rs.render();
                match parse_save(&once) {
                    Ok(again) if again.render() == once => {}
                    Ok(again) => failures.push(format!(
                        "{name}: render not idempotent at {}",
                        first_diff(&once, &again.render())
                    )),
                    Err(e) => failures.push(format!("{name}: own rendering does not parse: {e}")),
                }
            }
            (Ok(_), Some(want)) => {
                failures.push(format!("{name}: parsed, expected error {want:?}"))
            }
            (Err(e), None) => failures.push(format!("{name}: unexpected error {e}")),
            (Err(e), Some((line, column, msg))) => {
                if (e.line, e.column) != (line, column) || !e.message.contains(msg) {
                    failures.push(format!("{name}: got {e}, want {line}:{column}: …{msg}…"));
                }
                assert_eq!(
                    e.to_string(),
                    format!("{}:{}: {}", e.line, e.column, e.message)
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} raw files misbehave:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn kernel_dumps_are_mostly_typed() {
    // The Calico dump must come out typed: comments, marks, sets, conntrack, multiport.
    let (_, text) = corpus_files(true)
        .into_iter()
        .find(|(n, _)| n.starts_with("002-"))
        .expect("corpus 002");
    let rs = parse_save(&text).unwrap();
    let mut generic = 0;
    let mut total = 0;
    for t in rs.tables() {
        for r in t.rules() {
            for m in &r.matches {
                total += 1;
                if matches!(m, iptables::model::Match::Generic { .. }) {
                    generic += 1;
                }
            }
        }
    }
    assert!(total > 50, "only {total} matches in 002");
    assert!(
        generic * 10 < total,
        "{generic} of {total} matches in 002 stayed generic"
    );
}

/// The streaming roundtrip (`felixrs iptables roundtrip`) gives what rendering the parsed model
/// gives, or the same error, for every file of the corpus, strict and lenient.
#[test]
fn streaming_roundtrip_matches_the_model_on_every_corpus_file() {
    let files: Vec<_> = corpus_files(true)
        .into_iter()
        .chain(corpus_files(false))
        .collect();
    assert_eq!(files.len(), 92);
    for (name, text) in &files {
        let mut out = String::new();
        let streamed = roundtrip_save(text, &mut out).map(|()| out);
        assert_eq!(
            streamed,
            parse_save(text).map(|rs| rs.render()),
            "{name} (strict)"
        );
        let mut out = String::new();
        let streamed = roundtrip_save_lenient(text, &mut out).map(|w| (out, w));
        assert_eq!(
            streamed,
            parse_save_lenient(text).map(|(rs, w)| (rs.render(), w)),
            "{name} (lenient)"
        );
    }
}

/// The parallel roundtrip (chunks on threads) gives the sequential path's output or first error
/// on every corpus file, as it is and with a bad line (a foreign option, a stray `COMMIT`, a
/// table header inside a table) put at a quarter, half and three quarters of it, for any number of
/// chunks.
#[test]
fn parallel_roundtrip_is_the_sequential_one_on_every_corpus_file() {
    let files: Vec<_> = corpus_files(true)
        .into_iter()
        .chain(corpus_files(false))
        .collect();
    assert_eq!(files.len(), 92);
    let bad = ["-A INPUT -m tcp --bogus 1 -j ACCEPT", "COMMIT", "*nat"];
    let (mut ok, mut errors) = (0, 0);
    for (name, text) in &files {
        let lines: Vec<&str> = text.split('\n').collect();
        let mut variants = vec![text.clone()];
        for (i, b) in bad.iter().enumerate() {
            let mut l = lines.clone();
            l.insert(lines.len() * (i + 1) / 4, b);
            variants.push(l.join("\n"));
        }
        for (v, text) in variants.iter().enumerate() {
            let sequential = roundtrip_save_parts(text, 1).map(|p| p.concat());
            let mut out = String::new();
            assert_eq!(
                roundtrip_save(text, &mut out).map(|()| out),
                sequential,
                "{name} variant {v}"
            );
            for threads in [2, 3, 5, 8] {
                let parallel = roundtrip_save_parts(text, threads).map(|p| p.concat());
                assert_eq!(
                    parallel, sequential,
                    "{name} variant {v}, {threads} threads"
                );
            }
            match sequential {
                Ok(_) => ok += 1,
                Err(_) => errors += 1,
            }
        }
    }
    // Both paths of the check ran: dumps that parse and dumps with an error.
    assert!(ok >= 80 && errors >= 200, "{ok} parsed, {errors} errors");
}
