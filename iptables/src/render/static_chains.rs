//! Static chains and kernel hooks (felix-reference §2.1, §2.2, §2.8).
//!
//! Invariants: the hooks are the only rules we place in kernel chains, and each carries our
//! `cali:` hash comment; the static chains reach workload policy only through the dispatch chains,
//! whose defaults drop unknown `cali` interfaces. See `render/mod.rs` for what is simplified.

use calc_graph::proto::{Action, IpVersion, LocalEndpoint, Protocol};
use ipnet::IpNet;

use super::build::{CtStates, Match, Rule, Side, Target};
use super::dispatch::{FROM_WL_DISPATCH, TO_WL_DISPATCH};
use super::host;
use super::marks::MarkBits;
use super::{EndpointToHostAction, RenderConfig, SourceSpoofing};
use crate::desired::HookPosition;

pub const FORWARD: &str = "cali-FORWARD";
pub const INPUT: &str = "cali-INPUT";
pub const OUTPUT: &str = "cali-OUTPUT";
pub const WL_TO_HOST: &str = "cali-wl-to-host";
pub const PREROUTING: &str = "cali-PREROUTING";
pub const RPF_SKIP: &str = "cali-rpf-skip";
pub const POSTROUTING: &str = "cali-POSTROUTING";
pub const FIP_DNAT: &str = "cali-fip-dnat";
pub const FIP_SNAT: &str = "cali-fip-snat";
pub const NAT_OUTGOING: &str = "cali-nat-outgoing";
/// The shared layout's verdict chains: a policy or profile rule that allows, passes or denies
/// goes (`-g`) here ([`super::rule::RuleCtx::verdict_chains`]).
pub const VERDICT_ACCEPT: &str = "cali-verdict-accept";
pub const VERDICT_PASS: &str = "cali-verdict-pass";
pub const VERDICT_DROP: &str = "cali-verdict-drop";

/// ICMPv6 types a workload may always send to its host (router solicitation, neighbour
/// solicitation/advertisement, MLD); 134 (router advertisement) is deliberately absent.
pub const ICMPV6_TO_HOST_TYPES: [u8; 6] = [130, 131, 132, 133, 135, 136];

fn accepted(m: &MarkBits) -> Match {
    Match::Mark {
        value: m.accept,
        mask: m.accept,
        negated: false,
    }
}

pub(super) fn wildcard(prefix: &str) -> String {
    format!("{prefix}+")
}

/// The filter table's static chains for `version`. `hosts`: the node has host endpoints, so
/// `cali-FORWARD`, `cali-INPUT` and `cali-OUTPUT` also dispatch to the host endpoint chains in
/// Felix's places (felix-reference §2.2; [`super::host`]); without, they have none of those rules.
pub fn filter_chains(
    cfg: &RenderConfig,
    m: &MarkBits,
    version: IpVersion,
    hosts: bool,
) -> Vec<(String, Vec<Rule>)> {
    let mut forward = vec![Rule::new(
        vec![],
        Target::ClearMark(m.pass | m.scratch0 | m.scratch1),
    )];
    if hosts {
        // Forward policy of the incoming host endpoint, unless raw or pre-DNAT policy accepted.
        forward.push(Rule::new(
            vec![Match::Mark {
                value: 0,
                mask: m.accept,
                negated: false,
            }],
            Target::Jump(host::FROM_HEP_FORWARD.into()),
        ));
    }
    for p in &cfg.interface_prefixes {
        forward.push(Rule::new(
            vec![Match::InIface(wildcard(p))],
            Target::Jump(FROM_WL_DISPATCH.into()),
        ));
        forward.push(Rule::new(
            vec![Match::OutIface(wildcard(p))],
            Target::Jump(TO_WL_DISPATCH.into()),
        ));
    }

    if hosts {
        forward.push(Rule::new(vec![], Target::Jump(host::TO_HEP_FORWARD.into())));
    }

    let mut input = Vec::new();
    for p in &cfg.interface_prefixes {
        input.push(Rule::new(
            vec![Match::InIface(wildcard(p))],
            Target::Goto(WL_TO_HOST.into()),
        ));
    }
    input.push(Rule::new(vec![accepted(m)], Target::Accept));
    input.push(Rule::new(vec![], Target::ClearMark(m.all_calico())));
    if hosts {
        input.push(Rule::new(
            vec![],
            Target::Jump(host::FROM_HOST_DISPATCH.into()),
        ));
        input.push(
            Rule::new(vec![accepted(m)], Target::Accept)
                .with_comment("Host endpoint policy accepted packet."),
        );
    }

    let mut wl_to_host = Vec::new();
    if version == IpVersion::V6 {
        for t in ICMPV6_TO_HOST_TYPES {
            let icmp = vec![
                Match::Protocol {
                    proto: Protocol::Number(58),
                    negated: false,
                },
                Match::Icmp {
                    v6: true,
                    type_: t,
                    code: None,
                    negated: false,
                },
            ];
            wl_to_host.push(Rule::new(icmp, Target::Accept));
        }
    }
    wl_to_host.push(Rule::new(vec![], Target::Jump(FROM_WL_DISPATCH.into())));
    let action = match cfg.default_endpoint_to_host_action {
        EndpointToHostAction::Accept => Target::Accept,
        EndpointToHostAction::Drop => Target::Drop,
        EndpointToHostAction::Return => Target::Return,
    };
    wl_to_host
        .push(Rule::new(vec![], action).with_comment("Configured DefaultEndpointToHostAction"));

    let mut output = vec![Rule::new(vec![accepted(m)], Target::Accept)];
    for p in &cfg.interface_prefixes {
        output.push(Rule::new(
            vec![Match::OutIface(wildcard(p))],
            Target::Return,
        ));
    }
    output.push(Rule::new(vec![], Target::ClearMark(m.all_calico())));
    if hosts {
        // DNAT'd host traffic is policed in mangle POSTROUTING by Felix (not rendered yet).
        output.push(Rule::new(
            vec![Match::Conntrack {
                states: CtStates::Dnat,
                negated: true,
            }],
            Target::Jump(host::TO_HOST_DISPATCH.into()),
        ));
        output.push(
            Rule::new(vec![accepted(m)], Target::Accept)
                .with_comment("Host endpoint policy accepted packet."),
        );
    }

    let mut chains = vec![
        (FORWARD.into(), forward),
        (INPUT.into(), input),
        (WL_TO_HOST.into(), wl_to_host),
        (OUTPUT.into(), output),
    ];
    if cfg.share_chains {
        chains.extend(verdict_chains(m));
    }
    chains
}

