//! Recursive-descent parser over [`super::lexer`] tokens: libcalico-go's `parser.go`.
//!
//! `||` binds loosest, then `&&`, then the leading `!`s of an operation (collapsed by parity, as
//! Calico does). The only recursion is through parentheses, bounded by [`MAX_DEPTH`].
//!
//! Two limits, both [`MAX_DEPTH`]: the nesting of parentheses in the text (bounds the parser's
//! recursion) and the nesting of `And`/`Or` nodes in the tree (the parenthesis depth of the
//! canonical text, which prints every list in parentheses). The second keeps the set of accepted
//! trees closed under canonicalisation: `parse(canonical(s))` never hits a limit `s` did not.

use std::collections::BTreeSet;

use super::ast::Expr;
use super::lexer::{Lexer, Tok, excerpt};
use super::{MAX_DEPTH, SelectorError};

pub(crate) fn parse(input: &str) -> Result<Expr, SelectorError> {
    let mut p = Parser::new(input)?;
    if p.tok == Tok::Eof {
        return Ok(Expr::All);
    }
    let (expr, _) = p.or_expr(0)?;
    if p.tok != Tok::Eof {
        return Err(p.unexpected("after the end of the expression"));
    }
    Ok(expr)
}

struct Parser<'a> {
    lexer: Lexer<'a>,
    tok: Tok<'a>,
    offset: usize,
}

impl<'a> Parser<'a> {
    fn new(input: &'a str) -> Result<Self, SelectorError> {
        let mut lexer = Lexer::new(input);
        let (tok, offset) = lexer.next_token()?;
        Ok(Self { lexer, tok, offset })
    }

    fn advance(&mut self) -> Result<(), SelectorError> {
        let (tok, offset) = self.lexer.next_token()?;
        self.tok = tok;
        self.offset = offset;
        Ok(())
    }

    fn unexpected(&self, context: &str) -> SelectorError {
        SelectorError::new(
            self.offset,
            format!("unexpected {} {context}", self.tok.describe()),
        )
    }

    /// Returns the expression and its list depth (nesting of And/Or nodes).
    fn or_expr(&mut self, depth: usize) -> Result<(Expr, usize), SelectorError> {
        let start = self.offset;
        let mut ops = vec![self.and_expr(depth)?];
        while self.tok == Tok::Or {
            self.advance()?;
            ops.push(self.and_expr(depth)?);
        }
        list(ops, Expr::Or, start)
    }

    fn and_expr(&mut self, depth: usize) -> Result<(Expr, usize), SelectorError> {
        let start = self.offset;
        let mut ops = vec![self.operation(depth)?];
        while self.tok == Tok::And {
            self.advance()?;
            ops.push(self.operation(depth)?);
        }
        list(ops, Expr::And, start)
    }

    fn operation(&mut self, depth: usize) -> Result<(Expr, usize), SelectorError> {
        let mut negated = false;
        while self.tok == Tok::Not {
            negated = !negated;
            self.advance()?;
        }
        let (expr, list_depth) = match self.tok {
            Tok::Has(key) => {
                self.advance()?;
                (Expr::Has(key.to_string()), 0)
            }
            Tok::All => {
                self.advance()?;
                (Expr::All, 0)
            }
            Tok::Global => {
                self.advance()?;
                (Expr::Global, 0)
            }
            Tok::Label(key) => {
                self.advance()?;
                (self.comparison(key)?, 0)
            }
            Tok::LParen => {
                let open = self.offset;
                if depth >= MAX_DEPTH {
                    return Err(SelectorError::new(
                        open,
                        format!("selector nested too deeply (limit {MAX_DEPTH} parentheses)"),
                    ));
                }
                self.advance()?;
                let inner = self.or_expr(depth + 1)?;
                if self.tok != Tok::RParen {
                    return Err(
                        self.unexpected(&format!("where ')' should close the '(' at byte {open}"))
                    );
                }
                self.advance()?;
                inner
            }
            _ => return Err(self.unexpected("where an expression should start")),
        };
        let expr = if negated {
            Expr::Not(Box::new(expr))
        } else {
            expr
        };
        Ok((expr, list_depth))
    }

    /// After a label: an operator and its operand.
    fn comparison(&mut self, key: &str) -> Result<Expr, SelectorError> {
        let op = self.tok;
        let make: fn(String, String) -> Expr = match op {
            Tok::Eq => Expr::Eq,
            Tok::Ne => Expr::Ne,
            Tok::Contains => Expr::Contains,
            Tok::StartsWith => Expr::StartsWith,
            Tok::EndsWith => Expr::EndsWith,
            Tok::In | Tok::NotIn => {
                self.advance()?;
                let values = self.set_literal(op)?;
                return Ok(if op == Tok::In {
                    Expr::In(key.to_string(), values)
                } else {
                    Expr::NotIn(key.to_string(), values)
                });
            }
            _ => {
                return Err(self.unexpected(&format!(
                    "where an operator should follow label {}",
                    excerpt(key)
                )));
            }
        };
        self.advance()?;
        let Tok::Str(value) = self.tok else {
            return Err(self.unexpected(&format!(
                "where a quoted string should follow {}",
                op.describe()
            )));
        };
        self.advance()?;
        Ok(make(key.to_string(), value.to_string()))
    }

    /// `{ "a", "b", }`: strings separated by commas, a trailing comma allowed, as in Calico.
    fn set_literal(&mut self, op: Tok<'_>) -> Result<BTreeSet<String>, SelectorError> {
        if self.tok != Tok::LBrace {
            return Err(self.unexpected(&format!("where '{{' should follow {}", op.describe())));
        }
        self.advance()?;
        let mut values = BTreeSet::new();
        while let Tok::Str(value) = self.tok {
            values.insert(value.to_string());
            self.advance()?;
            if self.tok != Tok::Comma {
                break;
            }
            self.advance()?;
        }
        if self.tok != Tok::RBrace {
            return Err(self.unexpected("where '}' should close the set"));
        }
        self.advance()?;
        Ok(values)
    }
}

/// One operand stays itself; more become a list node one level deeper than its deepest operand.
fn list(
    mut ops: Vec<(Expr, usize)>,
    make: fn(Vec<Expr>) -> Expr,
    start: usize,
) -> Result<(Expr, usize), SelectorError> {
    if ops.len() == 1 {
        return Ok(ops.swap_remove(0));
    }
    let depth = 1 + ops.iter().map(|(_, d)| *d).max().unwrap_or(0);
    if depth > MAX_DEPTH {
        return Err(SelectorError::new(
            start,
            format!("selector nested too deeply (limit {MAX_DEPTH} levels of && and ||)"),
        ));
    }
    Ok((make(ops.into_iter().map(|(e, _)| e).collect()), depth))
}
