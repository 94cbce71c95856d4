//! The flow collector: kernel → NFLOG (groups 1 and 2: one packet per connection per endpoint
//! direction, with the prefixes of the policies that decided it) and conntrack `DESTROY` events
//! (the end of each allowed connection, with its counts; a table dump each interval for the live
//! ones' counts so far) → an [`Aggregator`] per 5-tuple and
//! reporter → [`FlowRecord`]s: each new 5-tuple is published to the [`FlowHub`] within
//! [`FRESH_TICK`] of its first packet, and every interval the aggregates go to the hub and to
//! the JSON lines file.
//!
//! Bounded: at most `max_entries` live 5-tuples (new ones beyond are dropped and counted), one
//! thread, reading in batches; its work is per packet logged, i.e. per new connection.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::conntrack::{self, Ended};
use super::drops;
use super::file::RotatingFile;
use super::names::Names;
use super::nflog::{self, NflogPacket, decode_icmp, decode_ip, parse_prefix};
use super::{
    Connection, FlowAction, FlowHub, FlowPolicies, FlowRecord, PendingPolicies, PolicyHit, Reporter,
};
use iptables::render::FLOW_LOG_NFLOG_SIZE;

/// How often new 5-tuples are published to the hub (a new flow reaches it within this, plus
/// NFLOG's own 50 ms batching).
pub const FRESH_TICK: Duration = Duration::from_millis(250);
/// How long the thread sleeps when neither socket has anything.
const IDLE_SLEEP: Duration = Duration::from_millis(20);

/// The collector's counters (exported as `felixrs_flow_logs_*` and Felix's names).
#[derive(Debug, Default)]
pub struct CollectorStats {
    /// Flow records written (hub and file).
    pub records: AtomicU64,
    /// Connections seen (new 5-tuples and reporters).
    pub connections: AtomicU64,
    /// New 5-tuples dropped because `max_entries` were live.
    pub dropped: AtomicU64,
    /// 5-tuples held now.
    pub live_entries: AtomicU64,
    /// NFLOG packets received (Felix `felix_nflog_*`).
    pub nflog_packets: AtomicU64,
    /// Conntrack end events received.
    pub conntrack_ended: AtomicU64,
    /// Receive errors (e.g. the socket's buffer overflowed: messages lost).
    pub receive_errors: AtomicU64,
    /// Messages the kernel dropped at the NFLOG socket (its buffer full), as the kernel counts
    /// them ([`super::drops`]).
    pub nflog_socket_drops: AtomicU64,
    /// The same at the conntrack events socket.
    pub conntrack_socket_drops: AtomicU64,
    /// Connections (5-tuple and reporter) each staged policy decided in the staged view, by
    /// policy and its staged action (`felixrs_staged_policy_connections_total`).
    pub staged: std::sync::Mutex<std::collections::BTreeMap<StagedCount, u64>>,
}

/// A staged policy and what it decided: a [`CollectorStats::staged`] key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct StagedCount {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub tier: String,
    pub action: FlowAction,
}

/// One staged policy's count, as `felixrs stats` shows it (over `agent.sock`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StagedRow {
    #[serde(flatten)]
    pub policy: StagedCount,
    /// Connections (5-tuple and reporter) it decided so in the staged view since the agent started.
    pub connections: u64,
}

impl CollectorStats {
    /// The staged counts, by policy and action.
    pub fn staged_rows(&self) -> Vec<StagedRow> {
        self.staged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(policy, n)| StagedRow {
                policy: policy.clone(),
                connections: *n,
            })
            .collect()
    }

    /// Counts one connection's staged verdict for each staged policy among its `hits`.
    fn count_staged(&self, hits: &[PolicyHit]) {
        let mut staged = None;
        for h in hits.iter().filter(|h| h.kind.starts_with("Staged")) {
            let map = staged.get_or_insert_with(|| {
                self.staged
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            });
            let key = StagedCount {
                kind: h.kind.clone(),
                namespace: h.namespace.clone().unwrap_or_default(),
                name: h.name.clone(),
                tier: h.tier.clone().unwrap_or_default(),
                action: h.action,
            };
            *map.entry(key).or_default() += 1;
        }
    }
}

/// One flow's key: reporter and 5-tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    reporter: Reporter,
    proto: u8,
    src: IpAddr,
    dst: IpAddr,
    src_port: Option<u16>,
    dst_port: Option<u16>,
}

