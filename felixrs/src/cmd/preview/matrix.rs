//! `preview` without flows: the reachability matrix of the node's pods against every pod and
//! network set of the view (and one address in none of them, "elsewhere"), per protocol/port the
//! policies of either view name (plus one port none names, "other"), both directions as the node
//! enforces them (egress: the local pod connects to the peer; ingress: the peer connects to the
//! local pod), before and after, and the cells that change. What network-policy-api's
//! `policy-assistant` prints for Kubernetes policy alone, here for every kind the node enforces,
//! each cell evaluated as `felixrs trace` evaluates that packet.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;

use calc_graph::model::Resource;
use calc_graph::proto::{IpSetMember, Output, ParsedRule, PortRange};
use serde::Serialize;

use super::{Outcome, View, Views, packet};

/// The source port of every probe (`felixrs trace`'s default).
pub const SOURCE_PORT: u16 = 40000;

/// A protocol/port the matrix probes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Column {
    /// `tcp/80`, `tcp/other`, `icmp`, `proto 47`.
    pub name: String,
    pub protocol: u8,
    /// The destination port probed (0 for protocols without ports).
    pub port: u16,
}

/// One peer of a local pod.
#[derive(Debug, Clone, Serialize)]
pub struct Peer {
    /// `ns/pod`, `NetworkSet ns/name`, `GlobalNetworkSet name`, or `elsewhere`.
    pub name: String,
    pub addr: IpAddr,
}

/// A local pod and a peer, one direction, every column.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub local: String,
    /// `egress` (local -> peer) or `ingress` (peer -> local).
    pub direction: &'static str,
    pub peer: String,
    /// The packet's source and destination addresses (`trace --from`/`--to`).
    pub from: IpAddr,
    pub to: IpAddr,
    /// One verdict per column, before and after.
    pub before: Vec<&'static str>,
    pub after: Vec<&'static str>,
}

/// A cell whose verdict would change.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub local: String,
    pub direction: &'static str,
    pub peer: String,
    pub from: IpAddr,
    pub to: IpAddr,
    pub column: String,
    pub protocol: u8,
    pub port: u16,
    pub before: Outcome,
    pub after: Outcome,
}

/// The matrix.
#[derive(Debug, Serialize)]
pub struct MatrixReport {
    pub columns: Vec<Column>,
    pub local_pods: usize,
    pub peers: usize,
    pub source_port: u16,
    pub rows: Vec<Row>,
    pub changes: Vec<Change>,
}

/// Evaluates the matrix in both views.
pub fn matrix(views: &Views) -> anyhow::Result<MatrixReport> {
    let columns = columns(&views.before, &views.after);
    let peers = peers(&views.after);
    let local: Vec<(String, IpAddr)> = peers
        .iter()
        .filter(|p| {
            (views.after.pods.by_addr(p.addr))
                .is_some_and(|pod| pod.node == views.node && pod.id == p.name)
        })
        .map(|p| (p.name.clone(), p.addr))
        .collect();
    let mut out = MatrixReport {
        columns: columns.clone(),
        local_pods: local.len(),
        peers: peers.len(),
        source_port: SOURCE_PORT,
        rows: Vec::new(),
        changes: Vec::new(),
    };
    for (name, addr) in &local {
        for direction in ["egress", "ingress"] {
            for peer in &peers {
                if peer.addr == *addr || peer.addr.is_ipv6() != addr.is_ipv6() {
                    continue;
                }
                let (from, to) = match direction {
                    "egress" => (*addr, peer.addr),
                    _ => (peer.addr, *addr),
                };
                let mut row = Row {
                    local: name.clone(),
                    direction,
                    peer: peer.name.clone(),
                    from,
                    to,
                    before: Vec::new(),
                    after: Vec::new(),
                };
                for c in &columns {
                    let p = packet(
                        &from.to_string(),
                        &to.to_string(),
                        c.protocol,
                        SOURCE_PORT,
                        c.port,
                    );
                    let before = views.before.evaluate(&views.node, &p)?;
                    let after = views.after.evaluate(&views.node, &p)?;
                    row.before.push(before.verdict);
                    row.after.push(after.verdict);
                    if before.verdict != after.verdict {
                        out.changes.push(Change {
                            local: name.clone(),
                            direction,
                            peer: peer.name.clone(),
                            from,
                            to,
                            column: c.name.clone(),
                            protocol: c.protocol,
                            port: c.port,
                            before,
                            after,
                        });
                    }
                }
                out.rows.push(row);
            }
        }
    }
    Ok(out)
}

