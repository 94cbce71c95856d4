//! Recognising typed matches/targets in option tokens.
//!
//! A typed variant is chosen only when rendering it gives back exactly the tokens it came from
//! (the "canonical check"), so parse∘render is the identity on every input the kernel prints and
//! non-canonical program-written spellings (`--mark 16384`, `--dport ssh`) stay generic, verbatim.
//! Comments are the exception: they are always typed and re-quoted the kernel's way.
//!
//! For modules whose option set is small and fixed (tcp, udp, multiport, icmp, icmp6, mark, mac,
//! comment, state, limit, addrtype, set) unknown options, missing values and the pre-1.4 `--opt ! X` negation are rejected, as
//! iptables-restore 1.8 does.

use crate::model::text::push_quoted;
use crate::model::{
    AddrType, CtState, CtStates, IcmpType, Iface, Match, ModelError, Negatable, NflogLen,
    PortRange, Ports, PortsKind, Rate, RateUnit, SetDir, SetName, Target, Text, Word,
};

use std::collections::HashMap;

use super::lexer::Tok;
use super::rule::LineError;

/// Options (without `--`) and their number of values, for modules we validate.
const KNOWN: &[(&str, &[(&str, usize)])] = &[
    (
        "multiport",
        &[
            ("source-ports", 1),
            ("sports", 1),
            ("destination-ports", 1),
            ("dports", 1),
            ("ports", 1),
        ],
    ),
    (
        "udp",
        &[
            ("source-port", 1),
            ("sport", 1),
            ("destination-port", 1),
            ("dport", 1),
        ],
    ),
    (
        "tcp",
        &[
            ("source-port", 1),
            ("sport", 1),
            ("destination-port", 1),
            ("dport", 1),
            ("syn", 0),
            ("tcp-flags", 2),
            ("tcp-option", 1),
        ],
    ),
    ("icmp", &[("icmp-type", 1)]),
    ("icmp6", &[("icmpv6-type", 1)]),
    ("mark", &[("mark", 1)]),
    ("mac", &[("mac-source", 1)]),
    ("comment", &[("comment", 1)]),
    ("state", &[("state", 1)]),
    ("limit", &[("limit", 1), ("limit-burst", 1)]),
    (
        "addrtype",
        &[
            ("src-type", 1),
            ("dst-type", 1),
            ("limit-iface-in", 0),
            ("limit-iface-out", 0),
        ],
    ),
    (
        "set",
        &[
            ("match-set", 2),
            ("set", 2),
            ("return-nomatch", 0),
            ("update-counters", 0),
            ("update-subcounters", 0),
            ("packets-eq", 1),
            ("packets-lt", 1),
            ("packets-gt", 1),
            ("bytes-eq", 1),
            ("bytes-lt", 1),
            ("bytes-gt", 1),
        ],
    ),
];

fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Targets with a fixed option set (options without `--`, number of values).
const KNOWN_TARGETS: &[(&str, &[(&str, usize)])] = &[
    ("ACCEPT", &[]),
    ("DROP", &[]),
    ("RETURN", &[]),
    ("REJECT", &[("reject-with", 1)]),
    (
        "LOG",
        &[
            ("log-prefix", 1),
            ("log-level", 1),
            ("log-tcp-sequence", 0),
            ("log-tcp-options", 0),
            ("log-ip-options", 0),
            ("log-uid", 0),
            ("log-macdecode", 0),
        ],
    ),
    (
        "NFLOG",
        &[
            ("nflog-prefix", 1),
            ("nflog-group", 1),
            ("nflog-range", 1),
            ("nflog-size", 1),
            ("nflog-threshold", 1),
        ],
    ),
    (
        "MARK",
        &[
            ("set-xmark", 1),
            ("set-mark", 1),
            ("and-mark", 1),
            ("or-mark", 1),
            ("xor-mark", 1),
        ],
    ),
];

/// Whether a match (`target == false`) or target with a fixed option set is known.
/// Options of a match/target with a fixed option set (name without `--`, number of values).
pub(crate) type Opts = &'static [(&'static str, usize)];

pub(crate) fn options_of(name: &str, target: bool) -> Option<Opts> {
    let table = if target { KNOWN_TARGETS } else { KNOWN };
    table.iter().find(|(m, _)| *m == name).map(|(_, o)| *o)
}

