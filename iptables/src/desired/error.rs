//! Why a desired state is refused. Every variant names the table, chain, rule or set at fault.

use super::TableName;

/// A desired state (or one of its chains, rules or sets) that must not be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DesiredError {
    #[error("invalid chain {chain} in table {table}: {reason}")]
    InvalidChain {
        table: TableName,
        chain: String,
        reason: &'static str,
    },
    #[error("invalid rule {hash} in chain {chain} of table {table}: {reason}")]
    InvalidRule {
        table: TableName,
        chain: String,
        hash: String,
        reason: &'static str,
    },
    #[error("invalid ip set {set}: {reason}")]
    InvalidSet { set: String, reason: String },
    #[error("invalid member {member} of ip set {set}: {reason}")]
    InvalidMember {
        set: String,
        member: String,
        reason: String,
    },
}
