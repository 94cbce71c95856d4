//! Parser of `iptables-save` / `ip6tables-save` output (legacy and nft flavours) into the typed
//! [`crate::model`], such that [`Ruleset::render`] gives back the exact text for anything the kernel
//! prints (comment and blank lines included).
//!
//! Accepted: `# …` lines anywhere (headers, `# Completed on …`, the nft
//! `# Warning: iptables-legacy tables present …` line), blank lines, tables in any order and
//! repeated, `:CHAIN POLICY [p:b]` with or without counters, rules with or without a `[p:b]` prefix,
//! `-A CHAIN …` and `-I CHAIN [n] …` (restore input), leading/trailing spaces and runs of spaces on
//! rule lines (the kernel's normal form is rendered back), double-quoted strings with `\`
//! escapes, `!` negations in the modern position.
//!
//! Rejected with `LINE:COL: message`, like iptables-restore 1.8 rejects them: CRLF line ends, a
//! whitespace-only line, NUL bytes, an unterminated `"`, a rule outside a table, a missing `COMMIT`,
//! the pre-1.4 negation `-s ! X` / `--dport ! X`, unknown options of the fixed-option matches
//! (tcp, udp, multiport, icmp, icmp6, mark, mac, comment, state, limit, addrtype, set) and targets
//! (ACCEPT, DROP, RETURN, REJECT, LOG, NFLOG, MARK), an invalid MAC in `--mac-source`, names the
//! model refuses (chain names over 28 bytes, interface names over 15, …), `-N`/`-X`/`-F`/`-D`
//! lines (not save output).
//!
//! [`parse_save_lenient`] (for the kernel's own output: the applier, `trace --kernel`) takes every
//! rule line: one the rules above reject is kept verbatim as an [`OpaqueRule`] with a warning,
//! joined with the following lines while a double quote is open (a comment holding a raw newline).
//!
//! Like getopt, an option of those known matches/targets takes its value(s) verbatim even when
//! they look like options (`--comment -s` is the comment `-s`); an option no loaded match knows
//! goes to the implicit protocol match (`-p tcp --dport 22` becomes `-p tcp -m tcp --dport 22`, as
//! the kernel saves it).
//!
//! Not checked (semantic, needs the kernel): host names in `-s`/`-d` (kept verbatim), options of
//! other extensions (kept as ordered tokens; a value of theirs that looks like a base option such
//! as `-s` would be misread – the kernel quotes string values, so its output is unaffected),
//! whether sets/chains exist, IPv4 vs IPv6 modules in the wrong family.

mod counters;
mod lexer;
mod parallel;
mod read;
mod rule;
mod scan;
mod typed;

pub use counters::scan_counters;
pub use parallel::{MAX_THREADS, PARALLEL_MIN_BYTES, roundtrip_save_parts, roundtrip_threads};
pub use read::read_tables;
pub use scan::{ActualRule, ActualTable, Tokens, body_target, scan_rule, scan_save, unquote};

use std::collections::HashSet;

use nom::IResult;
use nom::Parser;
use nom::character::complete::{char, u64 as nom_u64};
use nom::sequence::{delimited, separated_pair};

use crate::model::text::{self, find_byte_of};
use crate::model::{
    Chain, ChainName, CommentLine, Counters, Item, OpaqueRule, Policy, Ruleset, Table, TableLine,
    TableName, Target,
};

/// A syntax error, 1-based line and column (in characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{column}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

fn counters(i: &str) -> IResult<&str, Counters> {
    delimited(
        char('['),
        separated_pair(nom_u64, char(':'), nom_u64),
        char(']'),
    )
    .map(|(packets, bytes)| Counters { packets, bytes })
    .parse(i)
}

struct Cursor<'a> {
    line_no: usize,
    line: &'a str,
}

impl Cursor<'_> {
    fn err(&self, offset: usize, message: impl Into<String>) -> ParseError {
        let offset = offset.min(self.line.len());
        let column = self
            .line
            .get(..offset)
            .map_or(offset, |s| s.chars().count())
            + 1;
        ParseError {
            line: self.line_no,
            column,
            message: message.into(),
        }
    }
}

/// Parses a whole save file.
pub fn parse_save(text: &str) -> Result<Ruleset, ParseError> {
    let mut b = Builder::new(text);
    parse(text, None, &mut b)?;
    Ok(b.rs)
}

