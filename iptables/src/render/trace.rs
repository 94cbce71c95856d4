//! A packet's way through rendered chains (pure): the rules it matches, what each of them does,
//! and where it ends. This is the evaluator behind `felixrs trace` ("which rule decides this
//! packet?"), and the renderer's property tests check it against the policy semantics.
//!
//! It evaluates typed [`model::Rule`]s (the very rules the applier writes, or the kernel's as
//! parsed) as the kernel would for one packet: interfaces with `+` wildcards, addresses and
//! ports, IP set membership (`hash:net` one-dimensional, `hash:ip,port` two-dimensional), ICMP
//! type/code, mark bits (rules may change them), conntrack state and jumps, gotos and returns.
//! Routing is not modelled: the caller says which interfaces the packet arrives on and leaves by,
//! and `-m rpfilter` is refused, as is every match or target it does not know.

use std::net::IpAddr;

use calc_graph::proto::{DomainPattern, IpSetMember, IpVersion};

use super::Renderer;
use crate::model::{
    self, Addr, CtState, IcmpType, Match, PortsKind, Rule, SetDir, TableName, Target,
};

/// How deep jumps may nest before the trace gives up (our chains nest at most 5 deep).
const MAX_DEPTH: usize = 32;

/// The packet's conntrack state as rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConntrackState {
    New,
    Established,
    Related,
    Invalid,
    /// A raw-table `NOTRACK` gave it no conntrack entry (a `doNotTrack` allow).
    Untracked,
}

/// One packet, as the filter table sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IP protocol number (6 TCP, 17 UDP, 132 SCTP, 1 ICMP, 58 ICMPv6).
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub icmp_type: u8,
    pub icmp_code: u8,
    pub in_iface: String,
    pub out_iface: String,
    pub conntrack: ConntrackState,
    /// The packet mark on entry.
    pub mark: u32,
}

impl Packet {
    /// A new (conntrack NEW, unmarked) packet.
    pub fn new(src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> Self {
        Packet {
            src,
            dst,
            proto,
            sport,
            dport,
            icmp_type: 0,
            icmp_code: 0,
            in_iface: String::new(),
            out_iface: String::new(),
            conntrack: ConntrackState::New,
            mark: 0,
        }
    }

    pub fn version(&self) -> IpVersion {
        if self.src.is_ipv6() {
            IpVersion::V6
        } else {
            IpVersion::V4
        }
    }
}

/// What a matched rule did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Accept,
    Drop,
    Return,
    Jump(String),
    Goto(String),
    /// The mark after the rule (`MARK --set-mark` or its clearing form).
    Mark(u32),
    /// `LOG`/`NFLOG`, or a rule without a target: the packet goes on.
    Continue,
}

/// One matched rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub chain: String,
    /// 1-based, as `iptables -L --line-numbers` counts.
    pub rule: usize,
    /// How deep in jumps the chain is (0 for the chain the trace started in).
    pub depth: usize,
    pub effect: Effect,
}

/// How the trace ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Accept,
    Drop,
    /// The starting chain returned (or ran out of rules): the caller's chain goes on.
    Return,
}

/// A matched rule that matched through a domain set (`destination.domains`): which set, the
/// patterns it stands for, and the address found in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainHit {
    pub chain: String,
    /// 1-based, as [`Step::rule`].
    pub rule: usize,
    pub set: String,
    pub patterns: Vec<DomainPattern>,
    pub addr: IpAddr,
    /// Seconds the address has left in the set (from the learner, or the kernel's entry);
    /// `None` when unknown or permanent.
    pub remaining_secs: Option<u32>,
}

impl std::fmt::Display for DomainHit {
    /// `domain rule *.example.com, example.com (93.184.216.34 in cali40d:…, 60 s left)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.patterns.iter().map(DomainPattern::as_str).collect();
        write!(
            f,
            "domain rule {} ({} in {}",
            if names.is_empty() {
                "(patterns unknown)".to_string()
            } else {
                names.join(", ")
            },
            self.addr,
            self.set
        )?;
        match self.remaining_secs {
            Some(s) => write!(f, ", {s} s left)"),
            None => write!(f, ")"),
        }
    }
}

/// A whole trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub steps: Vec<Step>,
    pub outcome: Outcome,
    /// The mark when the trace ended.
    pub mark: u32,
    /// The matched rules (of `steps`) that matched through a domain set, in order.
    pub domain_hits: Vec<DomainHit>,
    /// A `NOTRACK` rule matched (raw table): the packet has no conntrack entry from here on.
    pub untracked: bool,
}

