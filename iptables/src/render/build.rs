//! The renderer's rule builder: it writes each typed fragment (in Felix's order, felix-reference
//! §4.2, §3, `felix/iptables/{match_builder,actions}.go`) into the typed [`model::Rule`] the kernel
//! gets and, in the same pass, Felix's own input syntax for the `cali:` hash.
//!
//! Why both: the rule hash (felix-reference §6.3) is computed over Felix's *input* text
//! (`--jump MARK --set-mark 0/0x30000`), whose fragment order and spellings the model (which
//! stores `-p`/`-s`/`-d`/`-i`/`-o` as fields and prints the kernel's canonical form) does not
//! keep; so the text is captured while building, never recovered afterwards. [`Match`] and
//! [`Target`] are the builder's vocabulary (Felix's fragments), not a rule form: the only rule is
//! the model rule inside [`Rule`], which is what the applier writes and what
//! [`super::trace`] evaluates. Invariant: nothing a fragment carries is a free-form string except
//! validated names (chains, sets, interfaces) and escaped comments.

use std::fmt::Write;
use std::sync::Arc;

use calc_graph::proto::{PortRange, Protocol};

use crate::model::{self, ModelError};
use ipnet::IpNet;

/// Which packet side a port or address match applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Src,
    Dst,
}

impl Side {
    /// `src` for [`Side::Src`], else `dst`.
    fn pick<T>(self, src: T, dst: T) -> T {
        match self {
            Side::Src => src,
            Side::Dst => dst,
        }
    }
}

/// The direction flags of an `-m set` match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetFlags {
    Src,
    Dst,
    SrcSrc,
    DstDst,
}

/// Conntrack state sets used by the renderer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtStates {
    RelatedEstablished,
    Invalid,
    /// `DNAT` (`cali-OUTPUT`'s `! --ctstate DNAT` before the host endpoint dispatch).
    Dnat,
}

/// One match fragment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    Protocol {
        proto: Protocol,
        negated: bool,
    },
    Net {
        side: Side,
        net: IpNet,
        negated: bool,
    },
    /// `--in-interface`; a trailing `+` is a wildcard.
    InIface(String),
    /// `--out-interface`; a trailing `+` is a wildcard.
    OutIface(String),
    Set {
        name: String,
        flags: SetFlags,
        negated: bool,
    },
    /// `-m set [!] --match-set <name> src|dst` on a content-addressed `hash:net` set holding
    /// exactly `nets` (a rule's multi-net `nets`/`notNets` list in the shared layout, see
    /// [`super::names::net_set_id`]). Rendered, hashed and evaluated exactly as a [`Match::Set`]; it carries
    /// its members so the family can declare the set while a stored chain names it.
    NetSet {
        name: String,
        side: Side,
        nets: Arc<[IpNet]>,
        negated: bool,
    },
    Ports {
        side: Side,
        ports: Vec<PortRange>,
        negated: bool,
    },
    Icmp {
        v6: bool,
        type_: u8,
        code: Option<u8>,
        negated: bool,
    },
    Mark {
        value: u32,
        mask: u32,
        negated: bool,
    },
    Conntrack {
        states: CtStates,
        negated: bool,
    },
    /// `-m rpfilter`: the packet's source is routed back out of the interface it came in on
    /// (strict reverse-path check); negated, the source is spoofed.
    Rpfilter {
        negated: bool,
    },
    /// `-m limit --limit N/sec --limit-burst B`: at most `per_second` packets a second after a
    /// burst of `burst` (the deny-log rules' kernel rate limit).
    Limit {
        per_second: u32,
        burst: u32,
    },
    /// `-m udp --sport N` / `-m tcp --sport N` (the protocol must be matched too).
    SrcPort {
        proto: Protocol,
        port: u16,
    },
    /// `-m conntrack --ctdir REPLY`: the packet goes in the reply direction of its connection.
    CtDirReply,
}

