//! The renderer's host endpoints ([`super::super::host`]): every change re-renders the host
//! endpoint chains, their dispatch chains and (while there are host endpoints) the failsafe
//! chains and the static chains' host endpoint rules, all in the same flush, so they reach the
//! kernel in one transaction. The same flush renders the mangle (preDNAT) and raw (doNotTrack)
//! side ([`super::super::host_tables`]): the endpoint, dispatch and failsafe chains, the policy
//! chains in Felix's form, the static chain and hook changes, again when such a policy changes.
//!
//! A host endpoint without `interfaceName` ([`BY_EXPECTED_IPS`]) applies to every interface
//! that carries one of its `expectedIPs`, from the host's interfaces and addresses the caller
//! passes in ([`Renderer::set_host_interfaces`]: data, read by the agent), as Felix's endpoint
//! manager resolves it: an endpoint with the interface's name wins it over an address match,
//! then the lowest name. One whose addresses are on no interface is not programmed
//! ([`Renderer::unresolved_host_endpoints`]).
//!
//! A node has a handful of host endpoints: rendering them all again is cheaper than tracking
//! which changed (the family writes only the chains that differ).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use std::net::IpAddr;

use calc_graph::proto::{ALL_INTERFACES, BY_EXPECTED_IPS, LocalHostEndpoint, PolicyId};

use super::super::family::hash_hooks;
use super::super::host_tables::{self, has_pre_dnat, has_untracked};
use super::super::{RenderError, dns_hold, host, names, static_chains};
use super::{Renderer, decrement};
use crate::desired::TableName;

#[derive(Default)]
pub(super) struct HostState {
    /// The node's host endpoints by resource name.
    endpoints: BTreeMap<String, LocalHostEndpoint>,
    /// The host's interfaces and their addresses (for [`BY_EXPECTED_IPS`] endpoints).
    interfaces: BTreeMap<String, Vec<IpAddr>>,
    /// The [`BY_EXPECTED_IPS`] endpoints none of whose addresses is on an interface.
    unresolved: Vec<String>,
    dirty: bool,
    /// The `(policy, ingress)` and `(profile, ingress)` chains the rendered chains jump to.
    policies: Vec<(PolicyId, bool)>,
    profiles: Vec<(String, bool)>,
    /// The chains rendered here (endpoint, dispatch and failsafe chains).
    chains: BTreeSet<String>,
    /// Whether the static chains currently have their host endpoint rules.
    static_rules: bool,
    /// The policy chains rendered in mangle (preDNAT) and raw (doNotTrack) for the endpoints:
    /// `(table, policy, ingress)`, in Felix's form (not shared, no verdict chains).
    table_policies: BTreeSet<(TableName, PolicyId, bool)>,
    /// The mangle and raw chains rendered here (besides the policy chains).
    table_chains: BTreeSet<(TableName, String)>,
    /// The profile chains rendered in mangle (outbound, Felix's form) for DNAT'd host egress.
    table_profiles: BTreeSet<String>,
    /// Whether mangle has its preDNAT rules and hook, raw its untracked ones.
    pre_dnat_on: bool,
    /// Whether mangle `cali-POSTROUTING` has its host endpoint rules (and the hook).
    egress_on: bool,
    untracked_on: bool,
}

