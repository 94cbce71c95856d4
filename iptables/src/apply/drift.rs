//! Fast drift detection: everything of ours checked every few seconds, cheaply when nothing
//! changed.
//!
//! The periodic full refresh (re-read everything, repair) stays the backstop; between two, each
//! check asks the backend's change signal ([`super::signal`]) whether the tables changed since
//! the last look or our last write: the nft generation id; legacy's table summaries, and the
//! hash of its tables' contents on a slower cadence; the save's hash where the programs run in
//! another namespace. Only when it moved are the tables re-read, and every table is planned against the desired state
//! exactly as an apply plans it (the same hash-positional diff): the chains the plan touches are
//! the drift of ours (every `cali-` chain: workload, dispatch, policy, profile, shared, nat,
//! mangle, raw; our hook rules, displaced or gone), and the next apply rewrites exactly those,
//! one transaction per table. A foreign rule (in a kernel chain, or appended below our hooks)
//! is not ours to remove: the plan keeps it and moves our hook back above it. Our IP sets are
//! compared by members on every check (`ipset save`, no signal exists): a set flushed and
//! refilled with other members is rewritten; a domain set counts as drifted only when gone.
//!
//! A rule is ours by its `cali:<id>` comment, but the id alone does not say the rule is what we
//! wrote: `iptables -R` (or `nft replace rule`) keeping the comment would pass any comparison
//! by id. So every read of the tables is checked by [`verify_bodies`]: each rule whose id is the
//! one the desired state has at its place must be, as the kernel saved it, exactly the text we
//! render for it (the renderer writes the kernel's own form, byte for byte); one that is not is
//! marked ([`EDITED`]) so the plan replaces it like any rule of another id.

use std::collections::BTreeMap;

use crate::desired::diff::Op;
use crate::desired::{DesiredRule, DesiredState, TableName};
use crate::model::HASH_COMMENT_PREFIX;
use crate::parse::{ActualRule, ActualTable};

/// Our root chains: one found empty or missing means the table was likely flushed wholesale.
pub const ROOTS: [&str; 3] = ["cali-FORWARD", "cali-INPUT", "cali-OUTPUT"];

/// The chains a plan writes, each once, in order.
pub fn touched(ops: &[Op]) -> Vec<&str> {
    let mut chains: Vec<&str> = Vec::new();
    for op in ops {
        let c = match op {
            Op::Declare(c) | Op::DeleteChain(c) => c,
            Op::Replace { chain, .. }
            | Op::Append { chain, .. }
            | Op::Insert { chain, .. }
            | Op::DeleteIndex { chain, .. }
            | Op::DeleteSpec { chain, .. } => chain,
        };
        if !chains.contains(&c.as_str()) {
            chains.push(c);
        }
    }
    chains
}

/// What one drift check found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriftReport {
    /// What of ours differed and was repaired: `table/chain`, `ipset/name`.
    pub drifted: Vec<String>,
    /// A root chain of ours was gone or empty (the table was likely flushed).
    pub full_refresh: bool,
    /// Table re-reads this check did (0 when the change signal had not moved).
    pub listings: u32,
    /// Our IP sets whose members differed (repaired).
    pub sets: Vec<String>,
    /// The chains (`table/chain`, also in `drifted`) holding a rule of ours edited in place:
    /// its id kept, its body not the one the id stands for ([`verify_bodies`]).
    pub edited: Vec<String>,
}

/// Appended to the id of a rule of ours whose body differs from what the id stands for: an id no
/// desired rule has (ids are base64), so the plan replaces the rule (in our chains by position,
/// in kernel chains by its spec, as any rule of ours).
pub const EDITED: &str = "~edited";

