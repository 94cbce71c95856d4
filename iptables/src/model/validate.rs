//! [`Rule::validate`]: limits the kernel enforces silently or that make a rule unrenderable.
//!
//! Rendering never fails, but some typed values would not survive a trip through the kernel
//! unchanged (a 300-byte comment is truncated to 255, so the applier would rewrite the rule forever)
//! or would print as text restore rejects (an empty state list). Builders of desired rules (the
//! renderer) should call this; the parser never produces rules that fail it from kernel output.

use super::{Match, ModelError, PortRange, Rule, Target};

/// Longest comment the kernel keeps (`XT_MAX_COMMENT_LEN` 256 with the NUL).
pub const MAX_COMMENT_LEN: usize = 255;
/// Longest LOG prefix the kernel keeps.
pub const MAX_LOG_PREFIX_LEN: usize = 29;
/// Longest NFLOG prefix the kernel keeps.
pub const MAX_NFLOG_PREFIX_LEN: usize = 63;
/// Most ports (a range counts twice) one multiport match takes.
pub const MAX_MULTIPORT_PORTS: usize = 15;

fn check_range(what: &'static str, chain: &str, p: &PortRange) -> Result<(), ModelError> {
    if p.first > p.last {
        return Err(ModelError::new(
            what,
            chain,
            format!("has reversed port range {}:{}", p.first, p.last),
        ));
    }
    Ok(())
}

impl Rule {
    /// Checks the limits above; the error names the rule's chain and the offending field.
    pub fn validate(&self) -> Result<(), ModelError> {
        let chain = self.chain.as_str();
        for m in &self.matches {
            match m {
                Match::Comment(t) if t.as_str().len() > MAX_COMMENT_LEN => {
                    return Err(ModelError::new(
                        "comment",
                        t.as_str(),
                        format!("is longer than {MAX_COMMENT_LEN} bytes"),
                    ));
                }
                Match::Conntrack { states, .. } | Match::State { states, .. }
                    if states.is_empty() =>
                {
                    return Err(ModelError::new(
                        "rule in chain",
                        chain,
                        "has an empty conntrack state list".into(),
                    ));
                }
                Match::Set { dirs, .. } if dirs.is_empty() || dirs.len() > 6 => {
                    return Err(ModelError::new(
                        "rule in chain",
                        chain,
                        "needs 1 to 6 --match-set directions".into(),
                    ));
                }
                Match::Multiport { ports, .. } => {
                    let n: usize = ports
                        .iter()
                        .map(|p| if p.first == p.last { 1 } else { 2 })
                        .sum();
                    if n == 0 || n > MAX_MULTIPORT_PORTS {
                        return Err(ModelError::new(
                            "rule in chain",
                            chain,
                            format!(
                                "has {n} multiport ports (1 to {MAX_MULTIPORT_PORTS} allowed, ranges count twice)"
                            ),
                        ));
                    }
                    for p in ports {
                        check_range("rule in chain", chain, p)?;
                    }
                }
                Match::Tcp(p) | Match::Udp(p) => {
                    for r in [&p.sport, &p.dport].into_iter().flatten() {
                        check_range("rule in chain", chain, &r.value)?;
                    }
                }
                Match::Addrtype { src, dst, .. }
                    if [src, dst].into_iter().flatten().any(|v| v.value.is_empty()) =>
                {
                    return Err(ModelError::new(
                        "rule in chain",
                        chain,
                        "has an empty addrtype list".into(),
                    ));
                }
                _ => {}
            }
        }
        match &self.target {
            Some(Target::Log {
                prefix: Some(p), ..
            }) if p.as_str().len() > MAX_LOG_PREFIX_LEN => Err(ModelError::new(
                "LOG prefix",
                p.as_str(),
                format!("is longer than {MAX_LOG_PREFIX_LEN} bytes"),
            )),
            Some(Target::Nflog {
                prefix: Some(p), ..
            }) if p.as_str().len() > MAX_NFLOG_PREFIX_LEN => Err(ModelError::new(
                "NFLOG prefix",
                p.as_str(),
                format!("is longer than {MAX_NFLOG_PREFIX_LEN} bytes"),
            )),
            _ => Ok(()),
        }
    }
}
