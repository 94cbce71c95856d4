//! The kernel's own rules for the packet evaluator of [`super::trace`] (pure): a parsed
//! `iptables-save` table (foreign rules included: kube-proxy, docker, an admin's) and our IP sets
//! as `ipset save` prints them. The evaluator reads the parsed [`model::Rule`]s themselves, as it
//! reads the renderer's, so `trace --kernel` checks exactly what the kernel holds.
//!
//! What the evaluator cannot model (an extension such as `-m addrtype`, a host name, a foreign
//! set, a rule kept verbatim, an unknown target) is assumed not to match (an unknown target: not
//! to end the packet, [`Rules::assume_unmodelled`]), and listed in [`KernelRules::assumptions`]
//! so the caller can say so.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use super::trace::{DomainHit, Packet, Rules, Trace, unmodelled};
use crate::desired::ipset::ActualSet;
use crate::model::{self, Match, Rule, SetDir, TableLine, Target};
use calc_graph::proto::DomainPattern;

/// A rule that never matches (no mark is ever equal to 1 under an empty mask), standing for a
/// line the parser kept verbatim.
fn never(chain: &str) -> Rule {
    let name = model::ChainName::new(chain)
        .or_else(|_| model::ChainName::new("opaque"))
        .expect("a chain name");
    Rule::new(name)
        .with_match(Match::Mark {
            negated: false,
            value: 1,
            mask: 0,
        })
        .with_target(Target::Return)
}

/// Something the evaluator assumed about a kernel rule it could not model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assumption {
    pub chain: String,
    /// 1-based position in the chain.
    pub rule: usize,
    pub what: String,
}

/// A kernel table's chains prepared for one packet, plus the kernel's chain policies.
#[derive(Debug, Clone, Default)]
pub struct KernelRules {
    chains: HashMap<String, Vec<Rule>>,
    /// Our IP sets of the packet's family as the kernel has them.
    sets: BTreeMap<String, ActualSet>,
    /// Built-in chains' policies (`ACCEPT`/`DROP`).
    pub policies: BTreeMap<String, model::Policy>,
    /// The kernel's text of each rule (`-A CHAIN …`, without counters), by chain, for reports.
    pub texts: HashMap<String, Vec<String>>,
    pub assumptions: Vec<Assumption>,
    /// Rules whose destination is in one of our domain sets (sets with timeouts) as the kernel
    /// has it, decided when the rules were prepared (see [`KernelRules::domain_hits`]).
    pub domain_matches: Vec<KernelDomainMatch>,
}

/// A kernel rule whose positive `--match-set <domain set> dst` holds the packet's destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelDomainMatch {
    pub chain: String,
    /// 1-based position in the chain.
    pub rule: usize,
    pub set: String,
    /// The kernel's seconds left for the destination's entry (`None`: permanent).
    pub remaining_secs: Option<u32>,
}

impl KernelRules {
    /// Prepares `table` (as parsed from the kernel) for `pkt`; `sets` are our IP sets of the
    /// packet's family as read from `ipset save` (other sets are assumed not to match).
    pub fn new(table: &model::Table, sets: &BTreeMap<String, ActualSet>, pkt: &Packet) -> Self {
        let mut k = KernelRules {
            sets: sets.clone(),
            ..KernelRules::default()
        };
        for c in table.chains() {
            k.chains.entry(c.name.as_str().to_string()).or_default();
            k.texts.entry(c.name.as_str().to_string()).or_default();
            if let Some(p) = c.policy {
                k.policies.insert(c.name.as_str().to_string(), p);
            }
        }
        for line in &table.lines {
            let (chain, rule, text, notes) = match line {
                TableLine::Rule(r) | TableLine::Insert { rule: r, .. } => {
                    let mut rule = r.clone();
                    rule.counters = None;
                    let text = rule.render_spec().trim_start().to_string();
                    let notes = unmodelled(&rule, |s| sets.contains_key(s));
                    (r.chain.as_str().to_string(), rule, text, notes)
                }
                TableLine::Opaque(o) => {
                    let Some((chain, spec)) = o.chain_and_spec() else {
                        continue;
                    };
                    let notes =
                        vec!["a rule the parser kept verbatim: assumed not to match".to_string()];
                    (
                        chain.to_string(),
                        never(chain),
                        spec.replace('\n', "\\n"),
                        notes,
                    )
                }
                _ => continue,
            };
            let index = k.chains.get(&chain).map_or(0, Vec::len) + 1;
            for (set, remaining_secs) in domain_sets_holding(&rule, sets, pkt) {
                k.domain_matches.push(KernelDomainMatch {
                    chain: chain.clone(),
                    rule: index,
                    set,
                    remaining_secs,
                });
            }
            for what in notes {
                k.assumptions.push(Assumption {
                    chain: chain.clone(),
                    rule: index,
                    what,
                });
            }
            k.texts.entry(chain.clone()).or_default().push(text);
            k.chains.entry(chain).or_default().push(rule);
        }
        k
    }