#[derive(Debug)]
struct Entry {
    action: FlowAction,
    /// The NFLOG prefixes that acted, in order; named when a record is made, so a name the
    /// view learns after the packet still shows.
    hits: Vec<String>,
    pending: Option<(FlowAction, Vec<PolicyHit>)>,
    started: u64,
    completed: u64,
    live: bool,
    packets_in: u64,
    packets_out: u64,
    bytes_in: u64,
    bytes_out: u64,
    /// The live connection's conntrack counters already added (orig packets, orig bytes,
    /// reply packets, reply bytes), from the last table dump: its end adds only the rest.
    counted: [u64; 4],
    /// Not yet published to the hub.
    fresh: bool,
    /// Something happened in this interval.
    dirty: bool,
}

/// Aggregates per reporter and 5-tuple (pure: no sockets, fed by the runner or a test).
pub struct Aggregator {
    host: String,
    max_entries: usize,
    entries: HashMap<Key, Entry>,
    /// Keys of the entries not yet published (so a tick costs what is new, not what is held).
    fresh_keys: Vec<Key>,
    interval_start: u64,
    stats: Arc<CollectorStats>,
}

fn proto_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmp6".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Aggregator {
    pub fn new(host: &str, max_entries: usize, stats: Arc<CollectorStats>) -> Aggregator {
        Aggregator {
            host: host.to_string(),
            max_entries,
            entries: HashMap::new(),
            fresh_keys: Vec::new(),
            interval_start: unix_now(),
            stats,
        }
    }

    /// One NFLOG packet of ours; ignored if its prefix or header is not ours.
    pub fn packet(&mut self, pending: &dyn PendingPolicies, p: &NflogPacket) {
        self.stats.nflog_packets.fetch_add(1, Ordering::Relaxed);
        let (Some(prefix), Some(ip)) = (parse_prefix(&p.prefix), decode_ip(&p.payload)) else {
            return;
        };
        if prefix.action == "log" {
            return;
        }
        let reporter = if prefix.direction == "ingress" {
            Reporter::Dst
        } else {
            Reporter::Src
        };
        let key = Key {
            reporter,
            proto: ip.protocol,
            src: ip.src,
            dst: ip.dst,
            src_port: ip.src_port,
            dst_port: ip.dst_port,
        };
        let action = match prefix.action {
            "allow" => FlowAction::Allow,
            "pass" => FlowAction::Pass,
            _ => FlowAction::Deny,
        };
        let len = self.entries.len();
        let entry = match self.entries.get_mut(&key) {
            Some(e) => e,
            None => {
                if len >= self.max_entries {
                    self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                self.stats.connections.fetch_add(1, Ordering::Relaxed);
                self.fresh_keys.push(key);
                let conn = Connection {
                    proto: ip.protocol,
                    src: ip.src,
                    dst: ip.dst,
                    src_port: ip.src_port,
                    dst_port: ip.dst_port,
                    icmp: decode_icmp(&p.payload),
                };
                let pending = pending.pending(&conn, reporter);
                if let Some((_, hits)) = &pending {
                    self.stats.count_staged(hits);
                }
                self.entries.entry(key).or_insert(Entry {
                    action: FlowAction::Deny,
                    hits: Vec::new(),
                    pending,
                    started: 1,
                    completed: 0,
                    live: false,
                    packets_in: 0,
                    packets_out: 0,
                    bytes_in: 0,
                    bytes_out: 0,
                    counted: [0; 4],
                    fresh: true,
                    dirty: true,
                })
            }
        };
        entry.dirty = true;
        if !entry.hits.contains(&p.prefix) {
            entry.hits.push(p.prefix.clone());
        }
        match action {
            FlowAction::Allow => {
                entry.action = FlowAction::Allow;
                entry.live = true;
            }
            FlowAction::Deny => {
                entry.action = FlowAction::Deny;
                entry.live = false;
                // A denied packet never reaches conntrack's end: count it here.
                let n = p.payload.len() as u64;
                match reporter {
                    Reporter::Dst => (entry.packets_in += 1, entry.bytes_in += n),
                    Reporter::Src => (entry.packets_out += 1, entry.bytes_out += n),
                };
            }
            FlowAction::Pass => {}
        }
        self.stats
            .live_entries
            .store(self.entries.len() as u64, Ordering::Relaxed);
    }

    /// A connection ended: its counts (what a dump has not already added) and its completion go
    /// to both reporters' entries.
    pub fn ended(&mut self, e: &Ended) {
        self.stats.conntrack_ended.fetch_add(1, Ordering::Relaxed);
        self.count(e, true);
    }

    /// A live connection's counts so far, from a table dump: what is new since the last dump
    /// goes to both reporters' entries (so an interval's record of a long connection carries
    /// the traffic of that interval, not nothing until the connection ends).
    pub fn live(&mut self, e: &Ended) {
        self.count(e, false);
    }

    fn count(&mut self, e: &Ended, end: bool) {
        let total = [e.orig_packets, e.orig_bytes, e.reply_packets, e.reply_bytes];
        for reporter in [Reporter::Src, Reporter::Dst] {
            let key = Key {
                reporter,
                proto: e.orig.proto,
                src: e.orig.src,
                dst: e.orig.dst,
                src_port: e.orig.src_port,
                dst_port: e.orig.dst_port,
            };
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            if !entry.live {
                continue;
            }
            // Counters below what was added: a new connection on the same 5-tuple (the old
            // one's end was not seen): all of it is new.
            let behind = total.iter().zip(&entry.counted).any(|(t, c)| t < c);
            let base = if behind { [0; 4] } else { entry.counted };
            let [op, ob, rp, rb] = std::array::from_fn(|i| total[i] - base[i]);
            // Counted from the reporter's endpoint: the source sent the original direction.
            let ((po, bo), (pi, bi)) = match reporter {
                Reporter::Src => ((op, ob), (rp, rb)),
                Reporter::Dst => ((rp, rb), (op, ob)),
            };
            entry.packets_out += po;
            entry.bytes_out += bo;
            entry.packets_in += pi;
            entry.bytes_in += bi;
            if end {
                entry.completed += 1;
                entry.live = false;
                entry.counted = [0; 4];
                entry.dirty = true;
            } else {
                entry.counted = total;
                entry.dirty |= op + rp > 0;
            }
        }
    }

    /// Whether a live connection is held (a dump would add something).
    pub fn has_live(&self) -> bool {
        self.entries.values().any(|e| e.live)
    }

    fn record(&self, key: &Key, e: &Entry, names: &Names, start: u64, end: u64) -> FlowRecord {
        FlowRecord {
            start_time: start,
            end_time: end,
            host: self.host.clone(),
            reporter: key.reporter,
            proto: proto_name(key.proto),
            source: names.end(key.src, key.src_port),
            dest: names.end(key.dst, key.dst_port),
            action: e.action,
            pending_action: e.pending.as_ref().map(|p| p.0),
            policies: FlowPolicies {
                enforced: e
                    .hits
                    .iter()
                    .filter_map(|h| parse_prefix(h))
                    .map(|h| names.hit(&h))
                    .collect(),
                pending: e.pending.as_ref().map(|p| p.1.clone()).unwrap_or_default(),
            },
            num_connections_started: e.started,
            num_connections_completed: e.completed,
            num_connections_live: u64::from(e.live),
            packets_in: e.packets_in,
            packets_out: e.packets_out,
            bytes_in: e.bytes_in,
            bytes_out: e.bytes_out,
        }
    }

    /// Records of the 5-tuples not yet published (each once), for the hub.
    pub fn fresh(&mut self, names: &Names) -> Vec<FlowRecord> {
        let now = unix_now();
        let mut out = Vec::new();
        for k in std::mem::take(&mut self.fresh_keys) {
            if let Some(e) = self.entries.get_mut(&k).filter(|e| e.fresh) {
                e.fresh = false;
                let e = &self.entries[&k];
                out.push(self.record(&k, e, names, self.interval_start, now));
            }
        }
        out
    }

    /// The interval's aggregates (every 5-tuple with activity, and every live one); then the
    /// counts restart and ended or denied 5-tuples are forgotten.
    pub fn flush(&mut self, names: &Names) -> Vec<FlowRecord> {
        let now = unix_now();
        let mut out = Vec::new();
        for (k, e) in &self.entries {
            if e.dirty || e.live {
                out.push(self.record(k, e, names, self.interval_start, now));
            }
        }
        self.entries.retain(|_, e| e.live);
        self.fresh_keys.clear();
        for e in self.entries.values_mut() {
            e.started = 0;
            e.completed = 0;
            e.packets_in = 0;
            e.packets_out = 0;
            e.bytes_in = 0;
            e.bytes_out = 0;
            e.dirty = false;
            e.fresh = false;
        }
        self.interval_start = now;
        self.stats
            .live_entries
            .store(self.entries.len() as u64, Ordering::Relaxed);
        out
    }
}

