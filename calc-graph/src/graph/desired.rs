//! The graph's current desired state, as the sequencer asks for it on flush.

use crate::proto::{DomainPattern, LocalHostEndpoint};

use super::sequencer::EpState;

use super::*;

impl Desired for CalcGraph {
    fn ip_pool(&self, name: &str) -> Option<IpPool> {
        self.pools.get(name).cloned()
    }

    fn ip_set(&self, id: &str) -> Option<(IpSetKind, Arc<[IpSetMember]>)> {
        if self.ipsets.domain_patterns(id).is_some() {
            return Some((IpSetKind::Domain, Arc::from(Vec::new())));
        }
        let set = self.ipsets.get(id)?;
        Some((set.kind, set.sorted_members()))
    }

    fn domain_patterns(&self, id: &str) -> Option<Arc<[DomainPattern]>> {
        self.ipsets.domain_patterns(id)
    }

    fn ip_set_active(&self, id: &str) -> bool {
        self.ipsets.get(id).is_some() || self.ipsets.domain_patterns(id).is_some()
    }

    fn policy(&self, id: &PolicyId) -> Option<ActivePolicy> {
        let key = self.policy_keys.get(id)?;
        if !self.active_policies.contains(key) {
            return None;
        }
        let p = &self.policies[key];
        Some(ActivePolicy {
            id: p.id.clone(),
            order: p.order,
            inbound_rules: p.rules.inbound.clone(),
            outbound_rules: p.rules.outbound.clone(),
            untracked: p.untracked,
            pre_dnat: p.pre_dnat,
            apply_on_forward: p.apply_on_forward,
        })
    }

    fn profile(&self, id: &str) -> Option<ActiveProfile> {
        let rules = self.active_profiles.get(id)?;
        Some(ActiveProfile {
            id: id.to_string(),
            inbound_rules: rules.inbound.clone(),
            outbound_rules: rules.outbound.clone(),
        })
    }

    fn endpoint(&self, id: &LocalId) -> Option<EpState> {
        let item = *self.ep_items.get(id)?;
        let ep = self.local_eps.get(&item)?;
        let policies = self.local.item_matches(item).iter().flat_map(|sel| {
            self.policies_by_sel
                .get(sel)
                .into_iter()
                .flatten()
                .map(|key| &self.policies[key])
        });
        fn r(p: &PolicyState) -> PolicyRef<'_> {
            PolicyRef {
                id: &p.id,
                order: p.order,
                ingress: p.ingress,
                egress: p.egress,
            }
        }
        match &ep.id {
            LocalId::Workload(wid) => {
                let normal = |p: &&PolicyState| !p.untracked && !p.pre_dnat;
                let refs = policies
                    .clone()
                    .filter(normal)
                    .filter(|p| !p.id.kind.is_staged())
                    .map(r)
                    .collect();
                // The staged view: only when a staged policy selects the endpoint or shadows
                // one of its policies.
                let staged_tiers = (!self.staged.is_empty())
                    .then(|| {
                        let normal: Vec<&PolicyState> = policies.filter(normal).collect();
                        let changed = normal
                            .iter()
                            .any(|p| p.id.kind.is_staged() || self.is_shadowed(&p.id));
                        changed.then(|| {
                            let view = normal
                                .into_iter()
                                .filter(|p| p.id.kind.is_staged() || !self.is_shadowed(&p.id))
                                .map(r)
                                .collect();
                            resolver::resolve_tiers(view, &self.tiers)
                        })
                    })
                    .flatten();
                Some(EpState::Workload(LocalEndpoint {
                    id: wid.clone(),
                    interface_name: ep.interface_name.clone(),
                    ipv4_nets: ep.ipv4_nets.clone(),
                    ipv6_nets: ep.ipv6_nets.clone(),
                    tiers: resolver::resolve_tiers(refs, &self.tiers),
                    profile_ids: ep.profiles.clone(),
                    allow_spoofed_source_prefixes: ep.allow_spoofed_source_prefixes.clone(),
                    staged_tiers,
                }))
            }
            LocalId::Host(name) => {
                // Felix's split (`tierInfoToProtoTierInfo`): untracked, pre-DNAT, and normal
                // policies, the normal ones with applyOnForward also in the forward tiers.
                // Pre-DNAT policies are ingress only.
                let (mut normal, mut forward, mut untracked, mut pre_dnat) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for p in policies.filter(|p| !p.id.kind.is_staged()) {
                    if p.untracked {
                        untracked.push(r(p));
                    } else if p.pre_dnat {
                        pre_dnat.push(PolicyRef {
                            egress: false,
                            ..r(p)
                        });
                    } else {
                        if p.apply_on_forward {
                            forward.push(r(p));
                        }
                        normal.push(r(p));
                    }
                }
                let addrs = |nets: &[ipnet::IpNet]| nets.iter().map(|n| n.addr()).collect();
                Some(EpState::Host(LocalHostEndpoint {
                    name: name.clone(),
                    interface_name: ep.interface_name.clone(),
                    ipv4_addrs: addrs(&ep.ipv4_nets),
                    ipv6_addrs: addrs(&ep.ipv6_nets),
                    tiers: resolver::resolve_tiers(normal, &self.tiers),
                    forward_tiers: resolver::resolve_tiers(forward, &self.tiers),
                    untracked_tiers: resolver::resolve_tiers(untracked, &self.tiers),
                    pre_dnat_tiers: resolver::resolve_tiers(pre_dnat, &self.tiers),
                    profile_ids: ep.profiles.clone(),
                }))
            }
        }
    }
}
