//! `preview --flows`: recorded flow records re-evaluated with the node's policies before and
//! after the proposal; the flows whose verdict would change, grouped by what would decide them.
//!
//! A record is evaluated as `felixrs trace --from SRC --to DST --protocol P --port D
//! --source-port S` evaluates that packet, on this node. A flow between two pods of the node is
//! recorded by both ends (reporter `src` and `dst`); it is counted once. A record that cannot be
//! evaluated (no address, mixed families, a line that is no flow record, both ends the host) is
//! counted and listed with the reason, never dropped silently.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::BufRead;
use std::net::IpAddr;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::matrix::esc;
use super::{Outcome, Views, packet};
use crate::flowlog::{FlowAction, FlowEnd, FlowRecord, Reporter};

/// What the replay found.
#[derive(Debug, Serialize)]
pub struct ReplayReport {
    pub file: String,
    /// Lines read (records and lines that are not).
    pub records: u64,
    /// Records evaluated before and after.
    pub evaluated: u64,
    /// Records of a flow between two local pods already counted from its other end.
    pub reported_twice: u64,
    /// Records whose recorded verdict differs from the node's current policies (they changed
    /// since the flow was recorded, or a staged verdict was recorded).
    pub recorded_differs: u64,
    pub unresolvable: Vec<Unresolvable>,
    /// The flows whose verdict would change, by (verdict, decider) after and before.
    pub groups: Vec<Group>,
}

/// A record that could not be evaluated.
#[derive(Debug, Serialize)]
pub struct Unresolvable {
    /// 1-based line of the file.
    pub line: u64,
    pub reason: String,
}

/// Changed flows with the same verdict and deciders after (and before).
#[derive(Debug, Serialize)]
pub struct Group {
    pub before: Outcome,
    pub after: Outcome,
    pub connections: u64,
    pub bytes: u64,
    pub records: u64,
    pub flows: Vec<Flow>,
}

/// One changed flow: records with the same ends, protocol and destination port.
#[derive(Debug, Clone, Serialize)]
pub struct Flow {
    pub source: String,
    pub dest: String,
    pub proto: String,
    pub port: Option<u16>,
    pub connections: u64,
    pub bytes: u64,
    pub records: u64,
}

/// A packet evaluated: source, destination, protocol, source and destination port.
type Probe = (IpAddr, IpAddr, u8, u16, u16);
/// A group of changed flows: the verdict and deciders after, then before.
type GroupKey = (String, Vec<String>, String, Vec<String>);
/// A changed flow: its ends, protocol and destination port.
type FlowKey = (String, String, String, Option<u16>);

