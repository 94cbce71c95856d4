//! The flow-log collector's own throughput on recorded messages (no kernel): N connections, each
//! one NFLOG packet per reporter (egress and ingress prefixes, as a pod-to-pod connection on one
//! node logs) and one conntrack `DESTROY` with counts, as the kernel sends them (netlink
//! datagrams of 64 messages), decoded and aggregated, new flows published, one interval flushed.
//!
//! `cargo bench -p felixrs --bench flow_logs [-- CONNECTIONS]` (default 100000)
//!
//! * floor: decoding the same datagrams only (`nflog::packets`, `conntrack::ended`);
//! * collector: decode + `Aggregator` (packet, ended, fresh records, interval flush) with names.
//!
//! Prints connections/s of each and the ratio.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use felixrs::flowlog::collector::{Aggregator, CollectorStats};
use felixrs::flowlog::names::Names;
use felixrs::flowlog::{NoPending, conntrack, nflog};
use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::{PacketNla, ULogMessage};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

fn ipv4_tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x45;
    p[9] = 6;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p[22..24].copy_from_slice(&dport.to_be_bytes());
    p
}

fn nflog_msg(group: u16, prefix: &str, payload: Vec<u8>) -> Vec<u8> {
    let inner = ULogMessage::Packet(vec![
        PacketNla::Prefix(std::ffi::CString::new(prefix).unwrap()),
        PacketNla::Payload(payload),
    ]);
    let mut m = NetlinkMessage::new(
        NetlinkHeader::default(),
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, group),
            inner,
        )),
    );
    m.finalize();
    let mut buf = vec![0; m.header.length as usize];
    m.serialize(&mut buf);
    buf
}

/// A conntrack DESTROY message (hand-encoded: the crate's emitter has no counters).
fn destroy_msg(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(value);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }
    const NESTED: u16 = 0x8000;
    let ip = [nla(1, &src.octets()), nla(2, &dst.octets())].concat();
    let proto = [
        nla(1, &[6]),
        nla(2, &sport.to_be_bytes()),
        nla(3, &dport.to_be_bytes()),
    ]
    .concat();
    let tuple = [nla(1 | NESTED, &ip), nla(2 | NESTED, &proto)].concat();
    let counters = |p: u64, b: u64| [nla(1, &p.to_be_bytes()), nla(2, &b.to_be_bytes())].concat();
    let body = [
        vec![2u8, 0, 0, 0], // nfgenmsg: AF_INET, version 0, res_id 0
        nla(1 | NESTED, &tuple),
        nla(9 | NESTED, &counters(5, 300)),
        nla(10 | NESTED, &counters(4, 250)),
    ]
    .concat();
    let mut msg = Vec::new();
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    // NFNL_SUBSYS_CTNETLINK (1) << 8 | IPCTNL_MSG_CT_DELETE (2)
    msg.extend_from_slice(&((1u16 << 8) | 2).to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&[0u8; 8]);
    msg.extend_from_slice(&body);
    msg
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let (client, server) = (Ipv4Addr::new(10, 79, 0, 1), Ipv4Addr::new(10, 79, 0, 2));
    let mut nf_dgrams = Vec::new();
    let mut ct_dgrams = Vec::new();
    let (mut nf, mut ct) = (Vec::new(), Vec::new());
    for i in 0..n {
        let sport = 1024 + (i % 60000) as u16;
        let dst = Ipv4Addr::from(u32::from(server) + (i / 60000) as u32);
        let pkt = ipv4_tcp(client, sport, dst, 8080);
        nf.extend(nflog_msg(2, "ARE0|kns.stats", pkt.clone()));
        nf.extend(nflog_msg(1, "API0|np/stats/knp.default.allow-web", pkt));
        ct.extend(destroy_msg(client, sport, dst, 8080));
        if i % 32 == 31 {
            nf_dgrams.push(std::mem::take(&mut nf));
            ct_dgrams.push(std::mem::take(&mut ct));
        }
    }
    nf_dgrams.push(nf);
    ct_dgrams.push(ct);

    let t = Instant::now();
    let (mut packets, mut ended) = (0usize, 0usize);
    for (a, b) in nf_dgrams.iter().zip(&ct_dgrams) {
        packets += nflog::packets(a).len();
        ended += conntrack::ended(b).len();
    }
    let floor = t.elapsed();
    assert_eq!((packets, ended), (2 * n, n), "recorded messages decode");

    let stats = Arc::new(CollectorStats::default());
    let mut agg = Aggregator::new("node-1", 2 * n, stats.clone());
    let names = Names::default();
    let t = Instant::now();
    let mut records = 0;
    for (a, b) in nf_dgrams.iter().zip(&ct_dgrams) {
        for p in nflog::packets(a) {
            agg.packet(&NoPending, &p);
        }
        for e in conntrack::ended(b) {
            agg.ended(&e);
        }
        records += agg.fresh(&names).len();
    }
    records += agg.flush(&names).len();
    let collector = t.elapsed();
    let dropped = stats.dropped.load(std::sync::atomic::Ordering::Relaxed);
    let rate = |d: std::time::Duration| n as f64 / d.as_secs_f64();
    println!("connections: {n}, records: {records}, dropped: {dropped}");
    println!("floor (decode only): {:.0} connections/s", rate(floor));
    println!("collector:           {:.0} connections/s", rate(collector));
    println!(
        "collector / floor time: {:.2}x",
        collector.as_secs_f64() / floor.as_secs_f64()
    );
}