/// What a rule going (`-g`) to `chain` decided, if `chain` is one of the verdict chains.
pub fn verdict_of_chain(chain: &str) -> Option<Action> {
    match chain {
        VERDICT_ACCEPT => Some(Action::Allow),
        VERDICT_PASS => Some(Action::Pass),
        VERDICT_DROP => Some(Action::Deny),
        _ => None,
    }
}

/// The verdict chains of the shared layout. A policy's rule goes here with `-g`, so when the
/// chain ends the packet is back in the chain that jumped to the policy's chain, right after the
/// jump: exactly where Felix's "set the mark, then RETURN if it is set" pair leaves it, with one
/// rule per Calico rule instead of two. The drop chain sets the drop mark before it drops, as
/// the pair did.
pub fn verdict_chains(m: &MarkBits) -> Vec<(String, Vec<Rule>)> {
    let set = |bit: u32| Target::SetMark {
        value: bit,
        mask: bit,
    };
    vec![
        (
            VERDICT_ACCEPT.into(),
            vec![
                Rule::new(vec![], set(m.accept))
                    .with_comment("Allowed by the policy rule that went here; back to its caller"),
            ],
        ),
        (
            VERDICT_PASS.into(),
            vec![
                Rule::new(vec![], set(m.pass))
                    .with_comment("Passed to the next tier by the policy rule that went here"),
            ],
        ),
        (
            VERDICT_DROP.into(),
            vec![
                Rule::new(vec![], set(m.drop))
                    .with_comment("Denied by the policy rule that went here"),
                Rule::new(vec![], Target::Drop),
            ],
        ),
    ]
}

/// The nat table's scaffolding chains (no floating IPs or NAT-outgoing pools in scope: the leaf
/// chains stay empty, ready for those features).
pub fn nat_chains() -> Vec<(String, Vec<Rule>)> {
    vec![
        (
            PREROUTING.into(),
            vec![Rule::new(vec![], Target::Jump(FIP_DNAT.into()))],
        ),
        (
            OUTPUT.into(),
            vec![Rule::new(vec![], Target::Jump(FIP_DNAT.into()))],
        ),
        (
            POSTROUTING.into(),
            vec![
                Rule::new(vec![], Target::Jump(FIP_SNAT.into())),
                Rule::new(vec![], Target::Jump(NAT_OUTGOING.into())),
            ],
        ),
        (FIP_DNAT.into(), vec![]),
        (FIP_SNAT.into(), vec![]),
        (NAT_OUTGOING.into(), vec![]),
    ]
}

