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

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkMessage, NetlinkPayload, Nla,
    NlasIterator,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{Socket, constants::NETLINK_NETFILTER};

/// `NFNLGRP_CONNTRACK_DESTROY`.
const GROUP_DESTROY: u32 = 3;
const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;
/// An attribute type without its flags (`NLA_TYPE_MASK`).
pub const NLA_TYPE_MASK: u16 = 0x3fff;

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

/// The 5-tuple of a conntrack tuple attribute (its protocol and addresses required).
pub fn tuple(parts: &[Tuple]) -> Option<Tuple5> {
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
    connections(datagram, false)
}

/// The connections (and their counts so far) in one datagram of a table dump.
pub fn dumped(datagram: &[u8]) -> Vec<Ended> {
    connections(datagram, true)
}

/// The counted connections of a datagram: `DESTROY` events, or the `NEW` messages a dump
/// replies with.
fn connections(datagram: &[u8], dump: bool) -> Vec<Ended> {
    let mut out = Vec::new();
    each_message(datagram, dump, |_, attrs| out.extend(counted(attrs)));
    out
}

/// Calls `f` with the family (`nfgen_family`) and the attributes of each conntrack message in
/// one datagram: `DESTROY` events (`dump == false`), or the `NEW` messages a dump replies with.
pub fn each_message(
    datagram: &[u8],
    dump: bool,
    mut f: impl FnMut(NetfilterProtoFamily, &[ConntrackAttribute]),
) {
    let mut offset = 0;
    while offset < datagram.len() {
        let Ok(msg) = <NetlinkMessage<NetfilterMessage>>::deserialize(&datagram[offset..]) else {
            break;
        };
        let len = msg.header.length as usize;
        if let NetlinkPayload::InnerMessage(NetfilterMessage { header, inner, .. }) = &msg.payload {
            match inner {
                NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(attrs)) if !dump => {
                    f(header.family, attrs)
                }
                NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) if dump => {
                    f(header.family, attrs)
                }
                _ => {}
            }
        }
        if len == 0 {
            break;
        }
        offset += len.next_multiple_of(4);
    }
}

fn counted(attrs: &[ConntrackAttribute]) -> Option<Ended> {
    let mut e = None;
    let (mut op, mut ob, mut rp, mut rb) = (0, 0, 0, 0);
    for a in attrs {
        match a {
            ConntrackAttribute::CtaTupleOrig(t) => e = tuple(t),
            // The raw attribute's kind keeps the kernel's NLA_F_NESTED flag.
            ConntrackAttribute::Other(o) if o.kind() & NLA_TYPE_MASK == CTA_COUNTERS_ORIG => {
                (op, ob) = counters(&raw(o));
            }
            ConntrackAttribute::Other(o) if o.kind() & NLA_TYPE_MASK == CTA_COUNTERS_REPLY => {
                (rp, rb) = counters(&raw(o));
            }
            _ => {}
        }
    }
    Some(Ended {
        orig: e?,
        orig_packets: op,
        orig_bytes: ob,
        reply_packets: rp,
        reply_bytes: rb,
    })
}

/// A socket for dumping the conntrack table (blocking, with a receive timeout so a dump can
/// never hang the collector).
pub fn open_dump() -> std::io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    rustix::net::sockopt::set_socket_timeout(
        &socket,
        rustix::net::sockopt::Timeout::Recv,
        Some(DUMP_TIMEOUT),
    )?;
    Ok(socket)
}

/// The longest a dump waits for the kernel's next datagram.
const DUMP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Every connection in the namespace's conntrack table (both families) with its counts so far:
/// `IPCTNL_MSG_CT_GET` with `NLM_F_DUMP`, read to `NLMSG_DONE`. How live connections get their
/// packets and bytes each interval, as Felix's collector polls conntrack, instead of only at
/// their end.
pub fn dump(socket: &Socket) -> std::io::Result<Vec<Ended>> {
    let mut out = Vec::new();
    dump_each(socket, |_, attrs| out.extend(counted(attrs)))?;
    Ok(out)
}

/// Dumps the namespace's conntrack table (both families), calling `f` with each entry's family
/// and attributes.
pub fn dump_each(
    socket: &Socket,
    mut f: impl FnMut(NetfilterProtoFamily, &[ConntrackAttribute]),
) -> std::io::Result<()> {
    let mut msg = NetlinkMessage::from(NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
        ConntrackMessage::Get(Vec::new()),
    ));
    msg.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    msg.finalize();
    let mut buf = vec![0; msg.header.length as usize];
    msg.serialize(&mut buf[..]);
    socket.send(&buf, 0)?;
    let mut rx = vec![0u8; 1 << 16];
    loop {
        let n = socket.recv(&mut &mut rx[..], 0)?;
        let datagram = &rx[..n];
        each_message(datagram, true, &mut f);
        // The dump ends with NLMSG_DONE (or an error) in the datagram's last message.
        for (kind, code) in control_messages(datagram) {
            match kind {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR if code != 0 => return Err(std::io::Error::from_raw_os_error(-code)),
                NLMSG_ERROR => return Ok(()),
                _ => {}
            }
        }
        if n == 0 {
            return Ok(());
        }
    }
}

/// The type of each netlink message in a datagram, with the error code of an `NLMSG_ERROR` (0
/// for an acknowledgement; 0 for other types).
pub fn control_messages(datagram: &[u8]) -> Vec<(u16, i32)> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset + 16 <= datagram.len() {
        let word = |at: usize| <[u8; 4]>::try_from(&datagram[at..at + 4]).unwrap();
        let len = u32::from_ne_bytes(word(offset)) as usize;
        let kind = u16::from_ne_bytes([datagram[offset + 4], datagram[offset + 5]]);
        let code = if kind == NLMSG_ERROR && offset + 20 <= datagram.len() {
            i32::from_ne_bytes(word(offset + 16))
        } else {
            0
        };
        out.push((kind, code));
        if len < 16 {
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
