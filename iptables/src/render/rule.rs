//! One Calico rule -> iptables rules (felix-reference §4: `ProtoRuleToIptablesRules`, `matchBlockBuilder`), and a
//! policy/profile direction -> one chain's rules.
//!
//! Invariants:
//! * In the shared layout ([`RuleCtx::net_sets`]) several positive nets on a side are one match
//!   on a content-addressed `hash:net` set, and a negated list beside another net on the same
//!   side one negated set match (`names::net_set_id`: the id is a hash of the family and the
//!   sorted nets, so equal lists share a set); Felix's inlined layout keeps the blocks below.
//! * OR semantics (several positive nets, > 15 port slots, numeric plus named ports, a negated net
//!   beside another net on the same side) go through scratch-mark blocks; the final rule matches
//!   AB = scratch0. Each positive block after the second starts by clearing TB = scratch1, so the
//!   result is correct for any number of blocks (Felix leaves TB set: felix-reference §4.4; we differ there only).
//! * A rule that cannot be rendered safely (ports without a port protocol, ICMP fields without the
//!   ICMP protocol of this family, an unknown IP set) is an error; the caller fails closed.
//! * Rules of the other IP family are filtered out per felix-reference §4.1, except that a negated CIDR list that
//!   only held other-family CIDRs is dropped from the rule instead of dropping the rule (a v4
//!   packet is never inside a v6 CIDR, so "not in any" holds; Felix drops the whole rule).

use calc_graph::proto::{Action, IpVersion, ParsedRule, PortRange, Protocol};
use ipnet::IpNet;

use super::build::{Match, Rule, SetFlags, Side, Target};
use super::marks::MarkBits;
use super::names;
use super::static_chains::{VERDICT_ACCEPT, VERDICT_DROP, VERDICT_PASS};

/// Most "slots" one multiport match may hold (a range takes two).
pub const MULTIPORT_SLOTS: usize = 15;

/// Why a rule could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("rule {index}: {field} needs protocol tcp, udp, sctp or udplite, got {protocol}")]
    PortsWithoutPortProtocol {
        index: usize,
        field: &'static str,
        protocol: String,
    },
    #[error("rule {index}: {field} needs protocol {needed} in an IPv{version} chain")]
    IcmpWithoutProtocol {
        index: usize,
        field: &'static str,
        needed: &'static str,
        version: u8,
    },
    #[error("rule {index}: {field} has an ICMP code without a type")]
    IcmpCodeWithoutType { index: usize, field: &'static str },
    #[error("rule {index}: {field} references unknown or invalid IP set {id:?}")]
    UnknownIpSet {
        index: usize,
        field: &'static str,
        id: String,
    },
}

/// How a `Log` action is rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogAction {
    /// `LOG --log-prefix "<prefix>: " --log-level 5` (Felix's behaviour).
    Log,
    /// `NFLOG --nflog-group <group> --nflog-prefix <L{P|R}{I|E}<idx>|<id>>`, prefix ≤ 63 chars.
    Nflog { group: u16 },
}

/// Everything rule rendering needs besides the rule.
pub struct RuleCtx<'a> {
    pub version: IpVersion,
    pub marks: &'a MarkBits,
    pub log_action: &'a LogAction,
    /// LOG prefix (already sanitised, ≤ 27 chars).
    pub log_prefix: &'a str,
    /// Resolves an IP set id to its kernel name in this family, or `None` if unknown.
    pub set_name: &'a dyn Fn(&str) -> Option<String>,
    /// `P` for policies, `R` for profiles (NFLOG prefix).
    pub owner: char,
    pub ingress: bool,
    /// Policy / profile id for the NFLOG prefix (`np/ns/name`, `kns.default`).
    pub owner_id: &'a str,
    /// Log denied packets (an NFLOG rule before each Deny's DROP).
    pub deny_log: Option<DenyLog>,
    /// The shared layout's verdicts: an Allow, Pass or Deny is one rule that goes (`-g`) to the
    /// shared verdict chain setting its mark (`cali-verdict-accept`/`-pass`/`-drop`), instead of
    /// Felix's mark rule plus `-m mark … -j RETURN`/`DROP` pair. Same meaning: a chain gone to
    /// returns to the chain that jumped to the policy's chain, as the RETURN did. With
    /// `deny_log`, a Deny's NFLOG rule (same matches, rate-limited) comes right before its goto.
    pub verdict_chains: bool,
    /// The shared layout: a net list that needs an OR block (several positive nets on a side) or
    /// a negated-net block becomes one match on a content-addressed `hash:net` set
    /// ([`Match::NetSet`]). Off: Felix's scratch-mark blocks, byte for byte.
    pub net_sets: bool,
}