/// A rule's target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Accept,
    Drop,
    Return,
    Jump(String),
    Goto(String),
    /// `MARK --set-mark value/mask` (Felix `SetMark`/`SetMaskedMark`).
    SetMark {
        value: u32,
        mask: u32,
    },
    /// `MARK --set-mark 0/mask` (Felix `ClearMark`, written with a literal `0`).
    ClearMark(u32),
    /// `LOG --log-prefix "<prefix>: " --log-level 5`; non-terminating.
    Log {
        prefix: String,
    },
    /// `NFLOG --nflog-group g --nflog-prefix p [--nflog-size n]`; non-terminating. `size`:
    /// bytes of the packet copied to the listener (flow logs copy only the headers).
    Nflog {
        group: u16,
        prefix: String,
        size: Option<u32>,
    },
    /// `MASQUERADE [--random-fully]` (nat table; Felix's `MasqAction`).
    Masquerade {
        random_fully: bool,
    },
    /// `NFQUEUE --queue-num N` (mangle: DNS responses held for the learner). Without
    /// `--queue-bypass`: with nobody bound to the queue the kernel drops the packet.
    Nfqueue {
        num: u16,
    },
    /// `NOTRACK` (raw table: the packet gets no conntrack entry; Felix's `NoTrackAction`, for
    /// `doNotTrack` host endpoint policy).
    NoTrack,
}

/// A rendered rule: the typed model rule the kernel gets, plus Felix's input text of the same
/// rule (for the `cali:` hash only), both written by one pass over the fragments so that the hash
/// keeps Felix's fragment order while the model keeps the kernel's. Read it as a
/// [`model::Rule`] (it derefs to one); change it only through the builder methods, which keep the
/// two forms in step.
#[derive(Debug, Clone)]
pub struct Rule {
    /// What the kernel gets, shared by every chain and family that holds the same rule. Its chain
    /// is a placeholder: where a rule stands is the key it is stored under (the applier writes
    /// `-A <chain>` from that, and [`Self::hashed`] takes it), so storing a rule never copies it.
    /// Its `cali:` comment is added by the applier.
    rule: Arc<model::Rule>,
    /// Felix's rendering of everything after `-A <chain> HASH` (felix-reference §6.3).
    felix: String,
    /// Bytes of `felix` taken by the comments (Felix writes them first).
    felix_comments: usize,
    /// The members of the content-addressed net sets ([`Match::NetSet`]) the rule names.
    net_sets: Vec<(String, Arc<[IpNet]>)>,
}

/// Two rendered rules are equal when they would be written and hashed the same, wherever they
/// are stored (the chain is not compared). Felix's text decides: it spells out every fragment
/// the model rule was built from (validated names, escaped comments), so equal texts mean equal
/// model rules; a net set's name is a hash of its members, compared too for what it declares.
impl PartialEq for Rule {
    fn eq(&self, o: &Self) -> bool {
        self.felix == o.felix && self.net_sets == o.net_sets
    }
}

impl Eq for Rule {}

impl std::ops::Deref for Rule {
    type Target = model::Rule;
    fn deref(&self) -> &model::Rule {
        &self.rule
    }
}

/// The placeholder chain of the renderer's model rules (see the `rule` field of [`Rule`]).
fn unplaced() -> model::ChainName {
    static NAME: std::sync::LazyLock<model::ChainName> =
        std::sync::LazyLock::new(|| model::ChainName::new("cali-unplaced").expect("a chain name"));
    NAME.clone()
}

impl Default for Rule {
    /// A rule that only counts (Felix writes one for a policy with no rules).
    fn default() -> Self {
        Rule {
            rule: Arc::new(model::Rule::new(unplaced())),
            felix: String::new(),
            felix_comments: 0,
            net_sets: Vec::new(),
        }
    }
}

impl Rule {
    /// The rule `matches` (in Felix's order) then `target`.
    pub fn new(matches: Vec<Match>, target: Target) -> Self {
        let mut r = Rule::default();
        // Room for a typical rule's text and its matches (and a comment or two) at once.
        r.felix.reserve(128);
        Arc::make_mut(&mut r.rule)
            .matches
            .reserve(matches.len() + 2);
        // Every fragment is written, so that Felix's text is whole even when the model refused one.
        let mut refused = None;
        for m in &matches {
            refused = refused.or(r.push_match(m).err());
        }
        refused = refused.or(r.set_target(&target).err());
        if let Some(e) = refused {
            // Impossible for validated names; kept as a safety net: the hash stays Felix's, the
            // kernel gets a bare DROP, so a bug can only make a chain stricter.
            tracing::error!(rule = %r.felix, error = %e, "rule refused by the model; rendering DROP instead");
            r.rule = Arc::new(model::Rule::new(unplaced()).with_target(model::Target::Drop));
            r.net_sets.clear();
        }
        r
    }

