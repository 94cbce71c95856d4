//! Host endpoints in the mangle table (`preDNAT` policy, DNAT'd host egress) and the raw table (`doNotTrack`
//! policy), as Felix renders them (felix-reference §2.7, §2.8, §2.9; Felix's
//! `HostEndpointToMangleIngressChains`, `HostEndpointToRawChains`, `StaticManglePreroutingChain`,
//! `StaticRawPreroutingChain`, `StaticRawOutputChain`, `failsafeInChain`/`failsafeOutChain`).
//!
//! **mangle** (only while some host endpoint has a `preDNAT` policy; `*` included):
//! ```text
//! -A PREROUTING -j cali-PREROUTING                                         (hook, top)
//! cali-PREROUTING: RELATED,ESTABLISHED -> ACCEPT; accept bit -> ACCEPT; -i cali+ -> ACCEPT;
//!                  -j cali-from-host-endpoint; accept bit -> ACCEPT ("Host endpoint policy accepted packet.")
//! cali-fh-<iface>: -j cali-failsafe-in; clear accept|pass; the preDNAT tiers (no end-of-tier drop,
//!                  no profiles: a packet no policy decided goes on to nat PREROUTING's DNAT)
//! ```
//! A preDNAT allow sets the accept bit, which the filter table honours: `cali-INPUT` accepts a
//! marked packet before its host endpoint dispatch, `cali-FORWARD` skips `cali-from-hep-forward`
//! for it, and workload policy still applies (the workload chains clear the bit first).
//!
//! **raw** (only while some named-interface host endpoint has a `doNotTrack` policy; never for
//! `*`, as Felix):
//! ```text
//! -A PREROUTING -j cali-PREROUTING   (always)      -A OUTPUT -j cali-OUTPUT   (hook, top)
//! cali-PREROUTING: clear the Calico bits; -i cali+ -> set scratch0; the anti-spoofing rules;
//!                  -m mark --mark 0/scratch0 -j cali-from-host-endpoint; accept bit -> ACCEPT
//! cali-OUTPUT:     clear the Calico bits; -j cali-to-host-endpoint; accept bit -> ACCEPT
//! cali-fh-/cali-th-<iface>: -j cali-failsafe-in/-out; clear accept|pass; per policy:
//!                  jump, accept bit -> NOTRACK, accept bit -> RETURN (no drops, no profiles)
//! ```
//! An untracked allow is `NOTRACK` + the accept bit: the packet gets no conntrack entry and is
//! accepted by raw, then by the filter table's accept-bit rules. Untracked traffic has no
//! conntrack state to let replies back, so a doNotTrack policy must allow both directions.
//!
//! The raw failsafe chains also accept the reverse direction by source port (replies to
//! failsafe connections, which would otherwise meet the untracked policy); the mangle copy is
//! the filter one. Only host endpoint chains jump to them, and with no such endpoint none of
//! the above exists (the tables are exactly as without host endpoint support).
//!
//! **mangle, DNAT'd host egress** (while any host endpoint exists; `*` included): traffic the
//! host sends that was DNAT'd skips filter `cali-OUTPUT`'s host endpoint dispatch (its output
//! interface is only known after the DNAT), so Felix polices it in mangle POSTROUTING:
//! ```text
//! -A POSTROUTING -j cali-POSTROUTING                                       (hook, top)
//! cali-POSTROUTING: [the DNS hold rules]; accept bit -> RETURN (forwarded, accepted at the end of
//!                   filter FORWARD); clear the Calico bits; --ctstate DNAT -j cali-to-host-endpoint;
//!                   accept bit -> RETURN ("Host endpoint policy accepted packet.")
//! cali-th-<iface>:  the filter chain's egress side with RETURN as the allow action: RELATED,
//!                   ESTABLISHED -> accept bit, -> RETURN; INVALID -> DROP; -j cali-failsafe-out;
//!                   clear accept|pass; the normal tiers; the profiles; "Drop if no profiles matched"
//! ```
//! RETURN rather than ACCEPT, as Felix: the mangle table is for packet manipulation that later
//! rules may still need to apply to allowed traffic.

use calc_graph::proto::{ALL_INTERFACES, IpVersion, LocalHostEndpoint, PortRange, TierInfo};
use ipnet::IpNet;

