//! Reference counts of the shared endpoint policy chains (`cali-si-`/`cali-so-`), and which
//! endpoint policy lists they were rendered from.
//!
//! Invariant: a shared chain is in the families iff at least one endpoint chain goes to it; the
//! renderer takes the new references of a flushed endpoint before it drops the old ones, so a
//! chain that stays in use is never deleted and re-created, and a chain reaches the kernel in the
//! same transaction as the first endpoint chain that goes to it (the applier declares new chains
//! first and deletes unused ones last). Every [`Inputs`] remembered names a chain in use, whose
//! rules are exactly what those inputs render to: an endpoint with the same inputs goes to it
//! without rendering (and hashing) its rules again.

use std::collections::HashMap;

use calc_graph::proto::{Action, LocalEndpoint, PolicyId};

/// What a shared chain's rules depend on besides the renderer's fixed configuration (marks,
/// encap, deny log): the direction, each tier's name, default action and policies in that
/// direction, and the profiles (see `endpoint::shared_endpoint_chain`).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct Inputs {
    ingress: bool,
    tiers: Vec<(String, Action, Vec<PolicyId>)>,
    profiles: Vec<String>,
}

impl Inputs {
    pub(super) fn of(ep: &LocalEndpoint, ingress: bool) -> Self {
        let tiers = ep.tiers.iter().map(|t| {
            let policies = if ingress {
                &t.ingress_policies
            } else {
                &t.egress_policies
            };
            (t.name.clone(), t.default_action, policies.clone())
        });
        Inputs {
            ingress,
            tiers: tiers.collect(),
            profiles: ep.profile_ids.clone(),
        }
    }
}

/// Users per shared chain name, and the chain each endpoint policy list in use renders to.
#[derive(Debug, Default)]
pub(super) struct SharedChains {
    users: HashMap<String, usize>,
    rendered: HashMap<Inputs, String>,
}

impl SharedChains {
    /// The chain in use that `inputs` render to, if one is known.
    pub(super) fn rendered(&self, inputs: &Inputs) -> Option<&str> {
        self.rendered.get(inputs).map(String::as_str)
    }

    /// Adds a user of `name`, which `inputs` render to (the caller creates the chain when it
    /// had no users).
    pub(super) fn acquire(&mut self, name: &str, inputs: Inputs) {
        *self.users.entry(name.to_string()).or_default() += 1;
        self.rendered
            .entry(inputs)
            .or_insert_with(|| name.to_string());
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
                self.rendered.retain(|_, n| n != name);
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
