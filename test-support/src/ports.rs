//! Free TCP ports for test servers.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// First port handed out; the kernel's ephemeral range (`ip_local_port_range`) starts at 32768.
const FIRST: u32 = 20_000;
/// How many ports below the ephemeral range are handed out, round-robin.
const SPAN: u32 = 12_000;

/// A TCP port on 127.0.0.1 that is free now in the calling thread's network namespace (a fresh
/// namespace has nothing listening, so a port picked in the host namespace is free there too).
///
/// The port lies below the kernel's ephemeral range, so no outgoing connection can take it as its
/// local port between now and the server's bind (that race made etcd fail with "address already in
/// use"). Ports are handed out round-robin from a per-process offset, so parallel tests in one
/// process never get the same port and concurrent processes rarely do.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (offset + n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free TCP port in {FIRST}..{}", FIRST + SPAN);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        for p in ports {
            assert!((20_000..32_000).contains(&p), "{p}");
            TcpListener::bind(("127.0.0.1", p)).expect("still free");
        }
    }
}
