//! The desired dataplane state: the renderer's output and the applier's input, and everything
//! about it that needs no kernel: its checks, the change log ([`Changes`]), the per-table plan
//! against a kernel view and the restore-semantics simulator ([`diff`]), the IP set plans
//! ([`ipset`]), cleanup planning ([`cleanup`]) and the dry run ([`preview`]). Pure: the applier
//! ([`crate::apply`]) is the I/O end that feeds it kernel views and writes its payloads.
//!
//! One [`DesiredState`] describes everything felixrs wants in the kernel for one IP family: our
//! `cali-` chains per table, our hook rules in the kernel chains, and our IP sets. Anything not
//! described here that *we own* (a `cali-*` chain, a rule carrying a `cali:` comment in a kernel
//! chain, a `cali4*`/`cali6*` set) is removed by the applier; anything we do not own is never
//! touched.
//!
//! Invariants checked by [`DesiredState::validate`] before anything is written:
//! * chain names are `cali-` + `[A-Za-z0-9_.:/-]`, at most 28 bytes; kernel chains are the built-in
//!   chains of their table;
//! * every rule carries a 16-character `[A-Za-z0-9_-]` hash that the applier writes as the rule's
//!   first comment (`-m comment --comment "cali:<hash>"`), and a body that is one line of restore
//!   text (no control characters, balanced double quotes);
//! * set names are `cali4`/`cali6` (matching the family) + `[A-Za-z0-9_.:-]`, at most 31 bytes, and
//!   never the temporary prefix `cali4t`/`cali6t`; members are typed and of the set's family.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use calc_graph::proto::Protocol;
pub use calc_graph::proto::{IpSetKind, IpSetMember, IpVersion};

pub use crate::model::TableName;
use crate::model::{HASH_COMMENT_PREFIX, MAX_CHAIN_LEN, is_our_chain, valid_hash};

mod changes;
pub mod cleanup;
pub mod diff;
mod error;
pub mod ipset;
mod preview;

pub use changes::Changes;
pub use error::DesiredError;
pub use preview::{Preview, preview};

/// Longest IP set name the kernel accepts.
pub const MAX_SET_NAME_LEN: usize = 31;
/// The longest member timeout the kernel accepts, in seconds (`ipset`: 0-2147483).
pub const MAX_SET_TIMEOUT: u32 = 2_147_483;
/// Felix's default `maxelem` for our sets.
pub const DEFAULT_MAXELEM: u32 = 1_048_576;

impl TableName {
    /// The built-in chains our hook rules may go into (= [`TableName::builtin_chains`]; the name
    /// the renderer's tests use).
    pub fn kernel_chains(self) -> &'static [&'static str] {
        self.builtin_chains()
    }
}

/// One rule we own. The applier writes it as
/// `-A <chain> -m comment --comment "cali:<hash>" <body>`.
///
/// `hash` is the Felix rule id (felix-reference §6.3: chained SHA-224 over the chain name and the
/// rule texts), computed by the renderer; the applier compares rules only by hash, so a rule whose
/// hash is unchanged is never rewritten (its counters survive).
///
/// The renderer's rules are made from their typed [`model::Rule`](crate::model::Rule)
/// ([`Self::from_rule`]): the body is rendered from it once, and the chain it jumps to comes from
/// its target. A rule built from restore text ([`Self::new`], for hand-written states) reads its
/// target from the text once.
#[derive(Debug, Clone)]
pub struct DesiredRule {
    pub hash: String,
    /// Matches and action in iptables-restore syntax, e.g.
    /// `-m comment --comment "Policy explicitly accepted packet." -m mark --mark 0x10000/0x10000 -j ACCEPT`.
    body: String,
    /// The user chain the rule jumps or goes to (`-j X` / `-g X`).
    target: Option<String>,
}

/// Rules are equal when they are written the same.
impl PartialEq for DesiredRule {
    fn eq(&self, o: &Self) -> bool {
        self.hash == o.hash && self.body == o.body
    }
}

impl Eq for DesiredRule {}

impl std::hash::Hash for DesiredRule {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.hash.hash(state);
        self.body.hash(state);
    }
}

impl DesiredRule {
    /// A rule from restore text (hand-written states; the renderer uses [`Self::from_rule`]).
    pub fn new(hash: impl Into<String>, body: impl Into<String>) -> Self {
        let body = body.into();
        DesiredRule {
            hash: hash.into(),
            target: crate::parse::body_target(&body).map(str::to_string),
            body,
        }
    }

