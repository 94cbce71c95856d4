//! Pure diff of one table: desired chains and hooks vs. the kernel's view -> the minimal list of
//! restore operations, rendered as one `iptables-restore --noflush` transaction.
//!
//! Invariants (checked by the property test below against [`simulate`], a model of the restore
//! semantics that rejects anything the kernel would reject):
//! * after the ops, every desired chain holds exactly the desired hashes, in order;
//! * rules whose hash is already right at the right position are not rewritten (counters survive);
//! * rules we do not own are never touched: foreign chains are never written, and in kernel chains
//!   only rules whose first comment is `cali:` are deleted, by full spec, never by index;
//! * our hook rules end up at the top (`Top`) / bottom (`Append`) of their kernel chains;
//! * chains no longer desired are flushed first and deleted last, after every reference from our
//!   rules is gone; a chain a foreign rule still jumps to is flushed but kept;
//! * planning again against the result yields no ops (a second apply writes nothing).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::{
    DesiredError, DesiredRule, DesiredTable, HookPosition, TableName, validate_chain_name,
    validate_hook_chain, validate_written_rule,
};
use crate::model::is_our_chain;
use crate::parse::{ActualRule, ActualTable};

/// One line of a restore transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `:<chain> - [0:0]`: creates the chain, or flushes it if it exists.
    Declare(String),
    /// `-R <chain> <index> <spec>` (1-based index).
    Replace {
        chain: String,
        index: usize,
        rule: NewRule,
    },
    /// `-A <chain> <spec>`.
    Append { chain: String, rule: NewRule },
    /// `-I <chain> 1 <spec>`.
    Insert { chain: String, rule: NewRule },
    /// `-D <chain> <index>`: only ever used in our own chains.
    DeleteIndex { chain: String, index: usize },
    /// `-D <chain> <spec>`: how our rules in kernel chains are removed.
    DeleteSpec { chain: String, spec: String },
    /// `-X <chain>`.
    DeleteChain(String),
}

/// A rule we are writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRule {
    pub hash: String,
    pub spec: String,
    pub target: Option<String>,
}

impl NewRule {
    pub fn from_desired(r: &DesiredRule) -> Self {
        NewRule {
            hash: r.hash.clone(),
            spec: r.restore_spec(),
            target: r.target().map(str::to_string),
        }
    }

    fn into_actual(self, chain: &str) -> ActualRule {
        ActualRule {
            hash: Some(self.hash),
            spec: if is_our_chain(chain) {
                String::new()
            } else {
                self.spec
            },
            target: self.target,
        }
    }
}

/// Plans the ops that turn `actual` into `desired` (`None`: remove everything of ours from the
/// table). Every desired chain name and hook chain is checked, and every rule that goes into an
/// op (and so into the payload) is validated first.
pub fn plan_table(
    table: TableName,
    desired: Option<&DesiredTable>,
    actual: &ActualTable,
) -> Result<Vec<Op>, DesiredError> {
    plan(table, desired, actual, None)
}

/// [`plan_table`] looking only at `chains` (and at the hook rules, which are few): the same ops
/// as [`plan_table`] whenever every other chain of ours in `actual` already matches `desired`,
/// which holds after an apply for every chain the desired state has not changed since. This is
/// how the applier plans a change in time proportional to the change, not to the table.
pub fn plan_chains(
    table: TableName,
    desired: Option<&DesiredTable>,
    actual: &ActualTable,
    chains: &BTreeSet<String>,
) -> Result<Vec<Op>, DesiredError> {
    plan(table, desired, actual, Some(chains))
}

/// A chain's name and rules.
type Named<'a, R> = (&'a String, &'a Vec<R>);

