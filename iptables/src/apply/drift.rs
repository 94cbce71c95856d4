//! Fast drift detection: everything of ours checked every few seconds, cheaply when nothing
//! changed.
//!
//! The periodic full refresh (re-read everything, repair) stays the backstop; between two, each
//! check asks the backend's change signal ([`super::signal`]) whether the tables changed since
//! the last look or our last write: the nft generation id; legacy's table summaries, and a hash
//! of its save on a slower cadence (the only signal where the programs run in another
//! namespace). Only
//! when it moved are the tables re-read, and every table is planned against the desired state
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
            let mut any = false;
            for (i, (rule, w)) in rules.iter_mut().zip(want).enumerate() {
                if rule.hash.as_deref() == Some(w.hash.as_str())
                    && !(aligned && spec_is(specs[i], w))
                {
                    mark(rule, t, chain, i);
                    any = true;
                }
            }
            if any {
                edited.push(format!("{t}/{chain}"));
            }
        }
        for kernel_chain in t.builtin_chains() {
            let Some(rules) = actual.chains.get_mut(*kernel_chain) else {
                continue;
            };
            let mut any = false;
            for (i, rule) in rules.iter_mut().enumerate() {
                let Some(hook) = (d.hooks.iter())
                    .filter(|h| h.kernel_chain == *kernel_chain)
                    .find(|h| rule.hash.as_deref() == Some(h.rule.hash.as_str()))
                else {
                    continue;
                };
                if !spec_is(&rule.spec, &hook.rule) {
                    mark(rule, t, kernel_chain, i);
                    any = true;
                }
            }
            if any {
                edited.push(format!("{t}/{kernel_chain}"));
            }
        }
    }
    edited
}

fn mark(rule: &mut ActualRule, table: &TableName, chain: &str, index: usize) {
    if let Some(id) = rule.hash.as_mut() {
        tracing::warn!(%table, %chain, rule = index + 1, %id, "drift: a rule of ours holds another body than its id stands for");
        id.push_str(EDITED);
    }
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