/// getopt_long: exact names and unambiguous abbreviations.
fn lookup(opts: &'static [(&'static str, usize)], option: &str) -> Option<(&'static str, usize)> {
    let name = option.strip_prefix("--").filter(|n| !n.is_empty())?;
    opts.iter()
        .find(|(o, _)| *o == name)
        .or_else(|| opts.iter().find(|(o, _)| o.starts_with(name)))
        .copied()
}

/// For a match/target with a fixed option set: `Some(arity)` of a known `--option`, `Some(None)`
/// for an unknown one; `None` when the match/target is not one we know.
pub(crate) fn option_arity(opts: Option<Opts>, option: &str) -> Option<Option<usize>> {
    Some(lookup(opts?, option).map(|(_, a)| a))
}

/// Rejects unknown options / missing values for the targets in [`KNOWN_TARGETS`].
pub(crate) fn validate_known_target(name: &str, args: &[&Tok]) -> Result<(), LineError> {
    validate(name, true, args)
}

/// Rejects unknown options / missing values for the modules in [`KNOWN`].
pub(crate) fn validate_known_module(module: &str, args: &[&Tok]) -> Result<(), LineError> {
    validate(module, false, args)
}

fn validate(module: &str, target: bool, args: &[&Tok]) -> Result<(), LineError> {
    let Some(opts) = options_of(module, target) else {
        return Ok(());
    };
    let kind = if target { "target" } else { "match" };
    let mut i = 0;
    while i < args.len() {
        let t = args[i];
        if t.is("!") {
            i += 1;
            continue;
        }
        if t.quoted || !t.as_str().starts_with("--") {
            return Err((
                t.offset,
                format!("unexpected argument {:?} for {kind} {module}", t.as_str()),
            ));
        }
        let Some((full, arity)) = lookup(opts, t.as_str()) else {
            return Err((
                t.offset,
                format!("unknown option {:?} for {kind} {module}", t.as_str()),
            ));
        };
        for k in 1..=arity {
            let v = args.get(i + k).ok_or_else(|| {
                (
                    t.offset,
                    format!("option --{full} of {kind} {module} needs a value"),
                )
            })?;
            if v.is("!") {
                return Err((
                    v.offset,
                    format!(
                        "old negation syntax `--{full} ! X` is not accepted by iptables 1.8; write `! --{full} X`"
                    ),
                ));
            }
            if full == "mac-source" && !is_mac(v.as_str()) {
                return Err((v.offset, format!("invalid MAC address {:?}", v.as_str())));
            }
        }
        i += 1 + arity;
    }
    Ok(())
}

/// Per-parse state of the typed-form recognisers: the render buffer of the canonical check and
/// the set names seen so far (a dump names the same few sets thousands of times; interning shares
/// one `Arc<str>` instead of allocating two buffers per `--match-set`).
#[derive(Default)]
pub(crate) struct Scratch {
    text: String,
    sets: HashMap<Box<str>, SetName>,
    ifaces: HashMap<Box<str>, Iface>,
}

impl Scratch {
    /// `SetName::new(s)`, shared with earlier equal names of this parse.
    fn set_name(&mut self, s: &str) -> Option<SetName> {
        if let Some(n) = self.sets.get(s) {
            return Some(n.clone());
        }
        let n = SetName::new(s).ok()?;
        self.sets.insert(s.into(), n.clone());
        Some(n)
    }

    /// `Iface::new(s)`, shared with earlier equal names of this parse (`-i cali+` on most rules).
    pub(crate) fn iface(&mut self, s: &str) -> Result<Iface, ModelError> {
        if let Some(n) = self.ifaces.get(s) {
            return Ok(n.clone());
        }
        let n = Iface::new(s)?;
        self.ifaces.insert(s.into(), n.clone());
        Ok(n)
    }
}

/// `[ "!" ] rest…` -> (negated, rest).
fn neg<'x, 'y>(a: &'x [&'y str]) -> (bool, &'x [&'y str]) {
    match a {
        ["!", rest @ ..] => (true, rest),
        _ => (false, a),
    }
}

/// Number of items of a comma-separated list (sizes its vector exactly, one allocation).
fn comma_list_len(s: &str) -> usize {
    1 + s.bytes().filter(|&b| b == b',').count()
}