use super::build::{CtStates, Match, Rule, Side, Target};
use super::dispatch;
use super::dns_hold::MANGLE_POSTROUTING;
use super::endpoint;
use super::host::{
    self, FAILSAFE_IN, FAILSAFE_OUT, FROM_HOST_DISPATCH, FailsafePort, HepChain, TO_HOST_DISPATCH,
};
use super::marks::MarkBits;
use super::rule::DenyLog;
use super::static_chains::{OUTPUT, PREROUTING, wildcard};
use crate::desired::HookPosition;

fn has_policies(tiers: &[TierInfo], ingress: bool) -> bool {
    tiers.iter().any(|t| {
        !(if ingress {
            &t.ingress_policies
        } else {
            &t.egress_policies
        })
        .is_empty()
    })
}

/// Whether the endpoint gets a mangle `cali-fh-` chain (it has an ingress preDNAT policy).
pub fn has_pre_dnat(h: &LocalHostEndpoint) -> bool {
    has_policies(&h.pre_dnat_tiers, true)
}

/// Whether the endpoint gets raw chains (a doNotTrack policy, named interface only).
pub fn has_untracked(h: &LocalHostEndpoint) -> bool {
    h.interface_name != ALL_INTERFACES
        && (has_policies(&h.untracked_tiers, true) || has_policies(&h.untracked_tiers, false))
}

fn accepted(m: &MarkBits) -> Match {
    Match::Mark {
        value: m.accept,
        mask: m.accept,
        negated: false,
    }
}

/// The tiers of a preDNAT or untracked chain: Felix's `endpointIptablesChain` for those chain
/// types, without the end-of-tier drop; `notrack`: an accepted packet is also `NOTRACK`ed.
fn tier_rules(tiers: &[TierInfo], ingress: bool, m: &MarkBits, notrack: bool) -> Vec<Rule> {
    let pass_clear = Match::Mark {
        value: 0,
        mask: m.pass,
        negated: false,
    };
    let mut rules = Vec::new();
    for tier in tiers {
        let policies = if ingress {
            &tier.ingress_policies
        } else {
            &tier.egress_policies
        };
        if policies.is_empty() {
            continue;
        }
        rules.push(
            Rule::new(vec![], Target::ClearMark(m.pass))
                .with_comment(&format!("Start of tier {}", tier.name)),
        );
        for p in policies {
            rules.push(Rule::new(
                vec![pass_clear.clone()],
                Target::Jump(super::names::policy_chain_name(p, ingress)),
            ));
            if notrack {
                rules.push(Rule::new(vec![accepted(m)], Target::NoTrack));
            }
            rules.push(
                Rule::new(vec![accepted(m)], Target::Return)
                    .with_comment("Return if policy accepted"),
            );
        }
    }
    rules
}

fn hep_chain(
    kind: HepChain,
    tiers: &[TierInfo],
    iface: &str,
    m: &MarkBits,
    notrack: bool,
) -> (String, Vec<Rule>) {
    let ingress = kind.ingress();
    let failsafe = if ingress { FAILSAFE_IN } else { FAILSAFE_OUT };
    let mut rules = vec![
        Rule::new(vec![], Target::Jump(failsafe.into())),
        Rule::new(vec![], Target::ClearMark(m.accept | m.pass)),
    ];
    rules.extend(tier_rules(tiers, ingress, m, notrack));
    (host::hep_chain_name(kind, iface), rules)
}

/// The mangle `cali-fh-<iface>` of an endpoint with preDNAT policy.
pub fn pre_dnat_chain(h: &LocalHostEndpoint, m: &MarkBits) -> (String, Vec<Rule>) {
    hep_chain(
        HepChain::From,
        &h.pre_dnat_tiers,
        &h.interface_name,
        m,
        false,
    )
}

/// The raw `cali-fh-<iface>` and `cali-th-<iface>` of an endpoint with doNotTrack policy.
pub fn untracked_chains(h: &LocalHostEndpoint, m: &MarkBits) -> Vec<(String, Vec<Rule>)> {
    [HepChain::From, HepChain::To]
        .into_iter()
        .map(|k| hep_chain(k, &h.untracked_tiers, &h.interface_name, m, true))
        .collect()
}