/// The protocols and ports the active policies and profiles of either view name, plus, per
/// protocol with ports, one port none of them names.
fn columns(before: &View, after: &View) -> Vec<Column> {
    let mut ports: BTreeSet<(u8, u16)> = BTreeSet::new();
    let mut ranges: Vec<(u8, PortRange)> = Vec::new();
    let mut protocols: BTreeSet<u8> = BTreeSet::from([6]);
    for v in [before, after] {
        for o in &v.view.outputs {
            let rules: Vec<&ParsedRule> = match o {
                Output::PolicyUpdated(p) => {
                    p.inbound_rules.iter().chain(&p.outbound_rules).collect()
                }
                Output::ProfileUpdated(p) => {
                    p.inbound_rules.iter().chain(&p.outbound_rules).collect()
                }
                Output::IpSetCreated { members, .. } => {
                    for m in members.iter() {
                        if let IpSetMember::IpPort { protocol, port, .. } = m {
                            ports.insert((protocol.number(), *port));
                        }
                    }
                    continue;
                }
                _ => continue,
            };
            for r in rules {
                let Some(proto) = r.protocol.or(r.not_protocol) else {
                    continue;
                };
                let n = proto.number();
                protocols.insert(n);
                for pr in r.dst_ports.iter().chain(&r.not_dst_ports) {
                    ports.insert((n, pr.first));
                    if pr.last != pr.first {
                        ports.insert((n, pr.last));
                    }
                    ranges.push((n, *pr));
                }
            }
        }
    }
    let name = |n: u8| match n {
        6 => "tcp".to_string(),
        17 => "udp".to_string(),
        132 => "sctp".to_string(),
        1 => "icmp".to_string(),
        58 => "icmpv6".to_string(),
        n => format!("proto {n}"),
    };
    let mut out = Vec::new();
    for &proto in &protocols {
        if matches!(proto, 6 | 17 | 132) {
            for &(_, port) in ports.iter().filter(|(p, _)| *p == proto) {
                out.push(Column {
                    name: format!("{}/{port}", name(proto)),
                    protocol: proto,
                    port,
                });
            }
            let covered = |port: u16| {
                ports.contains(&(proto, port))
                    || ranges
                        .iter()
                        .any(|(p, r)| *p == proto && r.first <= port && port <= r.last)
            };
            if let Some(other) = (1..=u16::MAX).find(|p| !covered(*p)) {
                out.push(Column {
                    name: format!("{}/other", name(proto)),
                    protocol: proto,
                    port: other,
                });
            }
        } else {
            out.push(Column {
                name: name(proto),
                protocol: proto,
                port: 0,
            });
        }
    }
    out
}

/// Every pod, network set and "elsewhere" of the view, with one address each (IPv4 first).
fn peers(view: &View) -> Vec<Peer> {
    let mut out = Vec::new();
    let mut nets = Vec::new();
    for r in view.view.resources.values() {
        let pick = |addrs: &mut dyn Iterator<Item = IpAddr>| {
            let all: Vec<IpAddr> = addrs.collect();
            all.iter().find(|a| a.is_ipv4()).or(all.first()).copied()
        };
        let (name, addr) = match r {
            Resource::WorkloadEndpoint(w) => {
                let ns = w.metadata.namespace.clone().unwrap_or_default();
                let pod = w
                    .spec
                    .pod
                    .clone()
                    .unwrap_or_else(|| w.metadata.name.clone());
                (
                    format!("{ns}/{pod}"),
                    pick(&mut w.spec.ip_networks.iter().map(|n| n.addr())),
                )
            }
            Resource::NetworkSet(n) => {
                nets.extend(n.spec.nets.iter().copied());
                let ns = n.metadata.namespace.clone().unwrap_or_default();
                (
                    format!("NetworkSet {ns}/{}", n.metadata.name),
                    pick(&mut n.spec.nets.iter().map(host_in)),
                )
            }
            Resource::GlobalNetworkSet(n) => {
                nets.extend(n.spec.nets.iter().copied());
                (
                    format!("GlobalNetworkSet {}", n.metadata.name),
                    pick(&mut n.spec.nets.iter().map(host_in)),
                )
            }
            _ => continue,
        };
        if let Some(addr) = addr {
            out.push(Peer { name, addr });
        }
    }
    // An address in no pod and no network set: the internet, say (TEST-NET-3, else TEST-NET-2).
    let known = |a: IpAddr| nets.iter().any(|n| n.contains(&a)) || view.pods.by_addr(a).is_some();
    let elsewhere = ["203.0.113.1", "198.51.100.1", "192.0.2.1"]
        .iter()
        .map(|a| a.parse::<IpAddr>().expect("a literal address"))
        .find(|a| !known(*a));
    if let Some(addr) = elsewhere {
        out.push(Peer {
            name: "elsewhere".into(),
            addr,
        });
    }
    out
}

