//! Free TCP ports for test servers.

use std::net::TcpListener;

/// A TCP port on 127.0.0.1 that was free a moment ago in the calling thread's network namespace (the
/// kernel picks it, so parallel tests do not collide). A fresh namespace has nothing listening, so a port
/// picked in the host namespace is free there too.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0 for a free port")
        .local_addr()
        .expect("local address of a bound socket")
        .port()
}
