//! A TCP relay the test owns on the path between two network namespaces: it listens in one (where
//! the code under test runs) and connects to an upstream address in another (where etcd runs), so
//! the test can cut that path for real and heal it, without a rule in anyone's firewall.
//!
//! [`Mode::Forward`] copies bytes both ways. [`Mode::Blackhole`] is a partition: connections stay
//! open and new ones are still accepted, but no byte crosses in either direction (they wait in the
//! kernel's buffers, as TCP retransmissions would across a healed link) until the mode is
//! `Forward` again. [`Relay::reset`] closes every open connection (both ends), as a dying peer's
//! kernel would. [`Relay::bytes`] counts what crossed, to tell which upstream a client talks to.
//!
//! Invariants: every thread stops and every socket closes on drop; an upstream that refuses closes
//! the client's connection at once.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::netns::{enter, in_netns};

/// What the relay does with bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Blackhole,
}

const POLL: Duration = Duration::from_millis(10);

struct Shared {
    mode: AtomicU8,
    stop: AtomicBool,
    bytes: AtomicU64,
    /// Both ends of every open connection (clones), to close them on reset and drop.
    open: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn forwarding(&self) -> bool {
        self.mode.load(Ordering::SeqCst) == Mode::Forward as u8
    }
}

/// A relay from a listening address in one namespace to an upstream address in another.
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on a free port of `host` inside namespace `listen_ns`; each connection is relayed to
    /// `upstream` as reached from namespace `upstream_ns`. Starts forwarding.
    pub fn start(listen_ns: &str, host: IpAddr, upstream_ns: &str, upstream: SocketAddr) -> Relay {
        let listener = in_netns(listen_ns, move || {
            TcpListener::bind(SocketAddr::new(host, 0)).expect("bind relay listener")
        });
        Self::serve(listener, upstream_ns, upstream)
    }

    /// Like [`Relay::start`], listening in the test process's own namespace (the host's), e.g. for
    /// a browser the test runs there to reach a server inside a test namespace.
    pub fn start_here(host: IpAddr, upstream_ns: &str, upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind(SocketAddr::new(host, 0)).expect("bind relay listener");
        Self::serve(listener, upstream_ns, upstream)
    }

    fn serve(listener: TcpListener, upstream_ns: &str, upstream: SocketAddr) -> Relay {
        listener
            .set_nonblocking(true)
            .expect("nonblocking relay listener");
        let addr = listener.local_addr().expect("relay address");
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Forward as u8),
            stop: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
            open: Mutex::new(Vec::new()),
        });
        let (s, upstream_ns) = (shared.clone(), upstream_ns.to_string());
        let accept = std::thread::spawn(move || {
            while !s.stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (s, ns) = (s.clone(), upstream_ns.clone());
                        std::thread::spawn(move || connect(s, &ns, upstream, client));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
                    Err(_) => std::thread::sleep(POLL),
                }
            }
        });
        Relay {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// Where clients connect (in the listening namespace).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// Closes every open connection, both ends.
    pub fn reset(&self) {
        for s in self.shared.open.lock().expect("relay lock").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Bytes relayed so far, both directions.
    pub fn bytes(&self) -> u64 {
        self.shared.bytes.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.reset();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Connects `client` to `upstream` from namespace `ns` and pumps both ways.
fn connect(s: Arc<Shared>, ns: &str, upstream: SocketAddr, client: TcpStream) {
    let up = enter(ns).and_then(|()| TcpStream::connect_timeout(&upstream, Duration::from_secs(2)));
    let Ok(up) = up else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let pairs = (|| {
        client.set_nonblocking(false)?;
        let _ = client.set_nodelay(true);
        let _ = up.set_nodelay(true);
        let mut open = s.open.lock().expect("relay lock");
        open.push(client.try_clone()?);
        open.push(up.try_clone()?);
        Ok::<_, std::io::Error>((client.try_clone()?, up.try_clone()?))
    })();
    let Ok((client2, up2)) = pairs else {
        let _ = client.shutdown(Shutdown::Both);
        let _ = up.shutdown(Shutdown::Both);
        return;
    };
    let s2 = s.clone();
    let back = std::thread::spawn(move || pump(&s2, up2, client2));
    pump(&s, client, up);
    let _ = back.join();
}

/// Copies `from` to `to` while forwarding; holds still while blackholed; closes both on EOF or error.
fn pump(s: &Shared, mut from: TcpStream, mut to: TcpStream) {
    let _ = from.set_read_timeout(Some(POLL * 5));
    let mut buf = vec![0u8; 64 * 1024];
    while !s.stop.load(Ordering::SeqCst) {
        if !s.forwarding() {
            std::thread::sleep(POLL);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                s.bytes.fetch_add(n as u64, Ordering::SeqCst);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
