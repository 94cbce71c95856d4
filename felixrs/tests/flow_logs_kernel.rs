//! The flow-log collector on the real kernel: the node of `node_support` rendered with
//! `--flow-logs` (plus a `security` tier whose policy passes port 8080 to the default tier) and
//! applied; the collector runs in the node's namespace (NFLOG groups 1/2, conntrack events),
//! publishing to a hub and a rotated file. Traffic only between the test's own pod namespaces.
//! Root; legacy and nft.

mod node_support;

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use felixrs::cmd::shared::dataplane_args::DataplaneArgs;
use felixrs::cmd::shared::node_view::{SourceArgs, render_node};
use felixrs::flowlog::collector::{Collector, CollectorConfig};
use felixrs::flowlog::names::Names;
use felixrs::flowlog::{FlowAction, FlowHub, FlowRecord, NoPending, Reporter};
use iptables::apply::Backend;
use node_support::{ALLOWED_PORT, DENIED_PORT, NODE, TELNET_PORT, connects};

const SECURITY_TIER: &str = r#"
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 10}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: security.pass-web}
spec:
  tier: security
  order: 1
  selector: app == 'server'
  types: [Ingress]
  ingress:
    - action: Pass
      protocol: TCP
      destination: {ports: [8080]}
    - action: Pass
      protocol: TCP
      destination: {ports: [2323, 9090]}
"#;

fn has_hit(r: &FlowRecord, kind: &str, name_part: &str, action: FlowAction) -> bool {
    r.policies
        .enforced
        .iter()
        .any(|h| h.kind == kind && h.name.contains(name_part) && h.action == action)
}

