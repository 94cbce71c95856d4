//! TCP probes between test namespaces: a server that answers `ok` to every connection, and a
//! client that reports whether a connection to it completes (a dropped SYN times out).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use felixrs_test_support::netns::Netns;

/// How long a probe waits for the handshake before calling the connection dropped.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long a connected probe waits for the answer (generous: only the passing path waits).
pub const ANSWER_TIMEOUT: Duration = Duration::from_millis(3000);

/// Listens on `addr:port` inside `ns` and answers every connection with `ok`, on a thread.
pub fn serve(ns: &Netns, addr: &str, port: u16) {
    let sock = SocketAddr::new(addr.parse().expect("server address"), port);
    let listener = ns.in_thread(move || TcpListener::bind(sock).expect("bind in netns"));
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let _ = conn.write_all(b"ok");
        }
    });
}

/// Whether a TCP connection from `ns` to `addr:port` completes and the server answers.
pub fn connects(ns: &Netns, addr: &str, port: u16) -> bool {
    let sock = SocketAddr::new(addr.parse().expect("server address"), port);
    ns.in_thread(
        move || match TcpStream::connect_timeout(&sock, PROBE_TIMEOUT) {
            Ok(mut s) => {
                s.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
                let mut buf = [0u8; 2];
                s.read_exact(&mut buf).is_ok() && &buf == b"ok"
            }
            Err(_) => false,
        },
    )
}

/// Like [`connects`], but retries a few times: for checks that expect the path to be open, so a lost
/// first SYN (a link still coming up, a loaded machine) is not mistaken for a drop. Checks that expect
/// a drop use a single [`connects`] attempt.
pub fn connects_eventually(ns: &Netns, addr: &str, port: u16) -> bool {
    (0..5).any(|_| connects(ns, addr, port))
}
