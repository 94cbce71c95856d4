//! The queued L3 packet → the DNS messages it carries.
//!
//! NFQUEUE hands us the packet from its IP header on (IPv4 or IPv6, reassembled by conntrack's
//! defragmentation before the mangle table saw it). A UDP datagram carries one DNS message; a TCP
//! segment carries zero or more messages, each behind a 2-byte length prefix (RFC 1035 4.2.2).
//! Only *whole* messages inside the one segment are returned: a message split over segments
//! cannot be learned from (the response is then released unlearned, and the pod's connection to
//! its addresses stays denied: fail closed, never open).

use std::net::IpAddr;

use etherparse::{IpNumber, IpSlice, TcpSlice, UdpSlice};

/// The transport protocol a response came over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// What a queued packet holds, as far as the learner cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted<'a> {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
    pub transport: Transport,
    /// The whole DNS messages in the packet (for TCP without their length prefixes).
    pub messages: Vec<&'a [u8]>,
    /// TCP: bytes after the last whole message (a message continued in a later segment, or the
    /// tail of one begun in an earlier one), which were not learned from.
    pub partial: bool,
}

/// Why a packet yields no DNS messages at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("not an IPv4/IPv6 packet: {0}")]
    Ip(String),
    #[error("fragmented IP payload")]
    Fragment,
    #[error("IP protocol {0} is neither UDP nor TCP")]
    Protocol(u8),
    #[error("malformed {0:?} header: {1}")]
    Transport(Transport, String),
}

/// At most this many messages are taken from one TCP segment (a 64 KiB segment of tiny
/// messages is not an answer anyone sends; bounding it keeps the per-packet work bounded).
pub const MAX_TCP_MESSAGES: usize = 64;

/// Splits a queued packet into its addresses, ports and DNS messages. Never panics.
pub fn extract(packet: &[u8]) -> Result<Extracted<'_>, PacketError> {
    let ip = IpSlice::from_slice(packet).map_err(|e| PacketError::Ip(e.to_string()))?;
    let payload = ip.payload();
    if payload.fragmented {
        return Err(PacketError::Fragment);
    }
    let (src, dst) = (ip.source_addr(), ip.destination_addr());
    match payload.ip_number {
        IpNumber::UDP => {
            let udp = UdpSlice::from_slice(payload.payload)
                .map_err(|e| PacketError::Transport(Transport::Udp, e.to_string()))?;
            let body = udp.payload();
            Ok(Extracted {
                src,
                dst,
                src_port: udp.source_port(),
                dst_port: udp.destination_port(),
                transport: Transport::Udp,
                messages: if body.is_empty() { vec![] } else { vec![body] },
                partial: false,
            })
        }
        IpNumber::TCP => {
            let tcp = TcpSlice::from_slice(payload.payload)
                .map_err(|e| PacketError::Transport(Transport::Tcp, e.to_string()))?;
            let (messages, partial) = split_tcp(tcp.payload());
            Ok(Extracted {
                src,
                dst,
                src_port: tcp.source_port(),
                dst_port: tcp.destination_port(),
                transport: Transport::Tcp,
                messages,
                partial,
            })
        }
        other => Err(PacketError::Protocol(other.0)),
    }
}

/// The whole length-prefixed messages at the start of a TCP segment's payload, and whether bytes
/// were left over.
pub fn split_tcp(mut body: &[u8]) -> (Vec<&[u8]>, bool) {
    let mut out = Vec::new();
    while body.len() >= 2 && out.len() < MAX_TCP_MESSAGES {
        let len = usize::from(u16::from_be_bytes([body[0], body[1]]));
        let Some(msg) = body.get(2..2 + len) else {
            break;
        };
        if len > 0 {
            out.push(msg);
        }
        body = &body[2 + len..];
    }
    (out, !body.is_empty())
}

#[cfg(test)]
pub(crate) mod build {
    //! Packets for the tests: real IPv4/IPv6 + UDP/TCP headers around a payload.
    use std::net::IpAddr;

    use etherparse::PacketBuilder;

