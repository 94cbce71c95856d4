//! Adding learned addresses to the kernel's domain sets: `add <set> <addr> timeout <secs> -exist`.
//!
//! Two writers behind one trait:
//! * [`NetlinkSetWriter`] (the agent's): the ipset netlink protocol spoken directly on a
//!   `NETLINK_NETFILTER` socket (netlink-sys, already ours for `felixrs flows`): one `IPSET_CMD_ADD`
//!   message per member, a batch in one `send`, one ack per message, so each member's outcome is
//!   known. No process is started, which is what keeps a held DNS response's added latency in the
//!   tens of microseconds (BENCHMARKS.md: against `ipset restore`, which forks and execs).
//! * [`RestoreSetWriter`]: `ipset restore -exist` of the same lines, one process per batch: the
//!   fallback where the netlink socket cannot be opened, and the benchmark's reference.
//!
//! A member of a set that no longer exists is not an error: the set is gone because no rule
//! references it any more (sets are destroyed after their last rule), so nothing needs the
//! address there. Set names are the renderer's (`cali40d:…`, ≤ 31 bytes); anything else is
//! refused before it reaches the kernel.

use std::io::{self, Write};
use std::net::IpAddr;
use std::process::{Command, Stdio};

use netlink_sys::{Socket, constants::NETLINK_NETFILTER};

/// One member to add.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetAdd {
    pub set: String,
    pub addr: IpAddr,
    pub timeout_secs: u32,
}

/// Why a member could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ipset add {set} {addr}: {reason}")]
pub struct WriteError {
    pub set: String,
    pub addr: IpAddr,
    pub reason: String,
}

/// Adds members to kernel sets; one result per member, in order.
pub trait SetWriter: Send {
    fn add(&mut self, adds: &[SetAdd]) -> Vec<Result<(), WriteError>>;
}

/// The kernel's largest ipset timeout (`IPSET_MAX_TIMEOUT`, seconds); 0 would mean "forever".
pub const MAX_TIMEOUT: u32 = 2_147_483;

fn valid_set_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() < 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'-' | b'_' | b'.'))
}

fn err(a: &SetAdd, reason: impl Into<String>) -> WriteError {
    WriteError {
        set: a.set.clone(),
        addr: a.addr,
        reason: reason.into(),
    }
}

// Netlink and ipset protocol numbers (linux/netlink.h, linux/netfilter/nfnetlink.h,
// linux/netfilter/ipset/ip_set.h).
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NFNL_SUBSYS_IPSET: u16 = 6;
const IPSET_CMD_ADD: u16 = 9;
const IPSET_PROTOCOL: u8 = 7;
const IPSET_ATTR_PROTOCOL: u16 = 1;
const IPSET_ATTR_SETNAME: u16 = 2;
const IPSET_ATTR_DATA: u16 = 7;
const IPSET_ATTR_IP: u16 = 1;
const IPSET_ATTR_TIMEOUT: u16 = 6;
const IPSET_ATTR_IPADDR_IPV4: u16 = 1;
const IPSET_ATTR_IPADDR_IPV6: u16 = 2;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
const AF_INET: u8 = 2;
/// The kernel's "set does not exist" (`ENOENT`).
const ENOENT: i32 = 2;
/// Messages per `send` (each ~76 bytes: far below the socket buffer).
const CHUNK: usize = 512;

fn put_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// Opens a nested attribute; returns where its length goes.
fn begin_nested(buf: &mut Vec<u8>, kind: u16) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    at
}

fn end_nested(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at) as u16;
    buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
}