    /// Adds a human comment after the existing ones, escaped per felix-reference §4.8.
    pub fn with_comment(mut self, comment: &str) -> Self {
        self.push_comment(comment);
        self
    }

    /// [`Self::with_comment`] in place.
    pub fn push_comment(&mut self, comment: &str) {
        let c = super::hash::escape_comment(comment);
        let mut frag = String::with_capacity(c.len() + 24);
        let at = self.felix_comments;
        if at > 0 {
            frag.push(' ');
        }
        let _ = write!(frag, "-m comment --comment \"{c}\"");
        self.felix_comments += frag.len();
        if at == 0 && !self.felix.is_empty() {
            frag.push(' ');
        }
        self.felix.insert_str(at, &frag);
        let n = self.rule.comments().count();
        match model::Text::new(c) {
            Ok(t) => Arc::make_mut(&mut self.rule)
                .matches
                .insert(n, model::Match::Comment(t)),
            Err(e) => tracing::error!(error = %e, "escaped comment refused by the model"),
        }
    }

    /// Felix's rendering of everything after `-A <chain> HASH`: what the `cali:` hash is over.
    pub fn felix_text(&self) -> &str {
        &self.felix
    }

    /// The typed rule the kernel gets.
    pub fn model(&self) -> &model::Rule {
        &self.rule
    }

    /// The rule as the applier writes it in `chain`: `cali:<hash>` as its first comment.
    pub fn hashed(&self, chain: &str, hash: &str) -> Result<model::Rule, ModelError> {
        let mut r = model::Rule::clone(&self.rule);
        r.chain = model::ChainName::new(chain)?;
        r.matches.insert(
            0,
            model::Match::Comment(model::Text::new(format!("cali:{hash}"))?),
        );
        Ok(r)
    }

    /// The members of each net set ([`Match::NetSet`]) the rule names, by kernel set name.
    pub fn net_sets(&self) -> &[(String, Arc<[IpNet]>)] {
        &self.net_sets
    }