/// An address inside `net` (its first host for a network wider than one address).
fn host_in(net: &ipnet::IpNet) -> IpAddr {
    let a = net.network();
    if net.prefix_len() == net.max_prefix_len() {
        return a;
    }
    match a {
        IpAddr::V4(v) => IpAddr::V4((u32::from(v).wrapping_add(1)).into()),
        IpAddr::V6(v) => IpAddr::V6((u128::from(v).wrapping_add(1)).into()),
    }
}

/// Text without control characters (a name cannot start a new line or forge a column).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Aligned columns, each line prefixed by `indent`.
pub fn table<const N: usize>(head: &[String; N], rows: &[[String; N]], indent: &str) -> String {
    table_rows(
        &head[..],
        &rows.iter().map(|r| r.to_vec()).collect::<Vec<_>>(),
        indent,
    )
}

fn table_rows(head: &[String], rows: &[Vec<String>], indent: &str) -> String {
    let mut widths: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut s = String::new();
    for r in std::iter::once(head).chain(rows.iter().map(Vec::as_slice)) {
        let mut line = indent.to_string();
        for (i, (c, w)) in r.iter().zip(&widths).enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}  ");
            }
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
    s
}

/// How many changed cells and matrix rows the text prints without `--all`.
const SHOWN: usize = 40;

/// The matrix for an operator: the changed cells, then the rows after (identical rows of a local
/// pod and direction grouped, peers listed), each cell `allow`, `deny`, or `before>after`.
pub fn text(m: &MatrixReport, all: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "reachability of {} local pods against {} peers, per port (source port {}):",
        m.local_pods, m.peers, m.source_port
    );
    if m.changes.is_empty() {
        let _ = writeln!(s, "no cell would change");
    } else {
        let _ = writeln!(s, "{} cells would change:", m.changes.len());
        let shown = if all {
            m.changes.len()
        } else {
            m.changes.len().min(SHOWN)
        };
        let rows: Vec<Vec<String>> = (m.changes[..shown].iter())
            .map(|c| {
                let (src, dst) = match c.direction {
                    "egress" => (&c.local, &c.peer),
                    _ => (&c.peer, &c.local),
                };
                vec![
                    c.direction.to_string(),
                    format!("{} -> {}", esc(src), esc(dst)),
                    c.column.clone(),
                    format!(
                        "{} -> {}",
                        c.before.verdict.to_uppercase(),
                        c.after.verdict.to_uppercase()
                    ),
                    format!("after: {}", esc(&c.after.decided_by.join("; "))),
                ]
            })
            .collect();
        let head = ["direction", "connection", "port", "verdict", "decided by"].map(String::from);
        s.push_str(&table_rows(&head, &rows, "  "));
        if shown < m.changes.len() {
            let _ = writeln!(
                s,
                "  ... {} more cells (--all prints them)",
                m.changes.len() - shown
            );
        }
    }
    // Rows grouped: a local pod, a direction, and the same cells before and after.
    let mut groups: Vec<(&Row, Vec<&str>)> = Vec::new();
    for r in &m.rows {
        match groups.iter_mut().find(|(g, _)| {
            g.local == r.local
                && g.direction == r.direction
                && g.before == r.before
                && g.after == r.after
        }) {
            Some((_, peers)) => peers.push(&r.peer),
            None => groups.push((r, vec![&r.peer])),
        }
    }
    let _ = writeln!(
        s,
        "\nmatrix ({} rows in {} groups; a cell is before>after where it changes):",
        m.rows.len(),
        groups.len()
    );
    let mut head = vec![
        "local pod".to_string(),
        "dir".to_string(),
        "peers".to_string(),
    ];
    head.extend(m.columns.iter().map(|c| c.name.clone()));
    let shown = if all {
        groups.len()
    } else {
        groups.len().min(SHOWN)
    };
    let rows: Vec<Vec<String>> = (groups[..shown].iter())
        .map(|(r, peers)| {
            let mut names: Vec<String> = peers
                .iter()
                .take(if all { usize::MAX } else { 3 })
                .map(|p| esc(p))
                .collect();
            if names.len() < peers.len() {
                names.push(format!("+{} more", peers.len() - names.len()));
            }
            let mut row = vec![esc(&r.local), r.direction.to_string(), names.join(", ")];
            row.extend(r.before.iter().zip(&r.after).map(|(b, a)| {
                if b == a {
                    b.to_string()
                } else {
                    format!("{b}>{a}")
                }
            }));
            row
        })
        .collect();
    s.push_str(&table_rows(&head, &rows, "  "));
    if shown < groups.len() {
        let _ = writeln!(
            s,
            "  ... {} more groups (--all prints them)",
            groups.len() - shown
        );
    }
    s
}