/// The collector's settings (the agent's `--flow-logs-*` flags).
#[derive(Debug, Clone)]
pub struct CollectorConfig {
    pub host: String,
    /// `None`: records go to the hub only.
    pub file: Option<PathBuf>,
    pub file_max_bytes: u64,
    pub file_keep: usize,
    pub interval: Duration,
    pub max_entries: usize,
}

/// A running collector; stops (and flushes) when dropped or [`Collector::stop`]ped.
pub struct Collector {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub stats: Arc<CollectorStats>,
}

/// Why the collector could not start.
#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    #[error(transparent)]
    Nflog(#[from] nflog::NflogError),
    #[error("conntrack events socket: {0}")]
    Conntrack(#[source] std::io::Error),
    #[error("flow log file {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Collector {
    /// Binds NFLOG groups 1 and 2 and conntrack events in the calling thread's network
    /// namespace, then collects on its own thread. `names` is re-read at each use (the agent
    /// replaces it when its view changes).
    pub fn start(
        cfg: CollectorConfig,
        hub: Arc<FlowHub>,
        names: Arc<RwLock<Names>>,
        pending: Arc<dyn PendingPolicies>,
    ) -> Result<Collector, CollectorError> {
        let nf = nflog::open(
            &[
                iptables::render::DenyLog::group(true),
                iptables::render::DenyLog::group(false),
            ],
            FLOW_LOG_NFLOG_SIZE,
        )?;
        if let Err(e) = conntrack::enable_accounting() {
            tracing::warn!(
                "flow logs: cannot set {}: {e}; connections get no packet or byte counts",
                conntrack::ACCT_SYSCTL
            );
        }
        let ct = conntrack::open().map_err(CollectorError::Conntrack)?;
        // Live connections' counts each interval; without it they come only at the end.
        let dump = conntrack::open_dump()
            .inspect_err(|e| {
                tracing::warn!("flow logs: no conntrack dump socket ({e}): counts only at ends")
            })
            .ok();
        let mut file = match &cfg.file {
            Some(p) => Some(
                RotatingFile::open(p, cfg.file_max_bytes, cfg.file_keep).map_err(|source| {
                    CollectorError::File {
                        path: p.clone(),
                        source,
                    }
                })?,
            ),
            None => None,
        };
        let stats = Arc::new(CollectorStats::default());
        let inodes = (drops::socket_inode(&nf), drops::socket_inode(&ct));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("flow-logs".into())
            .spawn(move || {
                let mut agg = Aggregator::new(&cfg.host, cfg.max_entries, st.clone());
                let mut buf = vec![0u8; 1 << 16];
                let mut last_fresh = Instant::now();
                let mut last_flush = Instant::now();
                let publish = |records: Vec<FlowRecord>, file: &mut Option<RotatingFile>| {
                    st.records
                        .fetch_add(records.len() as u64, Ordering::Relaxed);
                    if let Some(f) = file.as_mut() {
                        let lines: Vec<String> = records.iter().map(|r| r.to_json_line()).collect();
                        if let Err(e) = f.write_lines(lines.iter().map(String::as_str)) {
                            tracing::warn!("flow logs: writing the file: {e}");
                        }
                    }
                    for r in records {
                        hub.publish(r);
                    }
                };
                loop {
                    let stopping = s.load(Ordering::Relaxed);
                    let idle = {
                        let mut idle = true;
                        loop {
                            match nf.recv(&mut &mut buf[..], 0) {
                                Ok(n) => {
                                    idle = false;
                                    for p in nflog::packets(&buf[..n]) {
                                        agg.packet(pending.as_ref(), &p);
                                    }
                                }
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                                Err(_) => {
                                    st.receive_errors.fetch_add(1, Ordering::Relaxed);
                                    break;
                                }
                            }
                        }
                        loop {
                            match ct.recv(&mut &mut buf[..], 0) {
                                Ok(n) => {
                                    idle = false;
                                    for e in conntrack::ended(&buf[..n]) {
                                        agg.ended(&e);
                                    }
                                }
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                                Err(_) => {
                                    st.receive_errors.fetch_add(1, Ordering::Relaxed);
                                    break;
                                }
                            }
                        }
                        if stopping || last_fresh.elapsed() >= FRESH_TICK {
                            last_fresh = Instant::now();
                            if let Some(table) = drops::read_table() {
                                for (inode, counter) in [
                                    (inodes.0, &st.nflog_socket_drops),
                                    (inodes.1, &st.conntrack_socket_drops),
                                ] {
                                    if let Some(n) = inode.and_then(|i| drops::drops_in(&table, i))
                                    {
                                        counter.store(n, Ordering::Relaxed);
                                    }
                                }
                            }
                            // The names are locked only to make records: the dataplane
                            // sets them on its apply path and must never wait for a drain.
                            let records = agg.fresh(&names.read().expect("flow names lock"));
                            for r in records {
                                st.records.fetch_add(1, Ordering::Relaxed);
                                hub.publish(r);
                            }
                        }
                        if stopping || last_flush.elapsed() >= cfg.interval {
                            last_flush = Instant::now();
                            if let Some(d) = dump.as_ref().filter(|_| agg.has_live()) {
                                match conntrack::dump(d) {
                                    Ok(all) => all.iter().for_each(|c| agg.live(c)),
                                    Err(e) => {
                                        st.receive_errors.fetch_add(1, Ordering::Relaxed);
                                        tracing::debug!("flow logs: conntrack dump: {e}");
                                    }
                                }
                            }
                            let records = agg.flush(&names.read().expect("flow names lock"));
                            publish(records, &mut file);
                        }
                        idle
                    };
                    if stopping {
                        return;
                    }
                    if idle {
                        // Nothing queued: NFLOG batches for 50 ms anyway.
                        std::thread::sleep(IDLE_SLEEP);
                    }
                }
            })
            .expect("spawn the flow-logs thread");
        Ok(Collector {
            stop,
            thread: Some(thread),
            stats,
        })
    }

    /// Stops the thread after a last flush.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::flowlog::NoPending;

    const SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    /// The first packet of a TCP connection SRC:40000 → DST:80, as an ingress allow logged it.
    fn first_packet() -> NflogPacket {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[9] = 6;
        p[12..16].copy_from_slice(&SRC.octets());
        p[16..20].copy_from_slice(&DST.octets());
        p[20..22].copy_from_slice(&40000u16.to_be_bytes());
        p[22..24].copy_from_slice(&80u16.to_be_bytes());
        NflogPacket {
            group: 1,
            prefix: "API0|gnp/allow".into(),
            payload: p,
        }
    }

    fn counts(orig: (u64, u64), reply: (u64, u64)) -> Ended {
        Ended {
            orig: conntrack::Tuple5 {
                proto: 6,
                src: SRC.into(),
                dst: DST.into(),
                src_port: Some(40000),
                dst_port: Some(80),
            },
            orig_packets: orig.0,
            orig_bytes: orig.1,
            reply_packets: reply.0,
            reply_bytes: reply.1,
        }
    }

    #[test]
    fn a_live_connection_is_counted_per_interval_and_its_end_adds_only_the_rest() {
        let mut agg = Aggregator::new("node", 10, Arc::new(CollectorStats::default()));
        agg.packet(&NoPending, &first_packet());
        assert!(agg.has_live());
        let names = Names::default();
        // Interval 1: a dump sees 3 packets / 180 bytes sent, 2 / 120 received.
        agg.live(&counts((3, 180), (2, 120)));
        let r = agg.flush(&names);
        assert_eq!(r.len(), 1, "{r:#?}");
        let r = &r[0];
        assert_eq!(r.reporter, Reporter::Dst);
        assert_eq!(
            (r.packets_in, r.bytes_in),
            (3, 180),
            "the destination received orig"
        );
        assert_eq!((r.packets_out, r.bytes_out), (2, 120));
        assert_eq!(r.num_connections_live, 1);
        // Interval 2: nothing new by the dump, then the end with the totals: only the rest.
        agg.live(&counts((3, 180), (2, 120)));
        agg.ended(&counts((5, 300), (4, 240)));
        let r = agg.flush(&names);
        assert_eq!(r.len(), 1, "{r:#?}");
        assert_eq!((r[0].packets_in, r[0].bytes_in), (2, 120));
        assert_eq!((r[0].packets_out, r[0].bytes_out), (2, 120));
        assert_eq!(
            (r[0].num_connections_completed, r[0].num_connections_live),
            (1, 0)
        );
        // Ended and forgotten: a later dump adds nothing anywhere.
        agg.live(&counts((9, 900), (9, 900)));
        assert!(agg.flush(&names).is_empty());
    }

    #[test]
    fn counters_below_what_was_counted_are_a_new_connection_counted_whole() {
        let mut agg = Aggregator::new("node", 10, Arc::new(CollectorStats::default()));
        agg.packet(&NoPending, &first_packet());
        agg.live(&counts((10, 1000), (10, 1000)));
        agg.flush(&Names::default());
        // The 5-tuple's entry was replaced in the kernel (its end not seen): counted whole.
        agg.live(&counts((2, 100), (1, 60)));
        let r = agg.flush(&Names::default());
        assert_eq!((r[0].packets_in, r[0].bytes_in), (2, 100), "{r:#?}");
    }
}