    /// The domain hits of the rules `trace` matched (the kernel's set contents decided
    /// membership; `patterns` names a domain set's patterns, e.g. from the renderer's
    /// [`Renderer::domain_set_patterns`](super::Renderer::domain_set_patterns); a set it does
    /// not know is reported with no patterns).
    pub fn domain_hits(
        &self,
        trace: &Trace,
        pkt: &Packet,
        patterns: &dyn Fn(&str) -> Option<Vec<DomainPattern>>,
    ) -> Vec<DomainHit> {
        let mut out = Vec::new();
        for step in &trace.steps {
            for m in &self.domain_matches {
                if m.chain == step.chain && m.rule == step.rule {
                    out.push(DomainHit {
                        chain: m.chain.clone(),
                        rule: m.rule,
                        set: m.set.clone(),
                        patterns: patterns(&m.set).unwrap_or_default(),
                        addr: pkt.dst,
                        remaining_secs: m.remaining_secs,
                    });
                }
            }
        }
        out
    }

    /// Rule `rule` (1-based) of `chain` as the kernel has it (a line kept verbatim: a rule that
    /// never matches, without its comments).
    pub fn rule(&self, chain: &str, rule: usize) -> Option<&Rule> {
        self.chains.get(chain)?.get(rule.checked_sub(1)?)
    }

    /// How many rules `chain` has.
    pub fn chain_len(&self, chain: &str) -> usize {
        self.chains.get(chain).map_or(0, Vec::len)
    }

    /// The kernel's text of rule `rule` (1-based) of `chain`.
    pub fn text(&self, chain: &str, rule: usize) -> Option<&str> {
        self.texts
            .get(chain)
            .and_then(|t| t.get(rule.checked_sub(1)?))
            .map(String::as_str)
    }
}

impl Rules for KernelRules {
    fn chain(&self, name: &str) -> Option<Vec<&Rule>> {
        Some(self.chains.get(name)?.iter().collect())
    }

    fn set_contains(&self, name: &str, addr: IpAddr, proto: u8, port: u16) -> Option<bool> {
        let set = self.sets.get(name)?;
        Some(
            set.members
                .iter()
                .any(|m| set_member_holds(m, addr, proto, port)),
        )
    }

    fn assume_unmodelled(&self) -> bool {
        true
    }
}

/// Our domain sets (sets with timeouts: FQDN policy) whose positive `--match-set … dst` in
/// `rule` holds the packet's destination, with the kernel's seconds left for its entry.
fn domain_sets_holding(
    rule: &Rule,
    sets: &BTreeMap<String, ActualSet>,
    pkt: &Packet,
) -> Vec<(String, Option<u32>)> {
    let mut out = Vec::new();
    for m in &rule.matches {
        if let Match::Set {
            negated: false,
            name,
            dirs,
        } = m
            && dirs.first() == Some(&SetDir::Dst)
            && let Some(set) = sets.get(name.as_str())
            && set.is_timed()
            && (set.members.iter()).any(|m| set_member_holds(m, pkt.dst, pkt.proto, pkt.dport))
        {
            let left = set.member_timeouts.get(&pkt.dst.to_string()).copied();
            out.push((name.as_str().to_string(), left));
        }
    }
    out
}

/// Whether `member` (as `ipset save` prints it: `10.0.0.1`, `10.0.0.0/8`, `10.0.0.1,tcp:80`)
/// holds the probe.
pub fn set_member_holds(member: &str, addr: IpAddr, proto: u8, port: u16) -> bool {
    if let Some((ip, pp)) = member.split_once(',') {
        let Ok(ip) = ip.parse::<IpAddr>() else {
            return false;
        };
        let Some((p, n)) = pp.split_once(':') else {
            return false;
        };
        let number = match p {
            "tcp" => 6,
            "udp" => 17,
            "sctp" => 132,
            _ => return false,
        };
        return ip == addr && number == proto && n.parse::<u16>().ok() == Some(port);
    }
    if let Ok(net) = member.parse::<ipnet::IpNet>() {
        return net.contains(&addr);
    }
    member.parse::<IpAddr>().is_ok_and(|a| a == addr)
}
