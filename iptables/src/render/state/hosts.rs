//! The renderer's host endpoints ([`super::super::host`]): every change re-renders the host
//! endpoint chains, their dispatch chains and (while there are host endpoints) the failsafe
//! chains and the static chains' host endpoint rules, all in the same flush, so they reach the
//! kernel in one transaction. A node has a handful of host endpoints: rendering them all again
//! is cheaper than tracking which changed (the family writes only the chains that differ).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use calc_graph::proto::{ALL_INTERFACES, LocalHostEndpoint, PolicyId};

use super::super::{RenderError, host, names, static_chains};
use super::{Renderer, decrement};
use crate::desired::TableName;

#[derive(Default)]
pub(super) struct HostState {
    /// The node's host endpoints by resource name.
    endpoints: BTreeMap<String, LocalHostEndpoint>,
    dirty: bool,
    /// The `(policy, ingress)` and `(profile, ingress)` chains the rendered chains jump to.
    policies: Vec<(PolicyId, bool)>,
    profiles: Vec<(String, bool)>,
    /// The chains rendered here (endpoint, dispatch and failsafe chains).
    chains: BTreeSet<String>,
    /// Whether the static chains currently have their host endpoint rules.
    static_rules: bool,
}

impl Renderer {
    pub(super) fn update_host_endpoint(&mut self, h: LocalHostEndpoint) -> Result<(), RenderError> {
        let iface = &h.interface_name;
        if iface != ALL_INTERFACES && !names::is_valid_interface_name(iface) {
            let err = RenderError::InvalidHostInterface {
                endpoint: h.name.clone(),
                iface: iface.clone(),
            };
            self.remove_host_endpoint(&h.name);
            return Err(err);
        }
        self.hosts.dirty = true;
        self.hosts.endpoints.insert(h.name.clone(), h);
        Ok(())
    }

    pub(super) fn remove_host_endpoint(&mut self, name: &str) {
        self.hosts.dirty |= self.hosts.endpoints.remove(name).is_some();
    }

    /// The host endpoints the renderer holds, by name.
    pub fn host_endpoints(&self) -> impl Iterator<Item = &LocalHostEndpoint> {
        self.hosts.endpoints.values()
    }

    /// Re-renders the host endpoint chains if an endpoint changed; the policies and profiles
    /// whose references changed go to `touched_*` (rendered or removed by the caller).
    pub(super) fn flush_hosts(
        &mut self,
        touched_policies: &mut HashSet<PolicyId>,
        touched_profiles: &mut HashSet<String>,
    ) {
        if !std::mem::take(&mut self.hosts.dirty) {
            return;
        }
        // One endpoint per interface: the lowest name wins, as Felix resolves them.
        let mut by_iface: BTreeMap<&str, &LocalHostEndpoint> = BTreeMap::new();
        for h in self.hosts.endpoints.values() {
            by_iface.entry(h.interface_name.as_str()).or_insert(h);
        }
        let mut chains = Vec::new();
        let (mut policies, mut profiles) = (Vec::new(), Vec::new());
        for h in by_iface.values() {
            chains.extend(host::host_endpoint_chains(
                h,
                &self.marks,
                self.cfg.deny_log,
            ));
            for t in h.tiers.iter().chain(&h.forward_tiers) {
                policies.extend(t.ingress_policies.iter().map(|p| (p.clone(), true)));
                policies.extend(t.egress_policies.iter().map(|p| (p.clone(), false)));
            }
            for p in &h.profile_ids {
                profiles.push((p.clone(), true));
                profiles.push((p.clone(), false));
            }
        }
        let any = !by_iface.is_empty();
        if any {
            let named: Vec<&str> = by_iface
                .keys()
                .copied()
                .filter(|i| *i != ALL_INTERFACES)
                .collect();
            chains.extend(host::dispatch_chains(
                &named,
                by_iface.contains_key(ALL_INTERFACES),
            ));
        }

        // New references first, so a policy both lists use is never removed in between.
        for k in &policies {
            *self.policy_refs.entry(k.clone()).or_default() += 1;
            touched_policies.insert(k.0.clone());
        }
        for k in &profiles {
            *self.profile_refs.entry(k.clone()).or_default() += 1;
            touched_profiles.insert(k.0.clone());
        }
        let old_policies = std::mem::replace(&mut self.hosts.policies, policies);
        let old_profiles = std::mem::replace(&mut self.hosts.profiles, profiles);
        for k in &old_policies {
            decrement(&mut self.policy_refs, k);
            touched_policies.insert(k.0.clone());
        }
        for k in &old_profiles {
            decrement(&mut self.profile_refs, k);
            touched_profiles.insert(k.0.clone());
        }

        let mut names: BTreeSet<String> = chains.iter().map(|(n, _)| n.clone()).collect();
        let static_changed = any != self.hosts.static_rules;
        for fam in &mut self.families {
            if any {
                // The failsafe chains exist exactly while a host endpoint chain jumps to them,
                // and are written in the same change as that chain.
                for (name, rules) in host::failsafe_chains(
                    &self.cfg.failsafe_inbound,
                    &self.cfg.failsafe_outbound,
                    fam.version,
                ) {
                    fam.set_chain_if_changed(TableName::Filter, &name, &rules);
                    names.insert(name);
                }
            }
            for (name, rules) in &chains {
                fam.set_chain_if_changed(TableName::Filter, name, rules);
            }
            if static_changed {
                for (name, rules) in
                    static_chains::filter_chains(&self.cfg, &self.marks, fam.version, any)
                {
                    fam.set_chain_if_changed(TableName::Filter, &name, &rules);
                }
            }
            for gone in self.hosts.chains.difference(&names) {
                fam.remove_chain(TableName::Filter, gone);
            }
        }
        self.hosts.static_rules = any;
        self.hosts.chains = names;
    }
}
