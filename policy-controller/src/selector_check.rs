//! Selector syntax check for resources about to be written.
//!
//! Interim: checks quoting and parenthesis balance until `calc_graph::selector::parse` is merged, at which
//! point this delegates to the real parser.

/// Checks that a selector is well formed.
pub fn check(s: &str) -> Result<(), String> {
    let mut depth: i32 = 0;
    let mut quote: Option<char> = None;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '{') => depth += 1,
            (None, ')' | '}') => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("invalid selector {s:?}: unbalanced {c}"));
                }
            }
            _ => {}
        }
    }
    if quote.is_some() {
        return Err(format!("invalid selector {s:?}: unterminated string"));
    }
    if depth != 0 {
        return Err(format!("invalid selector {s:?}: unbalanced parentheses"));
    }
    Ok(())
}
