//! Per-endpoint chains `cali-tw-<iface>` / `cali-fw-<iface>` (felix-reference §2.4, `endpointIptablesChain`), and
//! the shared policy chains `cali-si-<hash>` / `cali-so-<hash>` they go to when chains are shared.
//!
//! Invariant (fail closed): every path through an endpoint chain ends in ACCEPT (established
//! only), RETURN with the accept bit set (a policy or profile allowed), or DROP. A direction with
//! at least one policy in a tier whose default action is Deny ends that tier with a DROP; a
//! direction with no policies falls through to the profiles, then to "Drop if no profiles matched".
//!
//! Sharing: an endpoint chain is a *preamble* (conntrack, mark clear, encap drops) and a *policy
//! part* (tiers, policies, profiles, final DROP). Neither holds anything of the pod itself: the
//! preamble is the same for every pod and the policy part depends only on the endpoint's ordered
//! tiers → policies and its profiles (what is per pod is elsewhere: the interface match in the
//! dispatch tree, the anti-spoofing check in raw `cali-PREROUTING`). With sharing on, both are one
//! chain named after a hash of its rules (content-addressed, `cali-si-`/`cali-so-`), and the
//! endpoint's own chain is a single `--goto` to it; every path through the shared chain ends in
//! ACCEPT, RETURN (accept bit set) or DROP, exactly as the inlined chain's, so the verdicts and
//! the order of evaluation are those of Felix's layout.

use calc_graph::proto::{Action, LocalEndpoint, Protocol, TierInfo};

use super::build::{CtStates, Match, Rule, Side, Target};
use super::marks::MarkBits;
use super::names;
use super::rule::DenyLog;

/// The id in the NFLOG prefix of "no profile matched" drops (Felix's).
pub const NO_MATCH: &str = "__NO_MATCH__";

/// The VXLAN port whose packets workloads may not send (Felix `VXLANPort`).
pub const VXLAN_PORT: u16 = 4789;

/// Renders one direction of an endpoint, inlined (Felix's form); `ingress` = `cali-tw-` (traffic
/// to the workload).
pub fn endpoint_chain(
    ep: &LocalEndpoint,
    ingress: bool,
    marks: &MarkBits,
    allow_encap: bool,
    deny_log: Option<DenyLog>,
) -> (String, Vec<Rule>) {
    let name = names::endpoint_chain_name(&ep.interface_name, ingress);
    let mut rules = preamble(ingress, marks, allow_encap);
    rules.extend(policy_rules(ep, ingress, marks, false, deny_log));
    (name, rules)
}

/// One direction of an endpoint's policy part with sharing: the shared chain `(name, rules)` its
/// own chain goes to (the inlined chain's rules, each jump naming its policy or profile).
pub fn shared_endpoint_chain(
    ep: &LocalEndpoint,
    ingress: bool,
    marks: &MarkBits,
    allow_encap: bool,
    deny_log: Option<DenyLog>,
) -> (String, Vec<Rule>) {
    let mut rules = preamble(ingress, marks, allow_encap);
    rules.extend(policy_rules(ep, ingress, marks, true, deny_log));
    (names::shared_chain_name(&rules, ingress), rules)
}

/// An endpoint's own chain with sharing: a goto to its `shared` chain.
pub fn goto_shared_chain(ep: &LocalEndpoint, ingress: bool, shared: &str) -> (String, Vec<Rule>) {
    let rules = vec![Rule::new(vec![], Target::Goto(shared.to_string()))];
    (
        names::endpoint_chain_name(&ep.interface_name, ingress),
        rules,
    )
}

/// Felix's `appendConntrackRules` (filter allow action ACCEPT): established traffic is accepted,
/// invalid traffic dropped. Every workload and host endpoint chain starts with them.
pub fn conntrack_rules() -> Vec<Rule> {
    vec![
        Rule::new(
            vec![Match::Conntrack {
                states: CtStates::RelatedEstablished,
                negated: false,
            }],
            Target::Accept,
        ),
        Rule::new(
            vec![Match::Conntrack {
                states: CtStates::Invalid,
                negated: false,
            }],
            Target::Drop,
        ),
    ]
}

/// What every endpoint chain starts with: conntrack, clearing the verdict bits, and (egress)
/// the encap drops. Nothing in it depends on the endpoint.
fn preamble(ingress: bool, marks: &MarkBits, allow_encap: bool) -> Vec<Rule> {
    let mut rules = conntrack_rules();
    rules.push(Rule::new(
        vec![],
        Target::ClearMark(marks.accept | marks.pass),
    ));
    if !ingress && !allow_encap {
        let vxlan = vec![
            Match::Protocol {
                proto: Protocol::Number(17),
                negated: false,
            },
            Match::Ports {
                side: Side::Dst,
                ports: vec![calc_graph::proto::PortRange {
                    first: VXLAN_PORT,
                    last: VXLAN_PORT,
                }],
                negated: false,
            },
        ];
        rules.push(
            Rule::new(vxlan, Target::Drop)
                .with_comment("Drop VXLAN encapped packets originating in workloads"),
        );
        let ipip = vec![Match::Protocol {
            proto: Protocol::Number(4),
            negated: false,
        }];
        rules.push(
            Rule::new(ipip, Target::Drop)
                .with_comment("Drop IPinIP encapped packets originating in workloads"),
        );
    }
    rules
}