    pub fn udp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, payload: &[u8]) -> Vec<u8> {
        let b = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
            (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
            _ => panic!("mixed families"),
        }
        .udp(sport, dport);
        let mut out = Vec::new();
        b.write(&mut out, payload).unwrap();
        out
    }

    pub fn tcp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, payload: &[u8]) -> Vec<u8> {
        let b = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
            (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
            _ => panic!("mixed families"),
        }
        .tcp(sport, dport, 1, 65535)
        .ack(1)
        .psh();
        let mut out = Vec::new();
        b.write(&mut out, payload).unwrap();
        out
    }

    /// `payload` behind a 2-byte length prefix.
    pub fn framed(payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(payload);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;
    use proptest::prelude::*;

    fn a(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn udp_over_both_families() {
        for (s, d) in [("10.0.0.53", "10.0.0.9"), ("fd00::53", "fd00::9")] {
            let p = udp(a(s), 53, a(d), 40000, b"hello");
            let e = extract(&p).unwrap();
            assert_eq!((e.src, e.dst), (a(s), a(d)));
            assert_eq!((e.src_port, e.dst_port), (53, 40000));
            assert_eq!(e.transport, Transport::Udp);
            assert_eq!(e.messages, vec![&b"hello"[..]]);
        }
    }

    #[test]
    fn tcp_takes_only_whole_framed_messages() {
        let mut body = framed(b"one");
        body.extend(framed(b"two"));
        body.extend_from_slice(&[0, 10, b'x']); // a third, cut short
        let p = tcp(a("10.0.0.53"), 53, a("10.0.0.9"), 40000, &body);
        let e = extract(&p).unwrap();
        assert_eq!(e.transport, Transport::Tcp);
        assert_eq!(e.messages, vec![&b"one"[..], &b"two"[..]]);
        assert!(e.partial);
        // A bare ACK carries nothing.
        let p = tcp(a("fd00::53"), 53, a("fd00::9"), 40000, b"");
        let e = extract(&p).unwrap();
        assert!(e.messages.is_empty() && !e.partial);
        // A lone length byte is partial.
        assert_eq!(split_tcp(&[0]), (vec![], true));
        assert_eq!(split_tcp(&[0, 0]), (vec![], false));
    }

    #[test]
    fn other_protocols_and_garbage_are_errors() {
        assert!(matches!(extract(&[]), Err(PacketError::Ip(_))));
        assert!(matches!(extract(&[0x45; 3]), Err(PacketError::Ip(_))));
        let mut p = udp(a("10.0.0.53"), 53, a("10.0.0.9"), 1, b"x");
        p[9] = 1; // ICMP
        assert!(matches!(extract(&p), Err(PacketError::Protocol(1))));
        // A truncated UDP header.
        let p = udp(a("10.0.0.53"), 53, a("10.0.0.9"), 1, b"");
        let mut short = p[..24].to_vec();
        short[2..4].copy_from_slice(&24u16.to_be_bytes());
        assert!(extract(&short).is_err());
    }

    #[test]
    fn the_tcp_message_bound_holds() {
        let body: Vec<u8> = (0..200).flat_map(|_| framed(b"m")).collect();
        let (msgs, partial) = split_tcp(&body);
        assert_eq!(msgs.len(), MAX_TCP_MESSAGES);
        assert!(partial);
    }

    proptest! {
        /// Any bytes: no panic, and messages are always inside the packet.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(e) = extract(&bytes) {
                for m in e.messages {
                    prop_assert!(m.len() <= bytes.len());
                }
            }
        }

        /// Framing round-trips: whatever whole messages were framed come back, in order.
        #[test]
        fn framing_round_trips(msgs in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..40), 0..8), cut in 0usize..3) {
            let mut body: Vec<u8> = msgs.iter().flat_map(|m| framed(m)).collect();
            let full = body.len();
            body.truncate(full.saturating_sub(cut));
            let (got, partial) = split_tcp(&body);
            let whole = if cut == 0 { msgs.len() } else { msgs.len().saturating_sub(1) };
            prop_assert_eq!(got.len(), whole);
            for (g, m) in got.iter().zip(&msgs) {
                prop_assert_eq!(*g, &m[..]);
            }
            prop_assert_eq!(partial, cut > 0 && !msgs.is_empty());
        }
    }
}
