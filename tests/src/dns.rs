//! A minimal DNS client for the end-to-end tests (`nat.rs`, `fqdn.rs`): one question (A or AAAA)
//! over UDP or TCP from inside a namespace, the answer's addresses with their TTLs (CNAME records
//! skipped, so a chain's final addresses come back), and a forged answer for the tests that check a
//! forged DNS reply opens nothing. Only what the tests need; names are ASCII.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use felixrs_test_support::netns::in_netns;

/// Record type A.
pub const A: u16 = 1;
/// Record type CNAME.
pub const CNAME: u16 = 5;
/// Record type AAAA.
pub const AAAA: u16 = 28;

/// One address record of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub addr: IpAddr,
    pub ttl: u32,
}

/// A query message: one question for `name` of type `qtype`, recursion desired.
pub fn query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>> {
    let mut q = Vec::with_capacity(32 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD; one question
    push_name(&mut q, name)?;
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&[0, 1]); // class IN
    Ok(q)
}

fn push_name(q: &mut Vec<u8>, name: &str) -> Result<()> {
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            bail!("bad DNS name {name:?}");
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    Ok(())
}

/// A response to `query(id, name, A or AAAA)` with one address record for `addr`, as a DNS
/// server would write it (the question echoed, the answer's name compressed to it).
pub fn response(id: u16, name: &str, addr: IpAddr, ttl: u32) -> Result<Vec<u8>> {
    let qtype = if addr.is_ipv4() { A } else { AAAA };
    let mut m = query(id, name, qtype)?;
    m[2] = 0x81; // QR, RD
    m[3] = 0x80; // RA
    m[7] = 1; // one answer
    m.extend_from_slice(&[0xc0, 12]);
    m.extend_from_slice(&qtype.to_be_bytes());
    m.extend_from_slice(&[0, 1]);
    m.extend_from_slice(&ttl.to_be_bytes());
    match addr {
        IpAddr::V4(a) => {
            m.extend_from_slice(&4u16.to_be_bytes());
            m.extend_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            m.extend_from_slice(&16u16.to_be_bytes());
            m.extend_from_slice(&a.octets());
        }
    }
    Ok(m)
}

/// Skips a (possibly compressed) name at `i`; returns the offset after it.
fn skip_name(m: &[u8], mut i: usize) -> Result<usize> {
    loop {
        let len = *m.get(i).context("truncated DNS name")? as usize;
        if len == 0 {
            return Ok(i + 1);
        }
        if len & 0xc0 == 0xc0 {
            return Ok(i + 2);
        }
        i += 1 + len;
    }
}

/// The A and AAAA records of the answer section of a response to query `id`, in order.
pub fn answers(m: &[u8], id: u16) -> Result<Vec<Answer>> {
    if m.len() < 12 || m[..2] != id.to_be_bytes() {
        bail!("not an answer to query {id}");
    }
    let qd = u16::from_be_bytes([m[4], m[5]]) as usize;
    let an = u16::from_be_bytes([m[6], m[7]]) as usize;
    let mut i = 12;
    for _ in 0..qd {
        i = skip_name(m, i)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..an {
        i = skip_name(m, i)?;
        let h = m.get(i..i + 10).context("truncated DNS record")?;
        let rtype = u16::from_be_bytes([h[0], h[1]]);
        let ttl = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let len = u16::from_be_bytes([h[8], h[9]]) as usize;
        let data = m.get(i + 10..i + 10 + len).context("truncated DNS data")?;
        let addr = match (rtype, len) {
            (A, 4) => Some(IpAddr::V4(Ipv4Addr::new(
                data[0], data[1], data[2], data[3],
            ))),
            (AAAA, 16) => {
                let o: [u8; 16] = data.try_into().expect("16 bytes");
                Some(IpAddr::V6(Ipv6Addr::from(o)))
            }
            _ => None,
        };
        if let Some(addr) = addr {
            out.push(Answer { addr, ttl });
        }
        i += 10 + len;
    }
    Ok(out)
}

fn query_id(salt: u16) -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(1);
    (std::process::id() as u16) ^ salt ^ NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One question over UDP from `netns` to `server`: the answer's addresses, or `None` when no
/// answer came within `timeout` (dropped, blocked).
pub fn ask(
    netns: &str,
    server: SocketAddr,
    name: &str,
    qtype: u16,
    timeout: Duration,
) -> Result<Option<Vec<Answer>>> {
    let name = name.to_string();
    in_netns(netns, move || -> Result<Option<Vec<Answer>>> {
        let any: IpAddr = if server.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let sock = UdpSocket::bind((any, 0))?;
        sock.set_read_timeout(Some(timeout))?;
        sock.connect(server)?;
        let id = query_id(0x4e41);
        sock.send(&query(id, &name, qtype)?)?;
        let mut buf = [0u8; 1500];
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        answers(&buf[..n], id).map(Some)
    })
}

/// [`ask`] over TCP (RFC 1035 §4.2.2: each message is prefixed with its 2-byte length).
pub fn ask_tcp(
    netns: &str,
    server: SocketAddr,
    name: &str,
    qtype: u16,
    timeout: Duration,
) -> Result<Option<Vec<Answer>>> {
    let name = name.to_string();
    in_netns(netns, move || -> Result<Option<Vec<Answer>>> {
        let Ok(mut s) = TcpStream::connect_timeout(&server, timeout) else {
            return Ok(None);
        };
        s.set_read_timeout(Some(timeout))?;
        let id = query_id(0x7443);
        let q = query(id, &name, qtype)?;
        s.write_all(&(q.len() as u16).to_be_bytes())?;
        s.write_all(&q)?;
        let mut len = [0u8; 2];
        if s.read_exact(&mut len).is_err() {
            return Ok(None);
        }
        let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
        if s.read_exact(&mut msg).is_err() {
            return Ok(None);
        }
        answers(&msg, id).map(Some)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_answer() {
        let q = query(7, "web.svc.cluster.test", A).unwrap();
        assert_eq!(&q[12..16], b"\x03web");
        let ip = IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10));
        let a = response(7, "web.svc.cluster.test", ip, 30).unwrap();
        assert_eq!(answers(&a, 7).unwrap(), vec![Answer { addr: ip, ttl: 30 }]);
        assert!(answers(&a, 8).is_err());
        assert!(query(1, "a..b", A).is_err());
        let ip6: IpAddr = "2001:db8::1".parse().unwrap();
        let a = response(9, "x.test", ip6, 2).unwrap();
        assert_eq!(answers(&a, 9).unwrap(), vec![Answer { addr: ip6, ttl: 2 }]);
    }

    #[test]
    fn cname_records_are_skipped() {
        // alias.test CNAME target.test (name compressed), then target.test A 192.0.2.7.
        let mut m = query(3, "alias.test", A).unwrap();
        m[2] = 0x81;
        m[7] = 2;
        let target_at = m.len() + 12;
        m.extend_from_slice(&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 9]);
        m.extend_from_slice(b"\x06target\xc0\x12");
        m.extend_from_slice(&[
            0xc0,
            target_at as u8,
            0,
            1,
            0,
            1,
            0,
            0,
            0,
            5,
            0,
            4,
            192,
            0,
            2,
            7,
        ]);
        assert_eq!(
            answers(&m, 3).unwrap(),
            vec![Answer {
                addr: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)),
                ttl: 5
            }]
        );
    }
}
