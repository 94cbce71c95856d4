//! [`Changes`]: the names of what changed in a [`DesiredState`](super::DesiredState) since an
//! applier last applied it, so that [`Applier::apply_changes`](super::Applier::apply_changes)
//! plans only those chains and sets. Generic over tables and set kinds: a chain is named by its
//! table, a set by its kernel name.

use std::collections::{BTreeMap, BTreeSet};

use super::TableName;

/// Chains and sets that changed (content, appearance or removal) since the previous apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Per table, the chains whose rules changed, that appeared or that went away.
    pub chains: BTreeMap<TableName, BTreeSet<String>>,
    /// The sets whose content changed, that appeared or that went away.
    pub sets: BTreeSet<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.chains.values().all(BTreeSet::is_empty) && self.sets.is_empty()
    }

    /// Records a changed chain.
    pub fn chain(&mut self, table: TableName, name: impl Into<String>) {
        self.chains.entry(table).or_default().insert(name.into());
    }

    /// Records a changed set.
    pub fn set(&mut self, name: impl Into<String>) {
        self.sets.insert(name.into());
    }

    /// Adds everything `other` names.
    pub fn merge(&mut self, other: Changes) {
        for (table, names) in other.chains {
            self.chains.entry(table).or_default().extend(names);
        }
        self.sets.extend(other.sets);
    }
}