/// Appends one `IPSET_CMD_ADD` request (without `NLM_F_EXCL`: `-exist` semantics, the timeout of
/// an existing member is replaced).
pub fn encode_add(buf: &mut Vec<u8>, seq: u32, add: &SetAdd) {
    let start = buf.len();
    // nlmsghdr: len (patched), type, flags, seq, pid.
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&((NFNL_SUBSYS_IPSET << 8) | IPSET_CMD_ADD).to_ne_bytes());
    buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family, version, res_id (big endian).
    buf.extend_from_slice(&[AF_INET, 0, 0, 0]);
    put_attr(buf, IPSET_ATTR_PROTOCOL, &[IPSET_PROTOCOL]);
    let mut name = add.set.as_bytes().to_vec();
    name.push(0);
    put_attr(buf, IPSET_ATTR_SETNAME, &name);
    let data = begin_nested(buf, IPSET_ATTR_DATA);
    let ip = begin_nested(buf, IPSET_ATTR_IP);
    match add.addr {
        IpAddr::V4(a) => put_attr(
            buf,
            IPSET_ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER,
            &a.octets(),
        ),
        IpAddr::V6(a) => put_attr(
            buf,
            IPSET_ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER,
            &a.octets(),
        ),
    }
    end_nested(buf, ip);
    put_attr(
        buf,
        IPSET_ATTR_TIMEOUT | NLA_F_NET_BYTEORDER,
        &add.timeout_secs.clamp(1, MAX_TIMEOUT).to_be_bytes(),
    );
    end_nested(buf, data);
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// The acks in a netlink receive buffer: (seq, errno) per `NLMSG_ERROR` message.
pub fn decode_acks(mut buf: &[u8]) -> Vec<(u32, i32)> {
    let mut out = Vec::new();
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        if len < 16 || len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes(buf[4..6].try_into().expect("2 bytes"));
        let seq = u32::from_ne_bytes(buf[8..12].try_into().expect("4 bytes"));
        if kind == NLMSG_ERROR && len >= 20 {
            let errno = i32::from_ne_bytes(buf[16..20].try_into().expect("4 bytes"));
            out.push((seq, -errno));
        }
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    out
}

/// The ipset netlink writer (see the module docs). The socket lives in the network namespace of
/// the thread that opened it.
pub struct NetlinkSetWriter {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl NetlinkSetWriter {
    pub fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        // Acks without a copy of the request.
        socket.set_cap_ack(true)?;
        Ok(NetlinkSetWriter {
            socket,
            seq: 1,
            buf: Vec::new(),
        })
    }

    fn add_chunk(&mut self, adds: &[SetAdd], out: &mut Vec<Result<(), WriteError>>) {
        let base = self.seq;
        self.seq = self.seq.wrapping_add(adds.len() as u32 + 1);
        self.buf.clear();
        for (i, a) in adds.iter().enumerate() {
            encode_add(&mut self.buf, base.wrapping_add(i as u32), a);
        }
        if let Err(e) = self.socket.send(&self.buf, 0) {
            out.extend(
                adds.iter()
                    .map(|a| Err(err(a, format!("netlink send: {e}")))),
            );
            return;
        }
        let mut results: Vec<Option<i32>> = vec![None; adds.len()];
        let mut missing = adds.len();
        let mut rx = vec![0u8; 64 * 1024];
        while missing > 0 {
            let n = match self.socket.recv(&mut &mut rx[..], 0) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    for (r, a) in results.iter().zip(adds) {
                        if r.is_none() {
                            out.push(Err(err(a, format!("netlink recv: {e}"))));
                        }
                    }
                    return;
                }
            };
            for (seq, errno) in decode_acks(&rx[..n]) {
                let i = seq.wrapping_sub(base) as usize;
                if let Some(slot @ None) = results.get_mut(i) {
                    *slot = Some(errno);
                    missing -= 1;
                }
            }
        }
        out.extend(results.into_iter().zip(adds).map(|(r, a)| match r {
            Some(0) | Some(ENOENT) => Ok(()),
            Some(errno) => Err(err(a, io::Error::from_raw_os_error(errno).to_string())),
            None => unreachable!("every ack was received"),
        }));
    }
}

impl SetWriter for NetlinkSetWriter {
    fn add(&mut self, adds: &[SetAdd]) -> Vec<Result<(), WriteError>> {
        let valid: Vec<SetAdd> = adds
            .iter()
            .filter(|a| valid_set_name(&a.set))
            .cloned()
            .collect();
        let mut results = Vec::with_capacity(valid.len());
        for chunk in valid.chunks(CHUNK) {
            self.add_chunk(chunk, &mut results);
        }
        // One result per valid member, in order: hand them back in the places of `adds`.
        let mut results = results.into_iter();
        adds.iter()
            .map(|a| {
                if valid_set_name(&a.set) {
                    results.next().expect("one result per valid member")
                } else {
                    Err(err(a, "invalid set name"))
                }
            })
            .collect()
    }
}

