//! Turning `iptables-save` output into the applier's kernel view.
//!
//! The save goes through the crate's parser ([`crate::parse::parse_save_lenient`]: a rule it
//! cannot type is kept verbatim, never ours, so its chain's rule positions stay true); per rule the view
//! keeps the first comment's `cali:` hash, the jump/goto target and (outside our chains) the
//! kernel's own rendering of the rule for delete-by-spec. A save the parser rejects (a foreign
//! rule using syntax it does not know) must not stop policy from being programmed, so it falls
//! back to the tolerant line scan of [`super::kernel::scan_save`], which reads the same three
//! facts.

use std::collections::BTreeMap;

use super::desired::{HASH_COMMENT_PREFIX, TableName, is_our_chain, valid_hash};
use super::kernel::{ActualRule, ActualTable, scan_rule, scan_save};
use crate::model::{Rule, TableLine, Target};
#[cfg(test)]
use crate::parse::parse_save;
use crate::parse::parse_save_lenient;

/// Every table in a save, as the applier sees it.
pub fn read_tables(text: &str) -> BTreeMap<TableName, ActualTable> {
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
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/iptables-corpus");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).expect("corpus directory") {
            let path = entry.unwrap().path();
            if !path.to_string_lossy().ends_with(".kernel.txt") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let parsed = parse_save(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            assert!(parsed.tables().next().is_some(), "{path:?}");
            let mut by_parser = read_tables(&text);
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
            n += 1;
        }
        assert!(n >= 40, "only {n} corpus files");
    }
}
