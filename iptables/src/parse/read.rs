//! Turning `iptables-save` output into the applier's kernel view ([`ActualTable`]s).
//!
//! The save goes through the crate's parser ([`crate::parse::parse_save_lenient`]: a rule it
//! cannot type is kept verbatim, never ours, so its chain's rule positions stay true), except
//! the rules of our own `cali-` chains, addressed by position, of which the line scan reads the
//! first comment and the target (ours by its `cali:` comment, as Felix reads them); per rule the view
//! keeps the first comment's `cali:` hash, the jump/goto target and (outside our chains) the
//! kernel's own rendering of the rule for delete-by-spec. A save the parser rejects (a foreign
//! rule using syntax it does not know) must not stop policy from being programmed, so it falls
//! back to the tolerant line scan of [`super::scan::scan_save`], which reads the same three
//! facts.

use std::collections::BTreeMap;

use super::parse_save_lenient;
use super::scan::{ActualRule, ActualTable, scan_rule, scan_save};
use crate::model::{
    HASH_COMMENT_PREFIX, Rule, TableLine, TableName, Target, is_our_chain, valid_hash,
};
#[cfg(test)]
use crate::parse::parse_save;

/// Every table in a save, as the applier sees it.
///
/// In our own chains (most of a node's rules) only each rule's first comment and target
/// matter, and they are read by the line scan (what Felix reads, felix-reference §6.2), so only the other
/// chains' rules go through the typed parser: a restart reads a 15,000-rule save several
/// times faster. A save with a quote left open on some line (a comment holding a raw newline,
/// which the parser joins into one rule across lines) or a `\r`/NUL byte is parsed whole.
pub fn read_tables(text: &str) -> BTreeMap<TableName, ActualTable> {
    let Some((rest, ours)) = split_our_rules(text) else {
        return read_parsed(text);
    };
    let mut out = read_parsed(&rest);
    for (table, chain, spec) in ours {
        let view = out.entry(table).or_default();
        let mut rule = scan_rule(chain, spec);
        // As the parser: a target is a chain only if the table declares it (`-j MARK` is not).
        rule.target = rule.target.filter(|t| view.chains.contains_key(t));
        match view.chains.get_mut(chain) {
            Some(rules) => rules.push(rule),
            None => {
                view.chains.insert(chain.to_string(), vec![rule]);
            }
        }
    }
    out
}

/// One rule line of ours: table, chain, the text after `-A <chain> `.
type OurRule<'a> = (TableName, &'a str, &'a str);

/// Splits a save into the text without the rule lines of our chains, and those lines; `None`
/// when the save must be parsed whole (see [`read_tables`]).
fn split_our_rules(text: &str) -> Option<(String, Vec<OurRule<'_>>)> {
    if text.contains(['\r', '\0']) {
        return None;
    }
    let mut rest = String::with_capacity(text.len() / 4);
    let mut ours = Vec::new();
    let mut table = None;
    for line in text.lines() {
        if !quotes_closed(line) {
            return None;
        }
        if let Some(name) = line.strip_prefix('*') {
            table = TableName::ALL.into_iter().find(|t| t.as_str() == name);
        }
        let rule = line
            .strip_prefix('[')
            .and_then(|l| l.split_once("] ").map(|(_, r)| r))
            .unwrap_or(line);
        if let (Some(t), Some(body)) = (table, rule.strip_prefix("-A ")) {
            let (chain, spec) = body.split_once(' ').unwrap_or((body, ""));
            if is_our_chain(chain) {
                ours.push((t, chain, spec));
                continue;
            }
        }
        rest.push_str(line);
        rest.push('\n');
    }
    Some((rest, ours))
}

/// Whether every double quote a line opens is closed on it (`\` escapes inside quotes, as the
/// kernel prints strings).
fn quotes_closed(line: &str) -> bool {
    let mut open = false;
    let mut bytes = line.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'"' => open = !open,
            b'\\' if open => {
                bytes.next();
            }
            _ => {}
        }
    }
    !open
}

/// [`read_tables`] through the typed parser for every rule.
fn read_parsed(text: &str) -> BTreeMap<TableName, ActualTable> {
    match parse_save_lenient(text) {
        Ok((ruleset, _warnings)) => {
            let mut out: BTreeMap<TableName, ActualTable> = BTreeMap::new();
            for table in ruleset.tables() {
                let view = out.entry(table.name).or_default();
                for name in table.chain_names() {
                    view.chains.entry(name.to_string()).or_default();
                }
                for line in &table.lines {
                    let (chain, actual) = match line {
                        TableLine::Rule(rule) | TableLine::Insert { rule, .. } => {
                            let chain = rule.chain.as_str();
                            (chain, actual_rule(chain, rule))
                        }
                        TableLine::Opaque(o) => {
                            let Some((chain, spec)) = o.chain_and_spec() else {
                                continue;
                            };
                            // Never ours: a rule we cannot type is never deleted by its spec
                            // (it may span lines); in our chains it is replaced by position.
                            let mut r = scan_rule(chain, spec);
                            r.hash = None;
                            (chain, r)
                        }
                        _ => continue,
                    };
                    match view.chains.get_mut(chain) {
                        Some(rules) => rules.push(actual),
                        None => {
                            view.chains.insert(chain.to_string(), vec![actual]);
                        }
                    }
                }
            }
            out
        }
        Err(e) => {
            tracing::warn!(error = %e, "iptables-save output not parsed, falling back to line scan");
            scan_save(text)
        }
    }
}

