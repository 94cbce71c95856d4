//! Line tokeniser with iptables-restore's quoting rules (nom).
//!
//! Mirrors `add_param_to_argv` of iptables 1.8.9: tokens are separated by spaces or tabs; a `"`
//! opens a quoted part in which `\x` stands for `x`; the closing `"` ends the token. Outside quotes
//! backslashes and single quotes are literal. Unlike restore, an unterminated quote is an error.

use std::borrow::Cow;

use nom::IResult;
use nom::Parser;
use nom::character::complete::char;
use nom::combinator::opt;

use crate::model::text::find_byte_of;

/// One token of a rule line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tok<'a> {
    pub text: Cow<'a, str>,
    /// The token had a double-quoted part (so it is never an option name).
    pub quoted: bool,
    /// Byte offset of the token's first character in the line.
    pub offset: usize,
}

impl Tok<'_> {
    /// True for an unquoted token equal to `s` (an option name or `!`).
    pub fn is(&self, s: &str) -> bool {
        !self.quoted && self.text == s
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

// The three scanners below are nom parsers (`IResult`) written over bytes: every byte they stop
// at is ASCII, so the split points are always char boundaries. This is the parser's hot loop.

#[inline]
fn spaces(i: &str) -> IResult<&str, &str> {
    let b = i.as_bytes();
    let mut n = 0;
    while n < b.len() && (b[n] == b' ' || b[n] == b'\t') {
        n += 1;
    }
    Ok((&i[n..], &i[..n]))
}

/// Length of the bare part at the start of `b`: up to the first space, tab or `"`.
#[inline]
fn bare_len(b: &[u8]) -> usize {
    find_byte_of(b, [b' ', b'\t', b'"'])
}

#[inline]
fn bare(i: &str) -> IResult<&str, &str> {
    let n = bare_len(i.as_bytes());
    Ok((&i[n..], &i[..n]))
}

/// The inside of a quoted part: up to the closing `"`, skipping `\x` escapes; and whether it
/// has any.
fn quoted_body(i: &str) -> IResult<&str, (&str, bool)> {
    let b = i.as_bytes();
    let mut k = 0;
    let mut escaped = false;
    loop {
        k += find_byte_of(&b[k..], [b'"', b'\\']);
        match b.get(k) {
            Some(b'"') => return Ok((&i[k..], (&i[..k], escaped))),
            Some(_) if k + 1 < b.len() => {
                // Skip the escaped character (possibly multi-byte).
                let step = i[k + 1..].chars().next().map_or(1, char::len_utf8);
                k += 1 + step;
                escaped = true;
            }
            Some(_) => k += 1,
            None => break,
        }
    }
    Err(nom::Err::Error(nom::error::Error::new(
        i,
        nom::error::ErrorKind::Char,
    )))
}

/// `raw` with its `\x` escapes replaced by `x`.
fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Splits `line` into tokens; `Err(offset)` points at an unterminated `"`.
pub(crate) fn tokenize(line: &str) -> Result<Vec<Tok<'_>>, usize> {
    let mut toks = Vec::with_capacity(24);
    tokenize_into(line, &mut toks)?;
    Ok(toks)
}

/// [`tokenize`] into a reused vector (cleared first).
pub(crate) fn tokenize_into<'a>(line: &'a str, toks: &mut Vec<Tok<'a>>) -> Result<(), usize> {
    toks.clear();
    let mut rest = line;
    loop {
        let (r, _) = spaces(rest).map_err(|_| line.len() - rest.len())?;
        rest = r;
        if rest.is_empty() {
            return Ok(());
        }
        let offset = line.len() - rest.len();
        let (r, b) = bare(rest).map_err(|_| offset)?;
        rest = r;
        if rest.starts_with('"') {
            let quote_at = line.len() - rest.len();
            let (r, body) = opt(quoted_body).parse(&rest[1..]).map_err(|_| quote_at)?;
            let (r, _) = char::<&str, nom::error::Error<&str>>('"')
                .parse(r)
                .map_err(|_| quote_at)?;
            rest = r;
            let body = match body {
                Some((raw, true)) => Cow::Owned(unescape(raw)),
                Some((raw, false)) => Cow::Borrowed(raw),
                None => Cow::Borrowed(""),
            };
            let text = if b.is_empty() {
                body
            } else {
                Cow::Owned(format!("{b}{body}"))
            };
            toks.push(Tok {
                text,
                quoted: true,
                offset,
            });
        } else {
            toks.push(Tok {
                text: Cow::Borrowed(b),
                quoted: false,
                offset,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(line: &str) -> Vec<(String, bool)> {
        tokenize(line)
            .unwrap()
            .into_iter()
            .map(|t| (t.text.into_owned(), t.quoted))
            .collect()
    }

    #[test]
    fn splits_and_unquotes_like_restore() {
        assert_eq!(
            texts("-A X  -m comment\t--comment \"a \\\"b\\\" \\\\ \\'c\" -j ACCEPT "),
            vec![
                ("-A".into(), false),
                ("X".into(), false),
                ("-m".into(), false),
                ("comment".into(), false),
                ("--comment".into(), false),
                ("a \"b\" \\ 'c".into(), true),
                ("-j".into(), false),
                ("ACCEPT".into(), false),
            ]
        );
        assert_eq!(texts("\"\""), vec![(String::new(), true)]);
        assert_eq!(
            texts("ab\"c d\"e"),
            vec![("abc d".into(), true), ("e".into(), false)]
        );
        assert_eq!(
            texts("it's a\\b"),
            vec![("it's".into(), false), ("a\\b".into(), false)]
        );
    }

    #[test]
    fn unterminated_quote_is_an_error_at_the_quote() {
        assert_eq!(tokenize("-m comment --comment \"abc"), Err(21));
        assert_eq!(tokenize("x \"abc\\\""), Err(2));
    }

    #[test]
    fn bare_len_stops_where_the_byte_loop_does() {
        // Stops at every offset of an eight-byte word and in the tail, UTF-8 around them.
        let line = "a\tbcdefghi\"jk lmnopqrstuvwxyzé\"0123456 789abcdef\tü";
        for start in 0..line.len() {
            if !line.is_char_boundary(start) {
                continue;
            }
            let b = &line.as_bytes()[start..];
            let want = b
                .iter()
                .position(|c| matches!(c, b' ' | b'\t' | b'"'))
                .unwrap_or(b.len());
            assert_eq!(bare_len(b), want, "from {start}");
        }
        assert_eq!(bare_len(b""), 0);
        assert_eq!(bare_len(b"12345678"), 8);
        assert_eq!(bare_len(b"1234567 "), 7);
    }

    #[test]
    fn offsets_point_at_token_starts() {
        let t = tokenize("  -A  X").unwrap();
        assert_eq!((t[0].offset, t[1].offset), (2, 6));
    }
}
