//! Deleting the conntrack flows of addresses that left local endpoints (Felix's
//! `RemoveConntrackFlows`), in the agent's own process over ctnetlink, off the apply path.
//!
//! Why: every endpoint chain starts with `--ctstate RELATED,ESTABLISHED -j ACCEPT`, so a flow of
//! a removed pod's address would let the next pod to get that address inherit it
//! (`iptables::apply::conntrack` says more). The agent used to run `conntrack` twice per removed
//! address, serially in the apply, each run a process that dumps the whole table: 15.4 ms a run,
//! 136 ms of every apply under a churn of 20 pods/s (BENCHMARKS.md "Issue 26: pod churn on a
//! node"). Here one dump serves every address an apply removed, and the matching flows are
//! deleted by their original tuple (and zone), as the tool deletes them, in batches of
//! acknowledged requests. A dump walks the kernel's whole conntrack hash (all namespaces' buckets,
//! ~10 ms at 262,144 buckets whatever this namespace holds), so it runs on a worker thread
//! ([`Cleaner`]), as Felix's route table cleans conntrack in the background.
//!
//! Invariants:
//! * A flow is a removed address's when its original source (the endpoint started it) or its
//!   reply source (the endpoint answered it; NAT included) is that address.
//! * The deletion starts after the program that removed the address's rules, and an apply that
//!   gives an address to an endpoint waits first for a deletion still running for it
//!   ([`Cleaner::wait_for`], Felix's `WaitForPendingDeletion`): a reused address never inherits
//!   the flows of the endpoint that had it.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::thread::JoinHandle;

use iptables::apply::{Runner, conntrack};
use prometheus_client::metrics::counter::Counter;

use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NLMSG_ERROR, NetlinkMessage, Nla};
use netlink_packet_netfilter::conntrack::{ConntrackAttribute, ConntrackMessage, Tuple};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
use netlink_sys::Socket;

use crate::flowlog::conntrack::{
    NLA_TYPE_MASK, control_messages, dump_each, open_dump, tuple as tuple5,
};

/// `CTA_ZONE`: a flow is deleted in the zone it lives in.
const CTA_ZONE: u16 = 18;
/// Delete requests per datagram: their acknowledgements (one small message each) stay far
/// below the socket's default receive buffer.
const BATCH: usize = 64;

/// What one removal did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// Flows the kernel deleted.
    pub deleted: u64,
    /// Flows whose delete request failed (other than "already gone").
    pub failed: u64,
}

/// A flow to delete: its family and what identifies it.
#[derive(Debug, Clone, PartialEq)]
struct Victim {
    family: NetfilterProtoFamily,
    attrs: Vec<ConntrackAttribute>,
}

/// Deletes every flow in this network namespace whose original or reply source is one of
/// `addrs`: one table dump, then the deletes. An error means the table could not be read (the
/// caller falls back to the `conntrack` tool); failed deletes are counted in [`Removed`].
pub fn remove(addrs: &BTreeSet<IpAddr>) -> std::io::Result<Removed> {
    if addrs.is_empty() {
        return Ok(Removed::default());
    }
    let socket = open_dump()?;
    let mut victims = Vec::new();
    dump_each(&socket, |family, attrs| {
        victims.extend(victim(family, attrs, addrs));
    })?;
    let mut removed = Removed::default();
    for batch in victims.chunks(BATCH) {
        delete(&socket, batch, &mut removed)?;
    }
    Ok(removed)
}

/// Deletes the flows of removed addresses on a worker thread, one deletion at a time; counts
/// what it deleted and what failed in the agent's metrics.
pub struct Cleaner<R> {
    runner: R,
    deleted: Counter,
    errors: Counter,
    /// The addresses of the deletion running on `worker`.
    running: BTreeSet<IpAddr>,
    worker: Option<JoinHandle<()>>,
}