/// Opt-in logging of denied packets with Felix's flow-log NFLOG rules (without flow logs): a
/// kernel-rate-limited NFLOG rule right before the DROP of every Deny rule
/// (`D<P|R><I|E><rule index>|<policy or profile id>`), every tier end (`DP<I|E>|<tier>`) and
/// every "no profile matched" (`DR<I|E>|__NO_MATCH__`), to group 1 (ingress) or 2 (egress).
///
/// With `flow_logs` (`RenderConfig::flow_logs`, [`DenyLog::FLOW_LOGS`]) these are Felix's
/// flow-log rules instead: unlimited, copying only the first [`FLOW_LOG_NFLOG_SIZE`] bytes
/// (headers), and on every verdict: also before each Allow (`A…`) and Pass (`N…`, Calico's
/// next-tier) of a policy or profile rule. Policy chains see only a connection's first packet
/// (established traffic is accepted before them), so that is one log per connection per
/// endpoint direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenyLog {
    /// Packets a second each such rule logs at most (after the burst); unused with `flow_logs`.
    pub per_second: u32,
    pub burst: u32,
    /// Flow logs: every verdict, no rate limit, headers only.
    pub flow_logs: bool,
}

impl Default for DenyLog {
    fn default() -> Self {
        DenyLog {
            per_second: 10,
            burst: 20,
            flow_logs: false,
        }
    }
}

/// Bytes of each packet a flow-log NFLOG rule copies to the collector (`--nflog-size`): the
/// largest IPv4 header (60) plus the TCP/UDP ports and some, or the IPv6 header plus 40; Felix
/// copies 80 too.
pub const FLOW_LOG_NFLOG_SIZE: u32 = 80;

/// Felix's NFLOG groups: 1 for ingress, 2 for egress.
pub const NFLOG_GROUP_INGRESS: u16 = 1;
pub const NFLOG_GROUP_EGRESS: u16 = 2;

impl DenyLog {
    /// Felix's flow-log NFLOG rules (see [`DenyLog`]).
    pub const FLOW_LOGS: DenyLog = DenyLog {
        per_second: 0,
        burst: 0,
        flow_logs: true,
    };

    /// The rate limit of a deny-log rule.
    pub fn limit(self) -> Match {
        Match::Limit {
            per_second: self.per_second,
            burst: self.burst,
        }
    }

    pub fn group(ingress: bool) -> u16 {
        if ingress {
            NFLOG_GROUP_INGRESS
        } else {
            NFLOG_GROUP_EGRESS
        }
    }

    /// The NFLOG rule logging what `matches` selects, with prefix `head|id`.
    pub fn rule(self, mut matches: Vec<Match>, ingress: bool, head: &str, id: &str) -> Rule {
        if !self.flow_logs {
            matches.push(self.limit());
        }
        Rule::new(
            matches,
            Target::Nflog {
                group: Self::group(ingress),
                prefix: nflog_prefix(head, id),
                size: self.flow_logs.then_some(FLOW_LOG_NFLOG_SIZE),
            },
        )
    }
}

/// Splits ports into multiport groups of at most 15 slots, greedily in order (`SplitPortList`).
pub fn split_ports(ports: &[PortRange]) -> Vec<Vec<PortRange>> {
    let mut splits = Vec::new();
    let mut cur: Vec<PortRange> = Vec::new();
    let mut left = MULTIPORT_SLOTS;
    for p in ports {
        let need = if p.first == p.last { 1 } else { 2 };
        if left < need {
            splits.push(std::mem::take(&mut cur));
            left = MULTIPORT_SLOTS;
        }
        cur.push(*p);
        left -= need;
    }
    if !cur.is_empty() {
        splits.push(cur);
    }
    splits
}

