//! The kernel view the planner ([`crate::desired::diff`]) compares against: per table, every chain with, per rule, our hash
//! (if the rule's first comment is `cali:<hash>`), its jump/goto target and, outside our own
//! chains, its full spec (so our rules in shared chains can be deleted by spec, never by index).
//!
//! Built from `iptables-save` output by the crate's parser ([`read_tables`](super::read_tables)). Like Felix
//! (felix-reference §6.2) we need only chain names, the first comment and the target of each rule, so
//! this module also has a tolerant line scan ([`scan_save`]) that reads the same three facts:
//! it is the fallback when the parser rejects a dump (a foreign rule using syntax nobody here
//! knows must not stop us from programming policy), and it checks rule bodies we write
//! ([`body_target`]) without allocating. Both readings are proven equal on the whole corpus.

use std::collections::BTreeMap;

use crate::model::{
    CHAIN_PREFIX, Counters, HASH_COMMENT_PREFIX, TableName, is_our_chain, valid_hash,
};

/// One rule as the applier sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActualRule {
    /// Our hash, if the first comment is `cali:<hash>`.
    pub hash: Option<String>,
    /// The rule text after `-A <chain> `; kept only for rules in chains that are not ours
    /// (empty for rules in `cali-` chains, which we address by index).
    pub spec: String,
    /// The chain this rule jumps or goes to, if it is a user chain (`-j X` / `-g X`).
    pub target: Option<String>,
}

/// One table's chains in kernel order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActualTable {
    pub chains: BTreeMap<String, Vec<ActualRule>>,
}

impl ActualTable {
    /// Our chains (`cali-*`).
    pub fn our_chains(&self) -> impl Iterator<Item = (&String, &Vec<ActualRule>)> {
        self.chains
            .range(CHAIN_PREFIX.to_string()..)
            .take_while(|(k, _)| is_our_chain(k))
    }

    /// Whether a rule we do not own (in a chain we do not own) jumps to `chain`.
    pub fn foreign_references(&self, chain: &str) -> bool {
        self.chains.iter().any(|(c, rules)| {
            !is_our_chain(c)
                && rules
                    .iter()
                    .any(|r| r.hash.is_none() && r.target.as_deref() == Some(chain))
        })
    }

    /// Total number of rules.
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(Vec::len).sum()
    }
}

/// Splits `iptables-save` output into tables. Unknown lines (comments, blank) are skipped.
/// Tables appear in the map even when they hold no rules.
pub fn scan_save(text: &str) -> BTreeMap<TableName, ActualTable> {
    let mut out: BTreeMap<TableName, ActualTable> = BTreeMap::new();
    let mut current: Option<TableName> = None;
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(name) = line.strip_prefix('*') {
            current = TableName::ALL.into_iter().find(|t| t.as_str() == name);
            if let Some(t) = current {
                out.entry(t).or_default();
            }
            continue;
        }
        let Some(table) = current.and_then(|t| out.get_mut(&t)) else {
            continue;
        };
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or_default();
            table.chains.entry(name.to_string()).or_default();
        } else if let Some(rest) = strip_counters(line).strip_prefix("-A ") {
            let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
            let rule = scan_rule(chain, spec);
            table
                .chains
                .entry(chain.to_string())
                .or_default()
                .push(rule);
        }
    }
    out
}

fn strip_counters(line: &str) -> &str {
    if line.starts_with('[')
        && let Some(i) = line.find("] ")
    {
        return &line[i + 2..];
    }
    line
}

/// The `[packets:bytes] ` prefix of an `iptables-save -c` line, read, and the rest of the line.
pub(super) fn split_counters(line: &str) -> Option<(Counters, &str)> {
    let (ctr, rest) = line.strip_prefix('[')?.split_once("] ")?;
    let (p, b) = ctr.split_once(':')?;
    let counters = Counters {
        packets: p.parse().ok()?,
        bytes: b.parse().ok()?,
    };
    Some((counters, rest))
}

/// The `cali:` hash of a rule text's first comment, if it is ours; reads no further.
pub(super) fn first_comment_hash(spec: &str) -> Option<&str> {
    let mut tokens = Tokens { rest: spec };
    tokens.find(|t| *t == "--comment")?;
    unquote(tokens.next()?)
        .strip_prefix(HASH_COMMENT_PREFIX)
        .filter(|h| valid_hash(h))
}

/// Reads hash and target of one rule's spec (the text after `-A <chain> `).
pub fn scan_rule(chain: &str, spec: &str) -> ActualRule {
    let (hash, target) = scan_hash_and_target(spec);
    let spec = if is_our_chain(chain) {
        String::new()
    } else {
        spec.to_string()
    };
    ActualRule {
        hash: hash.map(str::to_string),
        spec,
        target: target.map(str::to_string),
    }
}

/// The `cali:` hash of the first comment and the jump/goto target of a rule text, without
/// allocating (this runs for every rule of every apply).
fn scan_hash_and_target(spec: &str) -> (Option<&str>, Option<&str>) {
    let mut hash = None;
    let mut seen_comment = false;
    let mut target = None;
    let mut tokens = Tokens { rest: spec };
    while let Some(tok) = tokens.next() {
        match tok {
            "--comment" => {
                let value = unquote(tokens.next().unwrap_or_default());
                if !seen_comment {
                    seen_comment = true;
                    hash = value
                        .strip_prefix(HASH_COMMENT_PREFIX)
                        .filter(|h| valid_hash(h));
                }
            }
            "-j" | "--jump" | "-g" | "--goto" => {
                target = tokens.next().filter(|t| !is_builtin_target(t));
            }
            _ => {}
        }
    }
    (hash, target)
}

