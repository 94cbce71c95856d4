//! Fuzz target for the iptables-save parser (`iptables::parse::parse_save`).
//!
//! Properties: parsing never panics (valid UTF-8 as given, other bytes lossily converted); a
//! parse error has a 1-based position inside the input; text that parses renders to text that
//! parses again and renders identically (render∘parse∘render = render), to the same model.
//! The same properties also run as proptests in `iptables/tests/parse_proptest.rs` for stable CI.
//!
//! Shared by the cargo-fuzz target (`fuzz/fuzz_targets/iptables_save.rs`, nightly, coverage guided) and
//! the bounded stable run in CI (`tests/tests/fuzz_stable.rs`, `scripts/fuzz-stable.sh`).
use iptables::parse::parse_save;

/// Checks the properties on one input; panics when one does not hold.
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match parse_save(&text) {
        Ok(rs) => {
            let once = rs.render();
            let again = parse_save(&once)
                .unwrap_or_else(|e| panic!("rendering does not parse: {e}\n{once}"));
            assert_eq!(again.render(), once, "render∘parse∘render != render");
            assert_eq!(
                again,
                parse_save(&again.render()).unwrap(),
                "model not stable"
            );
        }
        Err(e) => {
            let lines = text.split('\n').count();
            assert!(
                e.line >= 1 && e.line <= lines,
                "line {} outside 1..={lines}",
                e.line
            );
            assert!(e.column >= 1, "column 0");
            assert_eq!(
                e.to_string(),
                format!("{}:{}: {}", e.line, e.column, e.message)
            );
        }
    }
}
