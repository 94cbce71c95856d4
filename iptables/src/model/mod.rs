//! Typed iptables tables, chains and rules, and their exact `iptables-save` / `iptables-restore` text.
//!
//! # Shape
//! * [`Ruleset`]: a whole save file: [`Item`]s = tables plus the `#` comment lines and blank lines
//!   around them (kept so that rendering reproduces the input).
//! * [`Table`]: `*name` … `COMMIT`; its body is an ordered list of [`TableLine`]s (chain
//!   declarations, `-A` rules, rare `-I` lines and comments) so program-written files with interleaved
//!   lines also render back in their order. Kernel output always lists all chains, then all rules.
//! * [`Chain`]: `:NAME POLICY [packets:bytes]` ([`Policy`] `None` renders `-`).
//! * [`Rule`]: chain, optional `[p:b]` counters, the base options (`-s -d -i -o -p -f`, each
//!   [`Negatable`]), the ordered [`Match`]es, and the optional [`Target`].
//!
//! # Rendering invariant
//! [`Rule::render`] prints exactly what `iptables-save` (1.8.9) prints for the rule: base options
//! first in the kernel's fixed order, then matches in order, then the target; strings quoted like
//! `xtables_save_string`. Typed variants only hold what the kernel prints in that form; everything
//! else is kept as [`Match::Generic`] / [`Target::Generic`] token lists (with `!` where it stood).
//! All strings are validated newtypes ([`Text`], [`Word`], [`ChainName`], …) so a rendered rule is
//! always one line whose tokens restore reads back as the same values (no option injection).
//!
//! # For the applier: reading a kernel dump
//! Parse with `crate::parse::parse_save`, then per table: [`Table::chain_names`] (declaration
//! order), [`Table::rules_of`] (a chain's rules in order), [`Rule::first_comment`] /
//! [`Rule::cali_comment`] (the `cali:` hash), [`Rule::render_spec`] (rule text to compare).
//! ```
//! use iptables::model::{Chain, ChainName, Match, Policy, Rule, Table, TableName, Target};
//! let mut t = Table::new(TableName::Filter);
//! t.push_chain(Chain::builtin(ChainName::new("INPUT").unwrap(), Policy::Accept));
//! t.push_chain(Chain::user(ChainName::new("cali-INPUT").unwrap()));
//! t.push_rule(
//!     Rule::new(ChainName::new("INPUT").unwrap())
//!         .with_match(Match::comment("cali:Cz_u1IQiXIMmKD4c").unwrap())
//!         .with_target(Target::Jump(ChainName::new("cali-INPUT").unwrap())),
//! );
//! assert_eq!(t.chain_names().collect::<Vec<_>>(), ["INPUT", "cali-INPUT"]);
//! let rule = t.rules_of("INPUT").next().unwrap();
//! assert_eq!(rule.cali_comment(), Some("cali:Cz_u1IQiXIMmKD4c"));
//! assert_eq!(rule.render_spec(), "-m comment --comment \"cali:Cz_u1IQiXIMmKD4c\" -j cali-INPUT");
//! assert_eq!(
//!     t.render(),
//!     "*filter\n:INPUT ACCEPT [0:0]\n:cali-INPUT - [0:0]\n\
//!      -A INPUT -m comment --comment \"cali:Cz_u1IQiXIMmKD4c\" -j cali-INPUT\nCOMMIT\n"
//! );
//! ```
//! Compare desired vs. kernel rules with [`Rule::render_spec`] (no chain, no counters). Build
//! `--noflush` payloads with [`RestoreWriter`] (`-N`, `-X`, `-F`, `-A`, `-I n`, `-R n`, `-D n`,
//! `-D spec`, chain declarations, `COMMIT`). A whole table as a restore section: [`Table::render`].
//! Desired rules should pass [`Rule::validate`] (kernel limits that would otherwise be applied
//! silently, e.g. comment truncation at 255 bytes).

mod matches;
mod restore;
mod rule;
mod table;
mod target;
pub(crate) mod text;
mod validate;

use std::fmt;

pub use matches::{
    AddrType, CtState, CtStates, IcmpType, Match, PortRange, Ports, PortsKind, Rate, RateUnit,
    SetDir,
};
pub use restore::RestoreWriter;
pub use rule::{Addr, Negatable, Protocol, Rule};
pub use table::{Chain, CommentLine, Item, Policy, Ruleset, Table, TableLine};
pub use target::{NflogLen, Target};
pub use text::{
    Arg, ChainName, Iface, MAX_CHAIN_NAME_LEN, MAX_IFACE_LEN, MAX_SET_NAME_LEN, MAX_TOKEN_LEN,
    SetName, Text, Word,
};
pub use validate::{
    MAX_COMMENT_LEN, MAX_LOG_PREFIX_LEN, MAX_MULTIPORT_PORTS, MAX_NFLOG_PREFIX_LEN,
};

/// A value the model refuses (it would not survive iptables-restore unchanged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} {message}")]
pub struct ModelError {
    /// What kind of value (e.g. `chain name`, `comment`).
    pub what: &'static str,
    /// The offending value (possibly shortened).
    pub value: String,
    pub message: String,
}

impl ModelError {
    pub(crate) fn new(what: &'static str, value: &str, message: String) -> Self {
        let value = if value.len() > 64 {
            let mut end = 64;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…", &value[..end])
        } else {
            value.to_string()
        };
        Self {
            what,
            value,
            message,
        }
    }
}

/// The five iptables tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableName {
    Filter,
    Nat,
    Mangle,
    Raw,
    Security,
}

impl TableName {
    pub const ALL: [TableName; 5] = [
        Self::Filter,
        Self::Nat,
        Self::Mangle,
        Self::Raw,
        Self::Security,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Nat => "nat",
            Self::Mangle => "mangle",
            Self::Raw => "raw",
            Self::Security => "security",
        }
    }

    /// The built-in chains of this table in the kernel's (hook) order.
    pub fn builtin_chains(self) -> &'static [&'static str] {
        match self {
            Self::Filter | Self::Security => &["INPUT", "FORWARD", "OUTPUT"],
            Self::Nat => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
            Self::Mangle => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
            Self::Raw => &["PREROUTING", "OUTPUT"],
        }
    }

    pub fn is_builtin_chain(self, chain: &str) -> bool {
        self.builtin_chains().contains(&chain)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TableName {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                ModelError::new(
                    "table name",
                    s,
                    "is not one of filter, nat, mangle, raw, security".into(),
                )
            })
    }
}

/// Packet and byte counters, printed `[packets:bytes]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Counters {
    pub packets: u64,
    pub bytes: u64,
}

impl fmt::Display for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}:{}]", self.packets, self.bytes)
    }
}

#[cfg(test)]
mod tests;
