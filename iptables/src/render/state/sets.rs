//! The renderer's IP sets: their desired content per family (selector, named-port, pool and
//! domain sets), the domain sets' seam with the DNS learner, and the checks of what the graph
//! sends.

use std::sync::Arc;

use calc_graph::proto::{DomainPattern, IpSetKind, IpSetMember, IpVersion};

use super::super::domains::{ActiveDomainSet, DomainMembers, LearnedAddr};
use super::super::{RenderError, names, nat, static_chains};
use super::Renderer;
use crate::desired::{IpSetSpec, TableName};

impl Renderer {
    /// Where the learned addresses of domain names come from (default: nothing learned). Used
    /// when a domain set is first put into the desired state: it is created full.
    pub fn set_domain_members(&mut self, members: Arc<dyn DomainMembers>) {
        self.domain_members = members;
    }

    /// The domain sets of the desired state, with their kernel names per family (`None` where no
    /// rule of that family references the set). After a successful apply these are the sets in
    /// the kernel; the learner adds each newly learned address to every one whose patterns match.
    pub fn active_domain_sets(&self) -> Vec<ActiveDomainSet> {
        let mut out: Vec<ActiveDomainSet> = (self.domain_patterns.iter())
            .filter_map(|(id, patterns)| {
                let [v4, v6] = [IpVersion::V4, IpVersion::V6].map(|v| {
                    let name = names::ipset_name(v, id);
                    self.family(v)
                        .state
                        .ip_sets
                        .contains_key(&name)
                        .then_some(name)
                });
                (v4.is_some() || v6.is_some()).then(|| ActiveDomainSet {
                    patterns: patterns.to_vec(),
                    v4_set: v4,
                    v6_set: v6,
                })
            })
            .collect();
        out.sort();
        out
    }

    /// The patterns of the domain set with kernel name `name` (either family), if it is one.
    pub fn domain_set_patterns(&self, name: &str) -> Option<&[DomainPattern]> {
        let id = self.set_ids.get(name)?;
        self.domain_patterns.get(id).map(|p| &p[..])
    }

    /// The learner's current members of a domain set in family `v` (for the evaluator and
    /// `felixrs trace`); `None` if `name` is not a domain set of the desired state.
    pub fn domain_set_members(&self, v: IpVersion, name: &str) -> Option<Vec<LearnedAddr>> {
        let patterns = self.domain_set_patterns(name)?;
        self.family(v).set_refs.contains_key(name).then(|| {
            let mut learned = self.domain_members.learned(patterns);
            learned.retain(|l| l.addr.is_ipv6() == (v == IpVersion::V6));
            learned
        })
    }

    pub(super) fn mark_set_changed(&mut self, id: &str) {
        self.mark_set_changed_in(id, [true, true]);
    }

    /// Marks the set changed in the families flagged `[v4, v6]` where it is referenced.
    pub(super) fn mark_set_changed_in(&mut self, id: &str, which: [bool; 2]) {
        for (fam, _) in self.families.iter_mut().zip(which).filter(|(_, w)| *w) {
            let name = names::ipset_name(fam.version, id);
            if fam.set_refs.contains_key(&name) {
                fam.set_changed(&name);
            }
        }
    }

    /// The pool sets' members and `cali-nat-outgoing`. A pool change that keeps some pool
    /// masquerading in a family only changes set members: the chain is identical, so not rewritten.
    pub(super) fn render_pools(&mut self) {
        let (all, masq) = nat::pool_sets(self.pools.values());
        for (id, members) in [(nat::ALL_POOLS_SET_ID, all), (nat::MASQ_POOLS_SET_ID, masq)] {
            for v in [IpVersion::V4, IpVersion::V6] {
                self.set_ids
                    .insert(names::ipset_name(v, id), id.to_string());
            }
            let changed: Vec<IpSetMember> = match self.ip_sets.get(id) {
                Some((_, old)) => old.symmetric_difference(&members).cloned().collect(),
                None => members.iter().cloned().collect(),
            };
            self.ip_sets
                .insert(id.to_string(), (IpSetKind::Net, members));
            self.mark_set_changed_in(id, families_of(&changed));
        }
        for fam in &mut self.families {
            let rules = nat::nat_outgoing_rules(
                fam.version,
                self.pools.values(),
                self.cfg.masquerade_random_fully,
            );
            fam.set_chain(TableName::Nat, static_chains::NAT_OUTGOING.into(), rules);
        }
    }