/// The tiers, policies and profiles of one direction, ending in "Drop if no profiles matched".
/// `annotate` (shared chains) adds the policy or profile id as a comment on each jump, so a
/// hashed chain name can be read back to the policies, and checks "accepted?" once per tier
/// (and once after the profiles) instead of after every jump: each later jump of the tier is
/// guarded by "neither accepted nor passed" (`-m mark --mark 0/accept|pass`), so once a policy
/// accepted the rest of the tier is skipped and the tier's one "Return if policy accepted" ends
/// the chain, where Felix's RETURN after that policy would have (one rule per policy, not two).
/// The first jump of a tier keeps Felix's form: the accept bit is clear there. `deny_log` adds
/// an NFLOG rule before every tier-end and "no profile" DROP.
fn policy_rules(
    ep: &LocalEndpoint,
    ingress: bool,
    marks: &MarkBits,
    annotate: bool,
    deny_log: Option<DenyLog>,
) -> Vec<Rule> {
    let mut rules = tier_rules(&ep.tiers, ingress, marks, annotate, deny_log);
    rules.extend(profile_rules(
        &ep.profile_ids,
        ingress,
        marks,
        annotate,
        deny_log,
    ));
    rules
}

/// The tiers part of [`policy_rules`] (also a host endpoint's, whose egress is `!ingress`).
pub fn tier_rules(
    tiers: &[TierInfo],
    ingress: bool,
    marks: &MarkBits,
    annotate: bool,
    deny_log: Option<DenyLog>,
) -> Vec<Rule> {
    let dir = if ingress { 'I' } else { 'E' };
    let mut rules = Vec::new();
    let pass_clear = Match::Mark {
        value: 0,
        mask: marks.pass,
        negated: false,
    };
    let accepted = Match::Mark {
        value: marks.accept,
        mask: marks.accept,
        negated: false,
    };
    let neither = Match::Mark {
        value: 0,
        mask: marks.accept | marks.pass,
        negated: false,
    };
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
            Rule::new(vec![], Target::ClearMark(marks.pass))
                .with_comment(&format!("Start of tier {}", tier.name)),
        );
        for (i, p) in policies.iter().enumerate() {
            let chain = names::policy_chain_name(p, ingress);
            // Shared: a later policy is skipped once an earlier one accepted (or passed), and
            // one "Return if policy accepted" ends the tier, instead of one after each jump.
            let guard = if annotate && i > 0 {
                neither.clone()
            } else {
                pass_clear.clone()
            };
            let jump = Rule::new(vec![guard], Target::Jump(chain));
            rules.push(if annotate {
                jump.with_comment(&format!("{p}"))
            } else {
                jump
            });
            if !annotate || i + 1 == policies.len() {
                rules.push(
                    Rule::new(vec![accepted.clone()], Target::Return)
                        .with_comment("Return if policy accepted"),
                );
            }
        }
        if tier.default_action != Action::Pass {
            let comment = format!(
                "End of tier {}. Drop if no policies passed packet",
                tier.name
            );
            if let Some(d) = deny_log {
                rules.push(d.rule(
                    vec![pass_clear.clone()],
                    ingress,
                    &format!("DP{dir}"),
                    &tier.name,
                ));
            }
            rules.push(Rule::new(vec![pass_clear.clone()], Target::Drop).with_comment(&comment));
        }
    }
    rules
}

/// The profiles part of [`policy_rules`], ending in "Drop if no profiles matched".
pub fn profile_rules(
    profiles: &[String],
    ingress: bool,
    marks: &MarkBits,
    annotate: bool,
    deny_log: Option<DenyLog>,
) -> Vec<Rule> {
    let dir = if ingress { 'I' } else { 'E' };
    let mut rules = Vec::new();
    let accepted = Match::Mark {
        value: marks.accept,
        mask: marks.accept,
        negated: false,
    };
    let not_accepted = Match::Mark {
        value: 0,
        mask: marks.accept,
        negated: false,
    };
    for (i, profile) in profiles.iter().enumerate() {
        // Shared: as for policies, a later profile is skipped once one accepted.
        let guard = if annotate && i > 0 {
            vec![not_accepted.clone()]
        } else {
            vec![]
        };
        let jump = Rule::new(
            guard,
            Target::Jump(names::profile_chain_name(profile, ingress)),
        );
        rules.push(if annotate {
            jump.with_comment(&format!("Profile {profile}"))
        } else {
            jump
        });
        if !annotate || i + 1 == profiles.len() {
            rules.push(
                Rule::new(vec![accepted.clone()], Target::Return)
                    .with_comment("Return if profile accepted"),
            );
        }
    }
    if let Some(d) = deny_log {
        rules.push(d.rule(vec![], ingress, &format!("DR{dir}"), NO_MATCH));
    }
    rules.push(Rule::new(vec![], Target::Drop).with_comment("Drop if no profiles matched"));
    rules
}
