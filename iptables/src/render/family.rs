//! Per-family chain store: rendered chains, the applier's [`DesiredState`] kept up to date
//! incrementally (so handing it to the applier costs nothing), reference counts of IP sets, and
//! the change log that [`super::Renderer::take_delta`] drains.
//!
//! Invariants: `state.tables[t].chains` has exactly the keys of `chains` (with the hashed,
//! kernel-form rules); `set_refs[name]` is the number of stored chains whose rules name set
//! `name` (a rule naming it twice counts twice), and `net_sets` holds the members of exactly the
//! referenced net sets; a set (or chain) whose presence or content changed is in `changed_sets` (`changed`)
//! until drained, and in `sets_dirty` until the renderer refreshes `state.ip_sets`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use calc_graph::proto::IpVersion;
use ipnet::IpNet;

use super::build::Rule;
use super::hash::rule_hashes;
use crate::desired::{DesiredRule, DesiredState, HookPosition, HookRule, IpSetSpec, TableName};

/// An IP set that changed in a family: its new content, or `None` when it is no longer wanted.
pub type SetChange = (String, Option<IpSetSpec>);

/// What changed in one family since the previous [`super::Renderer::take_delta`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub family: IpVersion,
    /// `(table, chain, new rules or None when deleted)`.
    pub chains: Vec<(TableName, String, Option<Vec<DesiredRule>>)>,
    pub ip_sets: Vec<SetChange>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.ip_sets.is_empty()
    }

    /// Total number of rules in the changed chains.
    pub fn rule_count(&self) -> usize {
        self.chains
            .iter()
            .filter_map(|(_, _, r)| r.as_ref())
            .map(Vec::len)
            .sum()
    }
}

pub(super) struct Family {
    pub(super) version: IpVersion,
    /// The renderer's rules per chain (the hashed kernel form lives in `state`).
    pub(super) chains: BTreeMap<(TableName, String), Vec<Rule>>,
    pub(super) state: DesiredState,
    pub(super) changed: BTreeSet<(TableName, String)>,
    pub(super) set_refs: HashMap<String, usize>,
    /// The members of the net sets ([`super::build::Match::NetSet`]) named by stored chains, by kernel name:
    /// recorded with the first reference, forgotten with the last (content-addressed, so a
    /// name's members never change).
    pub(super) net_sets: HashMap<String, Arc<[IpNet]>>,
    pub(super) changed_sets: BTreeSet<String>,
    pub(super) sets_dirty: BTreeSet<String>,
}

/// The IP sets the rules name, once per match.
fn set_names(rules: &[Rule]) -> impl Iterator<Item = &str> {
    rules
        .iter()
        .flat_map(|r| &r.matches)
        .filter_map(|m| m.set_name())
}

/// The members of the net sets the rules name.
fn net_set_members(rules: &[Rule]) -> impl Iterator<Item = &(String, Arc<[IpNet]>)> {
    rules.iter().flat_map(|r| r.net_sets())
}

impl Family {
    pub(super) fn new(version: IpVersion) -> Self {
        Family {
            version,
            chains: BTreeMap::new(),
            state: DesiredState::new(version),
            changed: BTreeSet::new(),
            set_refs: HashMap::new(),
            net_sets: HashMap::new(),
            changed_sets: BTreeSet::new(),
            sets_dirty: BTreeSet::new(),
        }
    }

    pub(super) fn set_chain(&mut self, table: TableName, name: String, rules: Vec<Rule>) {
        let key = (table, name);
        if self.chains.get(&key).is_some_and(|c| *c == rules) {
            return;
        }
        let hashes = rule_hashes(&key.1, rules.iter().map(Rule::felix_text));
        let desired = desired_rules(hashes, &rules);
        for (s, nets) in net_set_members(&rules) {
            if !self.set_refs.contains_key(s) {
                self.net_sets.insert(s.clone(), nets.clone());
            }
        }
        for s in set_names(&rules) {
            let n = self.set_refs.entry(s.to_string()).or_default();
            *n += 1;
            if *n == 1 {
                self.set_changed(s);
            }
        }
        self.state
            .tables
            .entry(table)
            .or_default()
            .chains
            .insert(key.1.clone(), desired);
        if let Some(old) = self.chains.insert(key.clone(), rules) {
            self.unref_sets(&old);
        }
        self.changed.insert(key);
    }