impl Trace {
    /// The domain hit of a matched rule (`chain`, 1-based `rule`), if it matched through one.
    pub fn domain_hit_at(&self, chain: &str, rule: usize) -> Option<&DomainHit> {
        self.domain_hits
            .iter()
            .find(|h| h.chain == chain && h.rule == rule)
    }

    /// The domain rule that allowed the packet ("allowed by domain rule example.com"): the rule
    /// that set the accept bit (`accept`, [`super::MarkBits::accept`]) matched through a domain
    /// set, and the packet was accepted (ACCEPT, or `cali-FORWARD` returned with the accept bit).
    pub fn deciding_domain_hit(&self, accept: u32) -> Option<&DomainHit> {
        let accepted = self.outcome == Outcome::Accept
            || (self.outcome == Outcome::Return && self.mark & accept != 0);
        if !accepted {
            return None;
        }
        // The rule that allowed: the one that set the accept bit, or (shared layout) the one that
        // went to the verdict chain that set it.
        let at = self
            .steps
            .iter()
            .position(|s| matches!(s.effect, Effect::Mark(m) if m & accept != 0))?;
        let step = match (at.checked_sub(1).map(|i| &self.steps[i]), &self.steps[at]) {
            (Some(before), s) if before.effect == Effect::Goto(s.chain.clone()) => before,
            (_, s) => s,
        };
        self.domain_hit_at(&step.chain, step.rule)
    }
}

/// Why a packet could not be traced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("chain {chain} does not exist (reached from {from})")]
    MissingChain { chain: String, from: String },
    #[error("ip set {set} does not exist (used by {chain} rule {rule})")]
    MissingSet {
        set: String,
        chain: String,
        rule: usize,
    },
    #[error("{chain} rule {rule}: {what} cannot be evaluated without routing")]
    Unsupported {
        chain: String,
        rule: usize,
        what: &'static str,
    },
    #[error("{chain} rule {rule}: the {what} target cannot be traced")]
    UnsupportedTarget {
        chain: String,
        rule: usize,
        what: &'static str,
    },
    #[error("jumps nest deeper than {MAX_DEPTH} at {chain}")]
    TooDeep { chain: String },
}

/// Where the evaluator reads chains and IP set membership.
pub trait Rules {
    /// The rules of chain `name`, in order; `None` if there is no such chain.
    fn chain(&self, name: &str) -> Option<Vec<&Rule>>;
    /// Whether set `name` holds the address (one-dimensional set) or the address, protocol and
    /// port (two-dimensional set); `None` if there is no such set.
    fn set_contains(&self, name: &str, addr: IpAddr, proto: u8, port: u16) -> Option<bool>;
    /// The patterns of set `name` when it is a domain set (FQDN policy); `None` otherwise.
    fn domain_set(&self, _name: &str) -> Option<Vec<DomainPattern>> {
        None
    }
    /// The seconds `addr` has left in domain set `name`, when known.
    fn domain_remaining(&self, _name: &str, _addr: IpAddr) -> Option<u32> {
        None
    }
    /// What to do with what the evaluator cannot model ([`unmodelled`]: a host name, an
    /// extension match or target, a set `set_contains` does not know): `false` (the renderer's
    /// rules, which never hold any) fails the trace; `true` (the kernel's rules, foreign ones
    /// included) assumes such a match does not match and such a target does not end the packet.
    fn assume_unmodelled(&self) -> bool {
        false
    }
}

/// What the evaluator cannot decide in `rule` (so [`Rules::assume_unmodelled`] assumes), each as
/// a note, in rule order; `has_set` says which IP sets membership can be read for. Empty for
/// every rule the renderer writes that the trace can follow.
pub fn unmodelled(rule: &Rule, has_set: impl Fn(&str) -> bool) -> Vec<String> {
    let mut notes = Vec::new();
    for a in [&rule.src, &rule.dst].into_iter().flatten() {
        if let Addr::Other(w) = &a.value {
            notes.push(format!(
                "address {} (not an address): assumed not to match",
                w.as_str()
            ));
        }
    }
    for m in &rule.matches {
        match m {
            Match::Set { name, .. } if !has_set(name.as_str()) => notes.push(format!(
                "-m set --match-set {} (a set this trace did not read): assumed not to match",
                name.as_str()
            )),
            Match::Addrtype { .. } => notes.push("-m addrtype: assumed not to match".into()),
            Match::Generic { module, .. } => {
                notes.push(format!("-m {}: assumed not to match", module.as_str()))
            }
            _ => {}
        }
    }
    if let Some(target @ Target::Generic { name, .. }) = &rule.target
        && !is_notrack(target)
    {
        notes.push(format!(
            "-j {}: assumed not to end the packet",
            name.as_str()
        ));
    }
    notes
}

