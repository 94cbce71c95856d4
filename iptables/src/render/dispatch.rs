//! Dispatch chains `cali-from-wl-dispatch` / `cali-to-wl-dispatch` (§2.3, `dispatch.go`).
//!
//! Invariants: every known interface reaches its endpoint chain by `--goto` (so a verdict returns
//! straight to cali-FORWARD / cali-wl-to-host); every chain of the tree ends with
//! "Unknown interface" DROP, so an interface the renderer does not know (a new pod) is dropped.
//! The tree is Felix's (binned by the character after the names' common prefix) while every bin
//! holds at most [`MAX_LEAF`] names; bigger bins are split again, so the depth grows as
//! O(log n) (see [`dispatch_chains`]).

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

/// A chain of the tree holding more interfaces than this is split again, on the next character
/// of their names (as long as the child's name fits [`names::MAX_CHAIN_NAME_LEN`]).
pub const MAX_LEAF: usize = 16;

/// Builds the dispatch tree for `ifaces` (sorted, deduplicated, validated names). `from_wl` picks
/// `cali-from-wl-dispatch` (match `--in-interface`, goto `cali-fw-`) or the to-direction.
///
/// As Felix, the root bins the names by the character after their common prefix: a bin of one
/// name is a goto in the root, a bin of several a `--in-interface <key>+` goto to the child
/// `<root>-<key after the common prefix>`. Unlike Felix, a child with more than [`MAX_LEAF`]
/// names is binned again on its names' next character after their own common prefix, so a
/// packet crosses O(log n) chains of O(alphabet + [`MAX_LEAF`]) rules each instead of one chain
/// of O(n / alphabet) rules; with at most [`MAX_LEAF`] names per bin the tree is exactly
/// Felix's. A chain's rules depend only on the names under it, so adding or removing an
/// interface changes only the chains on its path (and the renderer writes only chains whose
/// rules changed).
pub fn dispatch_chains(ifaces: &[&str], from_wl: bool) -> Vec<(String, Vec<Rule>)> {
    let root = if from_wl {
        FROM_WL_DISPATCH
    } else {
        TO_WL_DISPATCH
    };
    let base = common_prefix(ifaces).len();
    let mut chains = Vec::new();
    let root_rules = node_rules(root, base, ifaces, base, from_wl, &mut chains);
    chains.insert(0, (root.to_string(), root_rules));
    chains
}

/// The rules of a chain of the tree holding `members`, which share their first `depth`
/// characters (`base` of them are the whole tree's common prefix); its children go to `out`.
fn node_rules(
    root: &str,
    base: usize,
    members: &[&str],
    depth: usize,
    from_wl: bool,
    out: &mut Vec<(String, Vec<Rule>)>,
) -> Vec<Rule> {
    let goto = |name: &str| {
        Rule::new(
            vec![iface_match(from_wl, name.to_string())],
            Target::Goto(names::endpoint_chain_name(name, !from_wl)),
        )
    };
    let mut bins: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for name in members {
        let key = &name[..(depth + 1).min(name.len())];
        bins.entry(key).or_default().push(name);
    }
    let mut rules = Vec::new();
    for (key, members) in bins {
        if members.len() == 1 {
            rules.push(goto(members[0]));
            continue;
        }
        // Several names share `key` (one character longer than `depth`, or they would be
        // equal); the part after the tree's common prefix names the child chain.
        let child = format!("{root}-{}", &key[base..]);
        rules.push(Rule::new(
            vec![iface_match(from_wl, format!("{key}+"))],
            Target::Goto(child.clone()),
        ));
        let next_depth = common_prefix(&members).len();
        let room = root.len() + 1 + (next_depth + 1 - base) <= names::MAX_CHAIN_NAME_LEN;
        let child_rules = if members.len() > MAX_LEAF && room {
            node_rules(root, base, &members, next_depth, from_wl, out)
        } else {
            let mut leaf: Vec<Rule> = members.into_iter().map(goto).collect();
            leaf.extend(end_rules());
            leaf
        };
        out.push((child, child_rules));
    }
    rules.extend(end_rules());
    rules
}
