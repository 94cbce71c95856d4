//! What is ours in a kernel table: chains named `cali-*`, and rules whose **first** comment is
//! `cali:<hash>` (the Felix rule id). One place for these rules: the renderer names chains and
//! rules with them, the readers in [`crate::parse`] recognise them, the planner in
//! [`crate::desired`] never touches anything else.

use super::text::MAX_CHAIN_NAME_LEN;

/// Prefix of every chain we own.
pub const CHAIN_PREFIX: &str = "cali-";
/// Prefix of the rule-ownership comment (`cali:<hash>`).
pub const HASH_COMMENT_PREFIX: &str = "cali:";
/// Length of a rule hash id.
pub const HASH_LEN: usize = 16;
/// Longest chain name iptables accepts.
pub const MAX_CHAIN_LEN: usize = MAX_CHAIN_NAME_LEN;

/// Whether a chain name has our prefix.
pub fn is_our_chain(name: &str) -> bool {
    name.starts_with(CHAIN_PREFIX)
}

/// Whether `hash` has the shape of a rule id (16 base64url characters).
pub fn valid_hash(hash: &str) -> bool {
    hash.len() == HASH_LEN
        && hash
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