/// `-j NOTRACK`, or `-j CT --notrack` as the kernel saves it.
fn is_notrack(t: &Target) -> bool {
    match t {
        Target::Generic { name, args } => {
            name.as_str() == "NOTRACK"
                || (name.as_str() == "CT" && args.len() == 1 && args[0].as_str() == "--notrack")
        }
        _ => false,
    }
}

/// A renderer's chains of one family and table.
pub struct RendererRules<'a> {
    pub renderer: &'a Renderer,
    pub version: IpVersion,
    pub table: TableName,
}

impl Rules for RendererRules<'_> {
    fn chain(&self, name: &str) -> Option<Vec<&Rule>> {
        let rules = self.renderer.chain(self.version, self.table, name)?;
        Some(rules.iter().map(|r| r.model()).collect())
    }

    fn set_contains(&self, name: &str, addr: IpAddr, proto: u8, port: u16) -> Option<bool> {
        // A domain set holds what the learner knows now (the renderer's `DomainMembers`).
        if let Some(learned) = self.renderer.domain_set_members(self.version, name) {
            return Some(learned.iter().any(|l| l.addr == addr));
        }
        let spec = self.renderer.set_members(self.version, name)?;
        Some(
            spec.members
                .iter()
                .any(|m| member_holds(m, addr, proto, port)),
        )
    }

    fn domain_set(&self, name: &str) -> Option<Vec<DomainPattern>> {
        self.renderer.domain_set_patterns(name).map(<[_]>::to_vec)
    }

    fn domain_remaining(&self, name: &str, addr: IpAddr) -> Option<u32> {
        let learned = self.renderer.domain_set_members(self.version, name)?;
        learned
            .iter()
            .filter(|l| l.addr == addr)
            .map(|l| l.remaining_secs)
            .max()
    }
}

/// Whether one set member holds the probe (a net holds an address; an `ip,port` member holds
/// exactly that address, protocol and port).
pub fn member_holds(m: &IpSetMember, addr: IpAddr, proto: u8, port: u16) -> bool {
    match m {
        IpSetMember::Net(n) => n.contains(&addr),
        IpSetMember::IpPort {
            addr: a,
            protocol,
            port: p,
        } => *a == addr && protocol.number() == proto && *p == port,
    }
}

/// Traces `pkt` from chain `start`.
pub fn trace(rules: &dyn Rules, start: &str, pkt: &Packet) -> Result<Trace, TraceError> {
    let mut t = Tracer {
        rules,
        assume: rules.assume_unmodelled(),
        pkt,
        mark: pkt.mark,
        steps: Vec::new(),
        domain_hits: Vec::new(),
        untracked: false,
    };
    let Some(chain) = rules.chain(start) else {
        return Err(TraceError::MissingChain {
            chain: start.to_string(),
            from: "the start".into(),
        });
    };
    let outcome = t.run(start, &chain, 0)?;
    Ok(Trace {
        steps: t.steps,
        outcome,
        mark: t.mark,
        domain_hits: t.domain_hits,
        untracked: t.untracked,
    })
}

struct Tracer<'a> {
    rules: &'a dyn Rules,
    /// [`Rules::assume_unmodelled`].
    assume: bool,
    pkt: &'a Packet,
    mark: u32,
    steps: Vec<Step>,
    domain_hits: Vec<DomainHit>,
    untracked: bool,
}

fn iface_matches(pattern: &str, iface: &str) -> bool {
    match pattern.strip_suffix('+') {
        Some(prefix) => iface.starts_with(prefix),
        None => pattern == iface,
    }
}

/// The IP protocol number of `-p` (`None` for `all`, which every packet has).
pub fn proto_number(p: &model::Protocol) -> Option<u8> {
    Some(match p {
        model::Protocol::Tcp => 6,
        model::Protocol::Udp => 17,
        model::Protocol::Sctp => 132,
        model::Protocol::Icmp => 1,
        model::Protocol::Icmpv6 => 58,
        model::Protocol::Other(w) => match w.as_str() {
            "all" => return None,
            "ipv6-icmp" => 58,
            "ipencap" => 4,
            "udplite" => 136,
            n => n.parse().ok()?,
        },
    })
}

