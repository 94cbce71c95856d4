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

mod felix;

pub use felix::felix_proto;
use felix::{push_sep, write_match, write_target};

use crate::model::{self, ModelError};
use ipnet::IpNet;

/// Which packet side a port or address match applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Src,
    Dst,
}

/// The direction flags of an `-m set` match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetFlags {
    Src,
    Dst,
    SrcSrc,
    DstDst,
}

impl SetFlags {
    pub fn as_str(self) -> &'static str {
        match self {
            SetFlags::Src => "src",
            SetFlags::Dst => "dst",
            SetFlags::SrcSrc => "src,src",
            SetFlags::DstDst => "dst,dst",
        }
    }
}

/// Conntrack state sets used by the renderer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtStates {
    RelatedEstablished,
    Invalid,
}

impl CtStates {
    pub fn as_str(self) -> &'static str {
        match self {
            CtStates::RelatedEstablished => "RELATED,ESTABLISHED",
            CtStates::Invalid => "INVALID",
        }
    }
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

impl Match {
    /// The IP set this match reads, if it reads one: its kernel name, direction flags and
    /// negation (a [`Match::NetSet`] reads its side's address, as a `Set` with `src` or `dst`).
    pub fn set_match(&self) -> Option<(&str, SetFlags, bool)> {
        match self {
            Match::Set {
                name,
                flags,
                negated,
            } => Some((name, *flags, *negated)),
            Match::NetSet {
                name,
                side,
                negated,
                ..
            } => {
                let flags = match side {
                    Side::Src => SetFlags::Src,
                    Side::Dst => SetFlags::Dst,
                };
                Some((name, flags, *negated))
            }
            _ => None,
        }
    }

