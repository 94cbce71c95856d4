//! Fast drift detection: everything of ours checked every few seconds, cheaply when nothing
//! changed.
//!
//! The periodic full refresh (re-read everything, repair) stays the backstop; between two, each
//! check asks the backend's change signal ([`super::signal`]) whether the tables changed since
//! the last look or our last write: the nft generation id; legacy's table summaries, and a hash
//! of its save on a slower cadence (the only signal where the programs run in another
//! namespace). Only
//! when it moved are the tables re-read, and every table is planned against the desired state
//! exactly as an apply plans it (the same hash-positional diff): the chains the plan touches are
//! the drift of ours (every `cali-` chain: workload, dispatch, policy, profile, shared, nat,
//! mangle, raw; our hook rules, displaced or gone), and the next apply rewrites exactly those,
//! one transaction per table. A foreign rule (in a kernel chain, or appended below our hooks)
//! is not ours to remove: the plan keeps it and moves our hook back above it. Our IP sets are
//! compared by members on every check (`ipset save`, no signal exists): a set flushed and
//! refilled with other members is rewritten; a domain set counts as drifted only when gone.

use crate::desired::diff::Op;

/// Our root chains: one found empty or missing means the table was likely flushed wholesale.
pub const ROOTS: [&str; 3] = ["cali-FORWARD", "cali-INPUT", "cali-OUTPUT"];

/// The chains a plan writes, each once, in order.
pub fn touched(ops: &[Op]) -> Vec<&str> {
    let mut chains: Vec<&str> = Vec::new();
    for op in ops {
        let c = match op {
            Op::Declare(c) | Op::DeleteChain(c) => c,
            Op::Replace { chain, .. }
            | Op::Append { chain, .. }
            | Op::Insert { chain, .. }
            | Op::DeleteIndex { chain, .. }
            | Op::DeleteSpec { chain, .. } => chain,
        };
        if !chains.contains(&c.as_str()) {
            chains.push(c);
        }
    }
    chains
}

/// What one drift check found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriftReport {
    /// What of ours differed and was repaired: `table/chain`, `ipset/name`.
    pub drifted: Vec<String>,
    /// A root chain of ours was gone or empty (the table was likely flushed).
    pub full_refresh: bool,
    /// Table re-reads this check did (0 when the change signal had not moved).
    pub listings: u32,
    /// Our IP sets whose members differed (repaired).
    pub sets: Vec<String>,
}