/// Reads and replays the records of `path`.
pub fn replay(views: &Views, path: &Path) -> anyhow::Result<ReplayReport> {
    let file =
        std::fs::File::open(path).with_context(|| format!("reading --flows {}", path.display()))?;
    let mut out = ReplayReport {
        file: path.display().to_string(),
        records: 0,
        evaluated: 0,
        reported_twice: 0,
        recorded_differs: 0,
        unresolvable: Vec::new(),
        groups: Vec::new(),
    };
    let mut records = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading --flows {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        out.records += 1;
        let n = i as u64 + 1;
        match serde_json::from_str::<FlowRecord>(&line) {
            Ok(r) => records.push((n, r)),
            Err(e) => out.unresolvable.push(Unresolvable {
                line: n,
                reason: format!("not a flow record: {e}"),
            }),
        }
    }
    // A flow between two local pods: both ends report it; keep the source's record.
    let twin = |r: &FlowRecord| {
        let (s, d) = (&r.source, &r.dest);
        (
            r.start_time,
            r.host.clone(),
            r.proto.clone(),
            s.ip,
            s.port,
            d.ip,
            d.port,
        )
    };
    let sources: HashSet<_> = (records.iter())
        .filter(|(_, r)| r.reporter == Reporter::Src)
        .map(|(_, r)| twin(r))
        .collect();
    let mut cache: HashMap<Probe, (Outcome, Outcome)> = HashMap::new();
    let mut groups: BTreeMap<GroupKey, BTreeMap<FlowKey, Flow>> = BTreeMap::new();
    let mut by_key: BTreeMap<GroupKey, (Outcome, Outcome)> = BTreeMap::new();
    for (n, r) in &records {
        if r.reporter == Reporter::Dst && sources.contains(&twin(r)) {
            out.reported_twice += 1;
            continue;
        }
        let (src, dst, proto) = match resolve(r) {
            Ok(t) => t,
            Err(e) => {
                let reason = e.to_string();
                out.unresolvable.push(Unresolvable { line: *n, reason });
                continue;
            }
        };
        let sport = r.source.port.unwrap_or(0);
        let dport = r.dest.port.unwrap_or(0);
        let key = (src, dst, proto, sport, dport);
        let (before, after) = match cache.get(&key) {
            Some(v) => v.clone(),
            None => {
                let p = packet(&src.to_string(), &dst.to_string(), proto, sport, dport);
                let eval = |v: &super::View| v.evaluate(&views.node, &p);
                match (eval(&views.before), eval(&views.after)) {
                    (Ok(b), Ok(a)) => {
                        cache.insert(key, (b.clone(), a.clone()));
                        (b, a)
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        out.unresolvable.push(Unresolvable {
                            line: *n,
                            reason: format!("{e:#}"),
                        });
                        continue;
                    }
                }
            }
        };
        out.evaluated += 1;
        let recorded = match r.action {
            FlowAction::Allow => "allow",
            FlowAction::Deny | FlowAction::Pass => "deny",
        };
        if recorded != before.verdict {
            out.recorded_differs += 1;
        }
        if before.verdict == after.verdict {
            continue;
        }
        let gk = (
            after.verdict.to_string(),
            after.decided_by.clone(),
            before.verdict.to_string(),
            before.decided_by.clone(),
        );
        by_key.entry(gk.clone()).or_insert((before, after));
        let (source, dest) = (end(&r.source), end(&r.dest));
        let fk = (source.clone(), dest.clone(), r.proto.clone(), r.dest.port);
        let flow = groups.entry(gk).or_default().entry(fk).or_insert(Flow {
            source,
            dest,
            proto: r.proto.clone(),
            port: r.dest.port,
            connections: 0,
            bytes: 0,
            records: 0,
        });
        flow.connections += r.num_connections_started;
        flow.bytes += r.bytes_in + r.bytes_out;
        flow.records += 1;
    }
    for (gk, flows) in groups {
        let (before, after) = by_key.remove(&gk).expect("every group has its outcomes");
        let mut flows: Vec<Flow> = flows.into_values().collect();
        flows.sort_by(|a, b| {
            b.connections
                .cmp(&a.connections)
                .then(b.bytes.cmp(&a.bytes))
        });
        out.groups.push(Group {
            connections: flows.iter().map(|f| f.connections).sum(),
            bytes: flows.iter().map(|f| f.bytes).sum(),
            records: flows.iter().map(|f| f.records).sum(),
            before,
            after,
            flows,
        });
    }
    out.unresolvable.sort_by_key(|u| u.line);
    out.groups.sort_by(|a, b| {
        b.connections
            .cmp(&a.connections)
            .then(b.records.cmp(&a.records))
    });
    Ok(out)
}

/// Why a record cannot be evaluated (the reason an [`Unresolvable`] lists).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("the record has no source address")]
    NoSource,
    #[error("the record has no destination address")]
    NoDestination,
    #[error("source {src} and destination {dst} are of different families")]
    MixedFamilies { src: IpAddr, dst: IpAddr },
    #[error("unknown protocol {0:?}")]
    UnknownProtocol(String),
}

