//! Dispatch chains `cali-from-wl-dispatch` / `cali-to-wl-dispatch` (felix-reference §2.3, `dispatch.go`).
//!
//! Invariants: every known interface reaches its endpoint chain by `--goto` (so a verdict returns
//! straight to cali-FORWARD / cali-wl-to-host); every chain of the tree ends with
//! "Unknown interface" DROP, so an interface the renderer does not know (a new pod) is dropped.
//! The tree is Felix's (binned by the character after the names' common prefix) while every bin
//! holds at most [`MAX_LEAF`] names; bigger bins are split again, so the depth grows as
//! O(log n) (see [`dispatch_chains`]).

use std::collections::BTreeMap;

use super::build::{Match, Rule, Target};
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
    let root = root_chain(from_wl);
    let base = common_prefix(ifaces).len();
    let mut chains = Vec::new();
    let root_rules = node_rules(root, base, ifaces, base, from_wl, &mut chains);
    chains.insert(0, (root.to_string(), root_rules));
    chains
}

fn root_chain(from_wl: bool) -> &'static str {
    if from_wl {
        FROM_WL_DISPATCH
    } else {
        TO_WL_DISPATCH
    }
}

/// `names` binned by their first `depth + 1` characters (in order).
fn bins<'a>(names: &[&'a str], depth: usize) -> BTreeMap<&'a str, Vec<&'a str>> {
    let mut bins: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for name in names {
        bins.entry(&name[..(depth + 1).min(name.len())])
            .or_default()
            .push(name);
    }
    bins
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
    let mut rules: Vec<Rule> = bins(members, depth)
        .into_iter()
        .map(|(key, members)| bin_rule(root, base, key, &members, from_wl, out))
        .collect();
    rules.extend(end_rules());
    rules
}

/// The rule of a chain for its bin `key` (the names `members`, sorted): a goto to the endpoint
/// chain for a single name, else a `<key>+` goto to the child chain, whose rules (and its own
/// children's) go to `out`.
fn bin_rule(
    root: &str,
    base: usize,
    key: &str,
    members: &[&str],
    from_wl: bool,
    out: &mut Vec<(String, Vec<Rule>)>,
) -> Rule {
    let goto = |name: &str| {
        Rule::new(
            vec![iface_match(from_wl, name.to_string())],
            Target::Goto(names::endpoint_chain_name(name, !from_wl)),
        )
    };
    if let [only] = members {
        return goto(only);
    }
    // Several names share `key` (one character longer than their parent's common prefix, or
    // they would be equal); the part after the tree's common prefix names the child chain.
    let child = format!("{root}-{}", &key[base..]);
    let next_depth = common_prefix(members).len();
    let room = root.len() + 1 + (next_depth + 1 - base) <= names::MAX_CHAIN_NAME_LEN;
    let child_rules = if members.len() > MAX_LEAF && room {
        node_rules(root, base, members, next_depth, from_wl, out)
    } else {
        let mut leaf: Vec<Rule> = members.iter().map(|m| goto(m)).collect();
        leaf.extend(end_rules());
        leaf
    };
    out.push((child.clone(), child_rules));
    Rule::new(
        vec![iface_match(from_wl, format!("{key}+"))],
        Target::Goto(child),
    )
}

/// Felix's one-level prefix tree (`buildSingleDispatchChainTree`) rooted at `root` over `names`
/// (sorted, unique): the names are binned by the character after their common prefix; a bin of
/// one name is a rule in the root, a bin of several a `<key>+` goto to the child `<root>-<char>`,
/// which holds one rule per name and a copy of `end`; the root ends with `end` too. `matches`
/// builds the interface match of a name (or `<key>+` wildcard), `target` the action for a name.
/// The host endpoint dispatch chains use it (few names: no further splitting).
pub fn felix_tree(
    root: &str,
    names: &[&str],
    matches: impl Fn(String) -> Match,
    target: impl Fn(&str) -> Target,
    end: &[Rule],
) -> Vec<(String, Vec<Rule>)> {
    let base = common_prefix(names).len();
    let rule = |name: &str| Rule::new(vec![matches(name.to_string())], target(name));
    let mut chains = Vec::new();
    let mut root_rules = Vec::new();
    for (key, members) in bins(names, base) {
        if let [only] = members.as_slice() {
            root_rules.push(rule(only));
            continue;
        }
        let child = format!("{root}-{}", &key[base..]);
        let mut rules: Vec<Rule> = members.iter().map(|m| rule(m)).collect();
        rules.extend_from_slice(end);
        root_rules.push(Rule::new(
            vec![matches(format!("{key}+"))],
            Target::Goto(child.clone()),
        ));
        chains.push((child, rules));
    }
    root_rules.extend_from_slice(end);
    chains.insert(0, (root.to_string(), root_rules));
    chains
}

/// One direction's dispatch tree kept between renders. The root's bins (the names sharing the
/// character after the tree's common prefix) are re-rendered only when their names change, so
/// adding or removing a pod re-renders the root (one rule per bin) and that pod's bin, not the
/// whole tree. Always equal to [`dispatch_chains`] of the same names (proptest below).
#[derive(Debug)]
pub struct DispatchTree {
    from_wl: bool,
    /// The common prefix the bins were built under (`None`: nothing built yet).
    base: Option<String>,
    bins: BTreeMap<String, Bin>,
}

#[derive(Debug)]
struct Bin {
    members: Vec<String>,
    /// The root's rule for the bin.
    rule: Rule,
    /// The names of the bin's own chains (its child and the child's descendants; none for a
    /// single name).
    chains: Vec<String>,
}