    pub(super) fn set_spec(&self, v: IpVersion, name: &str) -> IpSetSpec {
        if let Some(nets) = self.family(v).net_sets.get(name) {
            // A rule's CIDR list (shared layout): exactly the nets its matches carry.
            return IpSetSpec::new(IpSetKind::Net, nets.iter().map(|n| IpSetMember::Net(*n)));
        }
        let id = self.set_ids.get(name);
        if let Some(patterns) = id.and_then(|id| self.domain_patterns.get(id)) {
            // Created full: every unexpired address already learned for its patterns. The
            // applier uses these members only when it creates the set (the learner owns them).
            let learned = self.domain_members.learned(patterns);
            return IpSetSpec::domain(
                (learned.into_iter())
                    .filter(|l| l.addr.is_ipv6() == (v == IpVersion::V6))
                    .map(|l| (l.addr, l.remaining_secs)),
            );
        }
        match id.and_then(|id| self.ip_sets.get(id)) {
            Some((kind, members)) => IpSetSpec::new(
                *kind,
                members
                    .iter()
                    .filter(|m| m.is_ipv6() == (v == IpVersion::V6))
                    .flat_map(split_zero_prefix),
            ),
            // Referenced but removed by the graph: keep an empty set so no rule dangles.
            None => match id {
                Some(i) if i.starts_with("n:") => IpSetSpec::new(IpSetKind::IpPort, []),
                Some(i) if i.starts_with("d:") => IpSetSpec::domain([]),
                _ => IpSetSpec::new(IpSetKind::Net, []),
            },
        }
    }

    /// The members of an IP set in family `v` by kernel name (for the evaluator).
    pub fn set_members(&self, v: IpVersion, name: &str) -> Option<IpSetSpec> {
        self.family(v)
            .set_refs
            .contains_key(name)
            .then(|| self.set_spec(v, name))
    }
}

pub(super) fn check_set(
    id: &str,
    kind: IpSetKind,
    members: &[IpSetMember],
) -> Result<(), RenderError> {
    if !names::is_valid_ipset_id(&id.to_string()) {
        return Err(RenderError::InvalidIpSetId { id: id.to_string() });
    }
    for m in members {
        let ok = matches!(
            (kind, m),
            (IpSetKind::Net, IpSetMember::Net(_)) | (IpSetKind::IpPort, IpSetMember::IpPort { .. })
        );
        if !ok {
            let kind = match kind {
                IpSetKind::Net => "hash:net",
                IpSetKind::IpPort => "hash:ip,port",
                IpSetKind::Domain => "domain (no members from the graph)",
            };
            return Err(RenderError::InvalidIpSetMember {
                id: id.to_string(),
                member: format!("{m:?}"),
                kind,
            });
        }
    }
    Ok(())
}

/// `[has v4 members, has v6 members]`.
pub(super) fn families_of(members: &[IpSetMember]) -> [bool; 2] {
    [
        members.iter().any(|m| !m.is_ipv6()),
        members.iter().any(IpSetMember::is_ipv6),
    ]
}

/// The kernel's `hash:net` cannot hold a `/0`; like Felix, store it as the two `/1` halves.
fn split_zero_prefix(m: &IpSetMember) -> Vec<IpSetMember> {
    match m {
        IpSetMember::Net(n) if n.prefix_len() == 0 => {
            let halves: [&str; 2] = if n.addr().is_ipv6() {
                ["::/1", "8000::/1"]
            } else {
                ["0.0.0.0/1", "128.0.0.0/1"]
            };
            halves
                .iter()
                .map(|h| IpSetMember::Net(h.parse().expect("valid literal")))
                .collect()
        }
        other => vec![other.clone()],
    }
}