/// The record's addresses and protocol number, or why it cannot be evaluated.
fn resolve(r: &FlowRecord) -> Result<(IpAddr, IpAddr, u8), ResolveError> {
    let src = r.source.ip.ok_or(ResolveError::NoSource)?;
    let dst = r.dest.ip.ok_or(ResolveError::NoDestination)?;
    if src.is_ipv6() != dst.is_ipv6() {
        return Err(ResolveError::MixedFamilies { src, dst });
    }
    let proto = match r.proto.to_ascii_lowercase().as_str() {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        "icmp" => 1,
        "icmp6" | "icmpv6" => 58,
        other => other
            .parse()
            .map_err(|_| ResolveError::UnknownProtocol(r.proto.clone()))?,
    };
    Ok((src, dst, proto))
}

/// `ns/pod 10.0.0.1`, `hep name 10.0.0.1`, or the address.
fn end(e: &FlowEnd) -> String {
    let ip = e.ip.map(|i| i.to_string()).unwrap_or_default();
    match (&e.namespace, &e.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n} {ip}"),
        (None, Some(n)) => format!("{} {n} {ip}", e.kind),
        _ => ip,
    }
}

/// How many of the changed flows of each group the text prints without `--all`.
const FLOWS_SHOWN: usize = 20;

/// The replay for an operator.
pub fn text(r: &ReplayReport, all: bool) -> String {
    let mut s = String::new();
    let changed: usize = r.groups.iter().map(|g| g.flows.len()).sum();
    let _ = writeln!(
        s,
        "replayed {} flow records from {}: {} evaluated, {} unresolvable, {} counted from their other end",
        r.records,
        r.file,
        r.evaluated,
        r.unresolvable.len(),
        r.reported_twice
    );
    if r.recorded_differs > 0 {
        let _ = writeln!(
            s,
            "  note: {} records were recorded with another verdict than the node's current policies give",
            r.recorded_differs
        );
    }
    if changed == 0 {
        let _ = writeln!(s, "no recorded flow would change verdict");
    } else {
        let _ = writeln!(
            s,
            "{changed} flows would change verdict, by what would decide them:"
        );
    }
    for g in &r.groups {
        let _ = writeln!(
            s,
            "\n{} -> {}  ({} flows, {} connections, {} bytes, {} records)",
            g.before.verdict.to_uppercase(),
            g.after.verdict.to_uppercase(),
            g.flows.len(),
            g.connections,
            g.bytes,
            g.records
        );
        let _ = writeln!(s, "  after:  {}", esc(&g.after.decided_by.join("; ")));
        let _ = writeln!(s, "  before: {}", esc(&g.before.decided_by.join("; ")));
        let shown = if all {
            g.flows.len()
        } else {
            g.flows.len().min(FLOWS_SHOWN)
        };
        let rows: Vec<[String; 5]> = (g.flows[..shown].iter())
            .map(|f| {
                [
                    esc(&f.source),
                    esc(&f.dest),
                    format!(
                        "{}/{}",
                        f.proto,
                        f.port.map_or("-".to_string(), |p| p.to_string())
                    ),
                    f.connections.to_string(),
                    f.bytes.to_string(),
                ]
            })
            .collect();
        let head = ["source", "destination", "port", "connections", "bytes"].map(String::from);
        s.push_str(&super::matrix::table(&head, &rows, "    "));
        if shown < g.flows.len() {
            let _ = writeln!(
                s,
                "    ... {} more flows (--all prints them)",
                g.flows.len() - shown
            );
        }
    }
    if !r.unresolvable.is_empty() {
        let _ = writeln!(s, "\nunresolvable records ({}):", r.unresolvable.len());
        let shown = if all {
            r.unresolvable.len()
        } else {
            r.unresolvable.len().min(FLOWS_SHOWN)
        };
        for u in &r.unresolvable[..shown] {
            let _ = writeln!(s, "  line {}: {}", u.line, esc(&u.reason));
        }
        if shown < r.unresolvable.len() {
            let _ = writeln!(
                s,
                "  ... {} more (--all prints them)",
                r.unresolvable.len() - shown
            );
        }
    }
    s
}
