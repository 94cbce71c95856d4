//! Host endpoints in the filter table (felix-reference §2.2, §2.7, §2.9; Felix's
//! `HostEndpointToFilterChains`, `hostDispatchChains`, `failsafeInChain`/`failsafeOutChain`).
//!
//! For each host endpoint of the node (the lowest-named one wins an interface, as Felix's
//! resolver picks it), four chains, named after the interface (`*` is Felix's
//! `any-interface-at-all`):
//! * `cali-fh-<iface>` (interface → host, ingress policy) and `cali-th-<iface>` (host →
//!   interface, egress policy): conntrack, then a jump to `cali-failsafe-in`/`-out` **before any
//!   policy**, then the tiers, the profiles and "Drop if no profiles matched": a host endpoint
//!   with no policy and no profile is default-deny except for the failsafe ports;
//! * `cali-fhfw-<iface>` / `cali-thfw-<iface>` (traffic forwarded through the interface): the
//!   `applyOnForward` policies only, no failsafes and no profiles; with no such policy,
//!   "Allow forwarded traffic by default".
//!
//! The dispatch chains `cali-from-host-endpoint` / `cali-to-host-endpoint` (from `cali-INPUT` /
//! `cali-OUTPUT`) and `cali-from-hep-forward` / `cali-to-hep-forward` (from `cali-FORWARD`) are
//! Felix's one-level prefix trees. An unknown interface falls through (RETURN: host interfaces
//! without a host endpoint are not policed), unless a `*` endpoint exists: then the end rule
//! goes to its chain, so its policy applies to host traffic on every interface without a more
//! specific endpoint (and, as in Felix, its forward chains to forwarded traffic, which they allow
//! unless an `applyOnForward` policy selects it).
//!
//! Workload traffic to the host never reaches host endpoint policy: `cali-INPUT` sends `cali+`
//! traffic to `cali-wl-to-host` (a goto, before the host endpoint dispatch), whose
//! `DefaultEndpointToHostAction` decides after the workload's egress policy, as in Felix; and
//! `cali-OUTPUT` returns for traffic to workloads before its host endpoint dispatch.
//!
//! Invariant (never lock out): every `cali-fh-`/`cali-th-` chain jumps to the failsafe chain
//! before its first policy jump, and the failsafe chains are written in the same change (one
//! restore) as the first host endpoint chain that jumps to them.
//!
//! With no host endpoint, nothing here is rendered and the static chains have none of the host
//! endpoint rules (the output is exactly that of a renderer without host endpoint support).

use std::fmt;
use std::str::FromStr;

use calc_graph::proto::{ALL_INTERFACES, IpVersion, LocalHostEndpoint, PortRange, Protocol};
use ipnet::IpNet;

use super::build::{Match, Rule, Side, Target};
use super::dispatch;
use super::endpoint::{conntrack_rules, profile_rules, tier_rules};
use super::marks::MarkBits;
use super::names::{self, MAX_CHAIN_NAME_LEN};
use super::rule::DenyLog;

pub const FROM_HOST_DISPATCH: &str = "cali-from-host-endpoint";
pub const TO_HOST_DISPATCH: &str = "cali-to-host-endpoint";
pub const FROM_HEP_FORWARD: &str = "cali-from-hep-forward";
pub const TO_HEP_FORWARD: &str = "cali-to-hep-forward";
pub const FAILSAFE_IN: &str = "cali-failsafe-in";
pub const FAILSAFE_OUT: &str = "cali-failsafe-out";
/// The interface name Felix uses in chain names for the `interfaceName: "*"` endpoint.
pub const ALL_INTERFACES_CHAIN_NAME: &str = "any-interface-at-all";

pub const TO_HOST_PREFIX: &str = "cali-th-";
pub const FROM_HOST_PREFIX: &str = "cali-fh-";
pub const TO_HOST_FORWARD_PREFIX: &str = "cali-thfw-";
pub const FROM_HOST_FORWARD_PREFIX: &str = "cali-fhfw-";

/// The four chains of a host endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HepChain {
    /// `cali-th-`: host → interface (egress policy).
    To,
    /// `cali-fh-`: interface → host (ingress policy).
    From,
    /// `cali-thfw-`: forwarded out of the interface (egress policy).
    ToForward,
    /// `cali-fhfw-`: forwarded in through the interface (ingress policy).
    FromForward,
}

impl HepChain {
    pub const ALL: [HepChain; 4] = [
        HepChain::To,
        HepChain::From,
        HepChain::ToForward,
        HepChain::FromForward,
    ];

    fn prefix(self) -> &'static str {
        match self {
            HepChain::To => TO_HOST_PREFIX,
            HepChain::From => FROM_HOST_PREFIX,
            HepChain::ToForward => TO_HOST_FORWARD_PREFIX,
            HepChain::FromForward => FROM_HOST_FORWARD_PREFIX,
        }
    }

    /// Whether the chain applies ingress policy (traffic arriving through the interface).
    pub fn ingress(self) -> bool {
        matches!(self, HepChain::From | HepChain::FromForward)
    }

    fn forward(self) -> bool {
        matches!(self, HepChain::ToForward | HepChain::FromForward)
    }
}

