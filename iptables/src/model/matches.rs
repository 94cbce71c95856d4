//! [`Match`]: one `-m module options…` group of a rule, typed for what Calico-style rules use.
//!
//! Each typed variant renders exactly the option order and number format `iptables-save` uses for
//! that module (hex marks without leading zeros, conntrack states in bit order, …). Anything else is
//! [`Match::Generic`], an ordered token list that renders back verbatim.

use std::fmt;
use std::fmt::Write as _;

use super::text::{push_dec, push_hex};
use super::{Arg, Negatable, SetName, Text, Word};

/// A port or port range as printed by tcp/udp/multiport (`80`, `1024:65535`): calc-graph's,
/// the same type the policy rules carry.
pub use calc_graph::proto::PortRange;

/// Appends a port range's Display form (`80`, `1024:65535`).
pub(crate) fn push_port_range(p: PortRange, out: &mut String) {
    push_dec(out, p.first.into());
    if p.first != p.last {
        out.push(':');
        push_dec(out, p.last.into());
    }
}

/// The ports of `-m tcp` / `-m udp` (`--sport` then `--dport`, each negatable).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ports {
    pub sport: Option<Negatable<PortRange>>,
    pub dport: Option<Negatable<PortRange>>,
}

/// Which ports `-m multiport` compares. The kernel saves Felix's `--source-ports` /
/// `--destination-ports` as `--sports` / `--dports`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortsKind {
    Source,
    Destination,
    Either,
}

impl PortsKind {
    pub fn option(self) -> &'static str {
        match self {
            Self::Source => "--sports",
            Self::Destination => "--dports",
            Self::Either => "--ports",
        }
    }
}

/// One conntrack state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CtState {
    Invalid,
    New,
    Related,
    Established,
    Untracked,
    Snat,
    Dnat,
}

impl CtState {
    /// In the kernel's print (bit) order.
    pub const ALL: [CtState; 7] = [
        Self::Invalid,
        Self::New,
        Self::Related,
        Self::Established,
        Self::Untracked,
        Self::Snat,
        Self::Dnat,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Invalid => "INVALID",
            Self::New => "NEW",
            Self::Related => "RELATED",
            Self::Established => "ESTABLISHED",
            Self::Untracked => "UNTRACKED",
            Self::Snat => "SNAT",
            Self::Dnat => "DNAT",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// A set of conntrack states; always printed in the kernel's order, comma separated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtStates(u8);

impl CtStates {
    pub fn of(states: &[CtState]) -> Self {
        Self(states.iter().fold(0, |acc, s| acc | 1 << (*s as u8)))
    }

    /// This set plus `s`.
    pub fn with(self, s: CtState) -> Self {
        Self(self.0 | 1 << (s as u8))
    }

    /// Appends the Display form (`NEW,ESTABLISHED`).
    pub(crate) fn push_to(self, out: &mut String) {
        for (i, s) in self.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(s.as_str());
        }
    }

    pub fn contains(self, s: CtState) -> bool {
        self.0 & (1 << (s as u8)) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = CtState> {
        CtState::ALL.into_iter().filter(move |s| self.contains(*s))
    }
}

impl fmt::Display for CtStates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(s.as_str())?;
        }
        Ok(())
    }
}

/// One direction flag of `--match-set NAME src,dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetDir {
    Src,
    Dst,
}

impl SetDir {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Src => "src",
            Self::Dst => "dst",
        }
    }
}

/// `--icmp-type` / `--icmpv6-type` value as printed (`8`, `3/4`, `any`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IcmpType {
    Any,
    Type(u8),
    TypeCode(u8, u8),
}

impl fmt::Display for IcmpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("any"),
            Self::Type(t) => write!(f, "{t}"),
            Self::TypeCode(t, c) => write!(f, "{t}/{c}"),
        }
    }
}

/// `-m addrtype` address type names (kernel bit order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddrType {
    Unspec,
    Unicast,
    Local,
    Broadcast,
    Anycast,
    Multicast,
    Blackhole,
    Unreachable,
    Prohibit,
    Throw,
    Nat,
    Xresolve,
}