fn flows_carry_the_deciding_policies(backend: Backend) {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&["ip", "conntrack"]);
    let args = DataplaneArgs {
        flow_logs: true,
        ..DataplaneArgs::default()
    };
    let w = node_support::with_manifest_dataplane(backend, SECURITY_TIER, &args);
    let view = render_node(
        &SourceArgs::manifests(vec![w.work.path().to_path_buf()]),
        NODE,
        &args,
    )
    .unwrap();
    let names = Arc::new(RwLock::new(Names::of(&view.resources, &view.renderer)));
    let hub = FlowHub::new(1000);
    let file = w.work.path().join("flows/flows.jsonl");
    let cfg = CollectorConfig {
        host: NODE.into(),
        file: Some(file.clone()),
        file_max_bytes: 4096,
        file_keep: 2,
        interval: Duration::from_secs(1),
        max_entries: 1000,
    };
    let (h, n) = (hub.clone(), names.clone());
    let mut collector = w
        .node
        .in_thread(move || Collector::start(cfg, h, n, Arc::new(NoPending)))
        .expect("collector starts");
    let mut live = hub.subscribe();

    // Allowed (passed by security, allowed by allow-web), denied by deny-telnet's Deny rule,
    // denied at the end of the default tier.
    let mut seen: Vec<FlowRecord> = Vec::new();
    let t0 = Instant::now();
    assert!(connects(&w.client.ns, w.server.v4, ALLOWED_PORT));
    // The allowed connection's first record reaches the hub within 2 s of its first packet.
    let first = loop {
        assert!(t0.elapsed() < Duration::from_secs(10), "{seen:#?}");
        match live.try_recv() {
            Ok(r) => {
                let allowed = r.dest.port == Some(ALLOWED_PORT);
                seen.push((*r).clone());
                if allowed {
                    break t0.elapsed();
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    assert!(
        first < Duration::from_secs(2),
        "first record after {first:?}"
    );
    assert!(!connects(&w.client.ns, w.server.v4, TELNET_PORT));
    assert!(!connects(&w.client.ns, w.server.v4, DENIED_PORT));

    let want = |seen: &[FlowRecord], port: u16, reporter: Reporter| {
        seen.iter()
            .any(|r| r.dest.port == Some(port) && r.reporter == reporter)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(want(&seen, ALLOWED_PORT, Reporter::Dst)
        && want(&seen, ALLOWED_PORT, Reporter::Src)
        && want(&seen, TELNET_PORT, Reporter::Dst)
        && want(&seen, DENIED_PORT, Reporter::Dst))
    {
        assert!(Instant::now() < deadline, "records so far: {seen:#?}");
        match live.try_recv() {
            Ok(r) => seen.push((*r).clone()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }

    let find = |port: u16, reporter: Reporter| {
        seen.iter()
            .find(|r| r.dest.port == Some(port) && r.reporter == reporter)
            .unwrap()
            .clone()
    };
    let ingress = find(ALLOWED_PORT, Reporter::Dst);
    assert_eq!(ingress.action, FlowAction::Allow, "{ingress:#?}");
    assert!(
        has_hit(
            &ingress,
            "GlobalNetworkPolicy",
            "pass-web",
            FlowAction::Pass
        ),
        "{ingress:#?}"
    );
    assert!(
        has_hit(&ingress, "NetworkPolicy", "allow-web", FlowAction::Allow),
        "{ingress:#?}"
    );
    let pass = ingress
        .policies
        .enforced
        .iter()
        .position(|h| h.action == FlowAction::Pass);
    let allow = ingress
        .policies
        .enforced
        .iter()
        .position(|h| h.action == FlowAction::Allow);
    assert!(pass < allow, "pass comes first: {ingress:#?}");
    let pass_hit = &ingress.policies.enforced[pass.unwrap()];
    assert_eq!(pass_hit.tier.as_deref(), Some("security"));
    assert_eq!(pass_hit.rule_index, Some(0));
    for end in [&ingress.source, &ingress.dest] {
        assert_eq!(end.kind, "wep");
        assert_eq!(end.namespace.as_deref(), Some("stats"));
    }
    assert_eq!(ingress.source.name.as_deref(), Some("client"));
    assert_eq!(ingress.dest.name.as_deref(), Some("server"));
    assert_eq!(
        ingress.dest.labels.get("app").map(String::as_str),
        Some("server")
    );
    assert_eq!(
        ingress.source.labels.get("app").map(String::as_str),
        Some("client")
    );

    let egress = find(ALLOWED_PORT, Reporter::Src);
    assert_eq!(egress.action, FlowAction::Allow);
    assert!(
        has_hit(&egress, "Profile", "kns.stats", FlowAction::Allow),
        "the client's namespace profile allows its egress: {egress:#?}"
    );

    let telnet = find(TELNET_PORT, Reporter::Dst);
    assert_eq!(telnet.action, FlowAction::Deny, "{telnet:#?}");
    let deny = telnet.policies.enforced.last().unwrap();
    assert_eq!(deny.kind, "GlobalNetworkPolicy");
    assert!(deny.name.contains("deny-telnet"), "{telnet:#?}");
    assert_eq!(
        (deny.tier.as_deref(), deny.rule_index),
        (Some("default"), Some(1))
    );

    let tier_end = find(DENIED_PORT, Reporter::Dst);
    assert_eq!(tier_end.action, FlowAction::Deny);
    let end = tier_end.policies.enforced.last().unwrap();
    assert_eq!(
        (end.kind.as_str(), end.name.as_str()),
        ("EndOfTier", "default")
    );

    // While its conntrack entry lives, an interval's record of the allowed connection carries
    // the traffic of that interval (a conntrack dump per interval), not nothing until its end.
    let counted = |r: &FlowRecord| {
        r.dest.port == Some(ALLOWED_PORT)
            && r.reporter == Reporter::Dst
            && r.num_connections_live == 1
            && r.packets_in > 0
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let counted_live = loop {
        if let Some(r) = seen.iter().find(|r| counted(r)) {
            break r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no live record with counts: {seen:#?}"
        );
        match live.try_recv() {
            Ok(r) => seen.push((*r).clone()),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    assert_eq!(
        counted_live.num_connections_completed, 0,
        "{counted_live:#?}"
    );

    // The allowed connection ends (its conntrack entry is deleted: DESTROY with its counts).
    w.node.ok(
        "conntrack",
        &["-D", "-p", "tcp", "--dport", &ALLOWED_PORT.to_string()],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let completed = loop {
        assert!(Instant::now() < deadline, "no completed record");
        match live.try_recv() {
            Ok(r)
                if r.dest.port == Some(ALLOWED_PORT)
                    && r.reporter == Reporter::Dst
                    && r.num_connections_completed == 1 =>
            {
                break (*r).clone();
            }
            Ok(_) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    // The server received the SYN, ACK, "ok"-less request side; it sent SYN-ACK and "ok": over
    // the live interval's record and the end's (which adds only what the dump had not).
    let (packets_in, packets_out, bytes_out) = (
        counted_live.packets_in + completed.packets_in,
        counted_live.packets_out + completed.packets_out,
        counted_live.bytes_out + completed.bytes_out,
    );
    assert!(packets_in >= 2, "{counted_live:#?} {completed:#?}");
    assert!(packets_out >= 2, "{counted_live:#?} {completed:#?}");
    assert!(
        bytes_out > packets_out * 40,
        "{counted_live:#?} {completed:#?}"
    );
    assert_eq!(completed.num_connections_live, 0);

    collector.stop();
    assert!(
        collector
            .stats
            .records
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    // The file holds the interval aggregates as JSON lines, in at most 2 files.
    let dir = file.parent().unwrap();
    let files: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    assert!(files.len() <= 2, "{files:?}");
    let text = std::fs::read_to_string(&file).unwrap_or_default()
        + &std::fs::read_to_string(dir.join("flows.jsonl.1")).unwrap_or_default();
    let lines: Vec<FlowRecord> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines.iter().any(|r| r.dest.port == Some(TELNET_PORT)),
        "{text}"
    );
}

#[test]
fn flows_carry_the_deciding_policies_legacy() {
    flows_carry_the_deciding_policies(Backend::Legacy);
}

#[test]
fn flows_carry_the_deciding_policies_nft() {
    flows_carry_the_deciding_policies(Backend::Nft);
}

/// The flow-log sockets get their 32 MiB receive buffer past `net.core.rmem_max`
/// (`SO_RCVBUFFORCE`, root): the load bench lost 61% of NFLOG messages to the capped
/// `SO_RCVBUF` (BENCHMARKS.md, "Issue 27: flow logs under load").
#[test]
fn flow_log_sockets_get_their_receive_buffer_past_rmem_max() {
    felixrs_test_support::require_root();
    let s = netlink_sys::Socket::new(netlink_sys::constants::NETLINK_NETFILTER).unwrap();
    felixrs::flowlog::size_receive_buffer(&s);
    // The kernel reports twice what was set (its bookkeeping), so at least the size asked for.
    let got = rustix::net::sockopt::socket_recv_buffer_size(&s).unwrap();
    assert!(
        got >= felixrs::flowlog::SOCKET_RCVBUF,
        "receive buffer {got}"
    );
}

/// The kernel's drops at a full netlink socket are read as the kernel counts them (what
/// `felixrs_flow_logs_*_socket_drops_total` export): a route socket with the smallest buffer,
/// never read while 300 links come up (150 veth pairs) in a namespace of the test's, has drops, and the reader
/// finds exactly that socket's.
#[test]
fn a_full_netlink_sockets_kernel_drops_are_read_by_its_inode() {
    use felixrs::flowlog::drops;
    use std::io::Write;
    felixrs_test_support::require_root();
    let ns = felixrs_test_support::netns::Netns::with_tag("fldrops");
    let (own, other) = ns.in_thread(|| {
        let mut s = netlink_sys::Socket::new(netlink_sys::constants::NETLINK_ROUTE).unwrap();
        s.bind_auto().unwrap();
        s.set_rx_buf_sz(1).unwrap();
        s.add_membership(1).unwrap(); // RTNLGRP_LINK
        let mut quiet = netlink_sys::Socket::new(netlink_sys::constants::NETLINK_ROUTE).unwrap();
        quiet.bind_auto().unwrap();
        let mut ip = std::process::Command::new("ip")
            .args(["-batch", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let script: String = (0..150)
            .map(|i| format!("link add va{i} type veth peer name vb{i}\n"))
            .collect();
        ip.stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        assert!(ip.wait().unwrap().success(), "ip -batch");
        let table = drops::read_table().expect("/proc/thread-self/net/netlink");
        let read = |s: &netlink_sys::Socket| drops::drops_in(&table, drops::socket_inode(s)?);
        (read(&s), read(&quiet))
    });
    assert!(
        own.is_some_and(|n| n > 0),
        "the subscribed socket's drops: {own:?}"
    );
    assert_eq!(other, Some(0), "a socket in no group drops nothing");
}