/// Marks each rule of ours in `tables` (read from `save`, the save text they were read from)
/// whose id is the one `desired` has there but whose text in the save is not the text that id
/// stands for ([`DesiredRule::restore_spec`]); returns the chains holding one, `table/chain`.
/// In our chains a rule is the one at its position; in a kernel chain a hook rule of ours is
/// found by its id (its spec is kept in the view). A chain of ours whose save lines cannot be
/// lined up with the view's rules (a rule printed across lines) has all its rules marked: it is
/// rewritten rather than trusted. One pass over the save's lines, no allocation per rule.
pub fn verify_bodies(
    save: &str,
    desired: &DesiredState,
    tables: &mut BTreeMap<TableName, ActualTable>,
) -> Vec<String> {
    let mut lines: BTreeMap<(TableName, &str), Vec<&str>> = BTreeMap::new();
    let mut table = None;
    for line in save.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = (TableName::ALL.into_iter())
                .find(|t| t.as_str() == name)
                .filter(|t| desired.tables.contains_key(t));
            continue;
        }
        let (Some(t), Some(rule)) = (table, without_counters(line).strip_prefix("-A ")) else {
            continue;
        };
        let (chain, spec) = rule.split_once(' ').unwrap_or((rule, ""));
        if desired.tables[&t].chains.contains_key(chain) {
            lines.entry((t, chain)).or_default().push(spec);
        }
    }
    let mut edited = Vec::new();
    for (t, d) in &desired.tables {
        let Some(actual) = tables.get_mut(t) else {
            continue;
        };
        for (chain, want) in &d.chains {
            let Some(rules) = actual.chains.get_mut(chain) else {
                continue;
            };
            let specs = lines
                .get(&(*t, chain.as_str()))
                .map_or(&[][..], Vec::as_slice);
            let aligned = specs.len() == rules.len();
            let mut marked = Vec::new();
            for (i, (rule, w)) in rules.iter_mut().zip(want).enumerate() {
                if rule.hash.as_deref() == Some(w.hash.as_str())
                    && !(aligned && spec_is(specs[i], w))
                {
                    mark(rule, &mut marked, i);
                }
            }
            report(&mut edited, t, chain, &marked);
        }
        for kernel_chain in t.builtin_chains() {
            let Some(rules) = actual.chains.get_mut(*kernel_chain) else {
                continue;
            };
            let mut marked = Vec::new();
            for (i, rule) in rules.iter_mut().enumerate() {
                let Some(hook) = (d.hooks.iter())
                    .filter(|h| h.kernel_chain == *kernel_chain)
                    .find(|h| rule.hash.as_deref() == Some(h.rule.hash.as_str()))
                else {
                    continue;
                };
                if !spec_is(&rule.spec, &hook.rule) {
                    mark(rule, &mut marked, i);
                }
            }
            report(&mut edited, t, kernel_chain, &marked);
        }
    }
    edited
}

/// Marks `rule` (at `index`) edited, noting its position (1-based) and id in `marked`.
fn mark(rule: &mut ActualRule, marked: &mut Vec<(usize, String)>, index: usize) {
    if let Some(id) = rule.hash.as_mut() {
        marked.push((index + 1, id.clone()));
        id.push_str(EDITED);
    }
}

/// One log line per chain with rules marked (the first named; a chain that cannot be lined up
/// has them all marked), and the chain in `edited`.
fn report(edited: &mut Vec<String>, table: &TableName, chain: &str, marked: &[(usize, String)]) {
    let Some((rule, id)) = marked.first() else {
        return;
    };
    let rules = marked.len();
    tracing::warn!(%table, %chain, rule, %id, rules, "drift: a rule of ours holds another body than its id stands for");
    edited.push(format!("{table}/{chain}"));
}

