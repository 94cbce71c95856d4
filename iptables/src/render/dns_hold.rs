//! Holding DNS responses for the learner (FQDN egress policy, issue 16): mangle
//! `cali-POSTROUTING`.
//!
//! For each trusted DNS server of a family ([`RenderConfig::dns_trusted_servers`]), per workload
//! interface prefix and for UDP and TCP, a response from the server to a workload goes to the
//! learner's NFQUEUE:
//!
//! ```text
//! -A POSTROUTING -j cali-POSTROUTING                                   (hook, top)
//! -A cali-POSTROUTING -o cali+ -s 10.96.0.10/32 -p udp -m udp --sport 53 -m conntrack --ctdir REPLY
//!    -m comment --comment "DNS response from trusted server" -j NFQUEUE --queue-num 100
//! ```
//!
//! The learner writes the response's addresses into the domain sets and only then releases it,
//! so the pod never sees an answer whose addresses are not yet allowed. There is deliberately no
//! `--queue-bypass`: with no agent bound to the queue the kernel drops the response (the client
//! retries): a response is delayed or dropped, never let through past the learner.
//!
//! mangle POSTROUTING runs after the filter table's policy decision (releasing with NF_ACCEPT
//! skips nothing of policy) and before nat POSTROUTING, so the source is still the server's own
//! address for a query that went to a service VIP. `--ctdir REPLY` keeps a pod from queueing
//! packets by sending to another pod *from* port 53 with a spoofed source (raw's RPF check drops
//! those anyway); only the replies of connections the pod opened to the server match.
//!
//! A family with no trusted server gets neither the chain nor the hook (nothing is queued).

use std::net::SocketAddr;

use calc_graph::proto::{IpVersion, Protocol};
use ipnet::IpNet;

use super::RenderConfig;
use super::build::{Match, Rule, Target};
use super::static_chains::wildcard;
use crate::desired::HookPosition;

/// The mangle chain the hook jumps to.
pub const MANGLE_POSTROUTING: &str = "cali-POSTROUTING";

/// The comment of every queue rule.
pub const COMMENT: &str = "DNS response from trusted server";

fn servers_of(cfg: &RenderConfig, v: IpVersion) -> impl Iterator<Item = &SocketAddr> {
    cfg.dns_trusted_servers
        .iter()
        .filter(move |s| s.is_ipv6() == (v == IpVersion::V6))
}

/// The mangle chains of family `v` (none without trusted servers of that family).
pub fn mangle_chains(cfg: &RenderConfig, v: IpVersion) -> Vec<(String, Vec<Rule>)> {
    let mut rules = Vec::new();
    for server in servers_of(cfg, v) {
        for prefix in &cfg.interface_prefixes {
            for proto in [Protocol::Udp, Protocol::Tcp] {
                rules.push(
                    Rule::new(
                        vec![
                            Match::OutIface(wildcard(prefix)),
                            Match::Net {
                                side: super::build::Side::Src,
                                net: IpNet::from(server.ip()),
                                negated: false,
                            },
                            Match::Protocol {
                                proto,
                                negated: false,
                            },
                            Match::SrcPort {
                                proto,
                                port: server.port(),
                            },
                            Match::CtDirReply,
                        ],
                        Target::Nfqueue {
                            num: cfg.dns_queue_num,
                        },
                    )
                    .with_comment(COMMENT),
                );
            }
        }
    }
    if rules.is_empty() {
        Vec::new()
    } else {
        vec![(MANGLE_POSTROUTING.to_string(), rules)]
    }
}

/// The mangle hooks of family `v`: `-j cali-POSTROUTING` at the top of `POSTROUTING`, only when
/// the chain exists.
pub fn mangle_hooks(cfg: &RenderConfig, v: IpVersion) -> Vec<(&'static str, HookPosition, Rule)> {
    if servers_of(cfg, v).next().is_none() {
        return Vec::new();
    }
    vec![(
        "POSTROUTING",
        HookPosition::Top,
        Rule::new(vec![], Target::Jump(MANGLE_POSTROUTING.into())),
    )]
}