fn is_v6(n: &IpNet) -> bool {
    matches!(n, IpNet::V6(_))
}

/// Keeps the nets of `version`; `None` means "the positive field emptied: drop the rule".
fn filter_nets(nets: &[IpNet], version: IpVersion, negated: bool) -> Option<Vec<IpNet>> {
    let want_v6 = version == IpVersion::V6;
    let kept: Vec<IpNet> = nets
        .iter()
        .filter(|n| is_v6(n) == want_v6)
        .copied()
        .collect();
    if negated {
        // `! 0.0.0.0/0` matches nothing of this family: the rule can never match.
        if kept.iter().any(|n| n.prefix_len() == 0) {
            return None;
        }
        Some(kept)
    } else if !nets.is_empty() && kept.is_empty() {
        None
    } else if kept.iter().any(|n| n.prefix_len() == 0) {
        // "Any of {everything, ...}" is no constraint (and the kernel drops `-s 0.0.0.0/0`).
        Some(Vec::new())
    } else {
        Some(kept)
    }
}

/// Whether the rule applies to `version` at all (explicit ipVersion, ICMP protocol family).
pub fn rule_applies_to(rule: &ParsedRule, version: IpVersion) -> bool {
    if rule.ip_version.is_some_and(|v| v != version) {
        return false;
    }
    !matches!(
        (rule.protocol, version),
        (Some(Protocol::Icmp | Protocol::Number(1)), IpVersion::V6)
            | (Some(Protocol::IcmpV6 | Protocol::Number(58)), IpVersion::V4)
    )
}

/// The scratch-mark block builder, with the TB clear that makes any number of blocks correct.
struct Blocks<'m> {
    marks: &'m MarkBits,
    rules: Vec<Rule>,
    used: bool,
    positive_blocks: usize,
}

impl<'m> Blocks<'m> {
    fn initial(&mut self, value: u32) {
        if !self.used {
            let mask = self.marks.scratch0 | self.marks.scratch1;
            self.rules
                .push(Rule::new(vec![], Target::SetMark { value, mask }));
            self.used = true;
        }
    }

    fn positive(&mut self, alternatives: Vec<Vec<Match>>) {
        let (ab, tb) = (self.marks.scratch0, self.marks.scratch1);
        self.initial(0);
        let first = self.positive_blocks == 0;
        // TB is clear after the initial rule and stays clear through the first block (which writes
        // AB directly), so only the third and later positive blocks need to clear it.
        if self.positive_blocks >= 2 {
            self.rules.push(Rule::new(vec![], Target::ClearMark(tb)));
        }
        let bit = if first { ab } else { tb };
        for m in alternatives {
            self.rules.push(Rule::new(
                m,
                Target::SetMark {
                    value: bit,
                    mask: bit,
                },
            ));
        }
        if !first {
            let m = vec![Match::Mark {
                value: 0,
                mask: tb,
                negated: false,
            }];
            self.rules.push(Rule::new(m, Target::ClearMark(ab)));
        }
        self.positive_blocks += 1;
    }

    fn negated_nets(&mut self, side: Side, nets: &[IpNet]) {
        let ab = self.marks.scratch0;
        self.initial(ab);
        for n in nets {
            let m = vec![Match::Net {
                side,
                net: *n,
                negated: false,
            }];
            self.rules.push(Rule::new(m, Target::ClearMark(ab)));
        }
    }
}

/// `-m set [!] --match-set cali4|60c:<hash> src|dst` on the set holding exactly `nets` (of
/// family `v`, no `/0`: `filter_nets` took those out).
fn net_set_match(v: IpVersion, side: Side, nets: &[IpNet], negated: bool) -> Match {
    let nets = names::canonical_nets(nets);
    Match::NetSet {
        name: names::ipset_name(v, &names::net_set_id(v, &nets)),
        side,
        nets: nets.into(),
        negated,
    }
}

fn proto_match(p: Option<Protocol>) -> Vec<Match> {
    p.map(|proto| Match::Protocol {
        proto,
        negated: false,
    })
    .into_iter()
    .collect()
}