/// Whether `spec` (a save line after `-A <chain> `) is `rule` as the kernel saves what we write
/// (`-m comment --comment "cali:<id>"`, then the body), without building that text. The kernel
/// prints the parts of a rule its entry header holds (`-s`, `-d`, `-i`, `-o`, `-p`, `-f`) before
/// every match, so the comment we write first may follow them: the save is the body with our
/// comment put in between two of its options.
pub fn spec_is(spec: &str, rule: &DesiredRule) -> bool {
    const COMMENT: &str = "-m comment --comment \"";
    let mut from = 0;
    // The comment as an option of its own: at the start or after a space (a quoted string
    // holding the same text has its quotes escaped).
    let at = loop {
        let Some(i) = spec[from..].find(COMMENT).map(|i| i + from) else {
            return false;
        };
        if i == 0 || spec.as_bytes()[i - 1] == b' ' {
            break i;
        }
        from = i + 1;
    };
    let (before, comment) = spec.split_at(at);
    let Some(after) = comment[COMMENT.len()..]
        .strip_prefix(HASH_COMMENT_PREFIX)
        .and_then(|s| s.strip_prefix(rule.hash.as_str()))
        .and_then(|s| s.strip_prefix('"'))
    else {
        return false;
    };
    let body = rule.body();
    match (before, after) {
        ("", after) => {
            after.strip_prefix(' ').unwrap_or(after) == body
                && (after.is_empty() || after.starts_with(' '))
        }
        (before, "") => before.strip_suffix(' ') == Some(body),
        (before, after) => {
            after.starts_with(' ')
                && body
                    .strip_prefix(before)
                    .is_some_and(|rest| rest == &after[1..])
        }
    }
}

