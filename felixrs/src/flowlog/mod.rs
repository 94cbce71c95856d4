//! Flow logs (issue 27): what is talking to what on this node, and which policy decided.
//!
//! * [`record`]: the one record type every producer and reader shares: the agent's collector
//!   writes it (JSON lines file, `/flows` stream), `felixrs preview --flows` replays it, and the
//!   web view reads it. Its JSON field names follow Calico's Goldmane/Whisker flows, so an
//!   operator who knows those reads these.
//! * [`hub`]: where the collector publishes records and their readers (the `/flows` stream, the
//!   web view) take them, bounded.
//! * [`http`]: `GET /flows`, JSON lines.
//! * [`pending`]: the seam to the staged-policy evaluator (what staged policies would decide).
//! * [`collector`]: kernel → NFLOG ([`nflog`]) and conntrack ([`conntrack`]) → aggregation per
//!   5-tuple → hub and rotated JSON lines file ([`file`]), names from [`names`]; the kernel's
//!   drops at its sockets from [`drops`].

pub mod collector;
pub mod conntrack;
pub mod drops;
pub mod file;
pub mod http;
pub mod hub;
pub mod names;
pub mod nflog;
pub mod pending;
pub mod record;

pub use hub::FlowHub;
pub use pending::{Connection, NoPending, PendingPolicies};
pub use record::{FlowAction, FlowEnd, FlowPolicies, FlowRecord, PolicyHit, Reporter};

/// Receive buffer of the flow-log netlink sockets: a burst of new connections (10k/s, two
/// NFLOG messages each, batched by the kernel for up to 50 ms) must not overflow it between two
/// drains of the collector thread on a loaded node.
pub const SOCKET_RCVBUF: usize = 32 << 20;

/// Sets a netlink socket's receive buffer to [`SOCKET_RCVBUF`]: `SO_RCVBUFFORCE` (the agent has
/// CAP_NET_ADMIN; `SO_RCVBUF` alone is capped by `net.core.rmem_max`, 208 KiB by default, and the
/// load bench lost 61% of NFLOG messages to that cap), else the capped `SO_RCVBUF`.
pub fn size_receive_buffer(socket: &netlink_sys::Socket) {
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(socket, SOCKET_RCVBUF).is_err() {
        let _ = socket.set_rx_buf_sz(SOCKET_RCVBUF);
    }
}

/// Keeps a netlink socket receiving after its buffer overflowed once (`NETLINK_NO_ENOBUFS`).
/// Without it the kernel marks the socket congested at the first overrun and drops *every*
/// message until the reader has emptied the whole queue (`netlink_overrun`, `netlink_rcv_wake`):
/// with a 32 MiB queue that is hundreds of milliseconds of events lost per burst (the load bench
/// lost 29% of conntrack ends so). With it only what does not fit is dropped, and the kernel
/// still counts each drop, which [`drops`] reads.
pub fn tolerate_overruns(socket: &netlink_sys::Socket) {
    if let Err(e) = socket.set_no_enobufs(true) {
        tracing::debug!("flow logs: NETLINK_NO_ENOBUFS not set: {e}");
    }
}