fn plan(
    table: TableName,
    desired: Option<&DesiredTable>,
    actual: &ActualTable,
    scope: Option<&BTreeSet<String>>,
) -> Result<Vec<Op>, DesiredError> {
    let empty = DesiredTable::default();
    let d = desired.unwrap_or(&empty);
    // The desired chains to write and our chains in the kernel to remove, in name order (as
    // the whole-table plan lists them).
    let (wanted, gone): (Vec<Named<DesiredRule>>, Vec<Named<ActualRule>>) = match scope {
        None => (
            d.chains.iter().collect(),
            actual
                .our_chains()
                .filter(|(name, _)| !d.chains.contains_key(*name))
                .collect(),
        ),
        Some(names) => (
            names
                .iter()
                .filter_map(|n| d.chains.get_key_value(n))
                .collect(),
            names
                .iter()
                .filter(|n| is_our_chain(n) && !d.chains.contains_key(*n))
                .filter_map(|n| actual.chains.get_key_value(n))
                .collect(),
        ),
    };
    for (name, _) in &wanted {
        validate_chain_name(table, name)?;
    }
    for h in &d.hooks {
        validate_hook_chain(table, &h.kernel_chain)?;
    }
    let new_rule = |chain: &str, r: &DesiredRule| -> Result<NewRule, DesiredError> {
        validate_written_rule(table, d, chain, r)?;
        Ok(NewRule::from_desired(r))
    };
    let mut declares = Vec::new();
    let mut updates = Vec::new();
    let mut hooks = Vec::new();
    let mut deletes = Vec::new();

    for (name, rules) in gone {
        if actual.foreign_references(name) {
            // Deleting would fail the whole transaction; flush so nothing of ours runs there.
            if !rules.is_empty() {
                declares.push(Op::Declare(name.clone()));
            }
            continue;
        }
        declares.push(Op::Declare(name.clone()));
        deletes.push(Op::DeleteChain(name.clone()));
    }

    for (name, rules) in wanted {
        let Some(old) = actual.chains.get(name) else {
            declares.push(Op::Declare(name.clone()));
            for r in rules {
                updates.push(Op::Append {
                    chain: name.clone(),
                    rule: new_rule(name, r)?,
                });
            }
            continue;
        };
        for (i, r) in rules.iter().enumerate() {
            match old.get(i) {
                Some(o) if o.hash.as_deref() == Some(r.hash.as_str()) => {}
                Some(_) => updates.push(Op::Replace {
                    chain: name.clone(),
                    index: i + 1,
                    rule: new_rule(name, r)?,
                }),
                None => updates.push(Op::Append {
                    chain: name.clone(),
                    rule: new_rule(name, r)?,
                }),
            }
        }
        for _ in rules.len()..old.len() {
            updates.push(Op::DeleteIndex {
                chain: name.clone(),
                index: rules.len() + 1,
            });
        }
    }

    for kc in table.builtin_chains() {
        let top: Vec<&DesiredRule> = hooks_of(d, kc, HookPosition::Top);
        let bottom: Vec<&DesiredRule> = hooks_of(d, kc, HookPosition::Append);
        let old = actual.chains.get(*kc).map(Vec::as_slice).unwrap_or(&[]);
        if hooks_in_sync(old, &top, &bottom) {
            continue;
        }
        for r in old.iter().filter(|r| r.hash.is_some()) {
            hooks.push(Op::DeleteSpec {
                chain: kc.to_string(),
                spec: r.spec.clone(),
            });
        }
        for r in top.iter().rev() {
            hooks.push(Op::Insert {
                chain: kc.to_string(),
                rule: new_rule(kc, r)?,
            });
        }
        for r in &bottom {
            hooks.push(Op::Append {
                chain: kc.to_string(),
                rule: new_rule(kc, r)?,
            });
        }
    }

    let mut ops = declares;
    ops.extend(updates);
    ops.extend(hooks);
    ops.extend(deletes);
    Ok(ops)
}

fn hooks_of<'a>(d: &'a DesiredTable, chain: &str, pos: HookPosition) -> Vec<&'a DesiredRule> {
    d.hooks
        .iter()
        .filter(|h| h.kernel_chain == chain && h.position == pos)
        .map(|h| &h.rule)
        .collect()
}

/// A kernel chain is in sync when it reads: our `top` hashes, then only foreign rules, then our
/// `bottom` hashes.
fn hooks_in_sync(old: &[ActualRule], top: &[&DesiredRule], bottom: &[&DesiredRule]) -> bool {
    if old.len() < top.len() + bottom.len() {
        return false;
    }
    let head_ok = top
        .iter()
        .zip(old)
        .all(|(d, o)| o.hash.as_deref() == Some(d.hash.as_str()));
    let tail = &old[old.len() - bottom.len()..];
    let tail_ok = bottom
        .iter()
        .zip(tail)
        .all(|(d, o)| o.hash.as_deref() == Some(d.hash.as_str()));
    let middle_ok = old[top.len()..old.len() - bottom.len()]
        .iter()
        .all(|o| o.hash.is_none());
    head_ok && tail_ok && middle_ok
}

/// Renders ops as one transaction (`*table … COMMIT`); no ops -> empty string (nothing to write).
pub fn render(table: TableName, ops: &[Op]) -> String {
    if ops.is_empty() {
        return String::new();
    }
    let mut s = String::with_capacity(ops.len() * 96);
    let _ = writeln!(s, "*{table}");
    for op in ops {
        let _ = match op {
            Op::Declare(c) => writeln!(s, ":{c} - [0:0]"),
            Op::Replace { chain, index, rule } => writeln!(s, "-R {chain} {index} {}", rule.spec),
            Op::Append { chain, rule } => writeln!(s, "-A {chain} {}", rule.spec),
            Op::Insert { chain, rule } => writeln!(s, "-I {chain} 1 {}", rule.spec),
            Op::DeleteIndex { chain, index } => writeln!(s, "-D {chain} {index}"),
            Op::DeleteSpec { chain, spec } => writeln!(s, "-D {chain} {spec}"),
            Op::DeleteChain(c) => writeln!(s, "-X {c}"),
        };
    }
    s.push_str("COMMIT\n");
    s
}

