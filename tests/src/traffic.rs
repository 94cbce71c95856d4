//! Servers and probes inside pod namespaces, in-process: a thread enters the pod's namespace with
//! `setns(2)`, so no helper binaries (agnhost, socat) are needed.
//!
//! Every pod serves TCP and UDP on ports 80 and 81, over IPv4 and IPv6 (separate v6-only sockets: the
//! cluster sets `net.ipv6.bindv6only` in pod namespaces). A TCP probe succeeds when the connection is
//! established; a UDP probe succeeds when the server's echo comes back; an ICMP probe is an echo
//! request (ICMPv6 echo for an IPv6 destination); an IP probe is one datagram of a bare IP protocol
//! ([`RAW_PROTO`], which no kernel module handles) that the pod's raw-socket server echoes back. All
//! need the forward path and the reply path (conntrack) open, as for a real client. The destination
//! address picks the family.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use felixrs_test_support::netns::enter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
    /// ICMP echo, or ICMPv6 echo to an IPv6 address: the kernel answers, no server needed. The
    /// probe's `port` is the echo request's ICMP code (0 for a normal ping; the kernel answers any).
    Icmp,
    /// One datagram of the bare IP protocol numbered by the probe's `port` (one of [`RAW_PROTOS`]),
    /// echoed back by the pod's raw-socket server. Conntrack tracks such a protocol by
    /// addresses alone: see [`Probe::is_raw`].
    Ip,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
            Proto::Icmp => "ICMP",
            Proto::Ip => "IP",
        }
    }
}

/// A (port, protocol) that cases probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Probe {
    pub port: u16,
    pub proto: Proto,
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.proto {
            Proto::Icmp if self.port == 0 => f.write_str("ICMP-echo"),
            Proto::Icmp => write!(f, "ICMP-echo-code-{}", self.port),
            Proto::Ip => write!(f, "IP-protocol-{}", self.port),
            _ => write!(f, "{}/{}", self.port, self.proto.as_str()),
        }
    }
}

/// The bare IP protocol every pod serves (RFC 3692's "use for experimentation and testing"): no
/// kernel module claims it, so only policy decides whether it passes.
pub const RAW_PROTO: u8 = 253;

/// Every bare IP protocol the pods serve: [`RAW_PROTO`] and 99 ("any private encryption scheme",
/// which has no name in /etc/protocols either).
pub const RAW_PROTOS: [u8; 2] = [RAW_PROTO, 99];

impl Probe {
    /// Whether this probe's flows are tracked by addresses and protocol only (conntrack's generic
    /// tracker): a flow one probe opens makes the reverse probe between the same pods a reply
    /// (`ESTABLISHED`), so such probes must not run in both directions at once, and their flows
    /// must be deleted between steps.
    pub fn is_raw(&self) -> bool {
        self.proto == Proto::Ip
    }
}

pub const SERVED: [Probe; 4] = [
    Probe {
        port: 80,
        proto: Proto::Tcp,
    },
    Probe {
        port: 81,
        proto: Proto::Tcp,
    },
    Probe {
        port: 80,
        proto: Proto::Udp,
    },
    Probe {
        port: 81,
        proto: Proto::Udp,
    },
];

/// The servers of one pod; stopped and joined on drop.
pub struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    /// Starts TCP and UDP servers on ports 80 and 81, IPv4 and IPv6, inside network namespace `netns`.
    pub fn start(netns: &str) -> Result<Servers> {
        let stop = Arc::new(AtomicBool::new(false));
        // Bind on a thread inside the namespace; the sockets stay in it wherever they are used later.
        let (tcp, udp, raw) = {
            let ns = netns.to_string();
            std::thread::spawn(
                move || -> Result<(Vec<TcpListener>, Vec<UdpSocket>, Vec<RawSocket>)> {
                    enter(&ns)?;
                    let mut tcp = Vec::new();
                    let mut udp = Vec::new();
                    let any = [
                        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                    ];
                    for (ip, port) in any.into_iter().flat_map(|ip| [(ip, 80u16), (ip, 81)]) {
                        let l = TcpListener::bind((ip, port))
                            .with_context(|| format!("binding tcp [{ip}]:{port} in netns {ns}"))?;
                        l.set_nonblocking(true)?;
                        tcp.push(l);
                        let u = UdpSocket::bind((ip, port))
                            .with_context(|| format!("binding udp [{ip}]:{port} in netns {ns}"))?;
                        u.set_read_timeout(Some(Duration::from_millis(100)))?;
                        udp.push(u);
                    }
                    let raw = [libc::AF_INET, libc::AF_INET6]
                        .into_iter()
                        .flat_map(|af| RAW_PROTOS.map(|p| (af, p)))
                        .map(|(af, proto)| {
                            let s = RawSocket::open(af, proto).with_context(|| {
                                format!("raw socket for protocol {proto} in netns {ns}")
                            })?;
                            s.set_timeout(Duration::from_millis(100));
                            Ok(s)
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok((tcp, udp, raw))
                },
            )
            .join()
            .map_err(|_| anyhow::anyhow!("server setup thread panicked"))??
        };
        let mut threads = Vec::new();
        for l in tcp {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((s, _)) => drop(s),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            }));
        }
        for u in udp {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = u.recv_from(&mut buf) {
                        let _ = u.send_to(&buf[..n], from);
                    }
                }
            }));
        }
        for r in raw {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some((from, payload)) = r.recv() {
                        // Echo requests only: the replies this pod's own probes receive reach this
                        // socket too, and echoing those would ping-pong.
                        if let Some(nonce) = payload.strip_prefix(RAW_REQUEST) {
                            let mut reply = RAW_REPLY.to_vec();
                            reply.extend_from_slice(nonce);
                            r.send(from, &reply);
                        }
                    }
                }
            }));
        }
        Ok(Servers { stop, threads })
    }
}