impl AddrType {
    pub const ALL: [AddrType; 12] = [
        Self::Unspec,
        Self::Unicast,
        Self::Local,
        Self::Broadcast,
        Self::Anycast,
        Self::Multicast,
        Self::Blackhole,
        Self::Unreachable,
        Self::Prohibit,
        Self::Throw,
        Self::Nat,
        Self::Xresolve,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspec => "UNSPEC",
            Self::Unicast => "UNICAST",
            Self::Local => "LOCAL",
            Self::Broadcast => "BROADCAST",
            Self::Anycast => "ANYCAST",
            Self::Multicast => "MULTICAST",
            Self::Blackhole => "BLACKHOLE",
            Self::Unreachable => "UNREACHABLE",
            Self::Prohibit => "PROHIBIT",
            Self::Throw => "THROW",
            Self::Nat => "NAT",
            Self::Xresolve => "XRESOLVE",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// Time unit of a `-m limit` rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RateUnit {
    Second,
    Minute,
    Hour,
    Day,
}

impl RateUnit {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Second => "sec",
            Self::Minute => "min",
            Self::Hour => "hour",
            Self::Day => "day",
        }
    }
}

/// `--limit N/unit` as printed (`5/min`, `1/sec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    pub count: u32,
    pub unit: RateUnit,
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, self.unit.as_str())
    }
}

/// One match of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Match {
    /// `-m comment --comment TEXT` (at most 255 bytes are kept by the kernel).
    Comment(Text),
    /// `-m conntrack [!] --ctstate A,B`.
    Conntrack { negated: bool, states: CtStates },
    /// `-m state [!] --state A,B` (the legacy spelling).
    State { negated: bool, states: CtStates },
    /// `-m mark [!] --mark 0xV[/0xM]` (mask omitted when it is `0xffffffff`).
    Mark {
        negated: bool,
        value: u32,
        mask: u32,
    },
    /// `-m set [!] --match-set NAME src|dst[,…]`.
    Set {
        negated: bool,
        name: SetName,
        dirs: Vec<SetDir>,
    },
    /// `-m multiport [!] --sports|--dports|--ports P,P:Q`.
    Multiport {
        negated: bool,
        kind: PortsKind,
        ports: Vec<PortRange>,
    },
    /// `-m tcp [[!] --sport P] [[!] --dport P]`.
    Tcp(Ports),
    /// `-m udp [[!] --sport P] [[!] --dport P]`.
    Udp(Ports),
    /// `-m icmp [!] --icmp-type T[/C]`.
    Icmp { negated: bool, icmp_type: IcmpType },
    /// `-m icmp6 [!] --icmpv6-type T[/C]`.
    Icmpv6 { negated: bool, icmp_type: IcmpType },
    /// `-m addrtype [[!] --src-type T,…] [[!] --dst-type T,…] [--limit-iface-in] [--limit-iface-out]`.
    Addrtype {
        src: Option<Negatable<Vec<AddrType>>>,
        dst: Option<Negatable<Vec<AddrType>>>,
        limit_iface_in: bool,
        limit_iface_out: bool,
    },
    /// `-m limit --limit N/unit [--limit-burst B]` (the kernel omits the default burst 5).
    Limit { rate: Rate, burst: Option<u32> },
    /// Any other module, or a typed module with options the typed form does not hold.
    Generic { module: Word, args: Vec<Arg> },
}

fn push_neg(out: &mut String, negated: bool) {
    if negated {
        out.push_str(" !");
    }
}

fn push_ports(out: &mut String, ports: &Ports) {
    if let Some(p) = &ports.sport {
        push_neg(out, p.negated);
        out.push_str(" --sport ");
        push_port_range(p.value, out);
    }
    if let Some(p) = &ports.dport {
        push_neg(out, p.negated);
        out.push_str(" --dport ");
        push_port_range(p.value, out);
    }
}

fn push_addr_types(out: &mut String, opt: &str, v: &Negatable<Vec<AddrType>>) {
    push_neg(out, v.negated);
    out.push(' ');
    out.push_str(opt);
    out.push(' ');
    for (i, t) in v.value.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(t.as_str());
    }
}

