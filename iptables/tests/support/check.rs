//! Reading the kernel back in tests: saves, per-chain hash lists, and a full in-sync check.

#![allow(dead_code)]

use iptables::apply::Mode;
use iptables::desired::{DesiredState, HookPosition, IpVersion};

use felixrs_test_support::netns::Netns;

/// `iptables-<backend>-save -t <table>` inside the namespace.
pub fn save(ns: &Netns, mode: Mode, table: &str) -> String {
    save_family(ns, mode, IpVersion::V4, table)
}

/// `ip[6]tables-<backend>-save -t <table>` inside the namespace.
pub fn save_family(ns: &Netns, mode: Mode, family: IpVersion, table: &str) -> String {
    ns.ok(&mode.save_program(family), &["-t", table])
}

/// The `-A <chain> …` lines of a save, in order, without the `-A <chain> ` prefix.
pub fn rules_of(save: &str, chain: &str) -> Vec<String> {
    let prefix = format!("-A {chain} ");
    save.lines()
        .filter_map(|l| {
            l.strip_prefix(&prefix)
                .map(str::to_string)
                .or_else(|| (l == format!("-A {chain}")).then(String::new))
        })
        .collect()
}

/// The first-comment `cali:` hash of each rule of a chain (`None` for rules that are not ours).
pub fn hashes_of(save: &str, chain: &str) -> Vec<Option<String>> {
    rules_of(save, chain)
        .iter()
        .map(|spec| {
            let rest = spec.split("--comment ").nth(1)?;
            let rest = rest.trim_start_matches('"');
            let h = rest.strip_prefix("cali:")?;
            Some(h.chars().take(16).collect())
        })
        .collect()
}

/// Foreign lines of a save: declarations of chains that are not ours and rules in them that do
/// not carry a `cali:` comment, byte for byte, in order.
pub fn foreign_lines(save: &str) -> Vec<String> {
    save.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| !l.starts_with(":cali-") && !l.starts_with("-A cali-"))
        .filter(|l| !l.contains("\"cali:"))
        // Built-in chain counters move with traffic; compare the declaration without them.
        .map(|l| match l.find(" [") {
            Some(i) if l.starts_with(':') => l[..i].to_string(),
            _ => l.to_string(),
        })
        .collect()
}

/// Asserts that every desired chain holds exactly its hashes in order, every hook is at the top
/// (or bottom) of its kernel chain, and no other chain of ours exists.
pub fn assert_in_sync(ns: &Netns, mode: Mode, desired: &DesiredState) {
    for (table, t) in &desired.tables {
        let save = save_family(ns, mode, desired.family, table.as_str());
        for (chain, rules) in &t.chains {
            let want: Vec<Option<String>> = rules.iter().map(|r| Some(r.hash.clone())).collect();
            assert_eq!(
                hashes_of(&save, chain),
                want,
                "chain {chain} in {table}:\n{save}"
            );
        }
        let ours: Vec<&str> = save
            .lines()
            .filter_map(|l| l.strip_prefix(":cali-"))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        assert_eq!(
            ours.len(),
            t.chains.len(),
            "our chains in {table}: {ours:?}"
        );
        let kernel_chains: std::collections::BTreeSet<&str> =
            t.hooks.iter().map(|h| h.kernel_chain.as_str()).collect();
        for kc in kernel_chains {
            let got = hashes_of(&save, kc);
            let top: Vec<Option<String>> = t
                .hooks
                .iter()
                .filter(|h| h.kernel_chain == kc && h.position == HookPosition::Top)
                .map(|h| Some(h.rule.hash.clone()))
                .collect();
            let bottom: Vec<Option<String>> = t
                .hooks
                .iter()
                .filter(|h| h.kernel_chain == kc && h.position == HookPosition::Append)
                .map(|h| Some(h.rule.hash.clone()))
                .collect();
            assert_eq!(got[..top.len()], top[..], "top of {kc} in {table}:\n{save}");
            assert_eq!(
                got[got.len() - bottom.len()..],
                bottom[..],
                "bottom of {kc}:\n{save}"
            );
            let ours = got.iter().filter(|h| h.is_some()).count();
            assert_eq!(ours, top.len() + bottom.len(), "our rules in {kc}:\n{save}");
        }
    }
}

/// Names of the IP sets in the namespace.
pub fn set_names(ns: &Netns) -> Vec<String> {
    ns.ok("ipset", &["list", "-n"])
        .lines()
        .map(str::to_string)
        .collect()
}

/// Members of a set as `ipset save` prints them.
pub fn set_members(ns: &Netns, set: &str) -> Vec<String> {
    let mut m: Vec<String> = ns
        .ok("ipset", &["save", set])
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("add {set} ")).map(str::to_string))
        .collect();
    m.sort();
    m
}

/// `ipset list -t <set>` header value (`Type`, `References`, `Header`).
pub fn set_header(ns: &Netns, set: &str, field: &str) -> String {
    ns.ok("ipset", &["list", "-t", set])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}: ")).map(str::to_string))
        .unwrap_or_default()
}