const RAW_REQUEST: &[u8] = b"felixrs-raw-req:";
const RAW_REPLY: &[u8] = b"felixrs-raw-rep:";

/// A raw IP socket of one protocol (root), closed on drop.
struct RawSocket {
    fd: i32,
    af: i32,
}

impl RawSocket {
    fn open(af: i32, proto: u8) -> std::io::Result<RawSocket> {
        // SAFETY: a plain socket(2) call; the descriptor is owned by the returned value.
        let fd = unsafe { libc::socket(af, libc::SOCK_RAW, i32::from(proto)) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(RawSocket { fd, af })
    }

    fn set_timeout(&self, t: Duration) {
        // SAFETY: `fd` is open for the lifetime of `self`.
        unsafe { rcvtimeo_until(self.fd, std::time::Instant::now() + t) };
    }

    /// Sends `payload` as one datagram of the socket's protocol to `dst` (the kernel adds the IP
    /// header).
    fn send(&self, dst: IpAddr, payload: &[u8]) -> bool {
        // SAFETY: all-zero is a valid sockaddr_storage; the buffers outlive the call.
        unsafe {
            let mut ss: libc::sockaddr_storage = std::mem::zeroed();
            let len = match dst {
                IpAddr::V4(a) => {
                    let sa = (&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                    (*sa).sin_family = libc::AF_INET as libc::sa_family_t;
                    (*sa).sin_addr.s_addr = u32::from_ne_bytes(a.octets());
                    std::mem::size_of::<libc::sockaddr_in>()
                }
                IpAddr::V6(a) => {
                    let sa = (&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                    (*sa).sin6_family = libc::AF_INET6 as libc::sa_family_t;
                    (*sa).sin6_addr.s6_addr = a.octets();
                    std::mem::size_of::<libc::sockaddr_in6>()
                }
            };
            libc::sendto(
                self.fd,
                payload.as_ptr().cast(),
                payload.len(),
                0,
                (&ss as *const libc::sockaddr_storage).cast(),
                len as libc::socklen_t,
            ) >= 0
        }
    }

    /// One datagram: its source and its payload (an IPv4 raw socket's IP header stripped), or
    /// `None` on timeout or error.
    fn recv(&self) -> Option<(IpAddr, Vec<u8>)> {
        let mut buf = [0u8; 512];
        // SAFETY: all-zero is a valid sockaddr_storage; the buffers outlive the call.
        unsafe {
            let mut ss: libc::sockaddr_storage = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            let n = libc::recvfrom(
                self.fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                &mut len,
            );
            if n < 0 {
                return None;
            }
            let n = n as usize;
            if self.af == libc::AF_INET {
                let sa = &*(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                let from = Ipv4Addr::from(sa.sin_addr.s_addr.to_ne_bytes());
                let ihl = usize::from(buf[0] & 0x0f) * 4;
                (n >= ihl).then(|| (IpAddr::V4(from), buf[ihl..n].to_vec()))
            } else {
                let sa = &*(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                let from = Ipv6Addr::from(sa.sin6_addr.s6_addr);
                Some((IpAddr::V6(from), buf[..n].to_vec()))
            }
        }
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        // SAFETY: `fd` is open and owned by `self`.
        unsafe { libc::close(self.fd) };
    }
}

/// One datagram of protocol `proto` to `dst`; true when the server's echo of it comes back in time.
fn raw_echo(dst: IpAddr, proto: u8, timeout: Duration) -> bool {
    let af = if dst.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    let Ok(sock) = RawSocket::open(af, proto) else {
        return false;
    };
    let (id, seq) = echo_id_seq();
    let mut nonce = id.to_be_bytes().to_vec();
    nonce.extend_from_slice(&seq.to_be_bytes());
    let mut req = RAW_REQUEST.to_vec();
    req.extend_from_slice(&nonce);
    if !sock.send(dst, &req) {
        return false;
    }
    let deadline = std::time::Instant::now() + timeout;
    // SAFETY: `sock.fd` is open for the lifetime of `sock`.
    while unsafe { rcvtimeo_until(sock.fd, deadline) } {
        if let Some((from, payload)) = sock.recv()
            && from == dst
            && payload.strip_prefix(RAW_REPLY) == Some(&nonce[..])
        {
            return true;
        }
    }
    false
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One connection attempt from inside network namespace `netns`.
pub fn probe_once(netns: &str, dst: IpAddr, probe: Probe, timeout: Duration) -> Result<bool> {
    let netns = netns.to_string();
    std::thread::spawn(move || -> Result<bool> {
        enter(&netns)?;
        Ok(connect(dst, probe, timeout))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("probe thread panicked"))?
}

/// Runs `during` while four probers in pod namespace `from` connect to `to` port 80 (TCP) back to
/// back (a denied attempt costs its 150 ms timeout: ~25 attempts a second); returns what `during`
/// returned, then the attempts and the connections that succeeded.
pub fn probe_while<T>(
    from: &str,
    to: IpAddr,
    during: impl FnOnce() -> T,
) -> anyhow::Result<(T, u32, u32)> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let probers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, from) = (stop.clone(), from.to_string());
            std::thread::spawn(move || -> anyhow::Result<(u32, u32)> {
                felixrs_test_support::netns::enter(&from)?;
                let (mut attempts, mut successes) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    attempts += 1;
                    if connect(to, crate::cases::T80, Duration::from_millis(150)) {
                        successes += 1;
                    }
                }
                Ok((attempts, successes))
            })
        })
        .collect();
    let out = during();
    stop.store(true, Ordering::Relaxed);
    let (mut attempts, mut successes) = (0, 0);
    for p in probers {
        let (a, s) = p.join().map_err(|_| anyhow::anyhow!("prober panicked"))??;
        attempts += a;
        successes += s;
    }
    Ok((out, attempts, successes))
}

/// Connects from the calling thread's namespace.
pub fn connect(dst: impl Into<IpAddr>, probe: Probe, timeout: Duration) -> bool {
    let dst = dst.into();
    let addr = SocketAddr::from((dst, probe.port));
    match probe.proto {
        Proto::Tcp => TcpStream::connect_timeout(&addr, timeout).is_ok(),
        Proto::Udp => {
            let local: IpAddr = match dst {
                IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
                IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
            };
            let Ok(sock) = UdpSocket::bind((local, 0)) else {
                return false;
            };
            if sock.set_read_timeout(Some(timeout)).is_err() || sock.connect(addr).is_err() {
                return false;
            }
            let msg = b"felixrs-probe";
            if sock.send(msg).is_err() {
                return false;
            }
            let mut buf = [0u8; 64];
            matches!(sock.recv(&mut buf), Ok(n) if &buf[..n] == msg)
        }
        Proto::Icmp => {
            let Ok(code) = u8::try_from(probe.port) else {
                return false;
            };
            match dst {
                IpAddr::V4(dst) => ping(dst, code, timeout),
                IpAddr::V6(dst) => ping6(dst, code, timeout),
            }
        }
        Proto::Ip => match u8::try_from(probe.port) {
            Ok(proto) => raw_echo(dst, proto, timeout),
            Err(_) => false,
        },
    }
}

/// The identifier and sequence number of the next echo request. The identifier differs per probe:
/// conntrack keys echo flows by identifier (not sequence), so a fixed one would make a probe ride on
/// the flow an earlier probe opened under an earlier step's policy and pass as ESTABLISHED.
fn echo_id_seq() -> (u16, u16) {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let id =
        ((std::process::id() as u16) ^ 0x5a5a).wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
    let seq = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        & 0xffff) as u16;
    (id, seq)
}

/// Sets the receive timeout of `fd` to what is left until `deadline`; false when nothing is left.
///
/// # Safety
/// `fd` must be an open socket.
unsafe fn rcvtimeo_until(fd: i32, deadline: std::time::Instant) -> bool {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return false;
    }
    let tv = libc::timeval {
        tv_sec: left.as_secs() as libc::time_t,
        tv_usec: left.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: the caller passes an open socket; `tv` outlives the call.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
    true
}

/// One ICMPv6 echo request over a raw socket (root); true when the matching reply from `dst` arrives
/// in time. The kernel fills in the ICMPv6 checksum (it covers a pseudo-header) and delivers replies
/// without the IPv6 header.
fn ping6(dst: Ipv6Addr, code: u8, timeout: Duration) -> bool {
    // SAFETY: plain socket syscalls on a descriptor this function owns and closes.
    unsafe {
        let fd = libc::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6);
        if fd < 0 {
            return false;
        }
        let ok = ping6_on(fd, dst, code, timeout);
        libc::close(fd);
        ok
    }
}