    /// The typed rule `rule` (its chain and counters are not part of the body).
    pub fn from_rule(hash: impl Into<String>, rule: &crate::model::Rule) -> Self {
        DesiredRule {
            hash: hash.into(),
            body: rule.render_spec(),
            target: rule
                .target
                .as_ref()
                .and_then(|t| t.chain())
                .map(|c| c.as_str().to_string()),
        }
    }

    /// Matches and action in iptables-restore syntax.
    pub fn body(&self) -> &str {
        &self.body
    }

    /// The user chain the rule jumps or goes to (`-j X` / `-g X`).
    pub fn target(&self) -> Option<&str> {
        self.target.as_deref()
    }

    /// The rule text after `-A <chain> ` / `-I <chain> ` as written to iptables-restore.
    pub fn restore_spec(&self) -> String {
        let mut s = String::with_capacity(self.body.len() + 40);
        s.push_str("-m comment --comment \"");
        s.push_str(HASH_COMMENT_PREFIX);
        s.push_str(&self.hash);
        s.push('"');
        if !self.body.is_empty() {
            s.push(' ');
            s.push_str(&self.body);
        }
        s
    }
}

/// Where a hook rule goes in its kernel chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HookPosition {
    /// At the top (Felix's `InsertOrAppend` in insert mode); re-inserted if anything lands above.
    Top,
    /// At the bottom (Felix's `AppendRules`), after every foreign rule.
    Append,
}

/// A rule of ours in a kernel chain (`INPUT`, `FORWARD`, ...), e.g. `-j cali-INPUT`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HookRule {
    pub kernel_chain: String,
    pub rule: DesiredRule,
    pub position: HookPosition,
}

/// The desired content of one table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredTable {
    /// Our chains, `cali-…` name -> rules in order. An empty vector is an empty chain that exists.
    pub chains: BTreeMap<String, Vec<DesiredRule>>,
    /// Our rules in kernel chains, in the order they should appear (per kernel chain: the `Top`
    /// rules in order at the top, the `Append` rules in order at the bottom).
    pub hooks: Vec<HookRule>,
}

/// The desired content of one of our IP sets.
///
/// A domain set ([`IpSetKind::Domain`], `hash:ip ... timeout 0`) has no `members`: its addresses
/// belong to the DNS learner and expire in the kernel. `learned` (address → seconds left) is what
/// the learner knew when the set was rendered; the applier writes it only when it *creates* the
/// set, and never diffs or removes a domain set's members afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpSetSpec {
    pub kind: IpSetKind,
    pub maxelem: u32,
    pub members: BTreeSet<IpSetMember>,
    /// Domain sets only: the members to create the set with, each with its timeout in seconds.
    pub learned: BTreeMap<IpAddr, u32>,
}

impl IpSetSpec {
    pub fn new(kind: IpSetKind, members: impl IntoIterator<Item = IpSetMember>) -> Self {
        IpSetSpec {
            kind,
            maxelem: DEFAULT_MAXELEM,
            members: members.into_iter().collect(),
            learned: BTreeMap::new(),
        }
    }

    /// A domain set, created with `learned` (address, seconds left) members. A zero timeout
    /// would be permanent in the kernel: such an entry (already expired) is left out; one above
    /// the kernel's limit ([`MAX_SET_TIMEOUT`], a DNS TTL may be up to 2^31 - 1) is cut to it, so
    /// it never fails the whole `ipset restore`.
    pub fn domain(learned: impl IntoIterator<Item = (IpAddr, u32)>) -> Self {
        IpSetSpec {
            learned: (learned.into_iter())
                .filter(|(_, t)| *t > 0)
                .map(|(a, t)| (a, t.min(MAX_SET_TIMEOUT)))
                .collect(),
            ..IpSetSpec::new(IpSetKind::Domain, [])
        }
    }
}

/// Everything we want in the kernel for one IP family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredState {
    pub family: IpVersion,
    /// Tables not listed here are cleaned: our chains and hook rules in them are removed (a table we
    /// never touched is only read, never written).
    pub tables: BTreeMap<TableName, DesiredTable>,
    /// Kernel set name (`cali40s:…`) -> content.
    pub ip_sets: BTreeMap<String, IpSetSpec>,
}

impl DesiredState {
    pub fn new(family: IpVersion) -> Self {
        DesiredState {
            family,
            tables: BTreeMap::new(),
            ip_sets: BTreeMap::new(),
        }
    }

