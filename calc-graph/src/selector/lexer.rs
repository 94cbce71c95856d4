//! Selector tokenizer: libcalico-go's `tokenizer.AppendTokens`, one token at a time.
//!
//! The tokenizer is context-sensitive in exactly one way, as Calico's is: right after a label it
//! looks for a word operator (`contains`, `starts with`, `ends with`, `not in`, `in`) instead of
//! another label. Whitespace is space and tab only. Strings have no escapes: the next matching
//! quote ends them. Every token carries the byte offset where it starts, for error messages.
//! Work per token is proportional to the bytes it consumes, so lexing is linear.

use nom::IResult;
use nom::bytes::complete::{tag, take_until, take_while};

use super::ast::is_key_byte;
use super::{MAX_LABEL_LENGTH, SelectorError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tok<'a> {
    Label(&'a str),
    Str(&'a str),
    LBrace,
    RBrace,
    Comma,
    Eq,
    Ne,
    In,
    Not,
    NotIn,
    Contains,
    StartsWith,
    EndsWith,
    All,
    Has(&'a str),
    Global,
    LParen,
    RParen,
    And,
    Or,
    Eof,
}

impl Tok<'_> {
    /// How the token reads in an error message.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Label(l) => format!("label {}", excerpt(l)),
            Tok::Str(s) => format!("string {}", excerpt(s)),
            Tok::Has(l) => format!("has({})", excerpt_bare(l)),
            Tok::LBrace => "'{'".into(),
            Tok::RBrace => "'}'".into(),
            Tok::Comma => "','".into(),
            Tok::Eq => "'=='".into(),
            Tok::Ne => "'!='".into(),
            Tok::In => "'in'".into(),
            Tok::Not => "'!'".into(),
            Tok::NotIn => "'not in'".into(),
            Tok::Contains => "'contains'".into(),
            Tok::StartsWith => "'starts with'".into(),
            Tok::EndsWith => "'ends with'".into(),
            Tok::All => "all()".into(),
            Tok::Global => "global()".into(),
            Tok::LParen => "'('".into(),
            Tok::RParen => "')'".into(),
            Tok::And => "'&&'".into(),
            Tok::Or => "'||'".into(),
            Tok::Eof => "end of selector".into(),
        }
    }
}

/// At most 40 characters of user text, debug-quoted so control characters stay visible.
pub(crate) fn excerpt(s: &str) -> String {
    format!("{:?}", excerpt_bare(s))
}

fn excerpt_bare(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let mut cut: String = s.chars().take(MAX).collect();
        cut.push('…');
        cut
    }
}

pub(crate) struct Lexer<'a> {
    input: &'a str,
    rest: &'a str,
    after_label: Option<&'a str>,
}

type NomResult<'a, O> = IResult<&'a str, O, nom::error::Error<&'a str>>;

fn ws(i: &str) -> &str {
    let r: NomResult<'_, &str> = take_while(|c| c == ' ' || c == '\t')(i);
    r.map_or(i, |(rest, _)| rest)
}

fn cut<'a>(i: &'a str, t: &'static str) -> Option<&'a str> {
    let r: NomResult<'a, &'a str> = tag(t)(i);
    r.ok().map(|(rest, _)| rest)
}

fn identifier(i: &str) -> (&str, &str) {
    let r: NomResult<'_, &str> = take_while(|c: char| c.is_ascii() && is_key_byte(c as u8))(i);
    r.map_or(("", i), |(rest, ident)| (ident, rest))
}

fn is_word_boundary(rest: &str) -> bool {
    rest.as_bytes().first().is_none_or(|&c| !is_key_byte(c))
}

/// `word`, then a word boundary (Calico's `cutPrefixCheckBreak`).
fn cut_word<'a>(i: &'a str, word: &'static str) -> Option<&'a str> {
    cut(i, word).filter(|rest| is_word_boundary(rest))
}

/// `first`, optional whitespace, `second`, optional whitespace, then a word boundary (Calico's
/// `cutMultiWordPrefixCheckBreak`: "starts with" and "startswith" are both accepted).
fn cut_two_words<'a>(i: &'a str, first: &'static str, second: &'static str) -> Option<&'a str> {
    let rest = ws(cut(i, first)?);
    let rest = ws(cut(rest, second)?);
    is_word_boundary(rest).then_some(rest)
}

impl<'a> Lexer<'a> {
    pub(crate) fn new(input: &'a str) -> Self {
        Self {
            input,
            rest: input,
            after_label: None,
        }
    }

    fn offset_of(&self, rest: &str) -> usize {
        self.input.len() - rest.len()
    }

    fn err(&self, at: &str, message: impl Into<String>) -> SelectorError {
        SelectorError::new(self.offset_of(at), message)
    }