    /// [`Self::set_chain`] from borrowed rules, copied only when they differ from the stored ones.
    pub(super) fn set_chain_if_changed(&mut self, table: TableName, name: &str, rules: &[Rule]) {
        let key = (table, name.to_string());
        if self.chains.get(&key).is_none_or(|r| r.as_slice() != rules) {
            self.set_chain(table, key.1, rules.to_vec());
        }
    }

    pub(super) fn remove_chain(&mut self, table: TableName, name: &str) {
        let key = (table, name.to_string());
        if let Some(old) = self.chains.remove(&key) {
            if let Some(t) = self.state.tables.get_mut(&table) {
                t.chains.remove(name);
            }
            self.unref_sets(&old);
            self.changed.insert(key);
        }
    }

    /// Records that set `name` changed (content or presence) in this family.
    pub(super) fn set_changed(&mut self, name: &str) {
        self.changed_sets.insert(name.to_string());
        self.sets_dirty.insert(name.to_string());
    }

    fn unref_sets(&mut self, rules: &[Rule]) {
        for s in set_names(rules) {
            if let Some(n) = self.set_refs.get_mut(s) {
                *n -= 1;
                if *n == 0 {
                    self.set_refs.remove(s);
                    self.net_sets.remove(s);
                    self.set_changed(s);
                }
            }
        }
    }

    /// Adds hook rules to the state (done once, at construction).
    pub(super) fn add_hooks(&mut self, hooks: Vec<(TableName, HookRule)>) {
        for (table, hook) in hooks {
            self.state.tables.entry(table).or_default().hooks.push(hook);
        }
    }

    /// Replaces the hook rules of `table` (host endpoints add and remove the raw `OUTPUT` and
    /// mangle `PREROUTING` hooks). The applier diffs every table's hooks on every apply, so no
    /// change log entry is needed; they change only with chains of the same table.
    pub(super) fn set_hooks(&mut self, table: TableName, hooks: Vec<(TableName, HookRule)>) {
        let t = self.state.tables.entry(table).or_default();
        t.hooks = hooks.into_iter().map(|(_, h)| h).collect();
    }

    /// Drops `table` from the desired state when it has neither chains nor hooks left (as a
    /// renderer that never had them: the applier then plans the table whole, removing ours).
    pub(super) fn prune_empty(&mut self, table: TableName) {
        if (self.state.tables.get(&table))
            .is_some_and(|t| t.chains.is_empty() && t.hooks.is_empty())
        {
            self.state.tables.remove(&table);
        }
    }

    pub(super) fn has(&self, table: TableName, name: &str) -> bool {
        self.chains.contains_key(&(table, name.to_string()))
    }
}

/// Hashes hook rules Felix's way: inserts per kernel chain over the chain name, appends over
/// `<chain>*appends*`.
pub(super) fn hash_hooks(
    table: TableName,
    hooks: Vec<(&'static str, HookPosition, Rule)>,
) -> Vec<(TableName, HookRule)> {
    let mut out = Vec::new();
    let mut by_chain: BTreeMap<(&str, bool), Vec<&Rule>> = BTreeMap::new();
    for (chain, pos, rule) in &hooks {
        by_chain
            .entry((chain, *pos == HookPosition::Append))
            .or_default()
            .push(rule);
    }
    let mut hashes: HashMap<(&str, bool), std::vec::IntoIter<String>> = HashMap::new();
    for ((chain, append), rules) in &by_chain {
        let hash_chain = if *append {
            format!("{chain}*appends*")
        } else {
            chain.to_string()
        };
        hashes.insert(
            (chain, *append),
            rule_hashes(&hash_chain, rules.iter().map(|r| r.felix_text())).into_iter(),
        );
    }
    for (chain, pos, rule) in hooks {
        let hash = hashes
            .get_mut(&(chain, pos == HookPosition::Append))
            .and_then(Iterator::next)
            .unwrap_or_default();
        out.push((
            table,
            HookRule {
                kernel_chain: chain.to_string(),
                rule: desired_rules(vec![hash], std::slice::from_ref(&rule)).remove(0),
                position: pos,
            },
        ));
    }
    out
}

/// The applier's form of a chain's rules: the hash and the kernel-form body of the model rule.
fn desired_rules(hashes: Vec<String>, rules: &[Rule]) -> Vec<DesiredRule> {
    hashes
        .into_iter()
        .zip(rules)
        .map(|(h, r)| DesiredRule::from_rule(h, r.model()))
        .collect()
}
