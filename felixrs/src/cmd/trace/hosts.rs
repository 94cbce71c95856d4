//! Host endpoints in `trace`: which address is one of the node's host endpoints (`expectedIPs`),
//! which interface a packet to or from it takes, who owns the host endpoint and failsafe chains,
//! and the raw (`doNotTrack`) and mangle (`preDNAT`) tables a packet meets before the filter table.
//!
//! As the kernel runs them: a packet arriving at the node (to it, or forwarded) meets raw
//! `cali-PREROUTING`, then mangle `cali-PREROUTING`, then filter; one the node sends meets raw
//! `cali-OUTPUT`, then filter. The mark carries from table to table (an untracked or preDNAT
//! allow sets the accept bit, which the filter table's chains accept on); a raw `NOTRACK` leaves
//! the packet untracked for the tables after it. Those tables are walked only while the node has
//! a host endpoint (without one they hold nothing that decides a packet, and the report is as it
//! always was).

use std::net::IpAddr;

use calc_graph::proto::{LocalHostEndpoint, Output};
use iptables::desired::{DesiredTable, TableName};
use iptables::model::{Match, PortsKind};
use iptables::render::host::{self, FAILSAFE_IN, FAILSAFE_OUT, HepChain};
use iptables::render::static_chains::{OUTPUT, PREROUTING};
use iptables::render::trace::{self, ConntrackState, Outcome, Packet, RendererRules, Rules, Step};

use super::Owner;
use super::traced::Path;
use crate::cmd::shared::node_view::NodeView;

/// The node's host endpoints, in the graph's order.
pub(super) fn host_endpoints(outputs: &[Output]) -> Vec<&LocalHostEndpoint> {
    (outputs.iter())
        .filter_map(|o| match o {
            Output::HostEndpointUpdated(h) => Some(h),
            _ => None,
        })
        .collect()
}

/// The host endpoint whose `expectedIPs` hold `addr` (the lowest-named, as the renderer picks).
pub(super) fn endpoint_of(outputs: &[Output], addr: IpAddr) -> Option<&LocalHostEndpoint> {
    let mut heps: Vec<_> = (host_endpoints(outputs).into_iter())
        .filter(|h| h.ipv4_addrs.contains(&addr) || h.ipv6_addrs.contains(&addr))
        .collect();
    heps.sort_by(|a, b| a.name.cmp(&b.name));
    heps.into_iter().next()
}

/// The owners of the host endpoint chains (all four of each endpoint) and the failsafe chains.
pub(super) fn chain_owners(outputs: &[Output]) -> Vec<(String, Owner)> {
    let mut owners = Vec::new();
    let heps = host_endpoints(outputs);
    for h in &heps {
        for kind in HepChain::ALL {
            let what = match kind {
                HepChain::From => "ingress",
                HepChain::To => "egress",
                HepChain::FromForward => "forwarded ingress",
                HepChain::ToForward => "forwarded egress",
            };
            owners.push((
                host::hep_chain_name(kind, &h.interface_name),
                Owner {
                    verdicts: false,
                    what: format!("{what} of host endpoint {} ({})", h.name, h.interface_name),
                    tier: None,
                },
            ));
        }
    }
    if !heps.is_empty() {
        for (chain, what) in [
            (FAILSAFE_IN, "failsafe inbound ports"),
            (FAILSAFE_OUT, "failsafe outbound ports"),
        ] {
            owners.push((
                chain.to_string(),
                Owner {
                    verdicts: false,
                    what: what.to_string(),
                    tier: None,
                },
            ));
        }
    }
    owners
}

/// One table the packet met before the filter table.
pub struct PreTable {
    pub table: TableName,
    /// Our chain the walk started in (`cali-PREROUTING` or `cali-OUTPUT`).
    pub start: &'static str,
    pub trace: trace::Trace,
    /// The table as rendered (to tell our rules from foreign ones in the kernel's).
    pub desired: Option<DesiredTable>,
}