unsafe fn ping6_on(fd: i32, dst: Ipv6Addr, code: u8, timeout: Duration) -> bool {
    let (id, seq) = echo_id_seq();
    let mut pkt = [0u8; 16];
    pkt[0] = 128; // echo request
    pkt[1] = code;
    pkt[4..6].copy_from_slice(&id.to_be_bytes());
    pkt[6..8].copy_from_slice(&seq.to_be_bytes());
    pkt[8..16].copy_from_slice(b"felixrs!");
    // SAFETY: all-zero is a valid sockaddr_in6.
    let mut addr: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    addr.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    addr.sin6_addr.s6_addr = dst.octets();
    // SAFETY: the caller passes an open raw socket; buffers outlive the calls.
    unsafe {
        let sent = libc::sendto(
            fd,
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&addr as *const libc::sockaddr_in6).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        );
        if sent < 0 {
            return false;
        }
        let deadline = std::time::Instant::now() + timeout;
        let mut buf = [0u8; 256];
        while rcvtimeo_until(fd, deadline) {
            let mut from: libc::sockaddr_in6 = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            let n = libc::recvfrom(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut from as *mut libc::sockaddr_in6).cast(),
                &mut len,
            );
            if n < 0 {
                return false;
            }
            let n = n as usize;
            if n >= 8
                && from.sin6_addr.s6_addr == dst.octets()
                && buf[0] == 129 // echo reply
                && buf[4..6] == id.to_be_bytes()
                && buf[6..8] == seq.to_be_bytes()
            {
                return true;
            }
        }
        false
    }
}