fn hex_u32(s: &str) -> Option<u32> {
    u32::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

fn port_range(s: &str) -> Option<PortRange> {
    match s.split_once(':') {
        Some((a, b)) => Some(PortRange::range(a.parse().ok()?, b.parse().ok()?)),
        None => Some(PortRange::single(s.parse().ok()?)),
    }
}

fn ct_states(s: &str) -> Option<CtStates> {
    let mut states = CtStates::default();
    for name in s.split(',') {
        states = states.with(CtState::from_name(name)?);
    }
    Some(states)
}

fn icmp_type(s: &str) -> Option<IcmpType> {
    if s == "any" {
        return Some(IcmpType::Any);
    }
    match s.split_once('/') {
        Some((t, c)) => Some(IcmpType::TypeCode(t.parse().ok()?, c.parse().ok()?)),
        None => Some(IcmpType::Type(s.parse().ok()?)),
    }
}

fn addr_types(s: &str) -> Option<Vec<AddrType>> {
    s.split(',').map(AddrType::from_name).collect()
}

fn rate(s: &str) -> Option<Rate> {
    let (n, u) = s.split_once('/')?;
    let unit = match u {
        "sec" => RateUnit::Second,
        "min" => RateUnit::Minute,
        "hour" => RateUnit::Hour,
        "day" => RateUnit::Day,
        _ => return None,
    };
    Some(Rate {
        count: n.parse().ok()?,
        unit,
    })
}

fn ports<'x>(mut a: &'x [&'x str]) -> Option<Ports> {
    let mut p = Ports::default();
    while !a.is_empty() {
        let (negated, rest) = neg(a);
        let [opt, v, rest @ ..] = rest else {
            return None;
        };
        let value = Some(Negatable {
            negated,
            value: port_range(v)?,
        });
        match *opt {
            "--sport" if p.sport.is_none() && p.dport.is_none() => p.sport = value,
            "--dport" if p.dport.is_none() => p.dport = value,
            _ => return None,
        }
        a = rest;
    }
    Some(p)
}

fn addrtype<'x>(mut a: &'x [&'x str]) -> Option<Match> {
    let (mut src, mut dst, mut lin, mut lout) = (None, None, false, false);
    while !a.is_empty() {
        let (negated, rest) = neg(a);
        match rest {
            ["--src-type", v, r @ ..] => {
                src = Some(Negatable {
                    negated,
                    value: addr_types(v)?,
                });
                a = r;
            }
            ["--dst-type", v, r @ ..] => {
                dst = Some(Negatable {
                    negated,
                    value: addr_types(v)?,
                });
                a = r;
            }
            ["--limit-iface-in", r @ ..] if !negated => {
                lin = true;
                a = r;
            }
            ["--limit-iface-out", r @ ..] if !negated => {
                lout = true;
                a = r;
            }
            _ => return None,
        }
    }
    Some(Match::Addrtype {
        src,
        dst,
        limit_iface_in: lin,
        limit_iface_out: lout,
    })
}

fn typed_match_unchecked(module: &str, a: &[&str], scratch: &mut Scratch) -> Option<Match> {
    let (negated, rest) = neg(a);
    Some(match (module, rest) {
        ("conntrack", ["--ctstate", s]) => Match::Conntrack {
            negated,
            states: ct_states(s)?,
        },
        ("state", ["--state", s]) => Match::State {
            negated,
            states: ct_states(s)?,
        },
        ("mark", ["--mark", v]) => {
            let (value, mask) = match v.split_once('/') {
                Some((v, m)) => (hex_u32(v)?, hex_u32(m)?),
                None => (hex_u32(v)?, u32::MAX),
            };
            Match::Mark {
                negated,
                value,
                mask,
            }
        }
        ("set", ["--match-set", name, dirs]) => {
            let mut parsed = Vec::with_capacity(comma_list_len(dirs));
            for d in dirs.split(',') {
                parsed.push(match d {
                    "src" => SetDir::Src,
                    "dst" => SetDir::Dst,
                    _ => return None,
                });
            }
            let dirs = parsed;
            Match::Set {
                negated,
                name: scratch.set_name(name)?,
                dirs,
            }
        }
        ("multiport", [opt, list]) => {
            let kind = match *opt {
                "--sports" => PortsKind::Source,
                "--dports" => PortsKind::Destination,
                "--ports" => PortsKind::Either,
                _ => return None,
            };
            let mut ports = Vec::with_capacity(comma_list_len(list));
            for p in list.split(',') {
                ports.push(port_range(p)?);
            }
            Match::Multiport {
                negated,
                kind,
                ports,
            }
        }
        ("tcp", _) => Match::Tcp(ports(a)?),
        ("udp", _) => Match::Udp(ports(a)?),
        ("icmp", ["--icmp-type", t]) => Match::Icmp {
            negated,
            icmp_type: icmp_type(t)?,
        },
        ("icmp6", ["--icmpv6-type", t]) => Match::Icmpv6 {
            negated,
            icmp_type: icmp_type(t)?,
        },
        ("addrtype", _) => addrtype(a)?,
        ("limit", ["--limit", r]) if !negated => Match::Limit {
            rate: rate(r)?,
            burst: None,
        },
        ("limit", ["--limit", r, "--limit-burst", b]) if !negated => Match::Limit {
            rate: rate(r)?,
            burst: Some(b.parse().ok()?),
        },
        _ => return None,
    })
}

/// Whether `rendered` equals the source tokens (` -m module args…` / ` -j name args…`) as
/// [`crate::model::Arg`] would print them (quoted ones re-quoted), without allocating.
fn canonical(rendered: &str, lead: &str, name: &str, args: &[&Tok]) -> bool {
    let Some(mut rest) = rendered
        .strip_prefix(lead)
        .and_then(|r| r.strip_prefix(name))
    else {
        return false;
    };
    for t in args {
        let Some(r) = rest.strip_prefix(' ') else {
            return false;
        };
        rest = r;
        if t.quoted {
            let mut q = String::with_capacity(t.as_str().len() + 2);
            push_quoted(&mut q, t.as_str());
            let Some(r) = rest.strip_prefix(q.as_str()) else {
                return false;
            };
            rest = r;
        } else {
            let Some(r) = rest.strip_prefix(t.as_str()) else {
                return false;
            };
            rest = r;
        }
    }
    rest.is_empty()
}

/// The typed form of a match, if it has one that reproduces its tokens, and whether its tokens
/// are proven to be in the typed form's exact spelling (see [`spelled_exactly`]; such tokens
/// always pass [`validate_known_module`], which the caller may then skip).
pub(crate) fn typed_match(
    module: &str,
    args: &[&Tok],
    scratch: &mut Scratch,
) -> Option<(Match, bool)> {
    if module == "comment" {
        return match args {
            // A bare `!` value is the rejected old negation syntax: not proven, so validated.
            [opt, v] if opt.is("--comment") => {
                Match::comment(v.as_str()).ok().map(|m| (m, !v.is("!")))
            }
            _ => None,
        };
    }
    if args.iter().any(|t| t.quoted) || args.len() > 8 {
        return None;
    }
    let mut plain = [""; 8];
    for (p, t) in plain.iter_mut().zip(args) {
        *p = t.as_str();
    }
    let plain = &plain[..args.len()];
    let m = typed_match_unchecked(module, plain, scratch)?;
    let exact = spelled_exactly(&m, plain);
    if exact && !cfg!(debug_assertions) {
        return Some((m, true));
    }
    scratch.text.clear();
    m.render_into(&mut scratch.text);
    let ok = canonical(&scratch.text, " -m ", module, args);
    debug_assert!(
        !exact || ok,
        "spelled_exactly wrong for -m {module} {plain:?}"
    );
    ok.then_some((m, exact))
}

/// `0x` + lowercase hex without leading zeros: how `{:#x}` prints a u32 that parsed from `s`.
fn canonical_hex(s: &str) -> bool {
    s.strip_prefix("0x").is_some_and(|d| {
        (1..=8).contains(&d.len())
            && d.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            && (d.len() == 1 || !d.starts_with('0'))
    })
}

/// Decimal digits without a sign or leading zeros: how `{}` prints a number that parsed from `s`.
fn canonical_dec(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s.len() == 1 || !s.starts_with('0'))
}

