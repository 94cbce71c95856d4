//! Reading our NFLOG rules' packets: the one prefix decoder (`<A><O><D><rule>|<id>`, Felix's
//! flow-log prefixes and ours) and IP header decoder, used by the agent's collector and by
//! `felixrs flows`, and the NFLOG netlink socket both bind (`netlink-sys` +
//! `netlink-packet-netfilter`, the rust-netlink crates: pure Rust, no C library).
//!
//! A group has one listener per network namespace: while the agent's `--flow-logs` holds groups
//! 1 and 2, `felixrs flows` cannot bind them and says so, naming the agent's `/flows` stream.

use std::net::IpAddr;
use std::time::Duration;

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::{
    ConfigCmd, ConfigFlags, ConfigMode, PacketNla, Timeout, ULogMessage, config_request,
};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{Socket, constants::NETLINK_NETFILTER};

/// Why an NFLOG socket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum NflogError {
    #[error("nflog netlink socket: {0} (root needed)")]
    Socket(#[source] std::io::Error),
    #[error("nflog netlink {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("nflog netlink reply: {0}")]
    Reply(String),
    #[error(
        "binding nflog group {group}: refused with error {code} (another listener holds it: the agent's --flow-logs holds groups 1 and 2; read its stream with `curl http://<status address>/flows` instead)"
    )]
    Taken { group: u16, code: i32 },
}

/// A decoded prefix of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix<'a> {
    /// `deny`, `log`, `allow` or `pass`.
    pub action: &'static str,
    /// `policy`, `profile`, `tier-end` or `no-profile`.
    pub kind: &'static str,
    /// `ingress` or `egress`.
    pub direction: &'static str,
    /// The rule's index, when the prefix names a rule.
    pub rule: Option<u32>,
    /// The policy chain id (`np/ns/name`), profile, tier, or `__NO_MATCH__`.
    pub id: &'a str,
}

/// Decodes an NFLOG prefix of ours: `(action, kind, direction, rule, id)`.
pub fn decode_prefix(
    prefix: &str,
) -> Option<(&'static str, &'static str, &'static str, Option<u32>, &str)> {
    let p = parse_prefix(prefix)?;
    Some((p.action, p.kind, p.direction, p.rule, p.id))
}

/// Decodes an NFLOG prefix of ours.
pub fn parse_prefix(prefix: &str) -> Option<Prefix<'_>> {
    let (head, id) = prefix.split_once('|')?;
    let mut c = head.chars();
    let action = match c.next()? {
        'D' => "deny",
        'L' => "log",
        'A' => "allow",
        'N' => "pass",
        _ => return None,
    };
    let owner = c.next()?;
    let direction = match c.next()? {
        'I' => "ingress",
        'E' => "egress",
        _ => return None,
    };
    let rest: String = c.collect();
    let rule = if rest.is_empty() {
        None
    } else {
        Some(rest.parse().ok()?)
    };
    let kind = match (owner, rule) {
        ('P', None) => "tier-end",
        ('R', None) => "no-profile",
        ('P', Some(_)) => "policy",
        ('R', Some(_)) => "profile",
        _ => return None,
    };
    Some(Prefix {
        action,
        kind,
        direction,
        rule,
        id,
    })
}

/// The addresses, protocol and ports of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpHeader {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: u8,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
}

/// The header of an IPv4 or IPv6 packet (ports for TCP, UDP and SCTP).
pub fn decode_ip(p: &[u8]) -> Option<IpHeader> {
    let v = p.first()? >> 4;
    let (src, dst, proto, l4) = match v {
        4 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            let a: [u8; 4] = p.get(12..16)?.try_into().ok()?;
            let b: [u8; 4] = p.get(16..20)?.try_into().ok()?;
            (IpAddr::from(a), IpAddr::from(b), *p.get(9)?, p.get(ihl..))
        }
        6 => {
            let a: [u8; 16] = p.get(8..24)?.try_into().ok()?;
            let b: [u8; 16] = p.get(24..40)?.try_into().ok()?;
            (IpAddr::from(a), IpAddr::from(b), *p.get(6)?, p.get(40..))
        }
        _ => return None,
    };
    let ports = match (proto, l4) {
        (6 | 17 | 132, Some(h)) if h.len() >= 4 => (
            Some(u16::from_be_bytes([h[0], h[1]])),
            Some(u16::from_be_bytes([h[2], h[3]])),
        ),
        _ => (None, None),
    };
    Some(IpHeader {
        src,
        dst,
        protocol: proto,
        src_port: ports.0,
        dst_port: ports.1,
    })
}

/// The ICMP / ICMPv6 type and code of a packet, if it is one.
pub fn decode_icmp(p: &[u8]) -> Option<(u8, u8)> {
    let (proto, l4) = match p.first()? >> 4 {
        4 => (*p.get(9)?, p.get(usize::from(p[0] & 0x0f) * 4..)?),
        6 => (*p.get(6)?, p.get(40..)?),
        _ => return None,
    };
    match proto {
        1 | 58 if l4.len() >= 2 => Some((l4[0], l4[1])),
        _ => None,
    }
}

