//! A DNS "world" in throwaway namespaces, shared by `tests/dns_queue_kernel.rs` and
//! `benches/dns_hold.rs`: a pod (`client`), a routing node (`router`, the pod's veth `cali…`, the
//! domain sets and the NFQUEUE hold rule as the renderer writes them) and a DNS server answering
//! `*.example.com` over UDP and TCP (`n<i>.example.com` resolves to an address made of `i`, every
//! other name to [`ANSWER4`]/[`ANSWER6`]), TTL 60.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use calc_graph::model::DomainPattern;
use felixrs::dns::learned::LearnedMap;
use felixrs::dns::learner::{Learner, LearnerConfig, SystemClock};
use felixrs::dns::metrics::DnsMetrics;
use felixrs::dns::queue::QueueLoop;
use felixrs::dns::setwriter::SetWriter;
use felixrs_test_support::netns::{Netns, enter, veth};
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use iptables::render::ActiveDomainSet;

pub const QUEUE: u16 = 100;
pub const SERVER4: &str = "10.77.2.2";
pub const SERVER6: &str = "fd77:2::2";
pub const CLIENT4: &str = "10.77.1.2";
pub const CLIENT6: &str = "fd77:1::2";
/// The server's answers: every name under example.com resolves to these, TTL 60.
pub const ANSWER4: &str = "192.0.2.44";
pub const ANSWER6: &str = "2001:db8::44";

pub struct World {
    pub client: Netns,
    pub router: Netns,
    pub server: Netns,
}

pub fn world() -> World {
    world_with(true)
}

/// The world, with or without the NFQUEUE hold rule (the benchmark's floor has none).
pub fn world_with(hold: bool) -> World {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&["ip", "ipset", "iptables", "ip6tables"]);
    let w = World {
        client: Netns::with_tag("dnsc"),
        router: Netns::with_tag("dnsr"),
        server: Netns::with_tag("dnss"),
    };
    veth(&w.client, "eth0", &w.router, "cali0dnstest");
    veth(&w.server, "eth0", &w.router, "srv0");
    for (ns, addrs, gw4, gw6) in [
        (&w.client, [CLIENT4, CLIENT6], "10.77.1.1", "fd77:1::1"),
        (&w.server, [SERVER4, SERVER6], "10.77.2.1", "fd77:2::1"),
    ] {
        ns.ok(
            "ip",
            &["addr", "add", &format!("{}/24", addrs[0]), "dev", "eth0"],
        );
        ns.ok(
            "ip",
            &[
                "-6",
                "addr",
                "add",
                &format!("{}/64", addrs[1]),
                "dev",
                "eth0",
                "nodad",
            ],
        );
        ns.ok("ip", &["route", "add", "default", "via", gw4]);
        ns.ok("ip", &["-6", "route", "add", "default", "via", gw6]);
    }
    let r = &w.router;
    r.ok(
        "ip",
        &["addr", "add", "10.77.1.1/24", "dev", "cali0dnstest"],
    );
    r.ok("ip", &["addr", "add", "10.77.2.1/24", "dev", "srv0"]);
    r.ok(
        "ip",
        &[
            "-6",
            "addr",
            "add",
            "fd77:1::1/64",
            "dev",
            "cali0dnstest",
            "nodad",
        ],
    );
    r.ok(
        "ip",
        &["-6", "addr", "add", "fd77:2::1/64", "dev", "srv0", "nodad"],
    );
    r.sysctl("net.ipv4.ip_forward", "1").unwrap();
    r.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
    // The domain sets and the hold rule, as the renderer writes them.
    r.ok(
        "ipset",
        &[
            "create",
            "cali40d:test",
            "hash:ip",
            "family",
            "inet",
            "timeout",
            "0",
            "maxelem",
            "1048576",
        ],
    );
    r.ok(
        "ipset",
        &[
            "create",
            "cali60d:test",
            "hash:ip",
            "family",
            "inet6",
            "timeout",
            "0",
            "maxelem",
            "1048576",
        ],
    );
    // A set without timeout support: every write to it fails.
    r.ok(
        "ipset",
        &["create", "cali40d:broken", "hash:ip", "family", "inet"],
    );
    for (tool, server) in [("iptables", SERVER4), ("ip6tables", SERVER6)]
        .into_iter()
        .filter(|_| hold)
    {
        for proto in ["udp", "tcp"] {
            r.ok(
                tool,
                &[
                    "-t",
                    "mangle",
                    "-A",
                    "POSTROUTING",
                    "-o",
                    "cali+",
                    "-s",
                    server,
                    "-p",
                    proto,
                    "--sport",
                    "53",
                    "-m",
                    "conntrack",
                    "--ctdir",
                    "REPLY",
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    &QUEUE.to_string(),
                ],
            );
        }
    }
    serve(&w.server);
    w
}

pub fn response_to(query: &[u8]) -> Option<Vec<u8>> {
    let q = Message::from_vec(query).ok()?;
    let question = q.queries.first()?.clone();
    let mut m = Message::query();
    m.metadata.id = q.metadata.id;
    m.metadata.message_type = MessageType::Response;
    m.metadata.op_code = OpCode::Query;
    let numbered = question.name.iter().next().and_then(|l| {
        std::str::from_utf8(l)
            .ok()?
            .strip_prefix('n')?
            .parse::<u32>()
            .ok()
    });
    let data = match (question.query_type, numbered) {
        (RecordType::AAAA, _) => RData::AAAA(AAAA(ANSWER6.parse().unwrap())),
        (_, Some(i)) => RData::A(A(Ipv4Addr::from(0x0a00_0000 | (i & 0x00ff_ffff)))),
        _ => RData::A(A(ANSWER4.parse().unwrap())),
    };
    m.answers
        .push(Record::from_rdata(question.name.clone(), 60, data));
    m.queries.push(question);
    m.to_vec().ok()
}