/// A save line without its `[packets:bytes] ` prefix (`-c`).
fn without_counters(line: &str) -> &str {
    match line.strip_prefix('[').and_then(|l| l.split_once("] ")) {
        Some((_, rest)) => rest,
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{HookPosition, HookRule, IpVersion};
    use crate::model::{Match, TableLine, Text, is_our_chain};
    use crate::parse::{parse_save, read_tables};

    fn rule(hash: &str, body: &str) -> DesiredRule {
        DesiredRule::new(hash, body)
    }

    #[test]
    fn a_spec_is_the_body_with_our_comment_where_the_kernel_prints_it() {
        let r = rule(
            "AAAAAAAAAAAAAAAA",
            "-p tcp -m set --match-set s src -j ACCEPT",
        );
        let c = "-m comment --comment \"cali:AAAAAAAAAAAAAAAA\"";
        for ok in [
            format!("{c} -p tcp -m set --match-set s src -j ACCEPT"),
            format!("-p tcp {c} -m set --match-set s src -j ACCEPT"),
            format!("-p tcp -m set --match-set s src -j ACCEPT {c}"),
        ] {
            assert!(spec_is(&ok, &r), "{ok}");
        }
        for bad in [
            format!("-p tcp {c} -m set --match-set s src -j DROP"),
            format!("-p udp {c} -m set --match-set s src -j ACCEPT"),
            format!("-p tcp {c} -m set --match-set s src -j ACCEPTX"),
            format!("-p tcp {c}-m set --match-set s src -j ACCEPT"),
            "-p tcp -m comment --comment \"cali:BBBBBBBBBBBBBBBB\" -m set --match-set s src -j ACCEPT".to_string(),
            "-p tcp -m set --match-set s src -j ACCEPT".to_string(),
            format!("-p tcp -m comment --comment \"x\\\" {c}\" -m set --match-set s src -j ACCEPT"),
        ] {
            assert!(!spec_is(&bad, &r), "{bad}");
        }
        let empty = rule("AAAAAAAAAAAAAAAA", "");
        assert!(spec_is(c, &empty));
        assert!(!spec_is(&format!("{c} -j ACCEPT"), &empty));
        assert!(spec_is(
            &format!("-p tcp {c}"),
            &rule("AAAAAAAAAAAAAAAA", "-p tcp")
        ));
    }

    /// Every rule of every kernel dump of the corpus (both families, all tables), as if it were
    /// ours: our comment put first among its matches, as we write it, and rendered as the kernel
    /// saves it (the model renders the kernel's order, proven byte for byte by the corpus round
    /// trip), is the rule its id stands for; the rule with any other token changed is not.
    #[test]
    fn no_rule_the_kernel_only_re_saves_is_taken_for_edited() {
        let dir = felixrs_test_support::iptables_corpus_dir();
        let (mut checked, mut files) = (0, 0);
        for entry in std::fs::read_dir(dir).expect("corpus directory") {
            let path = entry.unwrap().path();
            if !path.to_string_lossy().ends_with(".kernel.txt") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let parsed = parse_save(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            files += 1;
            for table in parsed.tables() {
                for line in &table.lines {
                    let TableLine::Rule(r) = line else { continue };
                    let id = "AAAAAAAAAAAAAAAA";
                    let want = DesiredRule::from_rule(id, r);
                    let mut ours = r.clone();
                    let comment = Text::new(format!("{HASH_COMMENT_PREFIX}{id}")).unwrap();
                    ours.matches.insert(0, Match::Comment(comment));
                    let saved = ours.render_spec();
                    assert!(spec_is(&saved, &want), "{path:?}: {saved}\n{want:?}");
                    // One token changed (the last: mostly the target or its value).
                    let edited = match saved.rsplit_once(' ') {
                        Some((head, last)) => format!("{head} {last}X"),
                        None => continue,
                    };
                    assert!(!spec_is(&edited, &want), "{path:?}: {edited}");
                    checked += 1;
                }
            }
        }
        assert!(
            files >= 40 && checked > 10_000,
            "{files} files, {checked} rules"
        );
    }

    /// The Calico dump of the corpus as our desired state (each rule of a `cali-` chain and each
    /// hook by its own id and body): nothing is marked; each rule with its target swapped in
    /// the save is marked, alone, in its chain; a hook edited is marked in its kernel chain.
    #[test]
    fn the_calico_dump_verifies_and_each_edit_in_place_is_marked() {
        let path = felixrs_test_support::iptables_corpus_dir()
            .join("002-calico-felix-cali-raw-nat-mangle-filter.kernel.txt");
        let save = std::fs::read_to_string(path).unwrap();
        let parsed = parse_save(&save).unwrap();
        let mut desired = DesiredState::new(IpVersion::V4);
        for table in parsed.tables() {
            let t = desired.tables.entry(table.name).or_default();
            for line in &table.lines {
                let TableLine::Rule(r) = line else { continue };
                let Some(id) = r
                    .first_comment()
                    .and_then(|c| c.strip_prefix(HASH_COMMENT_PREFIX))
                else {
                    continue;
                };
                let mut body = r.clone();
                let at = body
                    .matches
                    .iter()
                    .position(|m| matches!(m, Match::Comment(_)));
                body.matches.remove(at.unwrap());
                let d = DesiredRule::from_rule(id, &body);
                let chain = r.chain.as_str();
                if is_our_chain(chain) {
                    t.chains.entry(chain.to_string()).or_default().push(d);
                } else {
                    t.hooks.push(HookRule {
                        kernel_chain: chain.to_string(),
                        rule: d,
                        position: HookPosition::Top,
                    });
                }
            }
        }
        let mut tables = read_tables(&save);
        assert_eq!(
            verify_bodies(&save, &desired, &mut tables),
            Vec::<String>::new()
        );
        assert_eq!(tables, read_tables(&save), "nothing marked");
        let lines: Vec<&str> = save.lines().collect();
        let mut edits = 0;
        for (n, line) in lines.iter().enumerate() {
            if !line.contains("\"cali:")
                || !line.ends_with(" -j ACCEPT") && !line.ends_with(" -j DROP")
            {
                continue;
            }
            let flipped = match line.strip_suffix(" -j ACCEPT") {
                Some(head) => format!("{head} -j DROP"),
                None => format!("{} -j ACCEPT", line.strip_suffix(" -j DROP").unwrap()),
            };
            let mut edited = lines.clone();
            edited[n] = &flipped;
            let edited = edited.join("\n") + "\n";
            let table = lines[..n]
                .iter()
                .rev()
                .find_map(|l| l.strip_prefix('*'))
                .unwrap();
            let chain = line.split(' ').nth(1).unwrap();
            let mut tables = read_tables(&edited);
            let marked = verify_bodies(&edited, &desired, &mut tables);
            assert_eq!(marked, vec![format!("{table}/{chain}")], "{flipped}");
            let ids: usize = (tables.values().flat_map(|t| t.chains.values()).flatten())
                .filter(|r| r.hash.as_deref().is_some_and(|h| h.ends_with(EDITED)))
                .count();
            assert_eq!(ids, 1, "{flipped}");
            edits += 1;
        }
        assert!(edits >= 10, "{edits}");
    }
}
