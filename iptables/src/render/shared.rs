//! Reference counts of the shared endpoint policy chains (`cali-si-`/`cali-so-`).
//!
//! Invariant: a shared chain is in the families iff at least one endpoint chain goes to it; the
//! renderer takes the new references of a flushed endpoint before it drops the old ones, so a
//! chain that stays in use is never deleted and re-created, and a chain reaches the kernel in the
//! same transaction as the first endpoint chain that goes to it (the applier declares new chains
//! first and deletes unused ones last).

use std::collections::HashMap;

/// Users per shared chain name.
#[derive(Debug, Default)]
pub(super) struct SharedChains {
    users: HashMap<String, usize>,
}

impl SharedChains {
    /// Adds a user of `name`; true if it is the first (the chain must be created).
    pub(super) fn acquire(&mut self, name: &str) -> bool {
        let n = self.users.entry(name.to_string()).or_default();
        *n += 1;
        *n == 1
    }

    /// Drops a user of `name`; true if it was the last (the chain must be deleted).
    pub(super) fn release(&mut self, name: &str) -> bool {
        match self.users.get_mut(name) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                self.users.remove(name);
                true
            }
            None => false,
        }
    }

    /// How many endpoint chains go to `name`.
    pub(super) fn users(&self, name: &str) -> usize {
        self.users.get(name).copied().unwrap_or(0)
    }

    pub(super) fn len(&self) -> usize {
        self.users.len()
    }
}