/// UDP and TCP servers on port 53 of both server addresses, answering forever (they die with the
/// test process; the namespace's deletion does not wait for them).
pub fn serve(ns: &Netns) {
    let name = ns.name().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        enter(&name).unwrap();
        let mut handles = Vec::new();
        for addr in [SERVER4, SERVER6] {
            let sa = SocketAddr::new(addr.parse().unwrap(), 53);
            let udp = UdpSocket::bind(sa).unwrap();
            handles.push(std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while let Ok((n, from)) = udp.recv_from(&mut buf) {
                    if let Some(r) = response_to(&buf[..n]) {
                        let _ = udp.send_to(&r, from);
                    }
                }
            }));
            let tcp = TcpListener::bind(sa).unwrap();
            handles.push(std::thread::spawn(move || {
                for mut s in tcp.incoming().map_while(Result::ok) {
                    let mut len = [0u8; 2];
                    if s.read_exact(&mut len).is_err() {
                        continue;
                    }
                    let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
                    if s.read_exact(&mut q).is_err() {
                        continue;
                    }
                    if let Some(r) = response_to(&q) {
                        let mut out = (r.len() as u16).to_be_bytes().to_vec();
                        out.extend(r);
                        let _ = s.write_all(&out);
                    }
                }
            }));
        }
        tx.send(()).unwrap();
        for h in handles {
            let _ = h.join();
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("DNS server up");
}

pub fn query(name: &str, aaaa: bool) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = 0x4242;
    m.metadata.recursion_desired = true;
    let t = if aaaa {
        RecordType::AAAA
    } else {
        RecordType::A
    };
    m.queries
        .push(Query::query(Name::from_str(name).unwrap(), t));
    m.to_vec().unwrap()
}

/// Resolves `name` from the client over UDP or TCP; the answer's addresses, or `None` when no
/// answer came within `wait`.
pub fn resolve(w: &World, name: &str, v6: bool, tcp: bool, wait: Duration) -> Option<Vec<IpAddr>> {
    let server: IpAddr = if v6 { SERVER6 } else { SERVER4 }.parse().unwrap();
    let q = query(name, v6);
    let client = w.client.name().to_string();
    felixrs_test_support::netns::in_netns(&client, move || {
        let sa = SocketAddr::new(server, 53);
        let bytes = if tcp {
            let mut s = TcpStream::connect_timeout(&sa, wait).ok()?;
            s.set_read_timeout(Some(wait)).unwrap();
            let mut out = (q.len() as u16).to_be_bytes().to_vec();
            out.extend(&q);
            s.write_all(&out).ok()?;
            let mut len = [0u8; 2];
            s.read_exact(&mut len).ok()?;
            let mut r = vec![0u8; usize::from(u16::from_be_bytes(len))];
            s.read_exact(&mut r).ok()?;
            r
        } else {
            let bind: SocketAddr = if v6 { "[::]:0" } else { "0.0.0.0:0" }.parse().unwrap();
            let s = UdpSocket::bind(bind).unwrap();
            s.set_read_timeout(Some(wait)).unwrap();
            s.send_to(&q, sa).unwrap();
            let mut buf = [0u8; 1500];
            let (n, _) = s.recv_from(&mut buf).ok()?;
            buf[..n].to_vec()
        };
        let m = Message::from_vec(&bytes).ok()?;
        Some(
            m.answers
                .iter()
                .filter_map(|r| match &r.data {
                    RData::A(a) => Some(IpAddr::V4(a.0)),
                    RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                    _ => None,
                })
                .collect(),
        )
    })
}

/// `(member, timeout)` pairs of a set in the router.
pub fn members(w: &World, set: &str) -> Vec<(IpAddr, u32)> {
    let out = w.router.ok("ipset", &["list", set]);
    out.lines()
        .skip_while(|l| !l.starts_with("Members:"))
        .skip(1)
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let addr = it.next()?.parse().ok()?;
            let timeout = it.nth(1)?.parse().ok()?;
            Some((addr, timeout))
        })
        .collect()
}

pub fn bind_learner(w: &World, trusted_port: u16) -> Arc<Learner> {
    bind_learner_with(w, trusted_port, || {
        Box::new(felixrs::dns::setwriter::NetlinkSetWriter::open().expect("ipset netlink socket"))
    })
}

/// [`bind_learner`] with the set writer `writer` makes (in the router's namespace).
pub fn bind_learner_with(
    w: &World,
    trusted_port: u16,
    writer: impl FnOnce() -> Box<dyn SetWriter> + Send + 'static,
) -> Arc<Learner> {
    let router = w.router.name().to_string();
    felixrs_test_support::netns::in_netns(&router, move || {
        let learner = Arc::new(Learner::new(
            LearnerConfig {
                trusted_servers: vec![
                    SocketAddr::new(SERVER4.parse().unwrap(), trusted_port),
                    SocketAddr::new(SERVER6.parse().unwrap(), trusted_port),
                ],
                min_ttl: 0,
                max_learned: 1000,
                persist_path: None,
            },
            LearnedMap::new(1000),
            writer(),
            Arc::new(SystemClock),
            DnsMetrics::default(),
        ));
        let q = QueueLoop::bind(QUEUE).expect("bind the queue");
        // Runs until the process ends (the namespace goes with the test).
        std::mem::forget(q.spawn(learner.clone()));
        learner
    })
}

pub fn domain_set(pattern: &str, v4: &str, v6: Option<&str>) -> ActiveDomainSet {
    ActiveDomainSet {
        patterns: vec![DomainPattern::parse(pattern).unwrap()],
        v4_set: Some(v4.into()),
        v6_set: v6.map(String::from),
    }
}