/// Renders rule `index` of a chain for `ctx.version`; `Ok(vec![])` when it does not apply.
pub fn render_rule(
    rule: &ParsedRule,
    index: usize,
    ctx: &RuleCtx<'_>,
) -> Result<Vec<Rule>, RuleError> {
    let v = ctx.version;
    if !rule_applies_to(rule, v) {
        return Ok(Vec::new());
    }
    let (Some(src_nets), Some(not_src_nets), Some(dst_nets), Some(not_dst_nets)) = (
        filter_nets(&rule.src_nets, v, false),
        filter_nets(&rule.not_src_nets, v, true),
        filter_nets(&rule.dst_nets, v, false),
        filter_nets(&rule.not_dst_nets, v, true),
    ) else {
        return Ok(Vec::new());
    };
    check_ports(rule, index)?;
    let set = |ids: &[String], field: &'static str| -> Result<Vec<String>, RuleError> {
        ids.iter()
            .map(|id| {
                (ctx.set_name)(id).ok_or_else(|| RuleError::UnknownIpSet {
                    index,
                    field,
                    id: id.clone(),
                })
            })
            .collect()
    };
    let src_sets = set(&rule.src_ip_set_ids, "source selector")?;
    let not_src_sets = set(&rule.not_src_ip_set_ids, "source notSelector")?;
    let mut dst_sets = set(&rule.dst_ip_set_ids, "destination selector")?;
    // `destination.domains`: the destination in the domain set, matched as Felix matches a
    // destination IP set (`-m set --match-set cali40d:... dst`). The graph sends one set per rule;
    // several would be alternatives (an OR block).
    let mut dst_domains = set(&rule.dst_domain_ip_set_ids, "destination domains")?;
    if dst_domains.len() == 1 {
        dst_sets.append(&mut dst_domains);
    }
    let not_dst_sets = set(&rule.not_dst_ip_set_ids, "destination notSelector")?;
    let mut src_named = set(&rule.src_named_port_ip_set_ids, "source named ports")?;
    let not_src_named = set(
        &rule.not_src_named_port_ip_set_ids,
        "source notPorts (named)",
    )?;
    let mut dst_named = set(&rule.dst_named_port_ip_set_ids, "destination named ports")?;
    let not_dst_named = set(
        &rule.not_dst_named_port_ip_set_ids,
        "destination notPorts (named)",
    )?;
    let icmp = icmp_match(rule.icmp, rule.protocol, v, index, "icmp", false)?;
    let not_icmp = icmp_match(rule.not_icmp, rule.protocol, v, index, "notICMP", true)?;

    let mut blocks = Blocks {
        marks: ctx.marks,
        rules: Vec::new(),
        used: false,
        positive_blocks: 0,
    };
    let mut src_port_splits = split_ports(&rule.src_ports);
    let mut dst_port_splits = split_ports(&rule.dst_ports);
    for (side, splits, named) in [
        (Side::Src, &mut src_port_splits, &mut src_named),
        (Side::Dst, &mut dst_port_splits, &mut dst_named),
    ] {
        if splits.len() + named.len() > 1 {
            let flags = if side == Side::Src {
                SetFlags::SrcSrc
            } else {
                SetFlags::DstDst
            };
            let mut alts: Vec<Vec<Match>> = Vec::new();
            for ports in splits.drain(..) {
                let mut m = proto_match(rule.protocol);
                m.push(Match::Ports {
                    side,
                    ports,
                    negated: false,
                });
                alts.push(m);
            }
            for name in named.drain(..) {
                alts.push(vec![Match::Set {
                    name,
                    flags,
                    negated: false,
                }]);
            }
            blocks.positive(alts);
        }
    }
    if dst_domains.len() > 1 {
        let alts = dst_domains
            .drain(..)
            .map(|name| {
                vec![Match::Set {
                    name,
                    flags: SetFlags::Dst,
                    negated: false,
                }]
            })
            .collect();
        blocks.positive(alts);
    }
    let mut src_nets = src_nets;
    let mut dst_nets = dst_nets;
    // With `ctx.net_sets`, the set matches that stand for a side's net lists (positive, negated).
    let mut src_net_sets: [Option<Match>; 2] = [None, None];
    let mut dst_net_sets: [Option<Match>; 2] = [None, None];
    for (side, nets, set) in [
        (Side::Src, &mut src_nets, &mut src_net_sets[0]),
        (Side::Dst, &mut dst_nets, &mut dst_net_sets[0]),
    ] {
        if nets.len() > 1 && ctx.net_sets {
            *set = Some(net_set_match(v, side, nets, false));
            nets.clear();
        } else if nets.len() > 1 {
            let alts = nets
                .drain(..)
                .map(|net| {
                    vec![Match::Net {
                        side,
                        net,
                        negated: false,
                    }]
                })
                .collect();
            blocks.positive(alts);
        }
    }
    let mut not_src_nets = not_src_nets;
    let mut not_dst_nets = not_dst_nets;
    // `pos` holds at most the one net of the main rule's `-s`/`-d` here; iptables takes one.
    for (side, pos, neg, set) in [
        (
            Side::Src,
            &src_nets,
            &mut not_src_nets,
            &mut src_net_sets[1],
        ),
        (
            Side::Dst,
            &dst_nets,
            &mut not_dst_nets,
            &mut dst_net_sets[1],
        ),
    ] {
        if pos.len() + neg.len() > 1 && ctx.net_sets {
            *set = Some(net_set_match(v, side, neg, true));
            neg.clear();
        } else if pos.len() + neg.len() > 1 {
            blocks.negated_nets(side, neg);
            neg.clear();
        }
    }
    let [src_net_set, not_src_net_set] = src_net_sets;
    let [dst_net_set, not_dst_net_set] = dst_net_sets;

    // The main rule, in CalculateRuleMatch order.
    let mut m = proto_match(rule.protocol);
    let net = |side, net: &IpNet, negated| Match::Net {
        side,
        net: *net,
        negated,
    };
    fn sets(names: &[String], flags: SetFlags, negated: bool) -> impl Iterator<Item = Match> + '_ {
        names.iter().map(move |name| Match::Set {
            name: name.clone(),
            flags,
            negated,
        })
    }
    m.extend(src_nets.first().map(|n| net(Side::Src, n, false)));
    m.extend(src_net_set);
    m.extend(sets(&src_sets, SetFlags::Src, false));
    m.extend(src_port_splits.pop().map(|ports| Match::Ports {
        side: Side::Src,
        ports,
        negated: false,
    }));
    m.extend(sets(&src_named, SetFlags::SrcSrc, false));
    m.extend(dst_nets.first().map(|n| net(Side::Dst, n, false)));
    m.extend(dst_net_set);
    m.extend(sets(&dst_sets, SetFlags::Dst, false));
    m.extend(dst_port_splits.pop().map(|ports| Match::Ports {
        side: Side::Dst,
        ports,
        negated: false,
    }));
    m.extend(sets(&dst_named, SetFlags::DstDst, false));
    m.extend(icmp);
    m.extend(rule.not_protocol.map(|proto| Match::Protocol {
        proto,
        negated: true,
    }));
    m.extend(not_src_nets.first().map(|n| net(Side::Src, n, true)));
    m.extend(not_src_net_set);
    m.extend(sets(&not_src_sets, SetFlags::Src, true));
    for ports in split_ports(&rule.not_src_ports) {
        m.push(Match::Ports {
            side: Side::Src,
            ports,
            negated: true,
        });
    }
    m.extend(sets(&not_src_named, SetFlags::SrcSrc, true));
    m.extend(not_dst_nets.first().map(|n| net(Side::Dst, n, true)));
    m.extend(not_dst_net_set);
    m.extend(sets(&not_dst_sets, SetFlags::Dst, true));
    for ports in split_ports(&rule.not_dst_ports) {
        m.push(Match::Ports {
            side: Side::Dst,
            ports,
            negated: true,
        });
    }
    m.extend(sets(&not_dst_named, SetFlags::DstDst, true));
    m.extend(not_icmp);
    if blocks.used {
        let ab = ctx.marks.scratch0;
        m.push(Match::Mark {
            value: ab,
            mask: ab,
            negated: false,
        });
    }

    let mut out = blocks.rules;
    let mark_rule = |bit: u32, m: Vec<Match>| {
        Rule::new(
            m,
            Target::SetMark {
                value: bit,
                mask: bit,
            },
        )
    };
    let on_bit = |bit: u32| {
        vec![Match::Mark {
            value: bit,
            mask: bit,
            negated: false,
        }]
    };
    let log_head = |verdict: char| {
        format!(
            "{verdict}{}{}{index}",
            ctx.owner,
            if ctx.ingress { 'I' } else { 'E' }
        )
    };
    let deny_log_head = || log_head('D');
    // Flow logs: the verdicts besides Deny that are logged (Felix's `A…` and `N…` prefixes).
    let flow_log = ctx.deny_log.filter(|d| d.flow_logs);
    match rule.action() {
        action @ (Action::Allow | Action::Pass | Action::Deny) if ctx.verdict_chains => {
            let chain = match action {
                Action::Allow => VERDICT_ACCEPT,
                Action::Pass => VERDICT_PASS,
                _ => VERDICT_DROP,
            };
            if let (Action::Deny, Some(d)) = (action, ctx.deny_log) {
                // The same matches, rate-limited, log first (matches have no side effects).
                out.push(d.rule(m.clone(), ctx.ingress, &deny_log_head(), ctx.owner_id));
            }
            if let (Action::Allow | Action::Pass, Some(d)) = (action, flow_log) {
                let head = log_head(if action == Action::Allow { 'A' } else { 'N' });
                out.push(d.rule(m.clone(), ctx.ingress, &head, ctx.owner_id));
            }
            out.push(Rule::new(m, Target::Goto(chain.into())));
        }
        Action::Allow => {
            out.push(mark_rule(ctx.marks.accept, m));
            if let Some(d) = flow_log {
                let on = on_bit(ctx.marks.accept);
                out.push(d.rule(on, ctx.ingress, &log_head('A'), ctx.owner_id));
            }
            out.push(Rule::new(on_bit(ctx.marks.accept), Target::Return));
        }
        Action::Pass => {
            out.push(mark_rule(ctx.marks.pass, m));
            if let Some(d) = flow_log {
                let on = on_bit(ctx.marks.pass);
                out.push(d.rule(on, ctx.ingress, &log_head('N'), ctx.owner_id));
            }
            out.push(Rule::new(on_bit(ctx.marks.pass), Target::Return));
        }
        Action::Deny => {
            out.push(mark_rule(ctx.marks.drop, m));
            if let Some(d) = ctx.deny_log {
                out.push(d.rule(
                    on_bit(ctx.marks.drop),
                    ctx.ingress,
                    &deny_log_head(),
                    ctx.owner_id,
                ));
            }
            out.push(Rule::new(on_bit(ctx.marks.drop), Target::Drop));
        }
        Action::Log => out.push(Rule::new(m, log_target(index, ctx))),
    }
    let mut annotations = rule.annotations.clone();
    annotations.sort();
    for r in &mut out {
        for (k, v) in &annotations {
            r.push_comment(&format!("{k}={v}"));
        }
    }
    Ok(out)
}

