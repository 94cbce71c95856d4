//! Rule tokens (after `-A CHAIN` / `-I CHAIN [n]`) -> [`Rule`].
//!
//! Base options may appear anywhere (restore input) and are stored in their typed fields; `-m`
//! starts a match whose options are the following tokens up to the next `-m`/`-j`/`-g`; options after
//! `-j NAME` belong to the target. `!` before a base option negates it; anywhere else it is kept as
//! an option token of the current match/target. The pre-1.4 spelling `-s ! X` is rejected like
//! iptables 1.8 does.

use crate::model::{
    Addr, Arg, ChainName, Counters, Match, Negatable, Protocol, Rule, Target, Word,
};

use smallvec::SmallVec;

use super::lexer::Tok;
use super::typed::{
    Opts, Scratch, option_arity, options_of, typed_match, typed_target, validate_known_module,
    validate_known_target,
};

/// An error at a byte offset of the line.
pub(crate) type LineError = (usize, String);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Base {
    Src,
    Dst,
    In,
    Out,
    Proto,
    Frag,
}

fn base_option(t: &Tok) -> Option<Base> {
    // Most tokens are values: one byte test rejects them before the string compares.
    if t.quoted || !t.as_str().starts_with('-') {
        return None;
    }
    Some(match t.as_str() {
        "-s" | "--source" | "--src" => Base::Src,
        "-d" | "--destination" | "--dst" => Base::Dst,
        "-i" | "--in-interface" => Base::In,
        "-o" | "--out-interface" => Base::Out,
        "-p" | "--protocol" => Base::Proto,
        "-f" | "--fragment" => Base::Frag,
        _ => return None,
    })
}

enum Ctx {
    Base,
    Match,
    Target,
}

/// The match being read; its option tokens are `buf[start..]` of the shared argument buffer.
struct PendingMatch<'t> {
    module: &'t str,
    opts: Option<Opts>,
    offset: usize,
    start: usize,
}

/// The match iptables loads implicitly for `-p PROTO --option` (it prints it as `-m PROTO`).
fn implicit_module(p: &Option<Negatable<Protocol>>) -> Option<&'static str> {
    let p = p.as_ref().filter(|p| !p.negated)?;
    Some(match &p.value {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
        Protocol::Icmp => "icmp",
        Protocol::Icmpv6 => "icmp6",
        Protocol::Other(w) => match w.as_str() {
            "icmpv6" | "ipv6-icmp" => "icmp6",
            "dccp" => "dccp",
            _ => return None,
        },
    })
}

struct PendingTarget<'t, 'a> {
    name: &'t Tok<'a>,
    opts: Option<Opts>,
    goto: bool,
    args: SmallVec<[&'t Tok<'a>; 4]>,
}

/// Option tokens of the matches being read (a rule rarely has more than 16; no heap then).
type ArgBuf<'t, 'a> = SmallVec<[&'t Tok<'a>; 16]>;

pub(crate) fn to_arg(t: &Tok) -> Result<Arg, LineError> {
    let r = if t.quoted {
        Arg::quoted(t.as_str())
    } else {
        Arg::bare(t.as_str())
    };
    r.map_err(|e| (t.offset, e.to_string()))
}

fn finish_match<'t, 'a>(
    m: PendingMatch<'t>,
    buf: &mut ArgBuf<'t, 'a>,
    scratch: &mut Scratch,
) -> Result<Match, LineError> {
    let args = &buf[m.start..];
    let typed = typed_match(m.module, args, scratch);
    // Tokens proven to be a typed form's exact spelling always validate (debug builds check).
    let proven = matches!(typed, Some((_, true)));
    if !proven || cfg!(debug_assertions) {
        let v = validate_known_module(m.module, args);
        debug_assert!(
            !proven || v.is_ok(),
            "proven -m {} failed validation",
            m.module
        );
        v?;
    }
    let result = match typed {
        Some((typed, _)) => typed,
        None => {
            let module =
                Word::new(m.module).map_err(|e| (m.offset, format!("match module: {e}")))?;
            let args = args
                .iter()
                .map(|t| to_arg(t))
                .collect::<Result<Vec<_>, _>>()?;
            Match::Generic { module, args }
        }
    };
    buf.truncate(m.start);
    Ok(result)
}