impl PreTable {
    /// The kernel chain whose hook goes to [`PreTable::start`].
    pub fn kernel_chain(&self) -> &'static str {
        if self.start == OUTPUT {
            "OUTPUT"
        } else {
            "PREROUTING"
        }
    }

    /// How the report heads the table's steps.
    pub(super) fn heading(&self) -> String {
        let (name, why) = match self.table {
            TableName::Raw => ("raw", "doNotTrack policy"),
            TableName::Mangle => ("mangle", "preDNAT policy"),
            _ => ("filter", "policy"),
        };
        let hook = self.kernel_chain();
        format!(
            "{name} table ({why}): {hook}, from {}, rules the packet matched, in order:",
            self.start
        )
    }
}

/// The raw and mangle tables ahead of the filter table for `path`, walked in the kernel's order;
/// `pkt`'s mark and conntrack state become what the filter table sees. Stops at a table that
/// drops the packet (the last one's outcome is then [`Outcome::Drop`]).
pub(super) fn pre_tables(
    view: &NodeView,
    path: Path,
    pkt: &mut Packet,
) -> anyhow::Result<Vec<PreTable>> {
    if host_endpoints(&view.outputs).is_empty() {
        return Ok(Vec::new());
    }
    let walks: &[(TableName, &'static str)] = match path {
        Path::Input | Path::Forward => &[
            (TableName::Raw, PREROUTING),
            (TableName::Mangle, PREROUTING),
        ],
        Path::Output => &[(TableName::Raw, OUTPUT)],
    };
    let mut out = Vec::new();
    for &(table, start) in walks {
        let v = pkt.version();
        if view.renderer.chain(v, table, start).is_none() {
            continue;
        }
        let rules = ValidSource(RendererRules {
            renderer: &view.renderer,
            version: v,
            table,
        });
        let t = trace::trace(&rules, start, pkt)
            .map_err(|e| anyhow::anyhow!("cannot trace the {table:?} table: {e}"))?;
        pkt.mark = t.mark;
        if t.untracked {
            pkt.conntrack = ConntrackState::Untracked;
        }
        let dropped = t.outcome == Outcome::Drop;
        out.push(PreTable {
            table,
            start,
            trace: t,
            desired: view.renderer.desired_ref(v).tables.get(&table).cloned(),
        });
        if dropped {
            break;
        }
    }
    Ok(out)
}

/// The renderer's raw and mangle rules for a traced packet. The one rule there the evaluator
/// cannot decide is raw `cali-PREROUTING`'s anti-spoofing `-i cali+ -m rpfilter --invert -j
/// DROP`: a traced packet comes from its own end's address on its own interface, so its source
/// is valid and that rule does not match (which is what assuming an unmodelled match does not
/// match gives).
struct ValidSource<'a>(RendererRules<'a>);

impl Rules for ValidSource<'_> {
    fn chain(&self, name: &str) -> Option<Vec<&iptables::model::Rule>> {
        self.0.chain(name)
    }

    fn set_contains(&self, name: &str, addr: IpAddr, proto: u8, port: u16) -> Option<bool> {
        self.0.set_contains(name, addr, proto, port)
    }

    fn domain_set(&self, name: &str) -> Option<Vec<calc_graph::proto::DomainPattern>> {
        self.0.domain_set(name)
    }

    fn domain_remaining(&self, name: &str, addr: IpAddr) -> Option<u32> {
        self.0.domain_remaining(name, addr)
    }

    fn assume_unmodelled(&self) -> bool {
        true
    }
}

/// The failsafe entry a step accepted by (`failsafe: tcp:22`), when it is a failsafe chain's
/// ACCEPT.
pub(super) fn failsafe_hit(
    view: &NodeView,
    table: TableName,
    pkt: &Packet,
    step: &Step,
) -> Option<String> {
    if step.chain != FAILSAFE_IN && step.chain != FAILSAFE_OUT {
        return None;
    }
    let rule = view
        .renderer
        .chain(pkt.version(), table, &step.chain)?
        .get(step.rule - 1)?;
    // The raw copies also accept the replies by source port.
    let by_source = rule.model().matches.iter().any(|m| {
        matches!(
            m,
            Match::Multiport {
                kind: PortsKind::Source,
                ..
            }
        )
    });
    let port = if by_source { pkt.sport } else { pkt.dport };
    let proto = match pkt.proto {
        6 => "tcp",
        17 => "udp",
        132 => "sctp",
        _ => return None,
    };
    let dir = if by_source {
        " (a reply, by source port)"
    } else {
        ""
    };
    Some(format!("failsafe: {proto}:{port}{dir}"))
}