fn check_ports(rule: &ParsedRule, index: usize) -> Result<(), RuleError> {
    let port_proto = rule.protocol.is_some_and(|p| p.supports_ports());
    for (field, ports) in [
        ("source ports", &rule.src_ports),
        ("source notPorts", &rule.not_src_ports),
        ("destination ports", &rule.dst_ports),
        ("destination notPorts", &rule.not_dst_ports),
    ] {
        if !ports.is_empty() && !port_proto {
            let protocol = rule
                .protocol
                .map_or_else(|| "none".to_string(), |p| p.to_string());
            return Err(RuleError::PortsWithoutPortProtocol {
                index,
                field,
                protocol,
            });
        }
    }
    Ok(())
}

fn icmp_match(
    icmp: Option<calc_graph::proto::IcmpFields>,
    protocol: Option<Protocol>,
    v: IpVersion,
    index: usize,
    field: &'static str,
    negated: bool,
) -> Result<Option<Match>, RuleError> {
    let Some(f) = icmp else { return Ok(None) };
    let Some(type_) = f.type_ else {
        if f.code.is_some() {
            return Err(RuleError::IcmpCodeWithoutType { index, field });
        }
        return Ok(None);
    };
    let (ok, needed) = match v {
        IpVersion::V4 => (
            matches!(protocol, Some(Protocol::Icmp | Protocol::Number(1))),
            "ICMP",
        ),
        IpVersion::V6 => (
            matches!(protocol, Some(Protocol::IcmpV6 | Protocol::Number(58))),
            "ICMPv6",
        ),
    };
    if !ok {
        return Err(RuleError::IcmpWithoutProtocol {
            index,
            field,
            needed,
            version: v.number(),
        });
    }
    Ok(Some(Match::Icmp {
        v6: v == IpVersion::V6,
        type_,
        code: f.code,
        negated,
    }))
}