    /// The kernel name of the IP set this match reads, if it reads one.
    pub fn set_name(&self) -> Option<&str> {
        self.set_match().map(|(name, ..)| name)
    }
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
    /// `NFLOG --nflog-group g --nflog-prefix p`; non-terminating.
    Nflog {
        group: u16,
        prefix: String,
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
/// are stored (the chain is not compared).
impl PartialEq for Rule {
    fn eq(&self, o: &Self) -> bool {
        let (a, b) = (&self.rule, &o.rule);
        if Arc::ptr_eq(a, b) {
            return self.net_sets == o.net_sets;
        }
        self.felix == o.felix
            && a.matches == b.matches
            && a.target == b.target
            && (
                &a.src,
                &a.dst,
                &a.in_iface,
                &a.out_iface,
                &a.protocol,
                &a.fragment,
            ) == (
                &b.src,
                &b.dst,
                &b.in_iface,
                &b.out_iface,
                &b.protocol,
                &b.fragment,
            )
            && self.net_sets == o.net_sets
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
        Self::build(&matches, Some(&target))
    }

    /// A rule without a target (a pure counter).
    pub fn counter(matches: Vec<Match>) -> Self {
        Self::build(&matches, None)
    }

    fn build(matches: &[Match], target: Option<&Target>) -> Self {
        let mut r = Rule::default();
        let built = matches
            .iter()
            .try_for_each(|m| r.push_match(m))
            .and_then(|()| target.map_or(Ok(()), |t| r.set_target(t)));
        if let Err(e) = built {
            // Impossible for validated names; kept as a safety net: the hash stays Felix's, the
            // kernel gets a bare DROP, so a bug can only make a chain stricter.
            tracing::error!(rule = %r.felix, error = %e, "rule refused by the model; rendering DROP instead");
            r.rule = Arc::new(model::Rule::new(unplaced()).with_target(model::Target::Drop));
            r.net_sets.clear();
            // Finish Felix's text as it would have been.
            r.felix.clear();
            for m in matches {
                push_sep(&mut r.felix);
                write_match(&mut r.felix, m);
            }
            if let Some(t) = target {
                push_sep(&mut r.felix);
                write_target(&mut r.felix, t);
            }
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

    fn push_match(&mut self, m: &Match) -> Result<(), ModelError> {
        push_sep(&mut self.felix);
        write_match(&mut self.felix, m);
        let r = Arc::make_mut(&mut self.rule);
        match m {
            Match::Protocol { proto, negated } => {
                let p = model::Protocol::from_token(&kernel_proto(*proto))?;
                r.protocol = Some(model::Negatable {
                    negated: *negated,
                    value: p,
                });
            }
            Match::Net { side, net, negated } => {
                let v = Some(model::Negatable {
                    negated: *negated,
                    value: model::Addr::Net(*net),
                });
                match side {
                    Side::Src => r.src = v,
                    Side::Dst => r.dst = v,
                }
            }
            Match::InIface(i) => {
                r.in_iface = Some(model::Negatable::is(model::Iface::new(i.as_str())?))
            }
            Match::OutIface(i) => {
                r.out_iface = Some(model::Negatable::is(model::Iface::new(i.as_str())?))
            }
            Match::Set { .. } | Match::NetSet { .. } => {
                use model::SetDir::{Dst, Src};
                let (name, flags, negated) = m.set_match().expect("a set match");
                let dirs = match flags {
                    SetFlags::Src => vec![Src],
                    SetFlags::Dst => vec![Dst],
                    SetFlags::SrcSrc => vec![Src, Src],
                    SetFlags::DstDst => vec![Dst, Dst],
                };
                let name = model::SetName::new(name)?;
                r.matches.push(model::Match::Set {
                    negated,
                    name,
                    dirs,
                });
                if let Match::NetSet { name, nets, .. } = m {
                    self.net_sets.push((name.clone(), nets.clone()));
                }
            }
            Match::Ports {
                side,
                ports,
                negated,
            } => {
                let kind = match side {
                    Side::Src => model::PortsKind::Source,
                    Side::Dst => model::PortsKind::Destination,
                };
                r.matches.push(model::Match::Multiport {
                    negated: *negated,
                    kind,
                    ports: ports.clone(),
                });
            }
            Match::Icmp {
                v6,
                type_,
                code,
                negated,
            } => {
                let icmp_type = match code {
                    Some(c) => model::IcmpType::TypeCode(*type_, *c),
                    None => model::IcmpType::Type(*type_),
                };
                r.matches.push(if *v6 {
                    model::Match::Icmpv6 {
                        negated: *negated,
                        icmp_type,
                    }
                } else {
                    model::Match::Icmp {
                        negated: *negated,
                        icmp_type,
                    }
                });
            }
            Match::Mark {
                value,
                mask,
                negated,
            } => r.matches.push(model::Match::Mark {
                negated: *negated,
                value: *value,
                mask: *mask,
            }),
            Match::Conntrack { states, negated } => {
                use model::CtState::{Established, Invalid, Related};
                let states = match states {
                    CtStates::RelatedEstablished => model::CtStates::of(&[Related, Established]),
                    CtStates::Invalid => model::CtStates::of(&[Invalid]),
                };
                r.matches.push(model::Match::Conntrack {
                    negated: *negated,
                    states,
                });
            }
            Match::Limit { per_second, burst } => {
                r.matches.push(model::Match::Limit {
                    rate: model::Rate {
                        count: *per_second,
                        unit: model::RateUnit::Second,
                    },
                    // The kernel does not print the default burst.
                    burst: (*burst != 5).then_some(*burst),
                });
            }
            Match::SrcPort { proto, port } => {
                let ports = model::Ports {
                    sport: Some(model::Negatable::is(model::PortRange::single(*port))),
                    dport: None,
                };
                r.matches.push(if proto.number() == 17 {
                    model::Match::Udp(ports)
                } else {
                    model::Match::Tcp(ports)
                });
            }
            Match::CtDirReply => r.matches.push(model::Match::Generic {
                module: model::Word::new("conntrack")?,
                args: vec![model::Arg::bare("--ctdir")?, model::Arg::bare("REPLY")?],
            }),
            Match::Rpfilter { negated } => {
                let mut args = Vec::new();
                if *negated {
                    args.push(model::Arg::bare("--invert")?);
                }
                r.matches.push(model::Match::Generic {
                    module: model::Word::new("rpfilter")?,
                    args,
                });
            }
        }
        Ok(())
    }

    fn set_target(&mut self, t: &Target) -> Result<(), ModelError> {
        push_sep(&mut self.felix);
        write_target(&mut self.felix, t);
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
            Target::Nflog { group, prefix } => model::Target::Nflog {
                prefix: Some(model::Text::new(prefix.as_str())?),
                group: *group,
                len: None,
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
        });
        Ok(())
    }
}

/// The protocol as `iptables-save` prints it (numbers without a well-known name stay numbers;
/// the kernel may print a name from /etc/protocols for those, which only changes the text).
pub fn kernel_proto(p: Protocol) -> String {
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
