//! The kernel's own rules, for the packet evaluator of [`super::trace`] (pure): a parsed
//! `iptables-save` table (foreign rules included: kube-proxy, docker, an admin's) and our IP sets
//! as `ipset save` prints them, turned into evaluator rules for one packet.
//!
//! Everything about the packet that no rule can change (addresses, interfaces, protocol, ports,
//! ICMP type, conntrack state, set membership) is decided here, once per rule: a rule whose
//! static part matches keeps only its mark matches (the one thing rules change on the way); one
//! that cannot match becomes a rule that never matches. What the evaluator cannot model (an
//! extension such as `-m addrtype` or `-m limit`, a host name, a foreign set, a rule kept
//! verbatim, an unknown target) is assumed not to match (an unknown target: not to end the packet),
//! and listed in [`KernelRules::assumptions`] so the caller can say so.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use super::trace::{ConntrackState, DomainHit, Packet, Rules, Trace};
use crate::desired::ipset::ActualSet;
use crate::model::{
    self, Addr, CtState, IcmpType, Iface, Match, Negatable, PortRange, PortsKind, Protocol, Rule,
    SetDir, TableLine, Target,
};
use calc_graph::proto::DomainPattern;

/// A match no packet passes (no mark is ever equal to 1 under an empty mask).
fn never() -> Match {
    Match::Mark {
        value: 1,
        mask: 0,
        negated: false,
    }
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
        let mut k = KernelRules::default();
        for c in table.chains() {
            k.chains.entry(c.name.as_str().to_string()).or_default();
            k.texts.entry(c.name.as_str().to_string()).or_default();
            if let Some(p) = c.policy {
                k.policies.insert(c.name.as_str().to_string(), p);
            }
        }
        for line in &table.lines {
            match line {
                TableLine::Rule(r) | TableLine::Insert { rule: r, .. } => {
                    let chain = r.chain.as_str().to_string();
                    let index = k.chains.get(&chain).map_or(0, Vec::len) + 1;
                    let mut domain = Vec::new();
                    let (rule, notes) = convert(r, sets, pkt, &mut domain);
                    for (set, remaining_secs) in domain {
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
                    let mut text = r.clone();
                    text.counters = None;
                    k.texts
                        .entry(chain.clone())
                        .or_default()
                        .push(text.render_spec().trim_start().to_string());
                    k.chains.entry(chain).or_default().push(rule);
                }
                TableLine::Opaque(o) => {
                    let Some((chain, spec)) = o.chain_and_spec() else {
                        continue;
                    };
                    let chain = chain.to_string();
                    let index = k.chains.get(&chain).map_or(0, Vec::len) + 1;
                    k.assumptions.push(Assumption {
                        chain: chain.clone(),
                        rule: index,
                        what: "a rule the parser kept verbatim: assumed not to match".into(),
                    });
                    k.texts
                        .entry(chain.clone())
                        .or_default()
                        .push(spec.replace('\n', "\\n"));
                    let name = model::ChainName::new(chain.as_str())
                        .or_else(|_| model::ChainName::new("opaque"))
                        .expect("a chain name");
                    let rule = Rule::new(name)
                        .with_match(never())
                        .with_target(Target::Return);
                    k.chains.entry(chain).or_default().push(rule);
                }
                _ => {}
            }
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

    /// Set membership was decided when the rules were prepared; no rule asks.
    fn set_contains(&self, _name: &str, _addr: IpAddr, _proto: u8, _port: u16) -> Option<bool> {
        None
    }
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

fn proto_number(p: &Protocol) -> Option<u8> {
    Some(match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
        Protocol::Icmp => 1,
        Protocol::Icmpv6 => 58,
        Protocol::Other(w) => match w.as_str() {
            "all" => return None,
            "ipv6-icmp" => 58,
            "ipencap" => 4,
            n => n.parse().ok()?,
        },
    })
}

fn iface_holds(pattern: &str, iface: &str) -> bool {
    match pattern.strip_suffix('+') {
        Some(prefix) => iface.starts_with(prefix),
        None => pattern == iface,
    }
}

fn in_range(r: &PortRange, p: u16) -> bool {
    r.first <= p && p <= r.last
}

/// One kernel rule for `pkt`: the evaluator rule and what had to be assumed.
fn convert(
    r: &model::Rule,
    sets: &BTreeMap<String, ActualSet>,
    pkt: &Packet,
    domain: &mut Vec<(String, Option<u32>)>,
) -> (Rule, Vec<String>) {
    let mut notes = Vec::new();
    let mut matches = Vec::new();
    let mut ok = true;
    let mut check = |hit: bool, negated: bool| {
        if hit == negated {
            ok = false;
        }
    };
    let addr = |a: &Option<Negatable<Addr>>, of: IpAddr, notes: &mut Vec<String>| match a {
        None => Some((true, false)),
        Some(n) => match &n.value {
            Addr::Net(net) => Some((net.contains(&of), n.negated)),
            Addr::Other(w) => {
                notes.push(format!(
                    "address {} (not an address): assumed not to match",
                    w.as_str()
                ));
                None
            }
        },
    };
    for (a, of) in [(&r.src, pkt.src), (&r.dst, pkt.dst)] {
        match addr(a, of, &mut notes) {
            Some((hit, neg)) => check(hit, neg),
            None => check(false, false),
        }
    }
    let iface = |i: &Option<Negatable<Iface>>, of: &str| match i {
        None => (true, false),
        Some(n) => (iface_holds(n.value.as_str(), of), n.negated),
    };
    let (hit, neg) = iface(&r.in_iface, &pkt.in_iface);
    check(hit, neg);
    let (hit, neg) = iface(&r.out_iface, &pkt.out_iface);
    check(hit, neg);
    if let Some(p) = &r.protocol {
        match proto_number(&p.value) {
            Some(n) => check(n == pkt.proto, p.negated),
            None => check(true, p.negated),
        }
    }
    if let Some(f) = &r.fragment {
        // A traced packet is the first (or only) fragment.
        check(false, f.negated);
    }
    let port_of = |dst: bool| if dst { pkt.dport } else { pkt.sport };
    for m in &r.matches {
        match m {
            model::Match::Comment(_) => {}
            model::Match::Conntrack { negated, states }
            | model::Match::State { negated, states } => {
                let s = match pkt.conntrack {
                    ConntrackState::New => CtState::New,
                    ConntrackState::Established => CtState::Established,
                    ConntrackState::Related => CtState::Related,
                    ConntrackState::Invalid => CtState::Invalid,
                };
                check(states.contains(s), *negated);
            }
            model::Match::Mark { .. } => matches.push(m.clone()),
            model::Match::Set {
                negated,
                name,
                dirs,
            } => match sets.get(name.as_str()) {
                Some(set) => {
                    let (a, port) = match dirs.first() {
                        Some(SetDir::Dst) => (pkt.dst, pkt.dport),
                        _ => (pkt.src, pkt.sport),
                    };
                    // A second dimension (`dst,dst`) is the port of the same side.
                    let hit = set
                        .members
                        .iter()
                        .any(|m| set_member_holds(m, a, pkt.proto, port));
                    // A domain set (timeouts: FQDN policy) holding the destination.
                    if hit && !*negated && set.is_timed() && dirs.first() == Some(&SetDir::Dst) {
                        let left = set.member_timeouts.get(&a.to_string()).copied();
                        domain.push((name.as_str().to_string(), left));
                    }
                    check(hit, *negated);
                }
                None => {
                    notes.push(format!(
                        "-m set --match-set {} (a set this trace did not read): assumed not to match",
                        name.as_str()
                    ));
                    check(false, false);
                }
            },
            model::Match::Multiport {
                negated,
                kind,
                ports,
            } => {
                let hit = ports.iter().any(|r| match kind {
                    PortsKind::Source => in_range(r, pkt.sport),
                    PortsKind::Destination => in_range(r, pkt.dport),
                    PortsKind::Either => in_range(r, pkt.sport) || in_range(r, pkt.dport),
                });
                check(hit, *negated);
            }
            model::Match::Tcp(p) | model::Match::Udp(p) => {
                let want = if matches!(m, model::Match::Tcp(_)) {
                    6
                } else {
                    17
                };
                check(pkt.proto == want, false);
                for (side, dst) in [(&p.sport, false), (&p.dport, true)] {
                    if let Some(n) = side {
                        check(in_range(&n.value, port_of(dst)), n.negated);
                    }
                }
            }
            model::Match::Icmp { negated, icmp_type }
            | model::Match::Icmpv6 { negated, icmp_type } => {
                let hit = match icmp_type {
                    IcmpType::Any => true,
                    IcmpType::Type(t) => *t == pkt.icmp_type,
                    IcmpType::TypeCode(t, c) => *t == pkt.icmp_type && *c == pkt.icmp_code,
                };
                check(hit, *negated);
            }
            model::Match::Addrtype { .. } => {
                notes.push("-m addrtype: assumed not to match".into());
                check(false, false);
            }
            model::Match::Limit { .. } => {
                // A rate limit lets a single packet through.
            }
            model::Match::Generic { module, .. } => {
                notes.push(format!("-m {}: assumed not to match", module.as_str()));
                check(false, false);
            }
        }
    }
    let target = match &r.target {
        Some(Target::Generic { name, .. }) => {
            notes.push(format!(
                "-j {}: assumed not to end the packet",
                name.as_str()
            ));
            None
        }
        t => t.clone(),
    };
    if !ok {
        matches = vec![never()];
    }
    let mut rule = Rule::new(r.chain.clone());
    rule.matches = matches;
    rule.target = target;
    (rule, notes)
}
