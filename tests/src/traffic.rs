//! Servers and probes inside pod namespaces, in-process: a thread enters the pod's namespace with
//! `setns(2)`, so no helper binaries (agnhost, socat) are needed.
//!
//! Every pod serves TCP and UDP on ports 80 and 81. A TCP probe succeeds when the connection is
//! established; a UDP probe succeeds when the server's echo comes back. Both need the forward path and
//! the reply path (conntrack) open, as for a real client.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::netns::enter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
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
        write!(f, "{}/{}", self.port, self.proto.as_str())
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
    /// Starts TCP and UDP servers on ports 80 and 81 inside the namespace at `/var/run/netns/<netns>`.
    pub fn start(netns: &str) -> Result<Servers> {
        let stop = Arc::new(AtomicBool::new(false));
        let path = format!("/var/run/netns/{netns}");
        // Bind on a thread inside the namespace; the sockets stay in it wherever they are used later.
        let (tcp, udp) = {
            let path = path.clone();
            std::thread::spawn(move || -> Result<(Vec<TcpListener>, Vec<UdpSocket>)> {
                enter(&path)?;
                let mut tcp = Vec::new();
                let mut udp = Vec::new();
                for port in [80u16, 81] {
                    let l = TcpListener::bind(("0.0.0.0", port))
                        .with_context(|| format!("binding tcp/{port} in {path}"))?;
                    l.set_nonblocking(true)?;
                    tcp.push(l);
                    let u = UdpSocket::bind(("0.0.0.0", port))
                        .with_context(|| format!("binding udp/{port} in {path}"))?;
                    u.set_read_timeout(Some(Duration::from_millis(100)))?;
                    udp.push(u);
                }
                Ok((tcp, udp))
            })
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
        Ok(Servers { stop, threads })
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One connection attempt from inside the namespace at `/var/run/netns/<netns>`.
pub fn probe_once(netns: &str, dst: Ipv4Addr, probe: Probe, timeout: Duration) -> Result<bool> {
    let path = format!("/var/run/netns/{netns}");
    std::thread::spawn(move || -> Result<bool> {
        enter(&path)?;
        Ok(connect(dst, probe, timeout))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("probe thread panicked"))?
}

/// Connects from the calling thread's namespace.
pub fn connect(dst: Ipv4Addr, probe: Probe, timeout: Duration) -> bool {
    let addr = SocketAddr::from((dst, probe.port));
    match probe.proto {
        Proto::Tcp => TcpStream::connect_timeout(&addr, timeout).is_ok(),
        Proto::Udp => {
            let Ok(sock) = UdpSocket::bind(("0.0.0.0", 0)) else {
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
    }
}

/// Probes many (source netns, destination, probe) triples concurrently, one thread each.
pub fn probe_many(jobs: &[(String, Ipv4Addr, Probe)], timeout: Duration) -> Result<Vec<bool>> {
    let handles: Vec<_> = jobs
        .iter()
        .cloned()
        .map(|(ns, dst, probe)| {
            std::thread::spawn(move || -> Result<bool> {
                enter(&format!("/var/run/netns/{ns}"))?;
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