/// The interface part of a host endpoint's chain names (`*` → `any-interface-at-all`).
pub fn chain_iface(interface_name: &str) -> &str {
    if interface_name == ALL_INTERFACES {
        ALL_INTERFACES_CHAIN_NAME
    } else {
        interface_name
    }
}

/// `cali-th-<iface>` etc. (Felix's `EndpointChainName`).
pub fn hep_chain_name(kind: HepChain, iface: &str) -> String {
    names::length_limited_id(kind.prefix(), chain_iface(iface), MAX_CHAIN_NAME_LEN)
}

/// The four filter chains of one host endpoint (Felix's form, not shared).
pub fn host_endpoint_chains(
    hep: &LocalHostEndpoint,
    marks: &MarkBits,
    deny_log: Option<DenyLog>,
) -> Vec<(String, Vec<Rule>)> {
    HepChain::ALL
        .into_iter()
        .map(|kind| {
            let ingress = kind.ingress();
            let mut rules = conntrack_rules();
            if !kind.forward() {
                let failsafe = if ingress { FAILSAFE_IN } else { FAILSAFE_OUT };
                rules.push(Rule::new(vec![], Target::Jump(failsafe.into())));
            }
            rules.push(Rule::new(
                vec![],
                Target::ClearMark(marks.accept | marks.pass),
            ));
            if kind.forward() {
                rules.extend(tier_rules(
                    &hep.forward_tiers,
                    ingress,
                    marks,
                    false,
                    deny_log,
                ));
                if hep.forward_tiers.is_empty() {
                    rules.push(
                        Rule::new(
                            vec![],
                            Target::SetMark {
                                value: marks.accept,
                                mask: marks.accept,
                            },
                        )
                        .with_comment("Allow forwarded traffic by default"),
                    );
                    rules.push(
                        Rule::new(vec![], Target::Return)
                            .with_comment("Return for accepted forward traffic"),
                    );
                }
            } else {
                rules.extend(tier_rules(&hep.tiers, ingress, marks, false, deny_log));
                rules.extend(profile_rules(
                    &hep.profile_ids,
                    ingress,
                    marks,
                    false,
                    deny_log,
                ));
            }
            (hep_chain_name(kind, &hep.interface_name), rules)
        })
        .collect()
}

/// The host endpoint dispatch chains for the endpoints' interfaces (`ifaces`: sorted, unique,
/// valid names, without `*`); `all_interfaces`: a `*` endpoint exists (the end rule of each
/// chain goes to its chain). Felix's `HostDispatchChains(…, applyOnForward = true)`.
pub fn dispatch_chains(ifaces: &[&str], all_interfaces: bool) -> Vec<(String, Vec<Rule>)> {
    let mut out = Vec::new();
    for (root, kind) in [
        (FROM_HOST_DISPATCH, HepChain::From),
        (TO_HOST_DISPATCH, HepChain::To),
        (FROM_HEP_FORWARD, HepChain::FromForward),
        (TO_HEP_FORWARD, HepChain::ToForward),
    ] {
        let end = if all_interfaces {
            vec![Rule::new(
                vec![],
                Target::Goto(hep_chain_name(kind, ALL_INTERFACES)),
            )]
        } else {
            Vec::new()
        };
        let ingress = kind.ingress();
        out.extend(dispatch::felix_tree(
            root,
            ifaces,
            |iface| {
                if ingress {
                    Match::InIface(iface)
                } else {
                    Match::OutIface(iface)
                }
            },
            |iface| Target::Goto(hep_chain_name(kind, iface)),
            &end,
        ));
    }
    out
}

/// One failsafe entry (Felix's `ProtoPort`): `proto:port` or `proto:net:port`, IPv6 nets in
/// brackets (`tcp:[fd00::/8]:22`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailsafePort {
    pub protocol: Protocol,
    /// Inbound: the source; outbound: the destination. Only rendered in its own family.
    pub net: Option<IpNet>,
    pub port: u16,
}

/// A failsafe entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid failsafe port {text:?}: {reason} (expected proto:port or proto:net:port, proto tcp, udp or sctp)"
)]
pub struct FailsafePortError {
    pub text: String,
    pub reason: &'static str,
}

impl FromStr for FailsafePort {
    type Err = FailsafePortError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| FailsafePortError {
            text: s.to_string(),
            reason,
        };
        let (proto, rest) = s.trim().split_once(':').ok_or(err("missing ':'"))?;
        let protocol = match proto.to_ascii_lowercase().as_str() {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "sctp" => Protocol::Sctp,
            _ => return Err(err("unknown protocol")),
        };
        let (net, port) = match rest.rsplit_once(':') {
            Some((net, port)) => {
                let net = net
                    .strip_prefix('[')
                    .and_then(|n| n.strip_suffix(']'))
                    .unwrap_or(net);
                let net: IpNet = net
                    .parse()
                    .or_else(|_| net.parse::<std::net::IpAddr>().map(IpNet::from))
                    .map_err(|_| err("invalid net"))?;
                (Some(net.trunc()), port)
            }
            None => (None, rest),
        };
        let port: u16 = port.parse().map_err(|_| err("invalid port"))?;
        Ok(FailsafePort {
            protocol,
            net,
            port,
        })
    }
}