/// Parses the kernel's own output, never failing on a rule line: a rule the typed parser cannot
/// take is kept verbatim as an [`OpaqueRule`] (it renders back byte for byte) and reported as a
/// warning. A quoted string holding a raw newline (a comment with a newline in it, which the
/// kernel prints across lines) spans the lines up to its closing quote. Only the file's structure
/// (tables, chain lines, `COMMIT`, CR/NUL bytes) can still fail.
pub fn parse_save_lenient(text: &str) -> Result<(Ruleset, Vec<ParseError>), ParseError> {
    let mut warnings = Vec::new();
    let mut b = Builder::new(text);
    parse(text, Some(&mut warnings), &mut b)?;
    warn_opaque(&warnings);
    Ok((b.rs, warnings))
}

/// `parse_save(text)?.render()` appended to `out`, without holding the model: each line is
/// rendered as soon as it is parsed and dropped, so a 90k-rule dump never has its ~1M allocations
/// alive at once. The same parser and the same errors as [`parse_save`]; on an error `out` holds a
/// prefix of the rendering (callers that must not print partial output write `out` only on `Ok`).
/// The text is the same as rendering the parsed [`Ruleset`]: jump resolution at `COMMIT` changes
/// the type of a target, never its text (`-j NAME` either way).
///
/// A text of [`PARALLEL_MIN_BYTES`] or more is parsed in [`roundtrip_threads`] chunks on scoped
/// threads (see [`roundtrip_save_parts`]); output and errors are the sequential path's.
pub fn roundtrip_save(text: &str, out: &mut String) -> Result<(), ParseError> {
    let rest = parallel::roundtrip_into(text, roundtrip_threads(text.len()), out)?;
    out.reserve(rest.iter().map(String::len).sum());
    for part in rest {
        out.push_str(&part);
    }
    Ok(())
}

/// [`roundtrip_save`] with the leniency of [`parse_save_lenient`]; returns its warnings.
pub fn roundtrip_save_lenient(text: &str, out: &mut String) -> Result<Vec<ParseError>, ParseError> {
    let mut warnings = Vec::new();
    let mut r = Renderer { out };
    parse(text, Some(&mut warnings), &mut r)?;
    r.finish(text);
    warn_opaque(&warnings);
    Ok(warnings)
}

fn warn_opaque(warnings: &[ParseError]) {
    for w in warnings {
        tracing::warn!(warning = %w, "iptables-save line kept verbatim (opaque rule)");
    }
}

/// Where the parser puts what it has read, in file order: [`Builder`] makes the [`Ruleset`],
/// [`Renderer`] renders each line and drops it.
trait Sink {
    /// A comment or blank line outside any table.
    fn item(&mut self, item: Item);
    /// `*name`; `rest` is the text from that line to the end (the builder sizes the table's
    /// line vector from it; the renderer does not look: scanning it was ~2% of a roundtrip).
    fn table(&mut self, name: TableName, rest: &str);
    fn line(&mut self, line: TableLine);
    fn commit(&mut self);
}

struct Builder {
    rs: Ruleset,
    table: Option<Table>,
}

impl Builder {
    fn new(text: &str) -> Self {
        Self {
            rs: Ruleset {
                items: Vec::new(),
                missing_final_newline: !text.is_empty() && !text.ends_with('\n'),
            },
            table: None,
        }
    }
}

impl Sink for Builder {
    fn item(&mut self, item: Item) {
        self.rs.items.push(item);
    }
    fn table(&mut self, name: TableName, rest: &str) {
        // Size the table's line vector once: growing a 100k-rule vector by doubling copies it.
        let section = rest.find("\nCOMMIT").map_or(rest, |end| &rest[..end]);
        let mut t = Table::new(name);
        t.lines.reserve_exact(count_newlines(section.as_bytes()));
        self.table = Some(t);
    }
    fn line(&mut self, line: TableLine) {
        if let Some(t) = &mut self.table {
            t.lines.push(line);
        }
    }
    fn commit(&mut self) {
        if let Some(t) = self.table.take() {
            self.rs.items.push(Item::Table(resolve_jumps(t)));
        }
    }
}

/// Renders as [`Ruleset::render_into`] and [`Table::render_into`] do, one line at a time.
struct Renderer<'o> {
    out: &'o mut String,
}