impl<R: Runner + Clone + 'static> Cleaner<R> {
    /// Counts into unregistered counters until [`Self::with_metrics`].
    pub fn new(runner: R) -> Self {
        Cleaner {
            runner,
            deleted: Counter::default(),
            errors: Counter::default(),
            running: BTreeSet::new(),
            worker: None,
        }
    }

    /// `felixrs_conntrack_flows_deleted_total` and `felixrs_conntrack_errors_total`.
    pub fn with_metrics(mut self, deleted: Counter, errors: Counter) -> Self {
        self.deleted = deleted;
        self.errors = errors;
        self
    }

    /// Starts deleting the flows of `addrs` (after the running deletion, if any, is done).
    pub fn start(&mut self, addrs: BTreeSet<IpAddr>) {
        if addrs.is_empty() {
            return;
        }
        self.wait();
        let (runner, deleted, errors) = (
            self.runner.clone(),
            self.deleted.clone(),
            self.errors.clone(),
        );
        let work = addrs.clone();
        let run = move || {
            let r = clean(&runner, &work);
            deleted.inc_by(r.deleted);
            errors.inc_by(r.failed);
        };
        match std::thread::Builder::new()
            .name("conntrack".into())
            .spawn(run)
        {
            Ok(handle) => {
                self.running = addrs;
                self.worker = Some(handle);
            }
            Err(error) => {
                tracing::warn!(%error, "cannot start the conntrack cleanup thread; deleting in the apply");
                let r = clean(&self.runner, &addrs);
                self.deleted.inc_by(r.deleted);
                self.errors.inc_by(r.failed);
            }
        }
    }

    /// Waits for the running deletion when it covers one of `addrs` (about to be given to an
    /// endpoint).
    pub fn wait_for<'a>(&mut self, mut addrs: impl Iterator<Item = &'a IpAddr>) {
        if self.worker.is_some() && addrs.any(|a| self.running.contains(a)) {
            self.wait();
        }
    }

    /// Waits for the running deletion, if any.
    pub fn wait(&mut self) {
        if let Some(worker) = self.worker.take() {
            if worker.join().is_err() {
                tracing::error!("the conntrack cleanup thread panicked");
                self.errors.inc();
            }
            self.running.clear();
        }
    }
}

/// Deletes the flows of `addrs`: in this namespace over ctnetlink ([`remove`]); with a runner in
/// another namespace, or when the table cannot be read, with the `conntrack` tool per address.
/// Logs what it did.
fn clean<R: Runner>(runner: &R, addrs: &BTreeSet<IpAddr>) -> Removed {
    if runner.netns().is_none() {
        match remove(addrs) {
            Ok(removed) => {
                if removed.deleted > 0 {
                    tracing::info!(
                        addresses = addrs.len(),
                        flows = removed.deleted,
                        "deleted conntrack flows of removed endpoint addresses"
                    );
                }
                return removed;
            }
            Err(error) => tracing::warn!(
                %error,
                "cannot read the conntrack table; deleting flows with the conntrack tool"
            ),
        }
    }
    let mut removed = Removed::default();
    for &addr in addrs {
        match conntrack::remove_flows(runner, addr) {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(%addr, flows = n, "deleted conntrack flows of a removed endpoint address");
                }
                removed.deleted += n;
            }
            Err(error) => {
                tracing::warn!(%addr, %error, "cannot delete conntrack flows");
                removed.failed += 1;
            }
        }
    }
    removed
}

/// The delete request for a dumped flow, when one of its sources is in `addrs`.
fn victim(
    family: NetfilterProtoFamily,
    attrs: &[ConntrackAttribute],
    addrs: &BTreeSet<IpAddr>,
) -> Option<Victim> {
    let mut hit = false;
    let mut keep = Vec::new();
    for a in attrs {
        match a {
            ConntrackAttribute::CtaTupleOrig(t) => {
                hit |= source(t).is_some_and(|s| addrs.contains(&s));
                keep.push(a.clone());
            }
            ConntrackAttribute::CtaTupleReply(t) => {
                hit |= source(t).is_some_and(|s| addrs.contains(&s));
            }
            ConntrackAttribute::Other(o) if o.kind() & NLA_TYPE_MASK == CTA_ZONE => {
                keep.push(a.clone());
            }
            _ => {}
        }
    }
    hit.then_some(Victim {
        family,
        attrs: keep,
    })
}