    /// Checks every name, hash, rule body and set member (see the module docs); the first problem
    /// found is returned as an error naming the table/chain/set and the offending value.
    ///
    /// The applier itself runs the same checks lazily, on exactly what goes into a payload (every
    /// chain name and hook chain, and each rule or set when it is written), so an apply whose
    /// change is small does not pay for re-checking the whole state.
    pub fn validate(&self) -> Result<(), DesiredError> {
        for (table, t) in &self.tables {
            for (chain, rules) in &t.chains {
                validate_chain_name(*table, chain)?;
                for rule in rules {
                    validate_written_rule(*table, t, chain, rule)?;
                }
            }
            for hook in &t.hooks {
                validate_hook_chain(*table, &hook.kernel_chain)?;
                validate_written_rule(*table, t, &hook.kernel_chain, &hook.rule)?;
            }
        }
        for (name, spec) in &self.ip_sets {
            validate_set(self.family, name, spec)?;
        }
        Ok(())
    }
}

/// A desired chain must be ours: `cali-` + `[A-Za-z0-9_.:/-]`, at most 28 bytes.
pub fn validate_chain_name(table: TableName, chain: &str) -> Result<(), DesiredError> {
    if is_our_chain(chain) && valid_chain_name(chain) {
        return Ok(());
    }
    Err(DesiredError::InvalidChain {
        table,
        chain: chain.to_string(),
        reason: "our chains are `cali-` + [A-Za-z0-9_.:/-], at most 28 bytes",
    })
}

/// Hook rules go only into the table's built-in chains.
pub fn validate_hook_chain(table: TableName, chain: &str) -> Result<(), DesiredError> {
    if table.builtin_chains().contains(&chain) {
        return Ok(());
    }
    Err(DesiredError::InvalidChain {
        table,
        chain: chain.to_string(),
        reason: "hook rules go only into the table's built-in chains",
    })
}

/// Checks one rule of desired table `t` before it is written into `chain`: hash shape, body
/// shape and that a jump to one of our chains goes to a chain the table desires.
pub fn validate_written_rule(
    table: TableName,
    t: &DesiredTable,
    chain: &str,
    rule: &DesiredRule,
) -> Result<(), DesiredError> {
    validate_rule(table, chain, rule)?;
    check_target(table, t, chain, rule)
}

/// Checks one set before it is written: name, maxelem and every member.
pub fn validate_set(family: IpVersion, name: &str, spec: &IpSetSpec) -> Result<(), DesiredError> {
    validate_set_name(family, name)?;
    if spec.maxelem == 0 {
        return Err(DesiredError::InvalidSet {
            set: name.to_string(),
            reason: "maxelem must be positive".into(),
        });
    }
    for m in &spec.members {
        validate_member(family, name, spec.kind, m)?;
    }
    for addr in spec.learned.keys() {
        let bad = |reason: &str| DesiredError::InvalidMember {
            set: name.to_string(),
            member: addr.to_string(),
            reason: reason.to_string(),
        };
        if spec.kind != IpSetKind::Domain {
            return Err(bad("only domain sets have learned members"));
        }
        if addr.is_ipv6() != (family == IpVersion::V6) {
            return Err(bad("member is not of the set's IP family"));
        }
        if !(1..=MAX_SET_TIMEOUT).contains(&spec.learned[addr]) {
            return Err(bad("timeout must be 1-2147483 seconds"));
        }
    }
    Ok(())
}

/// Whether a set name is one of ours for the family (`cali4*` / `cali6*`, temp sets included).
pub fn is_our_set(family: IpVersion, name: &str) -> bool {
    name.starts_with(set_prefix(family))
}

/// `cali4` / `cali6`.
pub fn set_prefix(family: IpVersion) -> &'static str {
    match family {
        IpVersion::V4 => "cali4",
        IpVersion::V6 => "cali6",
    }
}

/// `cali4t` / `cali6t`: names reserved for temporary sets used to swap metadata.
pub fn temp_set_prefix(family: IpVersion) -> &'static str {
    match family {
        IpVersion::V4 => "cali4t",
        IpVersion::V6 => "cali6t",
    }
}