    /// Writes fragment `m` in both forms: Felix's text first (always whole), then the model's.
    fn push_match(&mut self, m: &Match) -> Result<(), ModelError> {
        let f = &mut self.felix;
        push_sep(f);
        let not = |n: bool| if n { "! " } else { "" };
        let r = Arc::make_mut(&mut self.rule);
        let model = match m {
            Match::Protocol { proto, negated } => {
                let _ = write!(f, "{}-p {}", not(*negated), felix_proto(*proto));
                let p = model::Protocol::from_token(&kernel_proto(*proto))?;
                r.protocol = Some(model::Negatable {
                    negated: *negated,
                    value: p,
                });
                return Ok(());
            }
            Match::Net { side, net, negated } => {
                let opt = side.pick("--source", "--destination");
                let _ = write!(f, "{}{opt} {net}", not(*negated));
                *side.pick(&mut r.src, &mut r.dst) = Some(model::Negatable {
                    negated: *negated,
                    value: model::Addr::Net(*net),
                });
                return Ok(());
            }
            Match::InIface(i) => {
                let _ = write!(f, "--in-interface {i}");
                r.in_iface = Some(model::Negatable::is(model::Iface::new(i.as_str())?));
                return Ok(());
            }
            Match::OutIface(i) => {
                let _ = write!(f, "--out-interface {i}");
                r.out_iface = Some(model::Negatable::is(model::Iface::new(i.as_str())?));
                return Ok(());
            }
            Match::Set {
                name,
                flags,
                negated,
            } => set_match(f, name, *flags, *negated)?,
            Match::NetSet {
                name,
                side,
                nets,
                negated,
            } => {
                self.net_sets.push((name.clone(), nets.clone()));
                let flags = side.pick(SetFlags::Src, SetFlags::Dst);
                set_match(f, name, flags, *negated)?
            }
            Match::Ports {
                side,
                ports,
                negated,
            } => {
                let opt = side.pick("--source-ports", "--destination-ports");
                let _ = write!(f, "-m multiport {}{opt} ", not(*negated));
                for (i, p) in ports.iter().enumerate() {
                    let _ = write!(f, "{}{p}", if i > 0 { "," } else { "" });
                }
                model::Match::Multiport {
                    negated: *negated,
                    kind: side.pick(model::PortsKind::Source, model::PortsKind::Destination),
                    ports: ports.clone(),
                }
            }
            Match::Icmp {
                v6,
                type_,
                code,
                negated,
            } => {
                let (module, opt) = if *v6 {
                    ("icmp6", "--icmpv6-type")
                } else {
                    ("icmp", "--icmp-type")
                };
                let _ = write!(f, "-m {module} {}{opt} {type_}", not(*negated));
                let icmp_type = match code {
                    Some(c) => {
                        let _ = write!(f, "/{c}");
                        model::IcmpType::TypeCode(*type_, *c)
                    }
                    None => model::IcmpType::Type(*type_),
                };
                let negated = *negated;
                if *v6 {
                    model::Match::Icmpv6 { negated, icmp_type }
                } else {
                    model::Match::Icmp { negated, icmp_type }
                }
            }
            Match::Mark {
                value,
                mask,
                negated,
            } => {
                let value_text = mark_value(*value);
                let _ = write!(f, "-m mark {}--mark {value_text}/{mask:#x}", not(*negated));
                model::Match::Mark {
                    negated: *negated,
                    value: *value,
                    mask: *mask,
                }
            }
            Match::Conntrack { states, negated } => {
                use model::CtState::{Dnat, Established, Invalid, Related};
                let (text, states) = match states {
                    CtStates::RelatedEstablished => (
                        "RELATED,ESTABLISHED",
                        model::CtStates::of(&[Related, Established]),
                    ),
                    CtStates::Invalid => ("INVALID", model::CtStates::of(&[Invalid])),
                    CtStates::Dnat => ("DNAT", model::CtStates::of(&[Dnat])),
                };
                let _ = write!(f, "-m conntrack {}--ctstate {text}", not(*negated));
                model::Match::Conntrack {
                    negated: *negated,
                    states,
                }
            }
            Match::Limit { per_second, burst } => {
                let _ = write!(
                    f,
                    "-m limit --limit {per_second}/second --limit-burst {burst}"
                );
                model::Match::Limit {
                    rate: model::Rate {
                        count: *per_second,
                        unit: model::RateUnit::Second,
                    },
                    // The kernel does not print the default burst.
                    burst: (*burst != 5).then_some(*burst),
                }
            }
            Match::SrcPort { proto, port } => {
                let _ = write!(f, "-m {} --sport {port}", felix_proto(*proto));
                let ports = model::Ports {
                    sport: Some(model::Negatable::is(model::PortRange::single(*port))),
                    dport: None,
                };
                if proto.number() == 17 {
                    model::Match::Udp(ports)
                } else {
                    model::Match::Tcp(ports)
                }
            }
            Match::CtDirReply => {
                f.push_str("-m conntrack --ctdir REPLY");
                model::Match::Generic {
                    module: model::Word::new("conntrack")?,
                    args: vec![model::Arg::bare("--ctdir")?, model::Arg::bare("REPLY")?],
                }
            }
            Match::Rpfilter { negated } => {
                f.push_str(if *negated {
                    "-m rpfilter --invert"
                } else {
                    "-m rpfilter"
                });
                let mut args = Vec::new();
                if *negated {
                    args.push(model::Arg::bare("--invert")?);
                }
                model::Match::Generic {
                    module: model::Word::new("rpfilter")?,
                    args,
                }
            }
        };
        r.matches.push(model);
        Ok(())
    }