impl Match {
    /// `-m comment --comment s`; fails for strings restore cannot carry or longer than 255 bytes
    /// (the kernel would silently truncate them, so the rule would never compare equal).
    pub fn comment(s: impl Into<String>) -> Result<Self, super::ModelError> {
        let s = s.into();
        if s.len() > 255 {
            return Err(super::ModelError::new(
                "comment",
                &s,
                "is longer than 255 bytes".into(),
            ));
        }
        Ok(Self::Comment(Text::new(s)?))
    }

    /// The IP set this match reads, if it is `-m set`.
    pub fn set_name(&self) -> Option<&str> {
        match self {
            Self::Set { name, .. } => Some(name.as_str()),
            _ => None,
        }
    }

    /// The module name (`comment`, `conntrack`, …).
    pub fn module(&self) -> &str {
        match self {
            Self::Comment(_) => "comment",
            Self::Conntrack { .. } => "conntrack",
            Self::State { .. } => "state",
            Self::Mark { .. } => "mark",
            Self::Set { .. } => "set",
            Self::Multiport { .. } => "multiport",
            Self::Tcp(_) => "tcp",
            Self::Udp(_) => "udp",
            Self::Icmp { .. } => "icmp",
            Self::Icmpv6 { .. } => "icmp6",
            Self::Addrtype { .. } => "addrtype",
            Self::Limit { .. } => "limit",
            Self::Generic { module, .. } => module.as_str(),
        }
    }

    /// Appends ` -m module options…` (leading space included).
    pub fn render_into(&self, out: &mut String) {
        out.push_str(" -m ");
        out.push_str(self.module());
        match self {
            Self::Comment(t) => {
                out.push_str(" --comment ");
                t.render_into(out);
            }
            Self::Conntrack { negated, states } => {
                push_neg(out, *negated);
                out.push_str(" --ctstate ");
                states.push_to(out);
            }
            Self::State { negated, states } => {
                push_neg(out, *negated);
                out.push_str(" --state ");
                states.push_to(out);
            }
            Self::Mark {
                negated,
                value,
                mask,
            } => {
                push_neg(out, *negated);
                out.push_str(" --mark ");
                push_hex(out, *value);
                if *mask != u32::MAX {
                    out.push('/');
                    push_hex(out, *mask);
                }
            }
            Self::Set {
                negated,
                name,
                dirs,
            } => {
                push_neg(out, *negated);
                out.push_str(" --match-set ");
                out.push_str(name.as_str());
                out.push(' ');
                for (i, d) in dirs.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(d.as_str());
                }
            }
            Self::Multiport {
                negated,
                kind,
                ports,
            } => {
                push_neg(out, *negated);
                out.push(' ');
                out.push_str(kind.option());
                out.push(' ');
                for (i, p) in ports.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    push_port_range(*p, out);
                }
            }
            Self::Tcp(p) | Self::Udp(p) => push_ports(out, p),
            Self::Icmp { negated, icmp_type } => {
                push_neg(out, *negated);
                out.push_str(" --icmp-type ");
                let _ = write!(out, "{}", icmp_type);
            }
            Self::Icmpv6 { negated, icmp_type } => {
                push_neg(out, *negated);
                out.push_str(" --icmpv6-type ");
                let _ = write!(out, "{}", icmp_type);
            }
            Self::Addrtype {
                src,
                dst,
                limit_iface_in,
                limit_iface_out,
            } => {
                if let Some(v) = src {
                    push_addr_types(out, "--src-type", v);
                }
                if let Some(v) = dst {
                    push_addr_types(out, "--dst-type", v);
                }
                if *limit_iface_in {
                    out.push_str(" --limit-iface-in");
                }
                if *limit_iface_out {
                    out.push_str(" --limit-iface-out");
                }
            }
            Self::Limit { rate, burst } => {
                out.push_str(" --limit ");
                let _ = write!(out, "{}", rate);
                if let Some(b) = burst {
                    let _ = write!(out, " --limit-burst {b}");
                }
            }
            Self::Generic { args, .. } => {
                for a in args {
                    out.push(' ');
                    a.render_into(out);
                }
            }
        }
    }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.render_into(&mut s);
        f.write_str(s.trim_start())
    }
}