fn source(parts: &[Tuple]) -> Option<IpAddr> {
    tuple5(parts).map(|t| t.src)
}

/// Sends one datagram of delete requests and counts their acknowledgements.
fn delete(socket: &Socket, batch: &[Victim], removed: &mut Removed) -> std::io::Result<()> {
    let mut buf = Vec::new();
    for (seq, v) in batch.iter().enumerate() {
        let mut msg = NetlinkMessage::from(NetfilterMessage::new(
            NetfilterHeader::new(v.family, 0, 0),
            ConntrackMessage::Delete(v.attrs.clone()),
        ));
        msg.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        msg.header.sequence_number = seq as u32 + 1;
        msg.finalize();
        let at = buf.len();
        buf.resize(at + (msg.header.length as usize).next_multiple_of(4), 0);
        msg.serialize(&mut buf[at..]);
    }
    socket.send(&buf, 0)?;
    let mut acked = 0;
    let mut rx = vec![0u8; 1 << 16];
    while acked < batch.len() {
        let n = socket.recv(&mut &mut rx[..], 0)?;
        if n == 0 {
            break;
        }
        for (kind, code) in control_messages(&rx[..n]) {
            if kind != NLMSG_ERROR {
                continue;
            }
            acked += 1;
            match code {
                0 => removed.deleted += 1,
                // Gone already (it ended, or another delete got it first).
                c if c == -rustix::io::Errno::NOENT.raw_os_error() => {}
                c => {
                    removed.failed += 1;
                    tracing::warn!(
                        error = %std::io::Error::from_raw_os_error(-c),
                        "cannot delete a conntrack flow of a removed endpoint address"
                    );
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::DefaultNla;
    use netlink_packet_netfilter::conntrack::{IPTuple, ProtoTuple, Protocol};

    use super::*;

    fn tuple(src: &str, dst: &str) -> Vec<Tuple> {
        vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(src.parse().unwrap()),
                IPTuple::DestinationAddress(dst.parse().unwrap()),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(Protocol::Tcp),
                ProtoTuple::SourcePort(40000),
                ProtoTuple::DestinationPort(80),
            ]),
        ]
    }

    fn flow(orig: (&str, &str), reply: (&str, &str)) -> Vec<ConntrackAttribute> {
        vec![
            ConntrackAttribute::CtaTupleOrig(tuple(orig.0, orig.1)),
            ConntrackAttribute::CtaTupleReply(tuple(reply.0, reply.1)),
            ConntrackAttribute::CtaMark(7),
            ConntrackAttribute::Other(DefaultNla::new(CTA_ZONE, 3u16.to_be_bytes().to_vec())),
        ]
    }

    #[test]
    fn a_flow_is_an_address_s_by_its_original_or_reply_source() {
        let addrs: BTreeSet<IpAddr> = ["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()]
            .into_iter()
            .collect();
        let v4 = NetfilterProtoFamily::IPv4;
        // The endpoint started it.
        let started = flow(("10.0.0.1", "10.0.0.9"), ("10.0.0.9", "10.0.0.1"));
        let hit = victim(v4, &started, &addrs).expect("its own flow");
        // Deleted by its original tuple, in its zone; nothing else is sent.
        assert_eq!(hit.attrs, vec![started[0].clone(), started[3].clone()]);
        assert_eq!(hit.family, v4);
        // The endpoint answered it behind a DNAT (the original destination is a service).
        let answered = flow(("10.0.0.5", "10.96.0.10"), ("10.0.0.1", "10.0.0.5"));
        assert!(victim(v4, &answered, &addrs).is_some());
        // Another address's flow, even one *to* the removed address' neighbour, stays.
        let other = flow(("10.0.0.2", "10.0.0.9"), ("10.0.0.9", "10.0.0.2"));
        assert_eq!(victim(v4, &other, &addrs), None);
        let v6 = flow(("fd00::1", "fd00::9"), ("fd00::9", "fd00::1"));
        assert!(victim(NetfilterProtoFamily::IPv6, &v6, &addrs).is_some());
    }
}