/// Longest NFLOG prefix the kernel takes (`xt_nflog_info.prefix[64]` with the NUL).
pub const MAX_NFLOG_PREFIX_LEN: usize = 63;

fn log_target(index: usize, ctx: &RuleCtx<'_>) -> Target {
    match ctx.log_action {
        LogAction::Log => Target::Log {
            prefix: ctx.log_prefix.to_string(),
        },
        LogAction::Nflog { group } => {
            let dir = if ctx.ingress { 'I' } else { 'E' };
            Target::Nflog {
                group: *group,
                prefix: nflog_prefix(&format!("L{}{dir}{index}", ctx.owner), ctx.owner_id),
                size: None,
            }
        }
    }
}

/// `<head>|<id>` with unsafe characters replaced by `_`; when longer than 63 characters the id is
/// replaced by `_` + base64url(SHA-256(id)), cut to fit (deterministic).
pub fn nflog_prefix(head: &str, id: &str) -> String {
    let clean: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._:/=-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let full = format!("{head}|{clean}");
    if full.len() <= MAX_NFLOG_PREFIX_LEN {
        return full;
    }
    super::names::hashed_id(&format!("{head}|"), id, MAX_NFLOG_PREFIX_LEN)
}

/// Renders one direction of a policy or profile into a chain's rules: the rules in order, trailing
/// RETURNs stripped, and `comment` appended to the first rule's comments (a counter-only rule when
/// there are no rules), as Felix's `ProtoRulesToIptablesRules` does.
pub fn render_rules(
    rules: &[ParsedRule],
    comment: &str,
    ctx: &RuleCtx<'_>,
) -> Result<Vec<Rule>, RuleError> {
    render_rules_after(rules, comment, ctx, Vec::new())
}