/// An op [`simulate`] refused, as the kernel would: the op (as debug-printed) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {refusal}")]
pub struct SimulateError {
    pub op: String,
    pub refusal: Refusal,
}

impl SimulateError {
    fn new(op: &Op, refusal: Refusal) -> Self {
        SimulateError {
            op: format!("{op:?}"),
            refusal,
        }
    }
}

/// Why the kernel would refuse an op.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("target {0} does not exist")]
    MissingTarget(String),
    #[error("no chain")]
    NoChain,
    #[error("index out of range")]
    IndexOutOfRange,
    #[error("no such rule")]
    NoSuchRule,
    #[error("chain not empty")]
    ChainNotEmpty,
    #[error("chain still referenced")]
    ChainReferenced,
}

/// Applies ops to a model of the table with iptables-restore's semantics, so the applier can keep
/// its view of the kernel current after a successful write without re-reading. Fails (without
/// guaranteeing the model is unchanged) on anything the kernel would refuse: a bad index, a
/// missing chain, deleting a non-empty or still-referenced chain, a jump to a missing `cali-` chain.
pub fn simulate(
    table: TableName,
    actual: &mut ActualTable,
    ops: &[Op],
) -> Result<(), SimulateError> {
    let chain_ok =
        |t: &ActualTable, c: &str| t.chains.contains_key(c) || table.builtin_chains().contains(&c);
    for op in ops {
        if let Op::Replace { rule, .. } | Op::Append { rule, .. } | Op::Insert { rule, .. } = op
            && let Some(target) = &rule.target
            && is_our_chain(target)
            && !actual.chains.contains_key(target)
        {
            return Err(SimulateError::new(
                op,
                Refusal::MissingTarget(target.clone()),
            ));
        }
        match op {
            Op::Declare(c) => actual.chains.entry(c.clone()).or_default().clear(),
            Op::Replace { chain, index, rule } => {
                let rules = actual
                    .chains
                    .get_mut(chain)
                    .ok_or_else(|| SimulateError::new(op, Refusal::NoChain))?;
                let slot = index
                    .checked_sub(1)
                    .and_then(|i| rules.get_mut(i))
                    .ok_or_else(|| SimulateError::new(op, Refusal::IndexOutOfRange))?;
                *slot = rule.clone().into_actual(chain);
            }
            Op::Append { chain, rule } | Op::Insert { chain, rule } => {
                if !chain_ok(actual, chain) {
                    return Err(SimulateError::new(op, Refusal::NoChain));
                }
                let rules = actual.chains.entry(chain.clone()).or_default();
                let r = rule.clone().into_actual(chain);
                if matches!(op, Op::Insert { .. }) {
                    rules.insert(0, r);
                } else {
                    rules.push(r);
                }
            }
            Op::DeleteIndex { chain, index } => {
                let rules = actual
                    .chains
                    .get_mut(chain)
                    .ok_or_else(|| SimulateError::new(op, Refusal::NoChain))?;
                if *index == 0 || *index > rules.len() {
                    return Err(SimulateError::new(op, Refusal::IndexOutOfRange));
                }
                rules.remove(index - 1);
            }
            Op::DeleteSpec { chain, spec } => {
                let rules = actual
                    .chains
                    .get_mut(chain)
                    .ok_or_else(|| SimulateError::new(op, Refusal::NoChain))?;
                let i = rules
                    .iter()
                    .position(|r| &r.spec == spec)
                    .ok_or_else(|| SimulateError::new(op, Refusal::NoSuchRule))?;
                rules.remove(i);
            }
            Op::DeleteChain(c) => {
                match actual.chains.get(c) {
                    None => return Err(SimulateError::new(op, Refusal::NoChain)),
                    Some(r) if !r.is_empty() => {
                        return Err(SimulateError::new(op, Refusal::ChainNotEmpty));
                    }
                    Some(_) => {}
                }
                if actual
                    .chains
                    .values()
                    .flatten()
                    .any(|r| r.target.as_deref() == Some(c))
                {
                    return Err(SimulateError::new(op, Refusal::ChainReferenced));
                }
                actual.chains.remove(c);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;