    /// Writes target `t` in both forms, as [`Self::push_match`].
    fn set_target(&mut self, t: &Target) -> Result<(), ModelError> {
        let f = &mut self.felix;
        push_sep(f);
        let _ = match t {
            Target::Accept => write!(f, "--jump ACCEPT"),
            Target::Drop => write!(f, "--jump DROP"),
            Target::Return => write!(f, "--jump RETURN"),
            Target::Jump(c) => write!(f, "--jump {c}"),
            Target::Goto(c) => write!(f, "--goto {c}"),
            Target::SetMark { value, mask } => {
                write!(f, "--jump MARK --set-mark {value:#x}/{mask:#x}")
            }
            Target::ClearMark(mask) => write!(f, "--jump MARK --set-mark 0/{mask:#x}"),
            Target::Log { prefix } => {
                write!(f, "--jump LOG --log-prefix \"{prefix}: \" --log-level 5")
            }
            Target::Nflog {
                group,
                prefix,
                size,
            } => {
                let _ = write!(
                    f,
                    "--jump NFLOG --nflog-group {group} --nflog-prefix {prefix}"
                );
                match size {
                    Some(n) => write!(f, " --nflog-size {n}"),
                    None => Ok(()),
                }
            }
            Target::Masquerade { random_fully } => write!(
                f,
                "--jump MASQUERADE{}",
                if *random_fully { " --random-fully" } else { "" }
            ),
            Target::Nfqueue { num } => write!(f, "--jump NFQUEUE --queue-num {num}"),
            Target::NoTrack => write!(f, "--jump NOTRACK"),
        };
        Arc::make_mut(&mut self.rule).target = Some(match t {
            Target::Accept => model::Target::Accept,
            Target::Drop => model::Target::Drop,
            Target::Return => model::Target::Return,
            Target::Jump(c) => model::Target::Jump(model::ChainName::new(c.as_str())?),
            Target::Goto(c) => model::Target::Goto(model::ChainName::new(c.as_str())?),
            Target::SetMark { value, mask } => model::Target::set_mark(*value, *mask),
            Target::ClearMark(mask) => model::Target::set_mark(0, *mask),
            Target::Log { prefix } => model::Target::Log {
                prefix: Some(model::Text::new(format!("{prefix}: "))?),
                level: Some(5),
            },
            Target::Nflog {
                group,
                prefix,
                size,
            } => model::Target::Nflog {
                prefix: Some(model::Text::new(prefix.as_str())?),
                group: *group,
                len: size.map(model::NflogLen::Size),
                threshold: None,
            },
            Target::Masquerade { random_fully } => model::Target::Generic {
                name: model::Word::new("MASQUERADE")?,
                args: if *random_fully {
                    vec![model::Arg::bare("--random-fully")?]
                } else {
                    Vec::new()
                },
            },
            Target::Nfqueue { num } => model::Target::Generic {
                name: model::Word::new("NFQUEUE")?,
                args: vec![
                    model::Arg::bare("--queue-num")?,
                    model::Arg::bare(num.to_string())?,
                ],
            },
            Target::NoTrack => model::Target::Generic {
                name: model::Word::new("NOTRACK")?,
                args: Vec::new(),
            },
        });
        Ok(())
    }
}

/// `-m set [!] --match-set <name> <flags>` in both forms (Felix's text first).
fn set_match(
    f: &mut String,
    name: &str,
    flags: SetFlags,
    negated: bool,
) -> Result<model::Match, ModelError> {
    use model::SetDir::{Dst, Src};
    let (flag, dirs) = match flags {
        SetFlags::Src => ("src", vec![Src]),
        SetFlags::Dst => ("dst", vec![Dst]),
        SetFlags::SrcSrc => ("src,src", vec![Src, Src]),
        SetFlags::DstDst => ("dst,dst", vec![Dst, Dst]),
    };
    let not = if negated { "! " } else { "" };
    let _ = write!(f, "-m set {not}--match-set {name} {flag}");
    let name = model::SetName::new(name)?;
    Ok(model::Match::Set {
        negated,
        name,
        dirs,
    })
}

fn push_sep(s: &mut String) {
    if !s.is_empty() {
        s.push(' ');
    }
}

/// Felix's protocol name (`-p tcp`), or the number.
fn felix_proto(p: Protocol) -> String {
    match p {
        Protocol::Tcp => "tcp".into(),
        Protocol::Udp => "udp".into(),
        Protocol::Sctp => "sctp".into(),
        Protocol::Icmp => "icmp".into(),
        Protocol::IcmpV6 => "icmpv6".into(),
        Protocol::UdpLite => "udplite".into(),
        Protocol::Number(n) => n.to_string(),
    }
}

/// A mark match's value as Felix writes it: `0`, else hex.
fn mark_value(v: u32) -> String {
    if v == 0 {
        "0".into()
    } else {
        format!("{v:#x}")
    }
}

/// The protocol as `iptables-save` prints it (numbers without a well-known name stay numbers;
/// the kernel may print a name from /etc/protocols for those, which only changes the text).
fn kernel_proto(p: Protocol) -> String {
    match p.number() {
        6 => "tcp".into(),
        17 => "udp".into(),
        132 => "sctp".into(),
        1 => "icmp".into(),
        4 => "ipencap".into(),
        58 => "ipv6-icmp".into(),
        136 => "udplite".into(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests;