/// One ICMP echo request over a raw socket (root); true when the matching reply arrives in time.
fn ping(dst: Ipv4Addr, code: u8, timeout: Duration) -> bool {
    // SAFETY: plain socket syscalls on a descriptor this function owns and closes.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP);
        if fd < 0 {
            return false;
        }
        let ok = ping_on(fd, dst, code, timeout);
        libc::close(fd);
        ok
    }
}

unsafe fn ping_on(fd: i32, dst: Ipv4Addr, code: u8, timeout: Duration) -> bool {
    let (id, seq) = echo_id_seq();
    let mut pkt = [0u8; 16];
    pkt[0] = 8; // echo request
    pkt[1] = code;
    pkt[4..6].copy_from_slice(&id.to_be_bytes());
    pkt[6..8].copy_from_slice(&seq.to_be_bytes());
    pkt[8..16].copy_from_slice(b"felixrs!");
    let sum = checksum(&pkt);
    pkt[2..4].copy_from_slice(&sum.to_be_bytes());
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(dst.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: the caller passes an open raw socket; buffers outlive the calls.
    unsafe {
        let sent = libc::sendto(
            fd,
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        if sent < 0 {
            return false;
        }
        let deadline = std::time::Instant::now() + timeout;
        let mut buf = [0u8; 256];
        while rcvtimeo_until(fd, deadline) {
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            if n < 0 {
                return false;
            }
            let n = n as usize;
            // Raw ICMP sockets deliver the IP header first.
            let ihl = usize::from(buf[0] & 0x0f) * 4;
            if n >= ihl + 8
                && buf[12..16] == dst.octets()
                && buf[ihl] == 0
                && buf[ihl + 4..ihl + 6] == id.to_be_bytes()
                && buf[ihl + 6..ihl + 8] == seq.to_be_bytes()
            {
                return true;
            }
        }
        false
    }
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Probes many (source netns, destination, probe) triples concurrently, one thread each.
pub fn probe_many(jobs: &[(String, IpAddr, Probe)], timeout: Duration) -> Result<Vec<bool>> {
    let handles: Vec<_> = jobs
        .iter()
        .cloned()
        .map(|(ns, dst, probe)| {
            std::thread::spawn(move || -> Result<bool> {
                enter(&ns)?;
                Ok(connect(dst, probe, timeout))
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("probe thread panicked"))?
        })
        .collect()
}