/// A port or `first:last` range as [`PortRange`] prints it (a range with equal ends prints one port).
fn canonical_port(p: &str) -> bool {
    match p.split_once(':') {
        Some((a, b)) => canonical_dec(a) && canonical_dec(b) && a != b,
        None => canonical_dec(p),
    }
}

/// True when the typed form `m`, parsed from `plain`, is known to render back to exactly those
/// tokens, so the render-and-compare check can be skipped (the common Calico shapes: set, mark,
/// multiport, ports, states). Such tokens are known options with their values, none of them a
/// bare `!`, so they also pass [`validate_known_module`]. `false` means "not known", never "not
/// canonical". Debug builds still run both checks and assert agreement.
fn spelled_exactly(m: &Match, plain: &[&str]) -> bool {
    let value = plain.last().copied().unwrap_or("");
    match m {
        // Name and direction words are stored as written; only `src`/`dst` parse. A set named
        // `!` is the rejected old negation syntax (`--match-set ! NAME`): left to validation.
        Match::Set { name, .. } => name.as_str() != "!",
        Match::Mark { mask, .. } => match value.split_once('/') {
            Some((v, m)) => canonical_hex(v) && canonical_hex(m) && *mask != u32::MAX,
            None => canonical_hex(value),
        },
        Match::Multiport { .. } => value.split(',').all(canonical_port),
        // Only `--sport` then `--dport` parse; their values are what needs checking.
        Match::Tcp(_) | Match::Udp(_) => plain
            .windows(2)
            .all(|w| !matches!(w[0], "--sport" | "--dport") || canonical_port(w[1])),
        // Printed in bit order without repeats.
        Match::Conntrack { .. } | Match::State { .. } => {
            let mut last = None;
            value.split(',').all(|n| {
                let s = CtState::from_name(n);
                let ok = s.is_some() && s > last;
                last = s;
                ok
            })
        }
        _ => false,
    }
}