/// The mangle `cali-th-<iface>` of every host endpoint (Felix's
/// `HostEndpointToMangleEgressChains`): DNAT'd host egress, RETURN as the allow action.
pub fn mangle_egress_chain(
    h: &LocalHostEndpoint,
    m: &MarkBits,
    deny_log: Option<DenyLog>,
) -> (String, Vec<Rule>) {
    let established = Match::Conntrack {
        states: CtStates::RelatedEstablished,
        negated: false,
    };
    let mut rules = vec![
        Rule::new(
            vec![established.clone()],
            Target::SetMark {
                value: m.accept,
                mask: m.accept,
            },
        ),
        Rule::new(vec![established], Target::Return),
        Rule::new(
            vec![Match::Conntrack {
                states: CtStates::Invalid,
                negated: false,
            }],
            Target::Drop,
        ),
        Rule::new(vec![], Target::Jump(FAILSAFE_OUT.into())),
        Rule::new(vec![], Target::ClearMark(m.accept | m.pass)),
    ];
    rules.extend(endpoint::tier_rules(&h.tiers, false, m, false, deny_log));
    rules.extend(endpoint::profile_rules(
        &h.profile_ids,
        false,
        m,
        false,
        deny_log,
    ));
    (host::hep_chain_name(HepChain::To, &h.interface_name), rules)
}

/// mangle `cali-to-host-endpoint` over every host endpoint's named interface (`ifaces`: sorted,
/// unique, without `*`); `all_interfaces`: a `*` endpoint exists (the default goes to its chain).
pub fn mangle_to_dispatch(ifaces: &[&str], all_interfaces: bool) -> Vec<(String, Vec<Rule>)> {
    let end = if all_interfaces {
        vec![Rule::new(
            vec![],
            Target::Goto(host::hep_chain_name(HepChain::To, ALL_INTERFACES)),
        )]
    } else {
        Vec::new()
    };
    dispatch::felix_tree(
        TO_HOST_DISPATCH,
        ifaces,
        Match::OutIface,
        |i| Target::Goto(host::hep_chain_name(HepChain::To, i)),
        &end,
    )
}

/// The host endpoint rules of mangle `cali-POSTROUTING` (Felix's
/// `StaticManglePostroutingChain` without IPVS, DSCP and Istio), after the DNS hold rules.
pub fn mangle_postrouting_rules(m: &MarkBits) -> Vec<Rule> {
    vec![
        Rule::new(vec![accepted(m)], Target::Return),
        Rule::new(vec![], Target::ClearMark(m.all_calico())),
        Rule::new(
            vec![Match::Conntrack {
                states: CtStates::Dnat,
                negated: false,
            }],
            Target::Jump(TO_HOST_DISPATCH.into()),
        ),
        Rule::new(vec![accepted(m)], Target::Return)
            .with_comment("Host endpoint policy accepted packet."),
    ]
}

/// mangle `cali-from-host-endpoint` over the preDNAT endpoints' named interfaces (`ifaces`:
/// sorted, unique, without `*`); `all_interfaces`: the `*` endpoint has preDNAT policy (the
/// default goes to its chain).
pub fn mangle_dispatch(ifaces: &[&str], all_interfaces: bool) -> Vec<(String, Vec<Rule>)> {
    let end = if all_interfaces {
        vec![Rule::new(
            vec![],
            Target::Goto(host::hep_chain_name(HepChain::From, ALL_INTERFACES)),
        )]
    } else {
        Vec::new()
    };
    dispatch::felix_tree(
        FROM_HOST_DISPATCH,
        ifaces,
        Match::InIface,
        |i| Target::Goto(host::hep_chain_name(HepChain::From, i)),
        &end,
    )
}

/// raw `cali-from-host-endpoint` / `cali-to-host-endpoint` over the untracked endpoints'
/// interfaces (no default: an interface without untracked policy falls through).
pub fn raw_dispatch(ifaces: &[&str]) -> Vec<(String, Vec<Rule>)> {
    let mut out = dispatch::felix_tree(
        FROM_HOST_DISPATCH,
        ifaces,
        Match::InIface,
        |i| Target::Goto(host::hep_chain_name(HepChain::From, i)),
        &[],
    );
    out.extend(dispatch::felix_tree(
        TO_HOST_DISPATCH,
        ifaces,
        Match::OutIface,
        |i| Target::Goto(host::hep_chain_name(HepChain::To, i)),
        &[],
    ));
    out
}

/// mangle `cali-PREROUTING` (Felix's `StaticManglePreroutingChain`, allow action ACCEPT).
pub fn mangle_prerouting(prefixes: &[String], m: &MarkBits) -> (String, Vec<Rule>) {
    let mut rules = vec![
        Rule::new(
            vec![Match::Conntrack {
                states: CtStates::RelatedEstablished,
                negated: false,
            }],
            Target::Accept,
        ),
        Rule::new(vec![accepted(m)], Target::Accept),
    ];
    // preDNAT policy is for host endpoints only: workload traffic is done here.
    for p in prefixes {
        rules.push(Rule::new(vec![Match::InIface(wildcard(p))], Target::Accept));
    }
    rules.push(Rule::new(vec![], Target::Jump(FROM_HOST_DISPATCH.into())));
    rules.push(
        Rule::new(vec![accepted(m)], Target::Accept)
            .with_comment("Host endpoint policy accepted packet."),
    );
    (PREROUTING.into(), rules)
}

