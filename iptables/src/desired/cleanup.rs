//! Cleanup planning: what removes everything of ours from one table, decided exactly as an apply
//! decides ownership, by planning the table against an empty desired state ([`plan_table`] with
//! `None`). The applier's `cleanup` reads the kernel and writes these plans.

use super::diff::{Op, plan_table, render};
use super::{DesiredError, TableName};
use crate::model::is_our_chain;
use crate::parse::ActualTable;

/// The removal of everything of ours from one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRemoval {
    /// Our chains that will be deleted.
    pub chains: Vec<String>,
    /// Our chains a foreign rule jumps to: flushed, not deleted.
    pub kept: Vec<String>,
    /// How many hook rules of ours (in built-in chains) will be deleted.
    pub hook_rules: usize,
    /// The planned operations, and their `iptables-restore --noflush` payload.
    pub ops: Vec<Op>,
    pub payload: String,
}

/// Plans the removal of everything of ours from `actual`; `None` when there is nothing of ours.
/// Planning towards "nothing desired" validates nothing we could get wrong: every op removes an
/// existing rule or chain of ours.
pub fn plan_removal(
    table: TableName,
    actual: &ActualTable,
) -> Result<Option<TableRemoval>, DesiredError> {
    let ops = plan_table(table, None, actual)?;
    if ops.is_empty() {
        return Ok(None);
    }
    let chains: Vec<String> = ops
        .iter()
        .filter_map(|op| match op {
            Op::DeleteChain(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    let kept = actual
        .our_chains()
        .map(|(c, _)| c)
        .filter(|c| !chains.contains(c))
        .cloned()
        .collect();
    let hook_rules = ops
        .iter()
        .filter(|op| matches!(op, Op::DeleteSpec { chain, .. } if !is_our_chain(chain)))
        .count();
    Ok(Some(TableRemoval {
        chains,
        kept,
        hook_rules,
        payload: render(table, &ops),
        ops,
    }))
}