fn in_range(r: &model::PortRange, p: u16) -> bool {
    r.first <= p && p <= r.last
}

impl Tracer<'_> {
    fn run(&mut self, name: &str, rules: &[&Rule], depth: usize) -> Result<Outcome, TraceError> {
        if depth > MAX_DEPTH {
            return Err(TraceError::TooDeep {
                chain: name.to_string(),
            });
        }
        for (i, rule) in rules.iter().enumerate() {
            let index = i + 1;
            if !self.matches(name, index, rule)? {
                continue;
            }
            self.record_domain_hits(name, index, rule);
            let mut step = |effect| {
                self.steps.push(Step {
                    chain: name.to_string(),
                    rule: index,
                    depth,
                    effect,
                })
            };
            match &rule.target {
                None | Some(Target::Log { .. } | Target::Nflog { .. }) => step(Effect::Continue),
                Some(Target::Accept) => {
                    step(Effect::Accept);
                    return Ok(Outcome::Accept);
                }
                // raw `NOTRACK` (the kernel saves it as `CT --notrack`): no conntrack entry; the
                // packet goes on through the chain.
                Some(target @ Target::Generic { .. }) if is_notrack(target) => {
                    step(Effect::Continue);
                    self.untracked = true;
                }
                Some(Target::Generic { .. }) if self.assume => step(Effect::Continue),
                // MASQUERADE (nat table) ends the table's traversal as ACCEPT does.
                Some(Target::Generic { name: t, .. }) if t.as_str() == "MASQUERADE" => {
                    step(Effect::Accept);
                    return Ok(Outcome::Accept);
                }
                Some(Target::Drop | Target::Reject { .. }) => {
                    step(Effect::Drop);
                    return Ok(Outcome::Drop);
                }
                Some(Target::Return) => {
                    step(Effect::Return);
                    return Ok(Outcome::Return);
                }
                // `--set-xmark value/mask`: clear the mask's bits, then flip the value's.
                Some(Target::Mark { value, mask }) => {
                    let mark = (self.mark & !mask) ^ value;
                    step(Effect::Mark(mark));
                    self.mark = mark;
                }
                Some(Target::Jump(next)) => {
                    step(Effect::Jump(next.as_str().to_string()));
                    match self.enter(name, next.as_str(), depth + 1)? {
                        Outcome::Return => {}
                        end => return Ok(end),
                    }
                }
                Some(Target::Goto(next)) => {
                    step(Effect::Goto(next.as_str().to_string()));
                    return self.enter(name, next.as_str(), depth + 1);
                }
                Some(Target::Generic { name: t, .. }) => {
                    return Err(TraceError::UnsupportedTarget {
                        chain: name.to_string(),
                        rule: index,
                        what: if t.as_str() == "NFQUEUE" {
                            "NFQUEUE"
                        } else {
                            "extension"
                        },
                    });
                }
            }
        }
        Ok(Outcome::Return)
    }

    fn enter(&mut self, from: &str, name: &str, depth: usize) -> Result<Outcome, TraceError> {
        let rules = self.rules;
        let chain = rules.chain(name).ok_or_else(|| TraceError::MissingChain {
            chain: name.to_string(),
            from: from.to_string(),
        })?;
        self.run(name, &chain, depth)
    }

    /// A matched rule's positive destination matches on domain sets.
    fn record_domain_hits(&mut self, chain: &str, index: usize, rule: &Rule) {
        for m in &rule.matches {
            if let Match::Set {
                name,
                dirs,
                negated: false,
            } = m
                && dirs[..] == [SetDir::Dst]
                && let Some(patterns) = self.rules.domain_set(name.as_str())
            {
                self.domain_hits.push(DomainHit {
                    chain: chain.to_string(),
                    rule: index,
                    set: name.as_str().to_string(),
                    patterns,
                    addr: self.pkt.dst,
                    remaining_secs: self.rules.domain_remaining(name.as_str(), self.pkt.dst),
                });
            }
        }
    }

    fn matches(&self, chain: &str, rule: usize, r: &Rule) -> Result<bool, TraceError> {
        let pkt = self.pkt;
        for (a, of) in [(&r.src, pkt.src), (&r.dst, pkt.dst)] {
            if let Some(a) = a {
                let Addr::Net(net) = &a.value else {
                    return self.unmodelled(chain, rule, "a host name");
                };
                if net.contains(&of) == a.negated {
                    return Ok(false);
                }
            }
        }
        for (i, of) in [(&r.in_iface, &pkt.in_iface), (&r.out_iface, &pkt.out_iface)] {
            if let Some(i) = i
                && iface_matches(i.value.as_str(), of) == i.negated
            {
                return Ok(false);
            }
        }
        if let Some(p) = &r.protocol {
            let hit = proto_number(&p.value).is_none_or(|n| n == pkt.proto);
            if hit == p.negated {
                return Ok(false);
            }
        }
        // A traced packet is the first (or only) fragment.
        if r.fragment.as_ref().is_some_and(|f| !f.negated) {
            return Ok(false);
        }
        for m in &r.matches {
            if !self.match_one(chain, rule, m)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A part of rule `rule` the evaluator cannot decide: not a match when assumed, else an error.
    fn unmodelled(&self, chain: &str, rule: usize, what: &'static str) -> Result<bool, TraceError> {
        if self.assume {
            return Ok(false);
        }
        Err(TraceError::Unsupported {
            chain: chain.to_string(),
            rule,
            what,
        })
    }

    fn match_one(&self, chain: &str, rule: usize, m: &Match) -> Result<bool, TraceError> {
        let pkt = self.pkt;
        Ok(match m {
            Match::Comment(_) => true,
            Match::Set {
                name,
                dirs,
                negated,
            } => {
                // A second dimension (`dst,dst`) is the port of the same side.
                let (addr, port) = match dirs.first() {
                    Some(SetDir::Dst) => (pkt.dst, pkt.dport),
                    _ => (pkt.src, pkt.sport),
                };
                match self
                    .rules
                    .set_contains(name.as_str(), addr, pkt.proto, port)
                {
                    Some(hit) => hit != *negated,
                    None if self.assume => false,
                    None => {
                        return Err(TraceError::MissingSet {
                            set: name.as_str().to_string(),
                            chain: chain.to_string(),
                            rule,
                        });
                    }
                }
            }
            Match::Multiport {
                negated,
                kind,
                ports,
            } => {
                let hit = ports.iter().any(|r| match kind {
                    PortsKind::Source => in_range(r, pkt.sport),
                    PortsKind::Destination => in_range(r, pkt.dport),
                    PortsKind::Either => in_range(r, pkt.sport) || in_range(r, pkt.dport),
                });
                hit != *negated
            }
            Match::Tcp(p) | Match::Udp(p) => {
                let want = if matches!(m, Match::Tcp(_)) { 6 } else { 17 };
                pkt.proto == want
                    && [(&p.sport, pkt.sport), (&p.dport, pkt.dport)]
                        .into_iter()
                        .all(|(side, port)| {
                            side.as_ref()
                                .is_none_or(|n| in_range(&n.value, port) != n.negated)
                        })
            }
            Match::Icmp { negated, icmp_type } | Match::Icmpv6 { negated, icmp_type } => {
                let hit = match icmp_type {
                    IcmpType::Any => true,
                    IcmpType::Type(t) => *t == pkt.icmp_type,
                    IcmpType::TypeCode(t, c) => *t == pkt.icmp_type && *c == pkt.icmp_code,
                };
                hit != *negated
            }
            Match::Mark {
                value,
                mask,
                negated,
            } => ((self.mark & mask) == *value) != *negated,
            Match::Conntrack { states, negated } | Match::State { states, negated } => {
                let s = match pkt.conntrack {
                    ConntrackState::New => CtState::New,
                    ConntrackState::Established => CtState::Established,
                    ConntrackState::Related => CtState::Related,
                    ConntrackState::Invalid => CtState::Invalid,
                    ConntrackState::Untracked => CtState::Untracked,
                };
                states.contains(s) != *negated
            }
            // A rate limit lets one traced packet through.
            Match::Limit { .. } => true,
            Match::Addrtype { .. } => return self.unmodelled(chain, rule, "-m addrtype"),
            Match::Generic { module, .. } => {
                let what = match module.as_str() {
                    "conntrack" => "-m conntrack --ctdir",
                    "rpfilter" => "-m rpfilter",
                    _ => "an extension match",
                };
                return self.unmodelled(chain, rule, what);
            }
        })
    }
}

#[cfg(test)]
mod tests;
