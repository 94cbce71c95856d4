//! The learner wired into the agent's dataplane (`KernelDataplane::with_learner`) on the real
//! kernel, in a throwaway node namespace (root): the persisted learned map is loaded before the
//! first apply, so the domain set the first apply creates is created full; after the apply the
//! learner knows the set by its kernel name; the hold queue is bound only then (not before the
//! first apply); a response learned afterwards lands in the kernel set;
//! the hold rule for the trusted server is in mangle `cali-POSTROUTING`; and the map is persisted
//! for the next start.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use felixrs::agent::apply_loop::Dataplane;
use felixrs::agent::kernel::KernelDataplane;
use felixrs::cmd::shared::dataplane_args::DataplaneArgs;
use felixrs::cmd::shared::node_view::{SourceArgs, render_node};
use felixrs::dns::learner::{Learner, LearnerConfig, SystemClock};
use felixrs::dns::metrics::DnsMetrics;
use felixrs::dns::persist;
use felixrs::dns::setwriter::NetlinkSetWriter;
use felixrs_test_support::netns::Netns;
use iptables::apply::{Backend, ExecRunner};

const GNP: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: web-to-api}
spec:
  order: 1
  selector: app == 'web'
  types: [Egress]
  egress:
  - action: Allow
    protocol: TCP
    destination: {domains: ["*.example.com"], ports: [443]}
"#;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn udp4(dns: &[u8]) -> Vec<u8> {
    let total = 28 + dns.len();
    let mut p = vec![0x45, 0];
    p.extend((total as u16).to_be_bytes());
    p.extend([0, 0, 0x40, 0, 64, 17, 0, 0, 10, 96, 0, 10, 10, 65, 1, 10]);
    p.extend(53u16.to_be_bytes());
    p.extend(40000u16.to_be_bytes());
    p.extend(((8 + dns.len()) as u16).to_be_bytes());
    p.extend([0, 0]);
    p.extend(dns);
    p
}

/// A response for `name` A `addr`, TTL 120, written by hand (header, question, one answer).
fn response(name: &str, addr: [u8; 4]) -> Vec<u8> {
    let mut m = vec![0x12, 0x34, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0];
    for l in name.split('.') {
        m.push(l.len() as u8);
        m.extend(l.as_bytes());
    }
    m.extend([0, 0, 1, 0, 1]);
    m.extend([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 120, 0, 4]);
    m.extend(addr);
    m
}

#[test]
fn the_first_apply_creates_domain_sets_full_and_later_answers_reach_them() {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&["ip", "ipset", "iptables-nft", "iptables-nft-save"]);
    let node = Netns::with_tag("dnsw");
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("domains.yaml"), GNP).unwrap();
    let state = work.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let file = state.join(persist::FILE_NAME);
    let now = now_ms();
    std::fs::write(
        &file,
        format!(
            r#"{{"version":1,"entries":[
              {{"name":"api.example.com","addr":"192.0.2.1","learned_at_ms":{now},"ttl_secs":300,"expires_at_ms":{}}},
              {{"name":"old.example.com","addr":"192.0.2.2","learned_at_ms":0,"ttl_secs":5,"expires_at_ms":5000}}]}}"#,
            now + 300_000
        ),
    )
    .unwrap();

    let args = DataplaneArgs {
        dns_trusted_servers: vec!["10.96.0.10:53".parse().unwrap()],
        ..DataplaneArgs::default()
    };
    let cfg = LearnerConfig {
        trusted_servers: args.dns_trusted_servers.clone(),
        min_ttl: 0,
        max_learned: 1000,
        persist_path: Some(file.clone()),
    };
    let map = Learner::load_map(&cfg, &SystemClock);
    assert_eq!(map.len(), 1, "the expired entry is dropped on load");
    let writer = node.in_thread(|| NetlinkSetWriter::open().expect("ipset netlink socket"));
    let learner = Arc::new(Learner::new(
        cfg,
        map,
        Box::new(writer),
        Arc::new(SystemClock),
        DnsMetrics::default(),
    ));
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-cluster");
    let view = render_node(
        &SourceArgs::manifests(vec![demo, work.path().to_path_buf()]),
        "node-1",
        &args,
    )
    .unwrap();
    let mut dp = KernelDataplane::new(
        ExecRunner::in_netns(node.name()).unwrap(),
        Backend::Nft,
        args.render_config(),
    )
    .unwrap()
    .with_learner(learner.clone());
    // The agent's queue thread, in the node's namespace: it waits for the first apply.
    let queue = {
        let l = learner.clone();
        node.in_thread(move || felixrs::dns::queue::spawn_retrying(100, l))
    };
    let bound = || {
        node.ok("cat", &["/proc/net/netfilter/nfnetlink_queue"])
            .lines()
            .any(|l| l.split_whitespace().next() == Some("100"))
    };
    assert!(!bound(), "queue bound before the first apply");
    assert_eq!(learner.metrics.queue_bound.get(), 0);
    dp.apply(view.outputs.clone()).expect("apply");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !bound() {
        assert!(
            std::time::Instant::now() < deadline,
            "queue not bound after the apply"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    queue.stop();

    let active = learner.active();
    assert_eq!(active.len(), 1, "{active:?}");
    let set = active[0].v4_set.clone().expect("an IPv4 domain set");
    assert!(set.starts_with("cali40d:"), "{set}");
    let members = |set: &str| -> Vec<IpAddr> {
        node.ok("ipset", &["list", set])
            .lines()
            .skip_while(|l| !l.starts_with("Members:"))
            .skip(1)
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    };
    assert_eq!(members(&set), vec!["192.0.2.1".parse::<IpAddr>().unwrap()]);
    let mangle = node.ok("iptables-nft-save", &["-t", "mangle"]);
    assert!(
        mangle.contains("-s 10.96.0.10/32") && mangle.contains("--queue-num 100"),
        "{mangle}"
    );

    // A response learned after the apply goes straight to the kernel set.
    let pkt = udp4(&response("www.example.com", [192, 0, 2, 3]));
    assert_eq!(
        learner.handle(&[&pkt]),
        vec![felixrs::dns::Verdict::Release]
    );
    let mut got = members(&set);
    got.sort();
    assert_eq!(
        got,
        vec![
            "192.0.2.1".parse::<IpAddr>().unwrap(),
            "192.0.2.3".parse().unwrap()
        ]
    );
    // A re-apply keeps the learned members (the applier never diffs domain sets).
    dp.refresh().expect("refresh");
    assert_eq!(members(&set).len(), 2);

    learner.persist();
    let back = persist::load(&file, 1000, now_ms()).unwrap().unwrap();
    let mut names: Vec<&str> = back.iter_lru().map(|(n, _, _)| n).collect();
    names.sort();
    assert_eq!(names, ["api.example.com", "www.example.com"]);
    // Leave the node's sets to the namespace's deletion.
}