impl Renderer {
    pub(super) fn update_host_endpoint(&mut self, h: LocalHostEndpoint) -> Result<(), RenderError> {
        let iface = &h.interface_name;
        if iface != ALL_INTERFACES
            && iface != BY_EXPECTED_IPS
            && !names::is_valid_interface_name(iface)
        {
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

    /// Sets the host's interfaces and their addresses, which place the endpoints without
    /// `interfaceName`; re-rendered on the next flush if that changes anything (then `true`).
    /// Interfaces whose names are not valid interface names are ignored.
    pub fn set_host_interfaces(&mut self, interfaces: BTreeMap<String, Vec<IpAddr>>) -> bool {
        if interfaces == self.hosts.interfaces {
            return false;
        }
        self.hosts.interfaces = interfaces;
        let affected = self.needs_host_interfaces();
        self.hosts.dirty |= affected;
        affected
    }

    /// Whether some host endpoint is placed by its `expectedIPs` (the caller then keeps
    /// [`Self::set_host_interfaces`] current).
    pub fn needs_host_interfaces(&self) -> bool {
        (self.hosts.endpoints.values()).any(|h| h.is_by_expected_ips())
    }

    /// The endpoints without `interfaceName` none of whose `expectedIPs` is on an interface
    /// (not programmed), by name, as of the last flush.
    pub fn unresolved_host_endpoints(&self) -> &[String] {
        &self.hosts.unresolved
    }

    /// Re-renders the host endpoint chains if an endpoint changed; the policies and profiles
    /// whose references changed go to `touched_*` (rendered or removed by the caller).
    pub(super) fn flush_hosts(
        &mut self,
        dirty_policies: &HashSet<PolicyId>,
        dirty_profiles: &HashSet<String>,
        touched_policies: &mut HashSet<PolicyId>,
        touched_profiles: &mut HashSet<String>,
        errors: &mut Vec<RenderError>,
    ) {
        // A preDNAT or doNotTrack policy's rules changed: its mangle/raw chains are rendered
        // here, so everything here is (the family skips the chains that did not change).
        let table_policy_dirty = (self.hosts.table_policies.iter())
            .any(|(_, p, _)| dirty_policies.contains(p))
            || (self.hosts.table_profiles.iter()).any(|p| dirty_profiles.contains(p));
        if !std::mem::take(&mut self.hosts.dirty) && !table_policy_dirty {
            return;
        }
        let (winners, unresolved) = resolve(&self.hosts.endpoints, &self.hosts.interfaces);
        self.hosts.unresolved = unresolved;
        let by_iface: BTreeMap<&str, &LocalHostEndpoint> = (winners.iter())
            .map(|h| (h.interface_name.as_str(), h))
            .collect();
        let mut chains = Vec::new();
        let (mut policies, mut profiles) = (Vec::new(), Vec::new());
        for h in by_iface.values() {
            chains.extend(host::host_endpoint_chains(
                h,
                &self.marks,
                self.cfg.verdict_log(),
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
        self.flush_host_tables(&winners, errors);
    }

    /// The mangle (preDNAT) and raw (doNotTrack) side of [`Self::flush_hosts`] for the
    /// endpoints that win their interface (`winners`, by interface).
    fn flush_host_tables(&mut self, winners: &[LocalHostEndpoint], errors: &mut Vec<RenderError>) {
        let heps: Vec<&LocalHostEndpoint> = winners.iter().collect();
        let pre: Vec<&LocalHostEndpoint> =
            heps.iter().copied().filter(|h| has_pre_dnat(h)).collect();
        let untracked: Vec<&LocalHostEndpoint> =
            heps.iter().copied().filter(|h| has_untracked(h)).collect();
        let (pre_on, untracked_on) = (!pre.is_empty(), !untracked.is_empty());
        let egress_on = !heps.is_empty();
        let mut chains: Vec<(TableName, String, Vec<_>)> = Vec::new();
        let mut policies = BTreeSet::new();
        let mut profiles = BTreeSet::new();
        // DNAT'd host egress: every endpoint's normal egress side, in mangle.
        for h in &heps {
            let (n, r) = host_tables::mangle_egress_chain(h, &self.marks, self.cfg.verdict_log());
            chains.push((TableName::Mangle, n, r));
            for t in &h.tiers {
                for p in &t.egress_policies {
                    policies.insert((TableName::Mangle, p.clone(), false));
                }
            }
            profiles.extend(h.profile_ids.iter().cloned());
        }
        if egress_on {
            let named: Vec<&str> = (heps.iter().map(|h| h.interface_name.as_str()))
                .filter(|i| *i != ALL_INTERFACES)
                .collect();
            let all = heps.iter().any(|h| h.is_all_interfaces());
            for (n, r) in host_tables::mangle_to_dispatch(&named, all) {
                chains.push((TableName::Mangle, n, r));
            }
        }
        for h in &pre {
            let (n, r) = host_tables::pre_dnat_chain(h, &self.marks);
            chains.push((TableName::Mangle, n, r));
            for t in &h.pre_dnat_tiers {
                for p in &t.ingress_policies {
                    policies.insert((TableName::Mangle, p.clone(), true));
                }
            }
        }
        if pre_on {
            let named: Vec<&str> = (pre.iter().map(|h| h.interface_name.as_str()))
                .filter(|i| *i != ALL_INTERFACES)
                .collect();
            let all = pre.iter().any(|h| h.is_all_interfaces());
            for (n, r) in host_tables::mangle_dispatch(&named, all) {
                chains.push((TableName::Mangle, n, r));
            }
            let (n, r) = host_tables::mangle_prerouting(&self.cfg.interface_prefixes, &self.marks);
            chains.push((TableName::Mangle, n, r));
        }
        for h in &untracked {
            for (n, r) in host_tables::untracked_chains(h, &self.marks) {
                chains.push((TableName::Raw, n, r));
            }
            for t in &h.untracked_tiers {
                for p in &t.ingress_policies {
                    policies.insert((TableName::Raw, p.clone(), true));
                }
                for p in &t.egress_policies {
                    policies.insert((TableName::Raw, p.clone(), false));
                }
            }
        }
        if untracked_on {
            let named: Vec<&str> = untracked
                .iter()
                .map(|h| h.interface_name.as_str())
                .collect();
            for (n, r) in host_tables::raw_dispatch(&named) {
                chains.push((TableName::Raw, n, r));
            }
            let (n, r) = host_tables::raw_output(&self.marks);
            chains.push((TableName::Raw, n, r));
        }

        let mut names: BTreeSet<(TableName, String)> =
            chains.iter().map(|(t, n, _)| (*t, n.clone())).collect();
        let hooks_changed = pre_on != self.hosts.pre_dnat_on
            || untracked_on != self.hosts.untracked_on
            || egress_on != self.hosts.egress_on;
        for fi in 0..2 {
            let v = self.families[fi].version;
            // Policy chains first: everything that jumps to them is written in the same change.
            for (table, id, ingress) in &policies {
                let rules = self.render_policy(id, *ingress, v, errors, false);
                let name = names::policy_chain_name(id, *ingress);
                self.families[fi].set_chain_if_changed(*table, &name, &rules);
            }
            for id in &profiles {
                let rules = self.render_profile(id, false, v, errors, false);
                let name = names::profile_chain_name(id, false);
                self.families[fi].set_chain_if_changed(TableName::Mangle, &name, &rules);
            }
            let fam = &mut self.families[fi];
            // mangle's failsafe chains are the filter ones: the inbound one while preDNAT
            // policy is rendered, the outbound one while any endpoint's egress chain is.
            let failsafe =
                host::failsafe_chains(&self.cfg.failsafe_inbound, &self.cfg.failsafe_outbound, v);
            for ((name, rules), on) in failsafe.into_iter().zip([pre_on, egress_on]) {
                if on {
                    fam.set_chain_if_changed(TableName::Mangle, &name, &rules);
                    names.insert((TableName::Mangle, name));
                }
            }
            if egress_on != self.hosts.egress_on {
                // cali-POSTROUTING is shared with the DNS hold rules, so it is never in `names`.
                let mut rules: Vec<_> = dns_hold::mangle_chains(&self.cfg, v)
                    .into_iter()
                    .flat_map(|(_, r)| r)
                    .collect();
                if egress_on {
                    rules.extend(host_tables::mangle_postrouting_rules(&self.marks));
                }
                if rules.is_empty() {
                    fam.remove_chain(TableName::Mangle, dns_hold::MANGLE_POSTROUTING);
                } else {
                    fam.set_chain_if_changed(
                        TableName::Mangle,
                        dns_hold::MANGLE_POSTROUTING,
                        &rules,
                    );
                }
            }
            if untracked_on {
                for (name, rules) in host_tables::raw_failsafe_chains(
                    &self.cfg.failsafe_inbound,
                    &self.cfg.failsafe_outbound,
                    v,
                ) {
                    fam.set_chain_if_changed(TableName::Raw, &name, &rules);
                    names.insert((TableName::Raw, name));
                }
            }
            for (table, name, rules) in &chains {
                fam.set_chain_if_changed(*table, name, rules);
            }
            if untracked_on != self.hosts.untracked_on {
                let (name, rules) =
                    static_chains::raw_chains(&self.cfg, &self.marks, untracked_on).remove(0);
                fam.set_chain_if_changed(TableName::Raw, &name, &rules);
            }
            if hooks_changed {
                let mut raw = static_chains::raw_hooks();
                if untracked_on {
                    raw.push(host_tables::raw_output_hook());
                }
                fam.set_hooks(TableName::Raw, hash_hooks(TableName::Raw, raw));
                let mut mangle = dns_hold::mangle_hooks(&self.cfg, v);
                if egress_on && mangle.is_empty() {
                    mangle.push(host_tables::mangle_postrouting_hook());
                }
                if pre_on {
                    mangle.push(host_tables::mangle_hook());
                }
                fam.set_hooks(TableName::Mangle, hash_hooks(TableName::Mangle, mangle));
            }
            for (table, name) in self.hosts.table_chains.difference(&names) {
                fam.remove_chain(*table, name);
            }
            for (table, id, ingress) in self.hosts.table_policies.difference(&policies) {
                fam.remove_chain(*table, &names::policy_chain_name(id, *ingress));
            }
            for id in self.hosts.table_profiles.difference(&profiles) {
                fam.remove_chain(TableName::Mangle, &names::profile_chain_name(id, false));
            }
            fam.prune_empty(TableName::Mangle);
        }
        self.hosts.table_chains = names;
        self.hosts.table_policies = policies;
        self.hosts.table_profiles = profiles;
        self.hosts.egress_on = egress_on;
        self.hosts.pre_dnat_on = pre_on;
        self.hosts.untracked_on = untracked_on;
    }
}

/// The endpoint that wins each interface, by interface (each with its interface as
/// `interface_name`), and the [`BY_EXPECTED_IPS`] endpoints that match no interface. As Felix's
/// endpoint manager: an endpoint naming the interface (or `*`) first, the lowest name among
/// them; then, for an interface no endpoint names, the lowest-named endpoint one of whose
/// `expectedIPs` the interface carries. An endpoint may win several interfaces.
fn resolve(
    endpoints: &BTreeMap<String, LocalHostEndpoint>,
    interfaces: &BTreeMap<String, Vec<IpAddr>>,
) -> (Vec<LocalHostEndpoint>, Vec<String>) {
    let mut by_iface: BTreeMap<String, LocalHostEndpoint> = BTreeMap::new();
    for h in endpoints.values().filter(|h| !h.is_by_expected_ips()) {
        by_iface
            .entry(h.interface_name.clone())
            .or_insert_with(|| h.clone());
    }
    let mut unresolved = Vec::new();
    for h in endpoints.values().filter(|h| h.is_by_expected_ips()) {
        let mut matched = false;
        for (iface, addrs) in interfaces {
            let carries = (h.ipv4_addrs.iter().chain(&h.ipv6_addrs)).any(|a| addrs.contains(a));
            if !carries || !names::is_valid_interface_name(iface) {
                continue;
            }
            matched = true;
            by_iface
                .entry(iface.clone())
                .or_insert_with(|| LocalHostEndpoint {
                    interface_name: iface.clone(),
                    ..h.clone()
                });
        }
        if !matched {
            unresolved.push(h.name.clone());
        }
    }
    (by_iface.into_values().collect(), unresolved)
}