impl Renderer<'_> {
    fn finish(&mut self, text: &str) {
        if !text.is_empty() && !text.ends_with('\n') && self.out.ends_with('\n') {
            self.out.pop();
        }
    }
}

impl Sink for Renderer<'_> {
    fn item(&mut self, item: Item) {
        if let Item::Comment(c) = &item {
            self.out.push_str(c.as_str());
        }
        self.out.push('\n');
    }
    fn table(&mut self, name: TableName, _rest: &str) {
        self.out.push('*');
        self.out.push_str(name.as_str());
        self.out.push('\n');
    }
    fn line(&mut self, line: TableLine) {
        line.render_into(self.out);
        self.out.push('\n');
    }
    fn commit(&mut self) {
        self.out.push_str("COMMIT\n");
    }
}

/// Lines a quoted string may span in lenient mode.
const MAX_CONTINUATION_LINES: usize = 16;

fn parse(
    text: &str,
    lenient: Option<&mut Vec<ParseError>>,
    sink: &mut impl Sink,
) -> Result<(), ParseError> {
    if text.is_empty() {
        return Ok(());
    }
    let body = text.strip_suffix('\n').unwrap_or(text);
    if let Open::Table(name, start) = parse_lines(body, Open::No, lenient, sink)? {
        let last = body.split('\n').count();
        let last_line = body.rsplit('\n').next().unwrap_or("");
        return Err(ParseError {
            line: last,
            column: last_line.chars().count() + 1,
            message: format!("COMMIT expected for table {name} started at line {start}"),
        });
    }
    Ok(())
}

/// Whether a table is open where a run of lines starts or ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    No,
    /// This table, opened at this line.
    Table(TableName, usize),
    /// Open since before the run (a parallel chunk's guess, see [`parallel`]): only its errors,
    /// which are never reported, would need the name.
    Before,
}

/// The lines of `body` (a run of whole lines without its final `\n`; its line numbers counted
/// from 1) with `table` open or not at its start; returns what is open at its end. What a line
/// renders to and whether it parses depend on nothing before it but whether a table is open
/// (the [`RuleState`] is a cache), which is what lets [`parallel`] run chunks of a dump apart.
fn parse_lines(
    body: &str,
    mut table: Open,
    mut lenient: Option<&mut Vec<ParseError>>,
    sink: &mut impl Sink,
) -> Result<Open, ParseError> {
    let has_cr_or_nul = has_cr_or_nul(body.as_bytes());
    let mut state = RuleState::default();
    let mut toks = Vec::with_capacity(32);
    let mut lines = SplitLines { rest: Some(body) }.enumerate().peekable();
    while let Some((idx, line)) = lines.next() {
        let cur = Cursor {
            line_no: idx + 1,
            line,
        };
        if has_cr_or_nul && let Some(off) = line.find(['\r', '\0']) {
            let what = if line.as_bytes()[off] == b'\r' {
                "carriage return (CRLF line end); iptables-restore rejects it"
            } else {
                "NUL byte"
            };
            return Err(cur.err(off, what));
        }
        if line.is_empty() {
            match table {
                Open::No => sink.item(Item::Blank),
                _ => sink.line(TableLine::Blank),
            }
            continue;
        }
        if line.starts_with('#') {
            let c = CommentLine::new(line).map_err(|e| cur.err(0, e.to_string()))?;
            match table {
                Open::No => sink.item(Item::Comment(c)),
                _ => sink.line(TableLine::Comment(c)),
            }
            continue;
        }
        if line.bytes().all(|b| b == b' ' || b == b'\t') {
            return Err(cur.err(
                0,
                "whitespace-only line; iptables-restore rejects it (no command specified)",
            ));
        }
        if let Some(name) = line.strip_prefix('*') {
            match table {
                Open::No => {}
                Open::Table(t, _) => {
                    return Err(cur.err(0, format!("table {t} is not committed (COMMIT expected)")));
                }
                Open::Before => return Err(cur.err(0, "table is not committed (COMMIT expected)")),
            }
            let name: TableName = name
                .parse()
                .map_err(|e: crate::model::ModelError| cur.err(1, e.to_string()))?;
            let start = line.as_ptr() as usize - body.as_ptr() as usize;
            sink.table(name, &body[start..]);
            table = Open::Table(name, idx + 1);
            continue;
        }
        if line == "COMMIT" {
            if std::mem::replace(&mut table, Open::No) == Open::No {
                return Err(cur.err(0, "COMMIT outside a table"));
            }
            sink.commit();
            continue;
        }
        if table == Open::No {
            return Err(cur.err(
                0,
                "line outside a table (expected *filter, *nat, *mangle, *raw or *security)",
            ));
        }
        if line.starts_with(':') {
            sink.line(TableLine::Chain(chain_line(&cur)?));
            continue;
        }
        let err = match rule_line(&cur, &mut state, &mut toks) {
            Ok(l) => {
                sink.line(l);
                continue;
            }
            Err(e) => e,
        };
        let Some(warnings) = lenient.as_deref_mut() else {
            return Err(err);
        };
        // A quote left open: the string holds a raw newline; take lines up to the closing quote.
        let mut raw = line.to_string();
        let mut joined = 0;
        while lexer::tokenize(&raw).is_err() && joined < MAX_CONTINUATION_LINES {
            let Some((_, next)) = lines.peek() else { break };
            if *next == "COMMIT" {
                break;
            }
            raw.push('\n');
            raw.push_str(next);
            lines.next();
            joined += 1;
        }
        if raw.contains(['\r', '\0']) {
            return Err(err);
        }
        let lines_note = if joined > 0 {
            format!(" (a rule printed across {} lines)", joined + 1)
        } else {
            String::new()
        };
        warnings.push(ParseError {
            message: format!("kept verbatim{lines_note}: {}", err.message),
            ..err
        });
        sink.line(TableLine::Opaque(OpaqueRule::new(raw)));
    }
    Ok(table)
}