    /// The next token and its byte offset. After `Eof` it keeps returning `Eof`.
    pub(crate) fn next_token(&mut self) -> Result<(Tok<'a>, usize), SelectorError> {
        let start = ws(self.rest);
        let offset = self.offset_of(start);
        let (tok, rest) = self.lex_one(start)?;
        self.rest = rest;
        self.after_label = match tok {
            Tok::Label(l) => Some(l),
            _ => None,
        };
        Ok((tok, offset))
    }

    fn lex_one(&self, i: &'a str) -> Result<(Tok<'a>, &'a str), SelectorError> {
        let Some(&first) = i.as_bytes().first() else {
            return Ok((Tok::Eof, i));
        };
        let one = |t| Ok((t, &i[1..]));
        match first {
            b'(' => one(Tok::LParen),
            b')' => one(Tok::RParen),
            b'{' => one(Tok::LBrace),
            b'}' => one(Tok::RBrace),
            b',' => one(Tok::Comma),
            b'"' | b'\'' => self.string(i),
            b'=' => cut(i, "==")
                .map(|r| (Tok::Eq, r))
                .ok_or_else(|| self.err(i, "expected '=='")),
            b'!' => Ok(cut(i, "!=").map_or((Tok::Not, &i[1..]), |r| (Tok::Ne, r))),
            b'&' => cut(i, "&&")
                .map(|r| (Tok::And, r))
                .ok_or_else(|| self.err(i, "expected '&&'")),
            b'|' => cut(i, "||")
                .map(|r| (Tok::Or, r))
                .ok_or_else(|| self.err(i, "expected '||'")),
            _ => match self.after_label {
                Some(label) => self.operator(i, label),
                None => self.word(i),
            },
        }
    }

    fn string(&self, i: &'a str) -> Result<(Tok<'a>, &'a str), SelectorError> {
        let quote = &i[..1];
        let body = &i[1..];
        let r: NomResult<'a, &'a str> = take_until(quote)(body);
        match r {
            Ok((rest, value)) => Ok((Tok::Str(value), &rest[1..])),
            Err(_) => Err(self.err(i, format!("unterminated string (no closing {quote})"))),
        }
    }

    fn operator(&self, i: &'a str, label: &str) -> Result<(Tok<'a>, &'a str), SelectorError> {
        if let Some(r) = cut_word(i, "contains") {
            Ok((Tok::Contains, r))
        } else if let Some(r) = cut_two_words(i, "starts", "with") {
            Ok((Tok::StartsWith, r))
        } else if let Some(r) = cut_two_words(i, "ends", "with") {
            Ok((Tok::EndsWith, r))
        } else if let Some(r) = cut_two_words(i, "not", "in") {
            Ok((Tok::NotIn, r))
        } else if let Some(r) = cut_word(i, "in") {
            Ok((Tok::In, r))
        } else {
            Err(self.err(
                i,
                format!("expected operator after label {}", excerpt(label)),
            ))
        }
    }

    fn word(&self, i: &'a str) -> Result<(Tok<'a>, &'a str), SelectorError> {
        if let Some(r) = cut(i, "has(") {
            let at = ws(r);
            let (ident, r) = self.label(at, "has(")?;
            let r = ws(r);
            return cut(r, ")")
                .map(|r| (Tok::Has(ident), r))
                .ok_or_else(|| self.err(r, "expected ')' to close has("));
        }
        for (word, tok) in [("all(", Tok::All), ("global(", Tok::Global)] {
            if let Some(r) = cut(i, word) {
                let r = ws(r);
                return cut(r, ")")
                    .map(|r| (tok, r))
                    .ok_or_else(|| self.err(r, format!("expected ')' after {word}")));
            }
        }
        let (ident, r) = self.label(i, "")?;
        Ok((Tok::Label(ident), r))
    }

    /// A label key (Calico's `cutIdentifier`): 1 to 512 key characters.
    fn label(&self, i: &'a str, context: &str) -> Result<(&'a str, &'a str), SelectorError> {
        let (ident, rest) = identifier(i);
        if ident.len() > MAX_LABEL_LENGTH {
            return Err(self.err(
                i,
                format!(
                    "label longer than {MAX_LABEL_LENGTH} bytes: {}",
                    excerpt(ident)
                ),
            ));
        }
        if ident.is_empty() {
            let what = match i.chars().next() {
                Some(c) => format!("unexpected character {c:?}"),
                None => "unexpected end of selector".to_string(),
            };
            let message = if context.is_empty() {
                what
            } else {
                format!("{what}, expected a label name in {context}")
            };
            return Err(self.err(i, message));
        }
        Ok((ident, rest))
    }
}