fn actual_rule(chain: &str, rule: &Rule) -> ActualRule {
    let hash = rule
        .first_comment()
        .and_then(|c| c.strip_prefix(HASH_COMMENT_PREFIX))
        .filter(|h| valid_hash(h))
        .map(str::to_string);
    let target = match &rule.target {
        Some(Target::Jump(c)) | Some(Target::Goto(c)) => Some(c.as_str().to_string()),
        _ => None,
    };
    let spec = if is_our_chain(chain) {
        String::new()
    } else {
        rule.render_spec()
    };
    ActualRule { hash, spec, target }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parser and the fallback scan must agree on every corpus dump (and on a Calico one).
    #[test]
    fn parser_view_equals_scan_view_on_the_corpus() {
        let dir = felixrs_test_support::iptables_corpus_dir();
        let mut n = 0;
        for entry in std::fs::read_dir(dir).expect("corpus directory") {
            let path = entry.unwrap().path();
            if !path.to_string_lossy().ends_with(".kernel.txt") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let parsed = parse_save(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            assert!(parsed.tables().next().is_some(), "{path:?}");
            let mut by_parser = read_parsed(&text);
            let mut by_scan = scan_save(&text);
            // The scan only knows non-chain targets by a short list; compare our chains only.
            for t in by_parser.values_mut().chain(by_scan.values_mut()) {
                for rules in t.chains.values_mut() {
                    for r in rules {
                        r.target = r.target.take().filter(|c| is_our_chain(c));
                    }
                }
            }
            assert_eq!(by_parser, by_scan, "{path:?}");
            // Our chains by the scan and the rest by the parser: the same view.
            assert_eq!(read_tables(&text), read_parsed(&text), "{path:?}");
            n += 1;
        }
        assert!(n >= 40, "only {n} corpus files");
    }

    /// Our rules are read by the scan, in order, between foreign rules in kernel chains and
    /// with counters; a rule printed across lines (an open quote) makes the whole save go
    /// through the parser, which joins it into one opaque rule, so positions stay true.
    #[test]
    fn split_reading_equals_the_parser_and_falls_back_on_open_quotes() {
        let save = "*filter\n:INPUT ACCEPT [0:0]\n:cali-a - [0:0]\n:cali-b - [0:0]\n\
            -A INPUT -m comment --comment \"cali:AAAAAAAAAAAAAAAA\" -j cali-a\n\
            -A INPUT -j ACCEPT\n\
            [1:2] -A cali-a -m comment --comment \"cali:BBBBBBBBBBBBBBBB\" -g cali-b\n\
            -A cali-a -m comment --comment \"x \\\"y\\\" z\" -j DROP\n\
            -A cali-b -m comment --comment \"cali:CCCCCCCCCCCCCCCC\" -j ACCEPT\n\
            COMMIT\n*raw\n:PREROUTING ACCEPT [0:0]\n:cali-c - [0:0]\n\
            -A cali-c -j DROP\nCOMMIT\n";
        assert!(split_our_rules(save).is_some());
        let view = read_tables(save);
        assert_eq!(view, read_parsed(save));
        let a = &view[&TableName::Filter].chains["cali-a"];
        assert_eq!(a[0].hash.as_deref(), Some("BBBBBBBBBBBBBBBB"));
        assert_eq!(a[0].target.as_deref(), Some("cali-b"));
        assert_eq!(a[1].hash, None);
        assert_eq!(view[&TableName::Raw].chains["cali-c"].len(), 1);
        assert_eq!(
            view[&TableName::Filter].chains["INPUT"][0].spec,
            "-m comment --comment \"cali:AAAAAAAAAAAAAAAA\" -j cali-a"
        );

        // A foreign rule whose comment holds a raw newline, followed by a line that looks
        // like one of our rules: the parser's reading (one opaque rule) is kept.
        let open = "*filter\n:INPUT ACCEPT [0:0]\n:cali-a - [0:0]\n\
            -A INPUT -m comment --comment \"two\n\
            -A cali-a -m comment --comment \\\"cali:BBBBBBBBBBBBBBBB\\\" -j DROP\" -j ACCEPT\n\
            COMMIT\n";
        assert!(split_our_rules(open).is_none());
        let view = read_tables(open);
        assert_eq!(view, read_parsed(open));
        assert!(view[&TableName::Filter].chains["cali-a"].is_empty());
        assert_eq!(view[&TableName::Filter].chains["INPUT"].len(), 1);
    }
}