/// `text.split('\n')`, finding each `\n` eight bytes at a time ([`find_byte_of`]): the std
/// splitter's `memchr` call per ~130-byte line was ~7% of a roundtrip.
struct SplitLines<'a> {
    rest: Option<&'a str>,
}

impl<'a> Iterator for SplitLines<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        let rest = self.rest?;
        let n = find_byte_of(rest.as_bytes(), [b'\n']);
        if n == rest.len() {
            self.rest = None;
            return Some(rest);
        }
        self.rest = Some(&rest[n + 1..]);
        Some(&rest[..n])
    }
}

/// Whether `b` holds a `\r` or NUL, in one pass eight bytes at a time (two `memchr` passes
/// over a 13 MB dump cost ~28 M instructions).
fn has_cr_or_nul(b: &[u8]) -> bool {
    const CR: u64 = 0x0d0d_0d0d_0d0d_0d0d;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let x = u64::from_ne_bytes(c.try_into().expect("chunk of 8"));
        if text::zero_bytes(x) | text::zero_bytes(x ^ CR) != 0 {
            return true;
        }
    }
    chunks.remainder().iter().any(|&c| c == b'\r' || c == 0)
}

/// Number of `\n` bytes, eight at a time (a byte loop cost ~30 M instructions on a 13 MB dump).
fn count_newlines(b: &[u8]) -> usize {
    const LO7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const NL: u64 = 0x0a0a_0a0a_0a0a_0a0a;
    let mut chunks = b.chunks_exact(8);
    let mut n = 0usize;
    for c in &mut chunks {
        let x = u64::from_ne_bytes(c.try_into().expect("chunk of 8")) ^ NL;
        // High bit of each byte set iff that byte of x is non-zero (i.e. was not '\n').
        let nonzero = ((x & LO7).wrapping_add(LO7) | x) & !LO7;
        n += 8 - nonzero.count_ones() as usize;
    }
    n + chunks.remainder().iter().filter(|&&c| c == b'\n').count()
}

