//! [`Rule`]: one `-A CHAIN …` line, with the base options typed and rendered in kernel order.

use std::fmt;
use std::fmt::Write as _;

use ipnet::IpNet;

use super::text::Word;
use super::{ChainName, Counters, Iface, Match, ModelError, Target};

/// A value with an optional `!` in front of its option (`! -s 10.0.0.0/8`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Negatable<T> {
    pub negated: bool,
    pub value: T,
}

impl<T> Negatable<T> {
    pub fn is(value: T) -> Self {
        Self {
            negated: false,
            value,
        }
    }

    pub fn not(value: T) -> Self {
        Self {
            negated: true,
            value,
        }
    }
}

/// Address of `-s`/`-d`. The kernel prints CIDR (`10.0.0.0/8`, `fd00::/64`); anything else it prints
/// (a non-contiguous dotted mask `10.0.2.0/255.0.255.0`) or a program wrote (bare host, host name) is
/// kept verbatim in `Other`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Addr {
    Net(IpNet),
    Other(Word),
}

impl Addr {
    /// Parses a token: `Net` only when the `IpNet` spelling is exactly the token.
    pub fn from_token(s: &str) -> Result<Self, ModelError> {
        // What `s.parse::<IpNet>()` does, without first trying IPv4 on IPv6 text (an IPv4 net
        // never contains ':' and an IPv6 one always does).
        let parsed = if s.contains(':') {
            s.parse::<ipnet::Ipv6Net>().map(IpNet::V6)
        } else {
            s.parse::<ipnet::Ipv4Net>().map(IpNet::V4)
        };
        if let Ok(net) = parsed
            && canonical_net(&net, s)
        {
            return Ok(Self::Net(net));
        }
        Ok(Self::Other(Word::new(s)?))
    }
}

/// Whether `net` displays exactly as `s`. IPv4 (the common case) without formatting: a parsed
/// `a.b.c.d/p` is canonical unless a number has a leading zero.
fn canonical_net(net: &IpNet, s: &str) -> bool {
    match net {
        IpNet::V4(_) => {
            s.contains('/') && s.split(['.', '/']).all(|p| p == "0" || !p.starts_with('0'))
        }
        IpNet::V6(n) => {
            let fast = v6_spelled_as(n, s);
            debug_assert_eq!(fast, spelled_as(net, s), "IPv6 spelling check for {s:?}");
            fast
        }
    }
}

/// Whether `net` displays exactly as `s`, without `core::fmt` (the formatted check was 40% of
/// parsing an IPv6 dump). Mirrors `Ipv6Addr`'s Display (RFC 5952): IPv4-mapped addresses as
/// `::ffff:a.b.c.d`; otherwise lowercase groups without leading zeros, the first longest run of
/// two or more zero groups written `::`; then `/len`. Debug builds cross-check it against the
/// formatted spelling, and a proptest compares the two on random addresses.
pub(crate) fn v6_spelled_as(net: &ipnet::Ipv6Net, s: &str) -> bool {
    let mut b = Spell::default();
    let addr = net.addr();
    if let Some(v4) = addr.to_ipv4_mapped() {
        b.bytes(b"::ffff:");
        for (i, o) in v4.octets().into_iter().enumerate() {
            if i > 0 {
                b.byte(b'.');
            }
            b.dec(o);
        }
    } else {
        let seg = addr.segments();
        let (mut best, mut best_len, mut cur, mut cur_len) = (0, 0, 0, 0);
        for (i, &g) in seg.iter().enumerate() {
            if g == 0 {
                if cur_len == 0 {
                    cur = i;
                }
                cur_len += 1;
                if cur_len > best_len {
                    (best, best_len) = (cur, cur_len);
                }
            } else {
                cur_len = 0;
            }
        }
        if best_len > 1 {
            b.groups(&seg[..best]);
            b.bytes(b"::");
            b.groups(&seg[best + best_len..]);
        } else {
            b.groups(&seg);
        }
    }
    b.byte(b'/');
    b.dec(net.prefix_len());
    &b.buf[..b.len] == s.as_bytes()
}

/// A stack buffer for [`v6_spelled_as`] (longest spelling: 39 bytes of address + `/128`).
struct Spell {
    buf: [u8; 48],
    len: usize,
}

impl Default for Spell {
    fn default() -> Self {
        Self {
            buf: [0; 48],
            len: 0,
        }
    }
}

impl Spell {
    fn byte(&mut self, c: u8) {
        self.buf[self.len] = c;
        self.len += 1;
    }

    fn bytes(&mut self, s: &[u8]) {
        for &c in s {
            self.byte(c);
        }
    }

    fn dec(&mut self, v: u8) {
        if v >= 100 {
            self.byte(b'0' + v / 100);
        }
        if v >= 10 {
            self.byte(b'0' + v / 10 % 10);
        }
        self.byte(b'0' + v % 10);
    }

    /// Groups in lowercase hex without leading zeros, `:`-separated.
    fn groups(&mut self, gs: &[u16]) {
        for (i, &g) in gs.iter().enumerate() {
            if i > 0 {
                self.byte(b':');
            }
            let digits = (16 - g.leading_zeros()).div_ceil(4).max(1);
            for k in (0..digits).rev() {
                self.byte(b"0123456789abcdef"[usize::from((g >> (k * 4)) & 0xf)]);
            }
        }
    }
}