/// A profile's chain. Profiles are entered with the pass bit possibly still set (by the last
/// tier's Pass, or by an earlier profile's Pass), so a profile with a Pass rule first clears it;
/// otherwise its "RETURN if pass bit" rule would fire before its own rules matched and skip the
/// rest of the profile (Felix has this bug: a later Deny in the profile could be skipped and a
/// later profile allow the packet). Profiles without Pass rules are byte-identical to Felix's.
pub fn render_profile_rules(
    rules: &[ParsedRule],
    comment: &str,
    ctx: &RuleCtx<'_>,
) -> Result<Vec<Rule>, RuleError> {
    let lead = if rules.iter().any(|r| r.action() == Action::Pass) {
        vec![Rule::new(vec![], Target::ClearMark(ctx.marks.pass))]
    } else {
        Vec::new()
    };
    render_rules_after(rules, comment, ctx, lead)
}

fn render_rules_after(
    rules: &[ParsedRule],
    comment: &str,
    ctx: &RuleCtx<'_>,
    lead: Vec<Rule>,
) -> Result<Vec<Rule>, RuleError> {
    let mut out = lead;
    for (i, r) in rules.iter().enumerate() {
        out.extend(render_rule(r, i, ctx)?);
    }
    while out
        .last()
        .is_some_and(|r| r.target == Some(crate::model::Target::Return))
    {
        out.pop();
    }
    if out.is_empty() {
        out.push(Rule::default());
    }
    out[0].push_comment(comment);
    Ok(out)
}
