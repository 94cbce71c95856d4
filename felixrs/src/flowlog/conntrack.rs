//! The end of each connection, with its packet and byte counts: conntrack `DESTROY` events over
//! ctnetlink (multicast group `NFNLGRP_CONNTRACK_DESTROY`), decoded with
//! `netlink-packet-netfilter`'s conntrack messages (the crate `felixrs flows` already uses for
//! NFLOG) plus the two counter attributes it leaves raw (`CTA_COUNTERS_ORIG`/`_REPLY`, nested
//! `CTA_COUNTERS_PACKETS`/`_BYTES`, u64 big-endian).
//!
//! The kernel sends counters only when `net.netfilter.nf_conntrack_acct` is 1 in the namespace
//! (off by default); the agent sets it when flow logs are on ([`enable_accounting`]), and
//! events need `nf_conntrack_events` (default 2: on when someone listens).

use std::net::IpAddr;

use netlink_packet_core::{NetlinkMessage, NetlinkPayload, Nla, NlasIterator};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Tuple,
};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner};
use netlink_sys::{Socket, constants::NETLINK_NETFILTER};

/// `NFNLGRP_CONNTRACK_DESTROY`.
const GROUP_DESTROY: u32 = 3;
const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;
/// An attribute type without its flags (`NLA_TYPE_MASK`).
const NLA_TYPE_MASK: u16 = 0x3fff;

/// The sysctl that makes the kernel count packets and bytes per connection.
pub const ACCT_SYSCTL: &str = "/proc/sys/net/netfilter/nf_conntrack_acct";

/// A connection's original-direction 5-tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple5 {
    pub proto: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
}

/// A connection that ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub orig: Tuple5,
    /// Packets and bytes the originator sent, and those it received (zero without accounting).
    pub orig_packets: u64,
    pub orig_bytes: u64,
    pub reply_packets: u64,
    pub reply_bytes: u64,
}

/// Turns on conntrack accounting in this network namespace (idempotent); the error names the
/// sysctl.
pub fn enable_accounting() -> std::io::Result<()> {
    match std::fs::read_to_string(ACCT_SYSCTL) {
        Ok(v) if v.trim() == "1" => Ok(()),
        _ => std::fs::write(ACCT_SYSCTL, "1"),
    }
}

/// A non-blocking socket receiving conntrack `DESTROY` events.
pub fn open() -> std::io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    super::size_receive_buffer(&socket);
    super::tolerate_overruns(&socket);
    socket.add_membership(GROUP_DESTROY)?;
    socket.set_non_blocking(true)?;
    Ok(socket)
}

fn raw(nla: &impl Nla) -> Vec<u8> {
    let mut v = vec![0; nla.value_len()];
    nla.emit_value(&mut v);
    v
}

fn counters(value: &[u8]) -> (u64, u64) {
    let (mut packets, mut bytes) = (0, 0);
    for nla in NlasIterator::new(value).flatten() {
        let v = nla.value();
        let Ok(n) = <[u8; 8]>::try_from(v) else {
            continue;
        };
        match nla.kind() {
            CTA_COUNTERS_PACKETS => packets = u64::from_be_bytes(n),
            CTA_COUNTERS_BYTES => bytes = u64::from_be_bytes(n),
            _ => {}
        }
    }
    (packets, bytes)
}

fn tuple(parts: &[Tuple]) -> Option<Tuple5> {
    let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, None, None);
    for t in parts {
        match t {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(n) => proto = Some(u8::from(*n)),
                        ProtoTuple::SourcePort(n) => sport = Some(*n),
                        ProtoTuple::DestinationPort(n) => dport = Some(*n),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Tuple5 {
        proto: proto?,
        src: src?,
        dst: dst?,
        src_port: sport,
        dst_port: dport,
    })
}

/// The ended connections in one datagram read from the socket.
pub fn ended(datagram: &[u8]) -> Vec<Ended> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < datagram.len() {
        let Ok(msg) = <NetlinkMessage<NetfilterMessage>>::deserialize(&datagram[offset..]) else {
            break;
        };
        let len = msg.header.length as usize;
        if let NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(attrs)),
            ..
        }) = &msg.payload
        {
            let mut e = None;
            let (mut op, mut ob, mut rp, mut rb) = (0, 0, 0, 0);
            for a in attrs {
                match a {
                    ConntrackAttribute::CtaTupleOrig(t) => e = tuple(t),
                    // The raw attribute's kind keeps the kernel's NLA_F_NESTED flag.
                    ConntrackAttribute::Other(o)
                        if o.kind() & NLA_TYPE_MASK == CTA_COUNTERS_ORIG =>
                    {
                        (op, ob) = counters(&raw(o));
                    }
                    ConntrackAttribute::Other(o)
                        if o.kind() & NLA_TYPE_MASK == CTA_COUNTERS_REPLY =>
                    {
                        (rp, rb) = counters(&raw(o));
                    }
                    _ => {}
                }
            }
            if let Some(orig) = e {
                out.push(Ended {
                    orig,
                    orig_packets: op,
                    orig_bytes: ob,
                    reply_packets: rp,
                    reply_bytes: rb,
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
    fn counters_decode_from_nested_attributes() {
        let mut v = Vec::new();
        for (kind, n) in [(CTA_COUNTERS_PACKETS, 7u64), (CTA_COUNTERS_BYTES, 420u64)] {
            v.extend_from_slice(&12u16.to_ne_bytes());
            v.extend_from_slice(&kind.to_ne_bytes());
            v.extend_from_slice(&n.to_be_bytes());
        }
        assert_eq!(counters(&v), (7, 420));
        // Truncated input is ignored, never a panic.
        assert_eq!(counters(&v[..10]), (0, 0));
    }
}
