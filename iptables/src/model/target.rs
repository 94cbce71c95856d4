//! [`Target`]: the `-j`/`-g` part of a rule, typed for what Calico-style rules use.

use std::fmt;
use std::fmt::Write as _;

use super::text::push_hex;
use super::{Arg, ChainName, Text, Word};

/// How NFLOG limits the copied length (`--nflog-size` is the working one; legacy kept `--nflog-range`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NflogLen {
    Size(u32),
    Range(u32),
}

/// The target of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Accept,
    Drop,
    Return,
    /// `-j REJECT [--reject-with X]` (the kernel always prints `--reject-with`).
    Reject {
        with: Option<Word>,
    },
    /// `-j CHAIN` (a user chain of the same table).
    Jump(ChainName),
    /// `-g CHAIN`.
    Goto(ChainName),
    /// `-j MARK --set-xmark 0xV/0xM` (how the kernel saves `--set-mark`, `--and-mark`, `--or-mark`:
    /// set-mark V/M = (V, M); or-mark M = (M, M); and-mark M = (0, !M)).
    Mark {
        value: u32,
        mask: u32,
    },
    /// `-j LOG [--log-prefix P] [--log-level N]` (the kernel omits level 4; prefix ≤ 29 bytes).
    Log {
        prefix: Option<Text>,
        level: Option<u8>,
    },
    /// `-j NFLOG [--nflog-prefix P] [--nflog-group G] [--nflog-size|--nflog-range N] [--nflog-threshold T]`
    /// in the kernel's print order; group 0 is not printed.
    Nflog {
        prefix: Option<Text>,
        group: u16,
        len: Option<NflogLen>,
        threshold: Option<u16>,
    },
    /// Any other target (`-j NAME args…`), including extension targets such as `DNAT` or `MASQUERADE`.
    Generic {
        name: Word,
        args: Vec<Arg>,
    },
}

impl Target {
    /// `-j MARK --or-mark bits` as the kernel saves it.
    pub fn or_mark(bits: u32) -> Self {
        Self::Mark {
            value: bits,
            mask: bits,
        }
    }

    /// `-j MARK --and-mark bits` as the kernel saves it.
    pub fn and_mark(bits: u32) -> Self {
        Self::Mark {
            value: 0,
            mask: !bits,
        }
    }

    /// `-j MARK --set-mark value/mask` as the kernel saves it.
    pub fn set_mark(value: u32, mask: u32) -> Self {
        Self::Mark { value, mask }
    }

    /// The name after `-j`/`-g`.
    pub fn name(&self) -> &str {
        match self {
            Self::Accept => "ACCEPT",
            Self::Drop => "DROP",
            Self::Return => "RETURN",
            Self::Reject { .. } => "REJECT",
            Self::Jump(c) | Self::Goto(c) => c.as_str(),
            Self::Mark { .. } => "MARK",
            Self::Log { .. } => "LOG",
            Self::Nflog { .. } => "NFLOG",
            Self::Generic { name, .. } => name.as_str(),
        }
    }

    /// The user chain this target jumps or goes to, if any.
    pub fn chain(&self) -> Option<&ChainName> {
        match self {
            Self::Jump(c) | Self::Goto(c) => Some(c),
            _ => None,
        }
    }

    /// Appends ` -j NAME options…` (or ` -g CHAIN`), leading space included.
    pub fn render_into(&self, out: &mut String) {
        out.push_str(if matches!(self, Self::Goto(_)) {
            " -g "
        } else {
            " -j "
        });
        out.push_str(self.name());
        match self {
            Self::Accept | Self::Drop | Self::Return | Self::Jump(_) | Self::Goto(_) => {}
            Self::Reject { with } => {
                if let Some(w) = with {
                    out.push_str(" --reject-with ");
                    out.push_str(w.as_str());
                }
            }
            Self::Mark { value, mask } => {
                out.push_str(" --set-xmark ");
                push_hex(out, *value);
                out.push('/');
                push_hex(out, *mask);
            }
            Self::Log { prefix, level } => {
                if let Some(p) = prefix {
                    out.push_str(" --log-prefix ");
                    p.render_into(out);
                }
                if let Some(l) = level {
                    let _ = write!(out, " --log-level {l}");
                }
            }
            Self::Nflog {
                prefix,
                group,
                len,
                threshold,
            } => {
                if let Some(p) = prefix {
                    out.push_str(" --nflog-prefix ");
                    p.render_into(out);
                }
                if *group != 0 {
                    let _ = write!(out, " --nflog-group {group}");
                }
                match len {
                    Some(NflogLen::Size(n)) => {
                        let _ = write!(out, " --nflog-size {n}");
                    }
                    Some(NflogLen::Range(n)) => {
                        let _ = write!(out, " --nflog-range {n}");
                    }
                    None => {}
                }
                if let Some(t) = threshold {
                    let _ = write!(out, " --nflog-threshold {t}");
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

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.render_into(&mut s);
        f.write_str(s.trim_start())
    }
}