fn chain_line(cur: &Cursor) -> Result<Chain, ParseError> {
    let line = cur.line;
    let toks =
        lexer::tokenize(&line[1..]).map_err(|o| cur.err(o + 1, "unterminated double quote"))?;
    let at = |i: usize| toks.get(i).map_or(line.len(), |t| t.offset + 1);
    let name_tok = toks
        .first()
        .filter(|t| !t.quoted && t.offset == 0)
        .ok_or_else(|| cur.err(1, "chain name expected after ':'"))?;
    let name = ChainName::new(name_tok.as_str()).map_err(|e| cur.err(1, e.to_string()))?;
    let policy = match toks.get(1).map(|t| t.as_str()) {
        Some("-") => None,
        Some("ACCEPT") => Some(Policy::Accept),
        Some("DROP") => Some(Policy::Drop),
        Some(p) => {
            return Err(cur.err(
                at(1),
                format!("invalid policy {p:?} for chain {name} (expected ACCEPT, DROP or -)"),
            ));
        }
        None => return Err(cur.err(line.len(), format!("policy expected for chain {name}"))),
    };
    let counters = match toks.get(2) {
        None => None,
        Some(t) => match counters(t.as_str()) {
            Ok(("", c)) if !t.quoted => Some(c),
            _ => {
                return Err(cur.err(
                    at(2),
                    format!(
                        "invalid counters {:?} for chain {name} (expected [packets:bytes])",
                        t.as_str()
                    ),
                ));
            }
        },
    };
    if toks.len() > 3 {
        return Err(cur.err(
            at(3),
            format!("unexpected {:?} after chain {name}", toks[3].as_str()),
        ));
    }
    Ok(Chain {
        name,
        policy,
        counters,
    })
}

/// Reused across rule lines: the last chain name (rules come grouped per chain, so most lines
/// reuse it without allocating) and the typed-form scratch state (render buffer, interned set names).
#[derive(Default)]
struct RuleState {
    last_chain: Option<ChainName>,
    scratch: typed::Scratch,
}

fn rule_line<'a>(
    cur: &Cursor<'a>,
    state: &mut RuleState,
    toks: &mut Vec<lexer::Tok<'a>>,
) -> Result<TableLine, ParseError> {
    lexer::tokenize_into(cur.line, toks).map_err(|o| cur.err(o, "unterminated double quote"))?;
    let mut rest = &toks[..];
    let mut rule_counters = None;
    if let Some(first) = rest.first()
        && first.as_str().starts_with('[')
        && !first.quoted
    {
        match counters(first.as_str()) {
            Ok(("", c)) => rule_counters = Some(c),
            _ => {
                return Err(cur.err(
                    first.offset,
                    format!(
                        "invalid counters {:?} (expected [packets:bytes])",
                        first.as_str()
                    ),
                ));
            }
        }
        rest = &rest[1..];
    }
    let Some(cmd) = rest.first() else {
        return Err(cur.err(cur.line.len(), "command expected after counters"));
    };
    let insert = match cmd.as_str() {
        "-A" | "--append" if !cmd.quoted => false,
        "-I" | "--insert" if !cmd.quoted => true,
        other => {
            return Err(cur.err(
                cmd.offset,
                format!("unsupported command {other:?} (expected -A CHAIN or -I CHAIN)"),
            ));
        }
    };
    let chain_tok = rest.get(1).ok_or_else(|| {
        cur.err(
            cur.line.len(),
            format!("chain name expected after {}", cmd.as_str()),
        )
    })?;
    let chain = match &state.last_chain {
        Some(c) if c.as_str() == chain_tok.as_str() && !chain_tok.quoted => c.clone(),
        _ => {
            let c = ChainName::new(chain_tok.as_str())
                .map_err(|e| cur.err(chain_tok.offset, e.to_string()))?;
            state.last_chain = Some(c.clone());
            c
        }
    };
    rest = &rest[2..];
    let mut position = None;
    if insert
        && let Some(p) = rest.first()
        && !p.quoted
        && let Ok(n) = p.as_str().parse::<u32>()
    {
        if n == 0 {
            return Err(cur.err(p.offset, "rule position must be at least 1"));
        }
        position = Some(n);
        rest = &rest[1..];
    }
    let rule = rule::parse_rule(chain, rule_counters, rest, &mut state.scratch)
        .map_err(|(o, m)| cur.err(o, m))?;
    Ok(if insert {
        TableLine::Insert { position, rule }
    } else {
        TableLine::Rule(rule)
    })
}

/// `-j NAME` without options where NAME is a chain declared in the table becomes [`Target::Jump`].
fn resolve_jumps(mut t: Table) -> Table {
    let declared: HashSet<String> = t.chain_names().map(str::to_string).collect();
    for line in &mut t.lines {
        let (TableLine::Rule(r) | TableLine::Insert { rule: r, .. }) = line else {
            continue;
        };
        if let Some(Target::Generic { name, args }) = &r.target
            && args.is_empty()
            && declared.contains(name.as_str())
            && let Ok(c) = ChainName::new(name.as_str())
        {
            r.target = Some(Target::Jump(c));
        }
    }
    t
}

#[cfg(test)]
mod tests;