fn name_chars_ok(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

fn valid_chain_name(name: &str) -> bool {
    // `/` appears in Felix's v3.32+ policy chain names (`cali-pi-np/<ns>/<name>`).
    name.len() <= MAX_CHAIN_LEN
        && !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-' | b'/'))
}

fn validate_rule(table: TableName, chain: &str, rule: &DesiredRule) -> Result<(), DesiredError> {
    let bad = |reason: &'static str| DesiredError::InvalidRule {
        table,
        chain: chain.to_string(),
        hash: rule.hash.clone(),
        reason,
    };
    if !valid_hash(&rule.hash) {
        return Err(bad("hash must be 16 characters of [A-Za-z0-9_-]"));
    }
    if rule.body.bytes().any(|b| b.is_ascii_control()) {
        return Err(bad("body must be one line without control characters"));
    }
    // Count unescaped double quotes: an odd count would let the rest of the line (or, in a
    // mis-quoted file, more) be read as one argument.
    let mut quotes = 0usize;
    let mut escaped = false;
    for c in rule.body.chars() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '"' {
            quotes += 1;
        }
    }
    if quotes % 2 == 1 {
        return Err(bad("body has an unbalanced double quote"));
    }
    let trimmed = rule.body.trim_start();
    if trimmed.starts_with('*') || trimmed.starts_with(':') || trimmed == "COMMIT" {
        return Err(bad("body must be rule options, not a restore command"));
    }
    Ok(())
}

/// A jump to one of our chains must go to a chain that is desired in the same table.
fn check_target(
    table: TableName,
    t: &DesiredTable,
    chain: &str,
    rule: &DesiredRule,
) -> Result<(), DesiredError> {
    match rule.target() {
        Some(target) if is_our_chain(target) && !t.chains.contains_key(target) => {
            Err(DesiredError::InvalidRule {
                table,
                chain: chain.to_string(),
                hash: rule.hash.clone(),
                reason: "jumps to a cali- chain that is not in the desired table",
            })
        }
        _ => Ok(()),
    }
}

/// Checks an IP set name we are about to put in a payload.
pub fn validate_set_name(family: IpVersion, name: &str) -> Result<(), DesiredError> {
    let reason = if !is_our_set(family, name) {
        format!("set names must start with {}", set_prefix(family))
    } else if name.starts_with(temp_set_prefix(family)) {
        format!("{} is reserved for temporary sets", temp_set_prefix(family))
    } else if name.len() > MAX_SET_NAME_LEN {
        format!("set names are at most {MAX_SET_NAME_LEN} bytes")
    } else if !name_chars_ok(name) {
        "set names may contain only [A-Za-z0-9_.:-]".to_string()
    } else {
        return Ok(());
    };
    Err(DesiredError::InvalidSet {
        set: name.to_string(),
        reason,
    })
}

fn validate_member(
    family: IpVersion,
    set: &str,
    kind: IpSetKind,
    m: &IpSetMember,
) -> Result<(), DesiredError> {
    let bad = |reason: &str| DesiredError::InvalidMember {
        set: set.to_string(),
        member: member_text(m),
        reason: reason.to_string(),
    };
    if m.is_ipv6() != (family == IpVersion::V6) {
        return Err(bad("member is not of the set's IP family"));
    }
    match (kind, m) {
        (IpSetKind::Net, IpSetMember::Net(_)) => Ok(()),
        (IpSetKind::IpPort, IpSetMember::IpPort { protocol, .. }) => {
            if port_protocol_name(*protocol).is_none() {
                Err(bad(
                    "hash:ip,port members must be tcp, udp, sctp or udplite",
                ))
            } else {
                Ok(())
            }
        }
        _ => Err(bad("member does not match the set type")),
    }
}

/// The ipset name of a port protocol (`tcp`, `udp`, `sctp`, `udplite`), the form `ipset save`
/// prints.
pub fn port_protocol_name(p: Protocol) -> Option<&'static str> {
    match p.number() {
        6 => Some("tcp"),
        17 => Some("udp"),
        132 => Some("sctp"),
        136 => Some("udplite"),
        _ => None,
    }
}