fn finish_target(t: PendingTarget, scratch: &mut Scratch) -> Result<Target, LineError> {
    if t.goto {
        let c =
            ChainName::new(t.name.as_str()).map_err(|e| (t.name.offset, format!("goto: {e}")))?;
        if let Some(a) = t.args.first() {
            return Err((
                a.offset,
                format!("unexpected argument {:?} after -g {}", a.as_str(), c),
            ));
        }
        return Ok(Target::Goto(c));
    }
    validate_known_target(t.name.as_str(), &t.args)?;
    if let Some(typed) = typed_target(t.name.as_str(), &t.args, scratch) {
        return Ok(typed);
    }
    let name = Word::new(t.name.as_str()).map_err(|e| (t.name.offset, format!("target: {e}")))?;
    let args = t
        .args
        .iter()
        .map(|a| to_arg(a))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Target::Generic { name, args })
}

fn number(t: Option<&Tok>, at: usize, what: &str) -> Result<u64, LineError> {
    let t = t.ok_or_else(|| (at, format!("{what} needs a value")))?;
    t.as_str().parse::<u64>().map_err(|_| {
        (
            t.offset,
            format!("{what}: {:?} is not a number", t.as_str()),
        )
    })
}

/// Parses the tokens of a rule (everything after `-A CHAIN`).
pub(crate) fn parse_rule(
    chain: ChainName,
    counters: Option<Counters>,
    toks: &[Tok],
    scratch: &mut Scratch,
) -> Result<Rule, LineError> {
    let mut rule = Rule::new(chain);
    rule.matches.reserve(4);
    let mut buf = ArgBuf::new();
    rule.counters = counters;
    let mut ctx = Ctx::Base;
    let mut cur: Option<PendingMatch> = None;
    let mut target: Option<PendingTarget> = None;
    // Values still owed to the last option of a known match/target: taken verbatim, even when they
    // look like options (`--comment -s` is a comment "-s", as getopt reads it).
    let mut owed = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        if owed > 0 {
            owed -= 1;
            i += 1;
            match ctx {
                Ctx::Match => {
                    if cur.is_some() {
                        buf.push(t);
                    }
                }
                Ctx::Target => target.as_mut().into_iter().for_each(|tg| tg.args.push(t)),
                Ctx::Base => {}
            }
            continue;
        }
        // `! -s X`: negation of a base option.
        let (negated, opt_tok, opt_idx) =
            if t.is("!") && toks.get(i + 1).is_some_and(|n| base_option(n).is_some()) {
                (true, &toks[i + 1], i + 1)
            } else {
                (false, t, i)
            };
        if let Some(base) = base_option(opt_tok) {
            i = opt_idx + 1;
            let name = opt_tok.as_str();
            if base == Base::Frag {
                if rule.fragment.is_some() {
                    return Err((opt_tok.offset, "multiple -f flags".into()));
                }
                rule.fragment = Some(Negatable { negated, value: () });
                continue;
            }
            let v = toks
                .get(i)
                .ok_or_else(|| (opt_tok.offset, format!("option {name} needs a value")))?;
            i += 1;
            if v.is("!") {
                return Err((
                    v.offset,
                    format!(
                        "old negation syntax `{name} ! X` is not accepted by iptables 1.8; write `! {name} X`"
                    ),
                ));
            }
            let dup = |what: &str| (opt_tok.offset, format!("multiple {what} flags"));
            let bad = |e: crate::model::ModelError| (v.offset, e.to_string());
            match base {
                Base::Src => {
                    if rule.src.is_some() {
                        return Err(dup("-s"));
                    }
                    rule.src = Some(Negatable {
                        negated,
                        value: Addr::from_token(v.as_str()).map_err(bad)?,
                    });
                }
                Base::Dst => {
                    if rule.dst.is_some() {
                        return Err(dup("-d"));
                    }
                    rule.dst = Some(Negatable {
                        negated,
                        value: Addr::from_token(v.as_str()).map_err(bad)?,
                    });
                }
                Base::In => {
                    if rule.in_iface.is_some() {
                        return Err(dup("-i"));
                    }
                    rule.in_iface = Some(Negatable {
                        negated,
                        value: scratch.iface(v.as_str()).map_err(bad)?,
                    });
                }
                Base::Out => {
                    if rule.out_iface.is_some() {
                        return Err(dup("-o"));
                    }
                    rule.out_iface = Some(Negatable {
                        negated,
                        value: scratch.iface(v.as_str()).map_err(bad)?,
                    });
                }
                Base::Proto => {
                    if rule.protocol.is_some() {
                        return Err(dup("-p"));
                    }
                    rule.protocol = Some(Negatable {
                        negated,
                        value: Protocol::from_token(v.as_str()).map_err(bad)?,
                    });
                }
                Base::Frag => {} // handled above: -f takes no value
            }
            continue;
        }
        i += 1;
        if !t.quoted {
            match t.as_str() {
                "-m" | "--match" => {
                    let m = toks
                        .get(i)
                        .ok_or_else(|| (t.offset, "option -m needs a module name".to_string()))?;
                    i += 1;
                    if let Some(prev) = cur.take() {
                        rule.matches.push(finish_match(prev, &mut buf, scratch)?);
                    }
                    cur = Some(PendingMatch {
                        module: m.as_str(),
                        opts: options_of(m.as_str(), false),
                        offset: m.offset,
                        start: buf.len(),
                    });
                    ctx = Ctx::Match;
                    continue;
                }
                "-j" | "--jump" | "-g" | "--goto" => {
                    let n = toks.get(i).ok_or_else(|| {
                        (t.offset, format!("option {} needs a target", t.as_str()))
                    })?;
                    i += 1;
                    if target.is_some() {
                        return Err((t.offset, "multiple targets (-j/-g) in one rule".into()));
                    }
                    if let Some(prev) = cur.take() {
                        rule.matches.push(finish_match(prev, &mut buf, scratch)?);
                    }
                    let goto = matches!(t.as_str(), "-g" | "--goto");
                    target = Some(PendingTarget {
                        name: n,
                        opts: if goto {
                            None
                        } else {
                            options_of(n.as_str(), true)
                        },
                        goto,
                        args: SmallVec::new(),
                    });
                    ctx = Ctx::Target;
                    continue;
                }
                "-c" | "--set-counters" => {
                    let packets = number(toks.get(i), t.offset, "-c packets")?;
                    let bytes = number(toks.get(i + 1), t.offset, "-c bytes")?;
                    i += 2;
                    rule.counters = Some(Counters { packets, bytes });
                    continue;
                }
                _ => {}
            }
        }
        // An option no loaded match knows goes to the protocol's implicit match (`-p tcp --dport 22`).
        let opt = if t.is("!") { toks.get(i) } else { Some(t) };
        if let Some(opt) = opt.filter(|o| !o.quoted && o.as_str().starts_with("--")) {
            let orphan = match ctx {
                Ctx::Base => true,
                Ctx::Match => cur
                    .as_ref()
                    .is_some_and(|m| option_arity(m.opts, opt.as_str()) == Some(None)),
                Ctx::Target => target.as_ref().is_some_and(|tg| {
                    !tg.goto && option_arity(tg.opts, opt.as_str()) == Some(None)
                }),
            };
            if orphan && let Some(module) = implicit_module(&rule.protocol) {
                if let Some(prev) = cur.take() {
                    rule.matches.push(finish_match(prev, &mut buf, scratch)?);
                }
                cur = Some(PendingMatch {
                    module,
                    opts: options_of(module, false),
                    offset: t.offset,
                    start: buf.len(),
                });
                ctx = Ctx::Match;
            }
        }
        let is_option = !t.quoted && t.as_str().starts_with("--");
        match ctx {
            Ctx::Match => {
                if let Some(m) = cur.as_ref() {
                    buf.push(t);
                    if is_option {
                        owed = option_arity(m.opts, t.as_str()).flatten().unwrap_or(0);
                    }
                }
            }
            Ctx::Target => {
                if let Some(tg) = target.as_mut() {
                    tg.args.push(t);
                    if is_option && !tg.goto {
                        owed = option_arity(tg.opts, t.as_str()).flatten().unwrap_or(0);
                    }
                }
            }
            Ctx::Base => {
                let what = if !t.quoted && t.as_str().starts_with('-') {
                    "unknown option"
                } else {
                    "unexpected argument"
                };
                return Err((t.offset, format!("{what} {:?}", t.as_str())));
            }
        }
    }
    if let Some(prev) = cur.take() {
        rule.matches.push(finish_match(prev, &mut buf, scratch)?);
    }
    if let Some(t) = target {
        rule.target = Some(finish_target(t, scratch)?);
    }
    Ok(rule)
}