/// Whether `v` displays exactly as `s` (no allocation).
fn spelled_as(v: &impl fmt::Display, s: &str) -> bool {
    struct Cmp<'a>(&'a str);
    impl fmt::Write for Cmp<'_> {
        fn write_str(&mut self, part: &str) -> fmt::Result {
            self.0 = self.0.strip_prefix(part).ok_or(fmt::Error)?;
            Ok(())
        }
    }
    let mut c = Cmp(s);
    write!(c, "{v}").is_ok() && c.0.is_empty()
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Net(n) => write!(f, "{n}"),
            Self::Other(w) => f.write_str(w.as_str()),
        }
    }
}

impl From<IpNet> for Addr {
    fn from(n: IpNet) -> Self {
        Self::Net(n)
    }
}

/// `-p` protocol, spelled as iptables-save prints it (`Icmpv6` is `ipv6-icmp`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
    Icmp,
    Icmpv6,
    Other(Word),
}

impl Protocol {
    pub fn from_token(s: &str) -> Result<Self, ModelError> {
        Ok(match s {
            "tcp" => Self::Tcp,
            "udp" => Self::Udp,
            "sctp" => Self::Sctp,
            "icmp" => Self::Icmp,
            "ipv6-icmp" => Self::Icmpv6,
            _ => Self::Other(Word::new(s)?),
        })
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
            Self::Icmp => "icmp",
            Self::Icmpv6 => "ipv6-icmp",
            Self::Other(w) => w.as_str(),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rule. Field order is the kernel's print order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub chain: ChainName,
    /// `[packets:bytes]` prefix (only in `iptables-save -c` output / `iptables-restore -c` input).
    pub counters: Option<Counters>,
    pub src: Option<Negatable<Addr>>,
    pub dst: Option<Negatable<Addr>>,
    pub in_iface: Option<Negatable<Iface>>,
    pub out_iface: Option<Negatable<Iface>>,
    pub protocol: Option<Negatable<Protocol>>,
    /// `-f` (second and later fragments); `Negatable { negated: true, .. }` is `! -f`.
    pub fragment: Option<Negatable<()>>,
    pub matches: Vec<Match>,
    /// `None`: a rule that only counts.
    pub target: Option<Target>,
}

impl Rule {
    /// An empty rule in `chain` (matches everything, no target).
    pub fn new(chain: ChainName) -> Self {
        Self {
            chain,
            counters: None,
            src: None,
            dst: None,
            in_iface: None,
            out_iface: None,
            protocol: None,
            fragment: None,
            matches: Vec::new(),
            target: None,
        }
    }

    /// Builder: adds a match at the end.
    pub fn with_match(mut self, m: Match) -> Self {
        self.matches.push(m);
        self
    }

    /// Builder: sets the target.
    pub fn with_target(mut self, t: Target) -> Self {
        self.target = Some(t);
        self
    }

    /// The values of all `-m comment --comment` matches, in order.
    pub fn comments(&self) -> impl Iterator<Item = &str> {
        self.matches.iter().filter_map(|m| match m {
            Match::Comment(t) => Some(t.as_str()),
            _ => None,
        })
    }

    pub fn first_comment(&self) -> Option<&str> {
        self.comments().next()
    }

    /// The first comment starting with `cali:` (Felix's rule hash), prefix included.
    pub fn cali_comment(&self) -> Option<&str> {
        self.comments().find(|c| c.starts_with("cali:"))
    }

    /// `[p:b] -A CHAIN spec` (counters only when present), exactly as `iptables-save` prints it.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(128);
        self.render_into(&mut out);
        out
    }

    /// Appends [`Rule::render`] to `out`.
    pub fn render_into(&self, out: &mut String) {
        if let Some(c) = self.counters {
            let _ = write!(out, "{}", c);
            out.push(' ');
        }
        out.push_str("-A ");
        out.push_str(self.chain.as_str());
        self.render_spec_into(out);
    }

    /// The rule without `-A CHAIN` and counters, e.g. `-p tcp -m tcp --dport 80 -j ACCEPT`; the form to
    /// compare desired vs. kernel rules and to use after `-I CHAIN n` / `-R CHAIN n` / `-D CHAIN`.
    pub fn render_spec(&self) -> String {
        let mut out = String::with_capacity(128);
        self.render_spec_into(&mut out);
        out.drain(..out.len().min(1));
        out
    }

    /// Appends the spec with a leading space (`" -s 10.0.0.0/8 -j ACCEPT"`); nothing for an empty rule.
    pub fn render_spec_into(&self, out: &mut String) {
        fn neg<T>(out: &mut String, v: &Negatable<T>, opt: &str) {
            if v.negated {
                out.push_str(" !");
            }
            out.push(' ');
            out.push_str(opt);
        }
        if let Some(v) = &self.src {
            neg(out, v, "-s ");
            let _ = write!(out, "{}", v.value);
        }
        if let Some(v) = &self.dst {
            neg(out, v, "-d ");
            let _ = write!(out, "{}", v.value);
        }
        if let Some(v) = &self.in_iface {
            neg(out, v, "-i ");
            out.push_str(v.value.as_str());
        }
        if let Some(v) = &self.out_iface {
            neg(out, v, "-o ");
            out.push_str(v.value.as_str());
        }
        if let Some(v) = &self.protocol {
            neg(out, v, "-p ");
            out.push_str(v.value.as_str());
        }
        if let Some(v) = &self.fragment {
            neg(out, v, "-f");
        }
        for m in &self.matches {
            m.render_into(out);
        }
        if let Some(t) = &self.target {
            t.render_into(out);
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}