/// One packet an NFLOG rule sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NflogPacket {
    pub group: u16,
    pub prefix: String,
    pub payload: Vec<u8>,
}

fn send(
    socket: &Socket,
    msg: NetlinkMessage<NetfilterMessage>,
    group: u16,
) -> Result<(), NflogError> {
    let mut buf = vec![0; msg.header.length as usize];
    msg.serialize(&mut buf[..]);
    socket.send(&buf[..], 0).map_err(|source| NflogError::Io {
        what: "send",
        source,
    })?;
    let mut rx = vec![0; 4096];
    let n = socket
        .recv(&mut &mut rx[..], 0)
        .map_err(|source| NflogError::Io {
            what: "recv",
            source,
        })?;
    let reply = <NetlinkMessage<NetfilterMessage>>::deserialize(&rx[..n])
        .map_err(|e| NflogError::Reply(e.to_string()))?;
    if let NetlinkPayload::Error(e) = reply.payload
        && let Some(code) = e.code
    {
        return Err(NflogError::Taken {
            group,
            code: code.get(),
        });
    }
    Ok(())
}

/// A socket bound to NFLOG `groups` (both families), copying up to `copy` bytes a packet and
/// batching for at most 50 ms; non-blocking.
pub fn open(groups: &[u16], copy: u32) -> Result<Socket, NflogError> {
    let mut socket = Socket::new(NETLINK_NETFILTER).map_err(NflogError::Socket)?;
    socket.bind_auto().map_err(|source| NflogError::Io {
        what: "bind",
        source,
    })?;
    // The kernel's receive buffer: bursts of new connections must not overflow it.
    super::size_receive_buffer(&socket);
    super::tolerate_overruns(&socket);
    for fam in [NetfilterProtoFamily::IPv4, NetfilterProtoFamily::IPv6] {
        send(
            &socket,
            config_request(fam, 0, vec![ConfigCmd::PfBind.into()]),
            0,
        )?;
    }
    let timeout: Timeout = Duration::from_millis(50).into();
    for &group in groups {
        send(
            &socket,
            config_request(
                NetfilterProtoFamily::Unspec,
                group,
                vec![
                    ConfigCmd::Bind.into(),
                    ConfigFlags::SEQ_GLOBAL.into(),
                    ConfigMode::new_packet(copy).into(),
                    timeout.into(),
                ],
            ),
            group,
        )?;
    }
    socket
        .set_non_blocking(true)
        .map_err(|source| NflogError::Io {
            what: "non-blocking",
            source,
        })?;
    Ok(socket)
}

/// The NFLOG packets in one datagram read from the socket.
pub fn packets(datagram: &[u8]) -> Vec<NflogPacket> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < datagram.len() {
        let Ok(msg) = <NetlinkMessage<NetfilterMessage>>::deserialize(&datagram[offset..]) else {
            break;
        };
        let len = msg.header.length as usize;
        if let NetlinkPayload::InnerMessage(NetfilterMessage {
            header,
            inner: NetfilterMessageInner::ULog(ULogMessage::Packet(nlas)),
            ..
        }) = &msg.payload
        {
            let prefix = nlas.iter().find_map(|n| match n {
                PacketNla::Prefix(p) => Some(p.to_string_lossy().into_owned()),
                _ => None,
            });
            let payload = nlas.iter().find_map(|n| match n {
                PacketNla::Payload(p) => Some(p.clone()),
                _ => None,
            });
            if let (Some(prefix), Some(payload)) = (prefix, payload) {
                out.push(NflogPacket {
                    group: header.res_id,
                    prefix,
                    payload,
                });
            }
        }
        if len == 0 {
            break;
        }
        offset += len.next_multiple_of(4);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_decode() {
        assert_eq!(
            decode_prefix("DPI|default"),
            Some(("deny", "tier-end", "ingress", None, "default"))
        );
        assert_eq!(
            decode_prefix("DRE|__NO_MATCH__"),
            Some(("deny", "no-profile", "egress", None, "__NO_MATCH__"))
        );
        assert_eq!(
            decode_prefix("API1|np/prod/web"),
            Some(("allow", "policy", "ingress", Some(1), "np/prod/web"))
        );
        assert_eq!(
            decode_prefix("NPE0|gnp/sec"),
            Some(("pass", "policy", "egress", Some(0), "gnp/sec"))
        );
        assert_eq!(decode_prefix("calico-packet"), None);
        assert_eq!(decode_prefix("XPI|x"), None);
    }

    #[test]
    fn icmp_type_and_code_decode() {
        let mut v4 = vec![0u8; 24];
        v4[0] = 0x45;
        v4[9] = 1;
        v4[20] = 8;
        assert_eq!(decode_icmp(&v4), Some((8, 0)));
        assert_eq!(decode_ip(&v4).unwrap().src_port, None);
    }
}