/// Targets that are not chains. Upper-case extension targets (`MARK`, `DNAT`, …) are extensions
/// unless a chain of that name exists; for reference tracking only our `cali-` chains matter, so
/// anything that is not `cali-*` is treated as "not ours" by callers anyway.
fn is_builtin_target(t: &str) -> bool {
    matches!(t, "ACCEPT" | "DROP" | "RETURN" | "QUEUE")
}

/// A token without its surrounding double quotes (escapes are left as they are: the values we
/// look at, hashes and chain names, never contain any).
pub fn unquote(tok: &str) -> &str {
    tok.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(tok)
}

/// Raw tokens of a restore/save line: whitespace-separated, where a `"…"` part (with `\"`
/// escapes, the `xtables_save_string` rules) does not split; quotes are kept in the token.
pub struct Tokens<'a> {
    pub rest: &'a str,
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let s = self.rest.trim_start();
        if s.is_empty() {
            self.rest = s;
            return None;
        }
        let bytes = s.as_bytes();
        let mut in_quotes = false;
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'"' => in_quotes = !in_quotes,
                b'\\' if in_quotes => i += 1,
                b if b.is_ascii_whitespace() && !in_quotes => break,
                _ => {}
            }
            i += 1;
        }
        let end = i.min(s.len());
        self.rest = &s[end..];
        Some(&s[..end])
    }
}

/// The user-chain target of a rule body (`-j X`, `-g X`), for reference checks.
pub fn body_target(body: &str) -> Option<&str> {
    scan_hash_and_target(body).1
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVE: &str = "# Generated by iptables-save v1.8.9 (nf_tables) on Sun Nov 22 04:28:09 2026
*filter
:INPUT ACCEPT [52:5761]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:cali-INPUT - [0:0]
:cali-wl-to-host - [0:0]
-A INPUT -m comment --comment \"cali:Cz_u1IQiXIMmKD4c\" -j cali-INPUT
-A INPUT -j KUBE-FIREWALL
[3:180] -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -m comment --comment \"cali:Cz_u1IQiXIMmKD4c\" -j ACCEPT
-A KUBE-FIREWALL -m comment --comment \"kubernetes firewall for dropping marked packets\" -m mark --mark 0x8000/0x8000 -j DROP
-A cali-INPUT -m comment --comment \"cali:abcdefghijklmnop\" -g cali-wl-to-host
-A cali-INPUT -j ACCEPT
COMMIT
# Completed on Sun Nov 22 04:28:09 2026
*nat
:PREROUTING ACCEPT [0:0]
COMMIT
";

    #[test]
    fn scan_reads_hashes_targets_and_specs() {
        let tables = scan_save(SAVE);
        assert_eq!(tables.len(), 2);
        assert!(tables[&TableName::Nat].chains.contains_key("PREROUTING"));
        let f = &tables[&TableName::Filter];
        let input = &f.chains["INPUT"];
        assert_eq!(input[0].hash.as_deref(), Some("Cz_u1IQiXIMmKD4c"));
        assert_eq!(input[0].target.as_deref(), Some("cali-INPUT"));
        assert_eq!(
            input[0].spec,
            "-m comment --comment \"cali:Cz_u1IQiXIMmKD4c\" -j cali-INPUT"
        );
        assert_eq!(input[1].hash, None);
        // Only the *first* comment decides ownership.
        assert_eq!(f.chains["FORWARD"][0].hash, None);
        assert_eq!(f.chains["FORWARD"][0].target, None);
        let ours = &f.chains["cali-INPUT"];
        assert_eq!(ours[0].hash.as_deref(), Some("abcdefghijklmnop"));
        assert_eq!(ours[0].target.as_deref(), Some("cali-wl-to-host"));
        assert_eq!(ours[0].spec, "");
        assert_eq!(ours[1].hash, None);
        let names: Vec<_> = f.our_chains().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["cali-INPUT", "cali-wl-to-host"]);
        assert!(!f.foreign_references("cali-INPUT"));
        assert_eq!(f.rule_count(), 6);
    }

    #[test]
    fn tokens_handle_quotes_and_escapes() {
        let toks: Vec<&str> = Tokens {
            rest: r#"-m comment --comment "it\'s \"x\" a b" -j  LOG"#,
        }
        .collect();
        assert_eq!(
            toks,
            [
                "-m",
                "comment",
                "--comment",
                r#""it\'s \"x\" a b""#,
                "-j",
                "LOG"
            ]
        );
        assert_eq!(unquote("\"cali:x\""), "cali:x");
    }

    #[test]
    fn foreign_reference_is_found() {
        let t = scan_save(
            "*filter\n:INPUT ACCEPT [0:0]\n:cali-x - [0:0]\n-A INPUT -j cali-x\nCOMMIT\n",
        );
        assert!(t[&TableName::Filter].foreign_references("cali-x"));
    }
}