impl fmt::Display for FailsafePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = match self.protocol {
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
            _ => "tcp",
        };
        match self.net {
            Some(IpNet::V6(n)) => write!(f, "{proto}:[{n}]:{}", self.port),
            Some(n) => write!(f, "{proto}:{n}:{}", self.port),
            None => write!(f, "{proto}:{}", self.port),
        }
    }
}

/// A comma-separated failsafe list (Felix's `PortListParam`); empty or `none`: no ports.
pub fn parse_failsafe_ports(list: &str) -> Result<Vec<FailsafePort>, FailsafePortError> {
    let list = list.trim();
    if list.is_empty() || list.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    list.split(',').map(str::parse).collect()
}

fn parse_list(list: &str) -> Vec<FailsafePort> {
    parse_failsafe_ports(list).expect("valid default")
}

/// [`default_inbound`] as flag text.
pub const DEFAULT_INBOUND: &str =
    "tcp:22,udp:68,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667";
/// [`default_outbound`] as flag text.
pub const DEFAULT_OUTBOUND: &str =
    "udp:53,udp:67,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667";

/// Felix's `FailsafeInboundHostPorts` default: SSH, DHCP, BGP, etcd, Typha, the API server.
pub fn default_inbound() -> Vec<FailsafePort> {
    parse_list(DEFAULT_INBOUND)
}

/// Felix's `FailsafeOutboundHostPorts` default: DNS, DHCP, BGP, etcd, Typha, the API server.
pub fn default_outbound() -> Vec<FailsafePort> {
    parse_list(DEFAULT_OUTBOUND)
}

/// `cali-failsafe-in` and `cali-failsafe-out` of family `v` (filter table): one ACCEPT per
/// entry, `-p <proto> -m multiport --destination-ports <port>`, plus `--source` (in) or
/// `--destination` (out) for an entry with a net of this family; an entry with a net of the
/// other family is left out. Empty lists give empty chains (failsafes off).
pub fn failsafe_chains(
    inbound: &[FailsafePort],
    outbound: &[FailsafePort],
    v: IpVersion,
) -> Vec<(String, Vec<Rule>)> {
    let chain = |ports: &[FailsafePort], side: Side| -> Vec<Rule> {
        ports
            .iter()
            .filter(|p| {
                p.net
                    .is_none_or(|n| matches!(n, IpNet::V6(_)) == (v == IpVersion::V6))
            })
            .map(|p| {
                let mut m = vec![
                    Match::Protocol {
                        proto: p.protocol,
                        negated: false,
                    },
                    Match::Ports {
                        side: Side::Dst,
                        ports: vec![PortRange::single(p.port)],
                        negated: false,
                    },
                ];
                if let Some(net) = p.net {
                    m.push(Match::Net {
                        side,
                        net,
                        negated: false,
                    });
                }
                Rule::new(m, Target::Accept)
            })
            .collect()
    };
    vec![
        (FAILSAFE_IN.into(), chain(inbound, Side::Src)),
        (FAILSAFE_OUT.into(), chain(outbound, Side::Dst)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failsafe_ports_parse_felix_syntax_and_print_back() {
        for s in [
            "tcp:22",
            "udp:68",
            "sctp:9",
            "tcp:10.0.0.0/8:22",
            "tcp:[fd00::/8]:22",
        ] {
            let p: FailsafePort = s.parse().unwrap();
            assert_eq!(p.to_string(), s);
        }
        let p: FailsafePort = "TCP:10.1.2.3:22".parse().unwrap();
        assert_eq!(p.net, Some("10.1.2.3/32".parse().unwrap()));
        for bad in [
            "22",
            "icmp:1",
            "tcp:x",
            "tcp:70000",
            "tcp:10.0.0.0/33:22",
            "",
        ] {
            let e = bad.parse::<FailsafePort>().unwrap_err();
            assert!(e.to_string().contains("invalid failsafe port"), "{e}");
        }
        assert_eq!(default_inbound().len(), 9);
        assert_eq!(parse_failsafe_ports(" ").unwrap(), []);
        assert_eq!(parse_failsafe_ports("none").unwrap(), []);
        assert_eq!(parse_failsafe_ports("tcp:22, udp:53").unwrap().len(), 2);
        assert!(parse_failsafe_ports("tcp:22,,udp:53").is_err());
        assert_eq!(default_outbound()[0].to_string(), "udp:53");
    }

    #[test]
    fn chain_names_follow_felix() {
        assert_eq!(hep_chain_name(HepChain::To, "eth0"), "cali-th-eth0");
        // 28 characters: fits.
        assert_eq!(
            hep_chain_name(HepChain::To, "*"),
            "cali-th-any-interface-at-all"
        );
        // Longer: hashed as Felix's GetLengthLimitedID does.
        let fw = hep_chain_name(HepChain::FromForward, "*");
        assert!(fw.starts_with("cali-fhfw-_") && fw.len() == 28, "{fw}");
    }
}
