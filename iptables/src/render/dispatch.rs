//! Dispatch chains `cali-from-wl-dispatch` / `cali-to-wl-dispatch` (§2.3, `dispatch.go`).
//!
//! Invariants: every known interface reaches its endpoint chain by `--goto` (so a verdict returns
//! straight to cali-FORWARD / cali-wl-to-host); every chain of the tree ends with
//! "Unknown interface" DROP, so an interface the renderer does not know (a new pod) is dropped.
//! The tree is one level deep, binned by the character after the names' common prefix.

use std::collections::BTreeMap;

use super::ir::{Match, Rule, Target};
use super::names;

pub const FROM_WL_DISPATCH: &str = "cali-from-wl-dispatch";
pub const TO_WL_DISPATCH: &str = "cali-to-wl-dispatch";

fn end_rules() -> Vec<Rule> {
    vec![Rule::new(vec![], Target::Drop).with_comment("Unknown interface")]
}

fn iface_match(from_wl: bool, iface: String) -> Match {
    if from_wl {
        Match::InIface(iface)
    } else {
        Match::OutIface(iface)
    }
}

fn common_prefix<'a>(names: &[&'a str]) -> &'a str {
    let Some(first) = names.first() else {
        return "";
    };
    let mut len = first.len();
    for n in &names[1..] {
        len = first
            .bytes()
            .zip(n.bytes())
            .take(len)
            .take_while(|(a, b)| a == b)
            .count();
    }
    &first[..len]
}

/// Builds the dispatch tree for `ifaces` (sorted, deduplicated, validated names). `from_wl` picks
/// `cali-from-wl-dispatch` (match `--in-interface`, goto `cali-fw-`) or the to-direction.
pub fn dispatch_chains(ifaces: &[&str], from_wl: bool) -> Vec<(String, Vec<Rule>)> {
    let root = if from_wl {
        FROM_WL_DISPATCH
    } else {
        TO_WL_DISPATCH
    };
    let prefix = common_prefix(ifaces);
    let mut bins: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for name in ifaces {
        let key = &name[..(prefix.len() + 1).min(name.len())];
        bins.entry(key).or_default().push(name);
    }
    let goto = |name: &str| {
        Rule::new(
            vec![iface_match(from_wl, name.to_string())],
            Target::Goto(names::endpoint_chain_name(name, !from_wl)),
        )
    };
    let mut root_rules = Vec::new();
    let mut chains = Vec::new();
    for (key, members) in bins {
        if members.len() == 1 {
            root_rules.push(goto(members[0]));
            continue;
        }
        // Several names share `key`, which is longer than the common prefix; its last
        // character names the child chain.
        let last = &key[key.len() - 1..];
        let child = format!("{root}-{last}");
        root_rules.push(Rule::new(
            vec![iface_match(from_wl, format!("{key}+"))],
            Target::Goto(child.clone()),
        ));
        let mut rules: Vec<Rule> = members.into_iter().map(goto).collect();
        rules.extend(end_rules());
        chains.push((child, rules));
    }
    root_rules.extend(end_rules());
    chains.insert(0, (root.to_string(), root_rules));
    chains
}