/// The raw table's `cali-PREROUTING`: anti-spoofing for workloads (Felix's strict RPF check,
/// felix-reference §2.8). A packet from a workload interface whose source address is not routed back out of that
/// interface claims an address that is not the pod's; dropping it in raw, before conntrack and
/// before any policy, keeps a pod from passing source-based rules (ipBlock, pod and namespace
/// selectors) with another pod's address.
///
/// With [`SourceSpoofing::Any`], workload packets first visit `cali-rpf-skip` (empty here; its
/// per-endpoint ACCEPTs come from [`rpf_skip_rules`]), which ends raw for a pod's allowed prefixes.
///
/// `untracked`: a host endpoint has doNotTrack policy, so the chain also clears the mark bits,
/// marks workload traffic and dispatches the rest to the raw host endpoint chains
/// ([`super::host_tables::raw_prerouting`]); without, it is the anti-spoofing rules alone.
pub fn raw_chains(cfg: &RenderConfig, m: &MarkBits, untracked: bool) -> Vec<(String, Vec<Rule>)> {
    let skip = cfg.workload_source_spoofing == SourceSpoofing::Any;
    let mut rules = Vec::new();
    for p in &cfg.interface_prefixes {
        if skip {
            rules.push(
                Rule::new(
                    vec![Match::InIface(wildcard(p))],
                    Target::Jump(RPF_SKIP.into()),
                )
                .with_comment("Accept the allowed spoofed source prefixes of workloads"),
            );
        }
        rules.push(
            Rule::new(
                vec![
                    Match::InIface(wildcard(p)),
                    Match::Rpfilter { negated: true },
                ],
                Target::Drop,
            )
            .with_comment("Drop workload packets with a spoofed source address"),
        );
    }
    if untracked {
        rules = super::host_tables::raw_prerouting(&cfg.interface_prefixes, m, rules);
    }
    let mut chains = vec![(PREROUTING.into(), rules)];
    if skip {
        chains.push((RPF_SKIP.into(), Vec::new()));
    }
    chains
}

/// `cali-rpf-skip` for one family: `-i <iface> -s <prefix> -j ACCEPT` for each endpoint's allowed
/// source prefixes of that family, endpoints by interface name, prefixes in the endpoint's order
/// (a `/0` prefix: `-i <iface> -j ACCEPT`).
pub fn rpf_skip_rules<'a>(
    endpoints: impl IntoIterator<Item = &'a LocalEndpoint>,
    version: IpVersion,
) -> Vec<Rule> {
    let mut eps: Vec<&LocalEndpoint> = endpoints
        .into_iter()
        .filter(|e| !e.allow_spoofed_source_prefixes.is_empty())
        .collect();
    eps.sort_by(|a, b| a.interface_name.cmp(&b.interface_name));
    let mut rules = Vec::new();
    for ep in eps {
        let mut seen = Vec::new();
        for net in &ep.allow_spoofed_source_prefixes {
            let net = net.trunc();
            if matches!(net, IpNet::V6(_)) != (version == IpVersion::V6) || seen.contains(&net) {
                continue;
            }
            seen.push(net);
            let mut matches = vec![Match::InIface(ep.interface_name.clone())];
            // `-s 0.0.0.0/0` is no constraint, and the kernel does not save it.
            if net.prefix_len() > 0 {
                matches.push(Match::Net {
                    side: Side::Src,
                    net,
                    negated: false,
                });
            }
            rules.push(Rule::new(matches, Target::Accept));
        }
    }
    rules
}

/// Raw hooks: PREROUTING inserted at the top.
pub fn raw_hooks() -> Vec<(&'static str, HookPosition, Rule)> {
    vec![(
        "PREROUTING",
        HookPosition::Top,
        Rule::new(vec![], Target::Jump(PREROUTING.into())),
    )]
}

/// Filter hooks: `(kernel chain, position, rule)`.
pub fn filter_hooks(m: &MarkBits) -> Vec<(&'static str, HookPosition, Rule)> {
    vec![
        (
            "INPUT",
            HookPosition::Top,
            Rule::new(vec![], Target::Jump(INPUT.into())),
        ),
        (
            "FORWARD",
            HookPosition::Top,
            Rule::new(vec![], Target::Jump(FORWARD.into())),
        ),
        (
            "OUTPUT",
            HookPosition::Top,
            Rule::new(vec![], Target::Jump(OUTPUT.into())),
        ),
        (
            "FORWARD",
            HookPosition::Append,
            Rule::new(vec![accepted(m)], Target::Accept)
                .with_comment("Policy explicitly accepted packet."),
        ),
        (
            "FORWARD",
            HookPosition::Append,
            Rule::new(
                vec![],
                Target::SetMark {
                    value: m.accept,
                    mask: m.accept,
                },
            ),
        ),
    ]
}

/// Nat hooks: PREROUTING and OUTPUT inserted, POSTROUTING appended (after kube-proxy, v3.29+).
pub fn nat_hooks() -> Vec<(&'static str, HookPosition, Rule)> {
    vec![
        (
            "PREROUTING",
            HookPosition::Top,
            Rule::new(vec![], Target::Jump(PREROUTING.into())),
        ),
        (
            "OUTPUT",
            HookPosition::Top,
            Rule::new(vec![], Target::Jump(OUTPUT.into())),
        ),
        (
            "POSTROUTING",
            HookPosition::Append,
            Rule::new(vec![], Target::Jump(POSTROUTING.into())),
        ),
    ]
}