/// `ipset restore -exist` per batch (see the module docs).
#[derive(Debug, Clone)]
pub struct RestoreSetWriter {
    pub program: String,
}

impl Default for RestoreSetWriter {
    fn default() -> Self {
        RestoreSetWriter {
            program: "ipset".into(),
        }
    }
}

impl SetWriter for RestoreSetWriter {
    fn add(&mut self, adds: &[SetAdd]) -> Vec<Result<(), WriteError>> {
        let mut script = String::new();
        for a in adds.iter().filter(|a| valid_set_name(&a.set)) {
            script.push_str(&format!(
                "add {} {} timeout {}\n",
                a.set,
                a.addr,
                a.timeout_secs.clamp(1, MAX_TIMEOUT)
            ));
        }
        let run = || -> io::Result<std::process::Output> {
            let mut child = Command::new(&self.program)
                .args(["restore", "-exist"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()?;
            child
                .stdin
                .take()
                .expect("piped")
                .write_all(script.as_bytes())?;
            child.wait_with_output()
        };
        let outcome = if script.is_empty() {
            Ok(())
        } else {
            match run() {
                Ok(o) if o.status.success() => Ok(()),
                Ok(o) => Err(format!(
                    "ipset restore: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => Err(format!("ipset restore: {e}")),
            }
        };
        adds.iter()
            .map(|a| {
                if !valid_set_name(&a.set) {
                    Err(err(a, "invalid set name"))
                } else {
                    outcome.clone().map_err(|r| err(a, r))
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_add_request_is_laid_out_as_the_kernel_expects() {
        let mut buf = Vec::new();
        let add = SetAdd {
            set: "cali40d:abc".into(),
            addr: "192.0.2.1".parse().unwrap(),
            timeout_secs: 60,
        };
        encode_add(&mut buf, 7, &add);
        assert_eq!(buf.len() % 4, 0);
        assert_eq!(
            u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize,
            buf.len()
        );
        assert_eq!(u16::from_ne_bytes(buf[4..6].try_into().unwrap()), 0x0609);
        assert_eq!(u32::from_ne_bytes(buf[8..12].try_into().unwrap()), 7);
        // The address and the timeout, big endian, are in there.
        assert!(buf.windows(4).any(|w| w == [192, 0, 2, 1]));
        assert!(buf.windows(4).any(|w| w == 60u32.to_be_bytes()));
        assert!(buf.windows(12).any(|w| w == b"cali40d:abc\0"));
    }

    #[test]
    fn acks_are_decoded_and_garbage_stops_the_scan() {
        let mut buf = Vec::new();
        for (seq, errno) in [(1u32, 0i32), (2, -17)] {
            buf.extend_from_slice(&36u32.to_ne_bytes());
            buf.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
            buf.extend_from_slice(&0u16.to_ne_bytes());
            buf.extend_from_slice(&seq.to_ne_bytes());
            buf.extend_from_slice(&0u32.to_ne_bytes());
            buf.extend_from_slice(&errno.to_ne_bytes());
            buf.extend_from_slice(&[0; 16]);
        }
        assert_eq!(decode_acks(&buf), vec![(1, 0), (2, 17)]);
        assert_eq!(decode_acks(&buf[..20]), vec![]);
        let mut bad = buf.clone();
        bad[0] = 3;
        assert_eq!(decode_acks(&bad), vec![]);
    }

    #[test]
    fn set_names_are_checked() {
        assert!(valid_set_name("cali40d:0123456789abcdef0123456"));
        assert!(!valid_set_name(""));
        assert!(!valid_set_name("a b"));
        assert!(!valid_set_name(&"x".repeat(32)));
        let mut w = RestoreSetWriter {
            program: "/nonexistent/ipset".into(),
        };
        let r = w.add(&[SetAdd {
            set: "bad name".into(),
            addr: "192.0.2.1".parse().unwrap(),
            timeout_secs: 1,
        }]);
        assert_eq!(r[0].as_ref().unwrap_err().reason, "invalid set name");
    }
}