/// raw `cali-PREROUTING` with untracked host endpoints: `anti_spoofing` (the rules
/// [`super::static_chains::raw_chains`] renders for workloads) wrapped in Felix's mark handling.
pub fn raw_prerouting(prefixes: &[String], m: &MarkBits, anti_spoofing: Vec<Rule>) -> Vec<Rule> {
    let mut rules = vec![Rule::new(vec![], Target::ClearMark(m.all_calico()))];
    for p in prefixes {
        rules.push(Rule::new(
            vec![Match::InIface(wildcard(p))],
            Target::SetMark {
                value: m.scratch0,
                mask: m.scratch0,
            },
        ));
    }
    rules.extend(anti_spoofing);
    rules.push(Rule::new(
        vec![Match::Mark {
            value: 0,
            mask: m.scratch0,
            negated: false,
        }],
        Target::Jump(FROM_HOST_DISPATCH.into()),
    ));
    rules.push(Rule::new(vec![accepted(m)], Target::Accept));
    rules
}

/// raw `cali-OUTPUT` (Felix's `StaticRawOutputChain`).
pub fn raw_output(m: &MarkBits) -> (String, Vec<Rule>) {
    (
        OUTPUT.into(),
        vec![
            Rule::new(vec![], Target::ClearMark(m.all_calico())),
            Rule::new(vec![], Target::Jump(TO_HOST_DISPATCH.into())),
            Rule::new(vec![accepted(m)], Target::Accept),
        ],
    )
}

/// The mangle hook while preDNAT policy is rendered.
pub fn mangle_hook() -> (&'static str, HookPosition, Rule) {
    (
        "PREROUTING",
        HookPosition::Top,
        Rule::new(vec![], Target::Jump(PREROUTING.into())),
    )
}

/// The mangle `POSTROUTING` hook while host endpoints exist (the DNS hold adds the same one).
pub fn mangle_postrouting_hook() -> (&'static str, HookPosition, Rule) {
    (
        "POSTROUTING",
        HookPosition::Top,
        Rule::new(vec![], Target::Jump(MANGLE_POSTROUTING.into())),
    )
}

/// The raw `OUTPUT` hook while untracked policy is rendered.
pub fn raw_output_hook() -> (&'static str, HookPosition, Rule) {
    (
        "OUTPUT",
        HookPosition::Top,
        Rule::new(vec![], Target::Jump(OUTPUT.into())),
    )
}

fn failsafe_rule(p: &FailsafePort, port_side: Side, net_side: Side) -> Rule {
    let mut m = vec![
        Match::Protocol {
            proto: p.protocol,
            negated: false,
        },
        Match::Ports {
            side: port_side,
            ports: vec![PortRange::single(p.port)],
            negated: false,
        },
    ];
    if let Some(net) = p.net {
        m.push(Match::Net {
            side: net_side,
            net,
            negated: false,
        });
    }
    Rule::new(m, Target::Accept)
}

/// The raw `cali-failsafe-in`/`-out` of family `v`: the filter rules, then the other list's
/// entries in reverse (by source port, the net on the same side as the chain's own entries), as
/// Felix's `failsafeInChain("raw")`.
pub fn raw_failsafe_chains(
    inbound: &[FailsafePort],
    outbound: &[FailsafePort],
    v: IpVersion,
) -> Vec<(String, Vec<Rule>)> {
    let of_family = |p: &&FailsafePort| {
        p.net
            .is_none_or(|n| matches!(n, IpNet::V6(_)) == (v == IpVersion::V6))
    };
    let chain = |own: &[FailsafePort], other: &[FailsafePort], net_side: Side| -> Vec<Rule> {
        let mut rules: Vec<Rule> = own
            .iter()
            .filter(of_family)
            .map(|p| failsafe_rule(p, Side::Dst, net_side))
            .collect();
        rules.extend(
            other
                .iter()
                .filter(of_family)
                .map(|p| failsafe_rule(p, Side::Src, net_side)),
        );
        rules
    };
    vec![
        (FAILSAFE_IN.into(), chain(inbound, outbound, Side::Src)),
        (FAILSAFE_OUT.into(), chain(outbound, inbound, Side::Dst)),
    ]
}