/// What [`DispatchTree::update`] changed: the chains to (re)write and the chains gone.
#[derive(Debug, Default)]
pub struct DispatchUpdate {
    pub set: Vec<(String, Vec<Rule>)>,
    pub removed: Vec<String>,
}

impl DispatchTree {
    pub fn new(from_wl: bool) -> Self {
        DispatchTree {
            from_wl,
            base: None,
            bins: BTreeMap::new(),
        }
    }

    /// Brings the tree to `ifaces` (sorted, deduplicated, validated names).
    pub fn update(&mut self, ifaces: &[&str]) -> DispatchUpdate {
        let root = root_chain(self.from_wl);
        let mut update = DispatchUpdate::default();
        let prefix = common_prefix(ifaces);
        if self.base.as_deref() != Some(prefix) {
            // Every bin's key and child name depend on the common prefix: build all again.
            for (_, bin) in std::mem::take(&mut self.bins) {
                update.removed.extend(bin.chains);
            }
            self.base = Some(prefix.to_string());
        }
        let base = prefix.len();
        let bins = bins(ifaces, base);
        self.bins.retain(|key, bin| {
            let keep = bins.contains_key(key.as_str());
            if !keep {
                update.removed.append(&mut bin.chains);
            }
            keep
        });
        for (key, members) in bins {
            let same = (self.bins.get(key)).is_some_and(|b| {
                b.members
                    .iter()
                    .map(String::as_str)
                    .eq(members.iter().copied())
            });
            if same {
                continue;
            }
            let mut chains = Vec::new();
            let rule = bin_rule(root, base, key, &members, self.from_wl, &mut chains);
            let bin = Bin {
                members: members.iter().map(|m| m.to_string()).collect(),
                rule,
                chains: chains.iter().map(|(n, _)| n.clone()).collect(),
            };
            if let Some(old) = self.bins.insert(key.to_string(), bin) {
                update.removed.extend(old.chains);
            }
            update.set.extend(chains);
        }
        let mut rules: Vec<Rule> = self.bins.values().map(|b| b.rule.clone()).collect();
        rules.extend(end_rules());
        update.set.push((root.to_string(), rules));
        // A chain of an old bin that a new bin renders again is rewritten, not removed.
        let set: std::collections::HashSet<&str> =
            update.set.iter().map(|(n, _)| n.as_str()).collect();
        update.removed.retain(|n| !set.contains(n.as_str()));
        update.removed.sort();
        update.removed.dedup();
        update
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn from_scratch(ifaces: &[&str]) -> BTreeMap<String, Vec<Rule>> {
        let mut all = dispatch_chains(ifaces, true);
        all.extend(dispatch_chains(ifaces, false));
        all.into_iter().collect()
    }

    proptest! {
        /// Applying each update to the chains kept so far gives exactly the tree built from
        /// scratch, after any sequence of interface sets; an unchanged set updates only the root.
        #[test]
        fn incremental_tree_equals_the_tree_from_scratch(
            steps in prop::collection::vec(
                prop::collection::btree_set(
                    prop::sample::select(vec![
                        "cali0a", "cali0b", "cali0c", "cali1", "cali1a", "cali1b", "cali2",
                        "caliab", "calia", "tap0", "tap1", "cali0a0", "cali0a1", "cali0a2",
                    ]).prop_flat_map(|p| (Just(p), 0u8..40)),
                    0..60,
                ),
                1..8,
            ),
        ) {
            let mut trees = [DispatchTree::new(true), DispatchTree::new(false)];
            let mut kept: BTreeMap<String, Vec<Rule>> = BTreeMap::new();
            for step in &steps {
                let names: std::collections::BTreeSet<String> =
                    step.iter().map(|(p, n)| format!("{p}{n}")).collect();
                let ifaces: Vec<&str> = names.iter().map(String::as_str).collect();
                for tree in &mut trees {
                    let u = tree.update(&ifaces);
                    for name in u.removed {
                        prop_assert!(kept.remove(&name).is_some(), "removed {} not kept", name);
                    }
                    kept.extend(u.set);
                }
                prop_assert_eq!(&kept, &from_scratch(&ifaces));
                // Nothing changed: only the two roots are written again.
                for tree in &mut trees {
                    let u = tree.update(&ifaces);
                    prop_assert!(u.removed.is_empty());
                    prop_assert_eq!(u.set.len(), 1);
                }
            }
        }
    }

    #[test]
    fn adding_a_pod_re_renders_only_its_bin() {
        // 1,000 pods named as Calico names them (a hash after `cali`): 16 root bins.
        let names: Vec<String> = (0..1000u64)
            .map(|i| format!("cali{:011x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20))
            .collect();
        let mut ifaces: Vec<&str> = names.iter().map(String::as_str).collect();
        ifaces.sort();
        let mut tree = DispatchTree::new(true);
        let all = tree.update(&ifaces).set.len();
        let mut more = ifaces.clone();
        more.push("cali7777777777z");
        more.sort();
        let u = tree.update(&more);
        assert!(u.removed.is_empty(), "{:?}", u.removed);
        // The root and the chains of the new name's bin (`cali7`), nothing of the 15 others.
        assert!(
            u.set
                .iter()
                .all(|(n, _)| n == FROM_WL_DISPATCH || n.starts_with("cali-from-wl-dispatch-7")),
            "{:?}",
            u.set.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
        assert!(u.set.len() * 8 < all, "{} of {all}", u.set.len());
        let mut kept: BTreeMap<String, Vec<Rule>> =
            dispatch_chains(&ifaces, true).into_iter().collect();
        kept.extend(u.set);
        assert_eq!(kept, dispatch_chains(&more, true).into_iter().collect());
    }
}