/// A member in the canonical text form `ipset save` prints: `10.0.0.1` for a /32 (or /128),
/// `10.1.0.0/16` for a net, `10.0.0.5,tcp:8080` for ip,port. Network bits are truncated first, as
/// the kernel does.
pub fn member_text(m: &IpSetMember) -> String {
    match m {
        IpSetMember::Net(net) => {
            let net = net.trunc();
            if net.prefix_len() == net.max_prefix_len() {
                net.addr().to_string()
            } else {
                net.to_string()
            }
        }
        IpSetMember::IpPort {
            addr,
            protocol,
            port,
        } => {
            let proto = port_protocol_name(*protocol)
                .map(str::to_string)
                .unwrap_or_else(|| protocol.number().to_string());
            format!("{addr},{proto}:{port}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::IpNet;

    fn mk_state() -> DesiredState {
        let mut s = DesiredState::new(IpVersion::V4);
        let t = s.tables.entry(TableName::Filter).or_default();
        t.chains.insert(
            "cali-INPUT".into(),
            vec![DesiredRule::new("aaaaaaaaaaaaaaaa", "-j ACCEPT")],
        );
        s.ip_sets.insert(
            "cali40s:abc".into(),
            IpSetSpec::new(
                IpSetKind::Net,
                [IpSetMember::Net("10.0.0.1/32".parse::<IpNet>().unwrap())],
            ),
        );
        s
    }

    #[test]
    fn valid_state_passes() {
        mk_state().validate().unwrap();
    }

    #[test]
    fn body_with_newline_is_rejected() {
        let mut s = mk_state();
        s.tables.get_mut(&TableName::Filter).unwrap().chains.insert(
            "cali-x".into(),
            vec![DesiredRule::new(
                "aaaaaaaaaaaaaaaa",
                "-j ACCEPT\nCOMMIT\n*nat",
            )],
        );
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("cali-x") && err.contains("control"), "{err}");
    }

    #[test]
    fn unbalanced_quote_and_bad_hash_are_rejected() {
        let mut s = mk_state();
        s.tables.get_mut(&TableName::Filter).unwrap().chains.insert(
            "cali-x".into(),
            vec![DesiredRule::new(
                "aaaaaaaaaaaaaaaa",
                "-m comment --comment \"x -j ACCEPT",
            )],
        );
        assert!(s.validate().unwrap_err().to_string().contains("quote"));
        let mut s = mk_state();
        s.tables.get_mut(&TableName::Filter).unwrap().chains.insert(
            "cali-x".into(),
            vec![DesiredRule::new("short\"", "-j ACCEPT")],
        );
        assert!(s.validate().unwrap_err().to_string().contains("hash"));
    }

    #[test]
    fn jump_to_undesired_chain_is_rejected() {
        let mut s = mk_state();
        s.tables.get_mut(&TableName::Filter).unwrap().chains.insert(
            "cali-x".into(),
            vec![DesiredRule::new("aaaaaaaaaaaaaaaa", "-g cali-missing")],
        );
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("cali-x") && err.contains("not in the desired"),
            "{err}"
        );
    }

    #[test]
    fn foreign_chain_and_bad_set_names_are_rejected() {
        let mut s = mk_state();
        s.tables
            .get_mut(&TableName::Filter)
            .unwrap()
            .chains
            .insert("KUBE-SERVICES".into(), vec![]);
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("KUBE-SERVICES")
        );
        for name in [
            "cali60s:x",
            "cali4tmp",
            "cali40 x",
            "cali40-this-name-is-far-too-long-for-ipset",
        ] {
            let mut s = mk_state();
            s.ip_sets
                .insert(name.into(), IpSetSpec::new(IpSetKind::Net, []));
            let err = s.validate().unwrap_err().to_string();
            assert!(err.contains(name), "{err}");
        }
    }

    #[test]
    fn members_must_match_family_and_kind() {
        let mut s = mk_state();
        s.ip_sets
            .get_mut("cali40s:abc")
            .unwrap()
            .members
            .insert(IpSetMember::Net("fd00::1/128".parse().unwrap()));
        assert!(s.validate().unwrap_err().to_string().contains("fd00::1"));
        let mut s = mk_state();
        s.ip_sets
            .get_mut("cali40s:abc")
            .unwrap()
            .members
            .insert(IpSetMember::IpPort {
                addr: "10.0.0.1".parse().unwrap(),
                protocol: Protocol::Tcp,
                port: 80,
            });
        assert!(s.validate().unwrap_err().to_string().contains("set type"));
    }

    #[test]
    fn member_text_matches_ipset_save() {
        let net = |s: &str| IpSetMember::Net(s.parse().unwrap());
        assert_eq!(member_text(&net("10.0.0.1/32")), "10.0.0.1");
        assert_eq!(member_text(&net("10.1.2.3/16")), "10.1.0.0/16");
        assert_eq!(member_text(&net("fd00::1/128")), "fd00::1");
        let ipp = IpSetMember::IpPort {
            addr: "10.0.0.5".parse().unwrap(),
            protocol: Protocol::Udp,
            port: 53,
        };
        assert_eq!(member_text(&ipp), "10.0.0.5,udp:53");
    }
}