fn text_arg(t: &Tok) -> Option<Text> {
    Text::new(t.as_str()).ok()
}

fn typed_target_unchecked(name: &str, args: &[&Tok]) -> Option<Target> {
    let plain = |i: usize| args.get(i).filter(|t| !t.quoted).map(|t| t.as_str());
    Some(match (name, args.len()) {
        ("ACCEPT", 0) => Target::Accept,
        ("DROP", 0) => Target::Drop,
        ("RETURN", 0) => Target::Return,
        ("REJECT", 0) => Target::Reject { with: None },
        ("REJECT", 2) if plain(0) == Some("--reject-with") => Target::Reject {
            with: Word::new(plain(1)?).ok(),
        },
        ("MARK", 2) if plain(0) == Some("--set-xmark") => {
            let (v, m) = plain(1)?.split_once('/')?;
            Target::Mark {
                value: hex_u32(v)?,
                mask: hex_u32(m)?,
            }
        }
        ("LOG", _) => {
            let (mut prefix, mut level) = (None, None);
            let mut i = 0;
            while i < args.len() {
                match plain(i)? {
                    "--log-prefix" if prefix.is_none() => {
                        prefix = Some(text_arg(args.get(i + 1)?)?)
                    }
                    "--log-level" if level.is_none() => level = Some(plain(i + 1)?.parse().ok()?),
                    _ => return None,
                }
                i += 2;
            }
            Target::Log { prefix, level }
        }
        ("NFLOG", _) => {
            let (mut prefix, mut group, mut len, mut threshold) = (None, 0, None, None);
            let mut i = 0;
            while i < args.len() {
                match plain(i)? {
                    "--nflog-prefix" if prefix.is_none() => {
                        prefix = Some(text_arg(args.get(i + 1)?)?)
                    }
                    "--nflog-group" => group = plain(i + 1)?.parse().ok()?,
                    "--nflog-size" if len.is_none() => {
                        len = Some(NflogLen::Size(plain(i + 1)?.parse().ok()?))
                    }
                    "--nflog-range" if len.is_none() => {
                        len = Some(NflogLen::Range(plain(i + 1)?.parse().ok()?))
                    }
                    "--nflog-threshold" if threshold.is_none() => {
                        threshold = Some(plain(i + 1)?.parse().ok()?)
                    }
                    _ => return None,
                }
                i += 2;
            }
            Target::Nflog {
                prefix,
                group,
                len,
                threshold,
            }
        }
        _ => return None,
    })
}

/// The typed form of a `-j` target, if it has one that reproduces its tokens. Jumps to user chains
/// are resolved later, per table, from the declared chain names.
pub(crate) fn typed_target(name: &str, args: &[&Tok], scratch: &mut Scratch) -> Option<Target> {
    let t = typed_target_unchecked(name, args)?;
    if args.is_empty() {
        return Some(t);
    }
    // `-j MARK --set-xmark V/M` renders both numbers with `{:#x}`: exact when they are spelled so.
    let exact = matches!(t, Target::Mark { .. })
        && args[1]
            .as_str()
            .split_once('/')
            .is_some_and(|(v, m)| canonical_hex(v) && canonical_hex(m));
    if exact && !cfg!(debug_assertions) {
        return Some(t);
    }
    scratch.text.clear();
    t.render_into(&mut scratch.text);
    let ok = canonical(&scratch.text, " -j ", name, args);
    debug_assert!(!exact || ok, "spelled_exactly wrong for -j {name}");
    ok.then_some(t)
}
