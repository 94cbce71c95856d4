//! Datastore faults (issue 23), in sequence on one 3-member etcd cluster (its own network
//! namespace) and one node namespace with three pods: `server`, whose policy admits only `client`,
//! and `intruder`, which connects to the server (v4 and v6) back to back for the whole test. The
//! agent reaches each member through a TCP relay the test owns (`test_support::relay`), so the
//! path can be cut for real. Each scenario asserts that no intruder connection was delivered, that
//! `client` still gets through, and that the kernel then holds exactly what a fresh agent (new
//! namespace, same etcd) programs:
//! 1. compaction past the agent's watch revision while it is cut off and policies change: one
//!    relist, and no unchanged rule rewritten (its kernel counters keep growing);
//! 2. the member the agent's watch talks to is killed, then the leader, while policies change
//!    through the survivors: the agent follows (it has every member's endpoint) and converges;
//! 3. a 60 s cut (a blackhole: connections stay open, nothing crosses) while policies change:
//!    converged within 1 s plus the agent's reconnect backoff (at most 1 s) of the path healing;
//! 4. 1,000 policy changes in one second: coalesced into far fewer applies, memory bounded,
//!    converged to the final state; then the latency of single changes (p99 printed).
//!
//! The figures are printed (`--nocapture`) for RELIABILITY-etcd.md.

mod support;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use calc_graph::model::EtcdPrefix;
use felixrs::agent::syncer::SyncerConfig;
use felixrs_test_support::etcd::cluster::EtcdCluster;
use felixrs_test_support::netns::{Netns, in_netns};
use felixrs_test_support::node::{self, ALLOWED_PORT, Dataplane, NodeWorld};
use felixrs_test_support::prober::{Counts, Prober};
use felixrs_test_support::relay::{Mode, Relay};
use serde_json::json;
use support::{Agent, PREFIX};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The agent's longest pause between two reconnect attempts.
fn max_backoff() -> Duration {
    SyncerConfig::new(EtcdPrefix::default()).max_backoff
}

/// The bound for convergence once the watch resumes.
const RESUME_BOUND: Duration = Duration::from_secs(1);

fn iface(pod: &str) -> String {
    format!("cali0{pod}")
}

fn pod_key(pod: &str) -> String {
    format!("{PREFIX}workloadendpoints/stats/node--1-k8s-{pod}-eth0")
}

fn seed(cluster: &EtcdCluster) -> i64 {
    cluster.put(
        &format!("{PREFIX}tiers/default"),
        &json!({"apiVersion":"projectcalico.org/v3","kind":"Tier",
                "metadata":{"name":"default"},"spec":{"order":1000000}})
        .to_string(),
    );
    cluster.put(
        &format!("{PREFIX}profiles/kns.stats"),
        &json!({"apiVersion":"projectcalico.org/v3","kind":"Profile","metadata":{"name":"kns.stats"},
                "spec":{"ingress":[{"action":"Allow"}],"egress":[{"action":"Allow"}]}})
        .to_string(),
    );
    for (pod, n) in [("client", 1), ("server", 2), ("intruder", 3)] {
        cluster.put(
            &pod_key(pod),
            &json!({"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint",
                    "metadata":{"name":format!("node--1-k8s-{pod}-eth0"),"namespace":"stats",
                                "labels":{"app":pod,"projectcalico.org/namespace":"stats",
                                          "projectcalico.org/orchestrator":"k8s"}},
                    "spec":{"orchestrator":"k8s","node":node::NODE,"pod":pod,"endpoint":"eth0",
                            "interfaceName":iface(pod),
                            "ipNetworks":[format!("10.79.0.{n}/32"), format!("fd79::{n}/128")],
                            "profiles":["kns.stats"]}})
            .to_string(),
        );
    }
    cluster.put_rev(
        &format!("{PREFIX}networkpolicies/stats/server-admits-client"),
        &json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
                "metadata":{"name":"server-admits-client","namespace":"stats"},
                "spec":{"tier":"default","order":100,"selector":"app == 'server'",
                        "types":["Ingress"],
                        "ingress":[{"action":"Allow","source":{"selector":"app == 'client'"}}]}})
        .to_string(),
    )
}

/// Change number `n`: one of a few policies on the server, rewritten (never admitting the
/// intruder: a Deny of it on one port, an Allow of the client on another).
fn churn(prefix: &str, slots: usize, n: usize) -> (String, String) {
    let name = format!("{prefix}-{}", n % slots);
    let value = json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
        "metadata":{"name":name,"namespace":"stats"},
        "spec":{"tier":"default","order":200 + n % slots,"selector":"app == 'server'",
                "types":["Ingress"],
                "ingress":[
                    {"action":"Deny","protocol":"TCP","source":{"selector":"app == 'intruder'"},
                     "destination":{"ports":[1024 + n % 30000]}},
                    {"action":"Allow","protocol":"TCP","source":{"selector":"app == 'client'"},
                     "destination":{"ports":[31024 + n % 30000]}}]}});
    (
        format!("{PREFIX}networkpolicies/stats/{name}"),
        value.to_string(),
    )
}

/// The node programmed by the agent under test, through one relay per member.
struct AgentPlane {
    etcd_ns: String,
    members: Vec<SocketAddr>,
    state: PathBuf,
    seeded: i64,
}

struct Programmed {
    agent: Agent,
    relays: Vec<Relay>,
}

impl Dataplane for AgentPlane {
    type Programmed = Programmed;

    fn interface_of(&self, pod: &str) -> String {
        iface(pod)
    }

    fn program(self, node: &Netns) -> Programmed {
        let relays: Vec<Relay> = (self.members.iter())
            .map(|m| Relay::start(node.name(), LOCALHOST, &self.etcd_ns, *m))
            .collect();
        let endpoints: Vec<String> = relays.iter().map(Relay::url).collect();
        let agent = Agent::start_with(
            node.name(),
            &endpoints.join(","),
            &self.state,
            &[] as &[&str],
        );
        agent.wait_applied(self.seeded);
        Programmed { agent, relays }
    }
}

fn metric(agent: &Agent, name: &str) -> u64 {
    let (_, m) = agent.get("/metrics").unwrap();
    m.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Our rules (by family, table and chain, in order; hook rules included) and our IP sets (members
/// sorted; the kernel's hash size, bucket size and random seed left out: they grow or differ).
type Ours = BTreeMap<String, Vec<String>>;

fn ours(ns: &Netns) -> Ours {
    let mut m = Ours::new();
    for tool in ["iptables-nft-save", "ip6tables-nft-save"] {
        let mut table = String::new();
        for l in ns.ok(tool, &[]).lines() {
            if let Some(t) = l.strip_prefix('*') {
                table = t.to_string();
            }
            let Some(rule) = l.strip_prefix("-A ").filter(|r| r.contains("cali")) else {
                continue;
            };
            let chain = rule.split(' ').next().unwrap_or_default();
            (m.entry(format!("{tool} {table} {chain}")).or_default()).push(rule.to_string());
        }
    }
    for l in ns.ok("ipset", &["save"]).lines() {
        let mut w: Vec<&str> = l.split(' ').collect();
        if w.len() < 2 || !w[1].starts_with("cali") {
            continue;
        }
        for field in ["hashsize", "initval", "bucketsize"] {
            if let Some(i) = w.iter().position(|x| *x == field) {
                w.drain(i..(i + 2).min(w.len()));
            }
        }
        (m.entry(format!("ipset {}", w[1])).or_default()).push(w.join(" "));
    }
    for (k, v) in m.iter_mut() {
        if k.starts_with("ipset ") {
            v.sort();
        }
    }
    m
}

/// Packets per rule of ours (`iptables-nft-save -c`), keyed by family, table, rule and occurrence.
fn counters(ns: &Netns) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for tool in ["iptables-nft-save", "ip6tables-nft-save"] {
        let mut table = String::new();
        for l in ns.ok(tool, &["-c"]).lines() {
            if let Some(t) = l.strip_prefix('*') {
                table = t.to_string();
            }
            let Some((count, rule)) = l.strip_prefix('[').and_then(|r| r.split_once("] ")) else {
                continue;
            };
            if !rule.starts_with("-A ") || !rule.contains("cali") {
                continue;
            }
            let packets: u64 = count.split(':').next().unwrap().parse().unwrap();
            let mut n = 0;
            while m.contains_key(&format!("{tool} {table} {rule} #{n}")) {
                n += 1;
            }
            m.insert(format!("{tool} {table} {rule} #{n}"), packets);
        }
    }
    m
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The shared world and its running probers.
/// (Dropped in this order: probers, pods and node, then etcd.)
struct World {
    intruder: Vec<Prober>,
    client: Prober,
    _intruder_pod: node::Pod,
    node: NodeWorld<Programmed>,
    cluster: EtcdCluster,
    etcd_ns: Netns,
    members: Vec<SocketAddr>,
}

impl World {
    fn agent(&self) -> &Agent {
        &self.node.agent
    }

    fn relays(&self) -> &[Relay] {
        &self.node.relays
    }

    fn cut(&self, mode: Mode, reset: bool) {
        for r in self.relays() {
            r.set_mode(mode);
            if reset {
                r.reset();
            }
        }
    }

    fn denied(&self) -> Counts {
        (self.intruder.iter()).fold(Counts::default(), |a, p| {
            let c = p.counts();
            Counts {
                attempts: a.attempts + c.attempts,
                delivered: a.delivered + c.delivered,
            }
        })
    }

    /// Long-polls `/status` until `applied_revision >= rev` (up to `limit`); the time it took.
    fn time_to_apply(&self, rev: i64, limit: Duration) -> Duration {
        let t = Instant::now();
        let s = self.agent().wait_applied(rev);
        let took = t.elapsed();
        assert!(took <= limit, "applied {rev} only after {took:?}: {s}");
        took
    }

    /// Runs `scenario` with the probers going; asserts nothing of the intruder's was delivered,
    /// the client still got through, and the kernel then matches a fresh agent's at `rev`.
    fn scenario(&mut self, name: &str, scenario: impl FnOnce(&mut World) -> (i64, String)) {
        let (d0, c0) = (self.denied(), self.client.counts());
        let t = Instant::now();
        let (rev, figures) = scenario(self);
        // The client's prober must get through again after the fault.
        let deadline = Instant::now() + Duration::from_secs(10);
        let c1 = self.client.counts();
        while self.client.counts().delivered == c1.delivered {
            assert!(
                Instant::now() < deadline,
                "{name}: client cut off after the fault"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let (d, c) = (self.denied() - d0, self.client.counts() - c0);
        assert_eq!(
            d.delivered, 0,
            "{name}: {} of {} intruder connections delivered",
            d.delivered, d.attempts
        );
        assert!(d.attempts >= 5, "{name}: intruder prober stalled: {d:?}");
        let fresh = self.fresh_render(rev);
        let now = ours(&self.node.node);
        if now != fresh {
            let keys: std::collections::BTreeSet<_> = now.keys().chain(fresh.keys()).collect();
            let diff: Vec<String> = keys
                .into_iter()
                .filter(|k| now.get(*k) != fresh.get(*k))
                .map(|k| {
                    format!(
                        "{k}:\n  kernel: {:?}\n  fresh:  {:?}",
                        now.get(k),
                        fresh.get(k)
                    )
                })
                .collect();
            panic!(
                "{name}: kernel differs from a fresh agent's:\n{}",
                diff.join("\n")
            );
        }
        eprintln!(
            "FAULT {name}: {:.1} s, intruder {}/{} delivered, client {}/{} delivered; {figures}",
            t.elapsed().as_secs_f64(),
            d.delivered,
            d.attempts,
            c.delivered,
            c.attempts
        );
    }

    /// What a fresh agent (new namespace, a relay to a running member) programs at `rev`.
    fn fresh_render(&self, rev: i64) -> Ours {
        let ns = Netns::with_tag("fresh");
        let member = (0..self.cluster.len())
            .find(|i| self.cluster.pid(*i).is_some())
            .expect("a running member");
        let relay = Relay::start(
            ns.name(),
            LOCALHOST,
            self.etcd_ns.name(),
            self.members[member],
        );
        let (_dir, state) = support::state_dir();
        let agent = Agent::start_with(ns.name(), &relay.url(), &state, &[] as &[&str]);
        agent.wait_applied(rev);
        ours(&ns)
    }
}

/// 1: etcd compacts past the agent's watch revision while it is cut off and policies change.
fn compaction(w: &mut World) -> (i64, String) {
    let node = &w.node.node;
    let before = counters(node);
    let (resyncs, applies) = (
        metric(w.agent(), "felixrs_resyncs_total"),
        metric(w.agent(), "felixrs_apply_seconds_count"),
    );
    w.cut(Mode::Blackhole, true);
    let disconnected = w.agent().poll_status(Duration::from_secs(15), |s| {
        s["datastore_connected"] == false
    });
    assert_eq!(disconnected["datastore_connected"], false, "{disconnected}");
    let mut rev = 0;
    for n in 0..5 {
        let (k, v) = churn("churn", 3, n);
        rev = w.cluster.put_rev(&k, &v);
    }
    w.cluster.compact(rev);
    w.cut(Mode::Forward, false);
    let took = w.time_to_apply(rev, Duration::from_secs(10));
    let relists = metric(w.agent(), "felixrs_resyncs_total") - resyncs;
    let applies = metric(w.agent(), "felixrs_apply_seconds_count") - applies;
    assert_eq!(relists, 1, "one relist after the compaction");
    assert!(
        w.agent().log().contains("watch revision compacted"),
        "no compaction in the agent's log"
    );
    // Let the client's traffic run through the unchanged rules, then compare their counters: a
    // rewritten rule starts again from zero.
    std::thread::sleep(Duration::from_millis(500));
    let after = counters(node);
    let common: Vec<_> = before.keys().filter(|k| after.contains_key(*k)).collect();
    let reset: Vec<_> = common.iter().filter(|k| after[**k] < before[**k]).collect();
    assert!(reset.is_empty(), "rules rewritten by the relist: {reset:?}");
    let grew = common.iter().filter(|k| after[**k] > before[**k]).count();
    assert!(grew > 0, "no counter of an unchanged rule grew");
    assert!(applies <= 2, "{applies} applies for one relist");
    let figures = format!(
        "converged {:.0} ms after the path healed; {relists} relist, {applies} apply, \
         {} unchanged rules kept (none rewritten, {grew} counting on)",
        took.as_secs_f64() * 1e3,
        common.len()
    );
    (rev, figures)
}

/// Which member the agent's watch talks to: the relay with the most traffic (progress requests
/// every second) over a few seconds.
fn talked_to(w: &World) -> (usize, Vec<u64>) {
    let b0: Vec<u64> = w.relays().iter().map(Relay::bytes).collect();
    std::thread::sleep(Duration::from_secs(3));
    let d: Vec<u64> = (w.relays().iter().zip(b0))
        .map(|(r, b)| r.bytes() - b)
        .collect();
    ((0..d.len()).max_by_key(|i| d[*i]).unwrap(), d)
}

/// Kills member `i` while changes are written through the survivors; the time from the kill and
/// from the last write to the last change applied. Restarts it afterwards.
fn kill_while_changing(w: &mut World, i: usize, from: usize) -> (i64, Duration, Duration) {
    let t = Instant::now();
    w.cluster.kill(i);
    let mut rev = 0;
    for n in from..from + 5 {
        let (k, v) = churn("churn", 3, n);
        rev = w.cluster.put_rev(&k, &v);
        std::thread::sleep(Duration::from_millis(200));
    }
    let after_write = w.time_to_apply(rev, Duration::from_secs(20));
    let took = t.elapsed();
    w.cluster.restart(i);
    (rev, took, after_write)
}

/// 2: the member the agent talks to is killed, then the leader.
fn member_kills(w: &mut World) -> (i64, String) {
    let (talk, bytes) = talked_to(w);
    let disconnects = metric(w.agent(), "felixrs_datastore_disconnects_total");
    let (_, t1, a1) = kill_while_changing(w, talk, 10);
    let lost = metric(w.agent(), "felixrs_datastore_disconnects_total") - disconnects;
    assert!(lost >= 1, "killing m{talk} did not cut the agent's watch");
    let leader = w.cluster.leader();
    let (rev, t2, a2) = kill_while_changing(w, leader, 20);
    let figures = format!(
        "watch's member m{talk} (relayed bytes over 3 s: {bytes:?}) killed: 5 changes applied {:.1} s after the kill ({:.0} ms after \
         the last write); leader m{leader} killed: {:.1} s ({:.0} ms)",
        t1.as_secs_f64(),
        a1.as_secs_f64() * 1e3,
        t2.as_secs_f64(),
        a2.as_secs_f64() * 1e3
    );
    (rev, figures)
}

/// 3: the agent cut off for 60 s while policies change.
fn long_cut(w: &mut World) -> (i64, String) {
    let applied = w.agent().status()["applied_revision"].as_i64().unwrap();
    w.cut(Mode::Blackhole, false);
    let t = Instant::now();
    let mut rev = 0;
    for n in 0..6 {
        std::thread::sleep(
            (t + Duration::from_secs(5 + 10 * n)).saturating_duration_since(Instant::now()),
        );
        let (k, v) = churn("churn", 3, 30 + n as usize);
        rev = w.cluster.put_rev(&k, &v);
    }
    std::thread::sleep((t + Duration::from_secs(60)).saturating_duration_since(Instant::now()));
    let s = w.agent().status();
    assert_eq!(
        s["applied_revision"].as_i64(),
        Some(applied),
        "the cut leaked: {s}"
    );
    assert_eq!(
        s["datastore_connected"], false,
        "the agent did not notice the cut: {s}"
    );
    // The bound holds only if the agent retries often enough after a long outage.
    assert!(
        max_backoff() <= RESUME_BOUND,
        "reconnect backoff {:?}",
        max_backoff()
    );
    w.cut(Mode::Forward, false);
    let took = w.time_to_apply(rev, RESUME_BOUND + max_backoff());
    let figures = format!(
        "cut 60 s, 6 changes meanwhile; converged {:.0} ms after the path healed \
         (bound {:?} + backoff {:?})",
        took.as_secs_f64() * 1e3,
        RESUME_BOUND,
        max_backoff()
    );
    (rev, figures)
}

/// Writes 1,000 changes over one second (one put every millisecond, not waiting for the previous
/// one) from inside the etcd namespace; the last revision and how long the writes took.
fn burst(etcd_ns: &str, endpoint: SocketAddr) -> (i64, Duration) {
    in_netns(etcd_ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client = etcd_client::Client::connect([format!("http://{endpoint}")], None)
                .await
                .expect("connect etcd");
            let t = tokio::time::Instant::now();
            let puts = (0..1000usize).map(|i| {
                let (k, v) = churn("burst", 100, i);
                let mut c = client.clone();
                async move {
                    tokio::time::sleep_until(t + Duration::from_millis(i as u64)).await;
                    c.put(k, v, None).await
                }
            });
            let mut last = 0;
            for r in futures::future::join_all(puts).await {
                let r = r.expect("burst put");
                last = last.max(r.header().map_or(0, |h| h.revision()));
            }
            (last, t.elapsed())
        })
    })
}

/// 4: a burst of 1,000 policy changes in one second, then single changes.
fn burst_then_singles(w: &mut World) -> (i64, String) {
    let pid = w.agent().pid().expect("agent runs");
    let rss0 = rss_kib(pid);
    let applies0 = metric(w.agent(), "felixrs_apply_seconds_count");
    let updates0 = metric(w.agent(), "felixrs_datastore_updates_total");
    let leader = w.cluster.leader();
    let (rev, wrote) = burst(w.etcd_ns.name(), w.members[leader]);
    let t = Instant::now();
    w.time_to_apply(rev, Duration::from_secs(60));
    let converged = t.elapsed();
    let applies = metric(w.agent(), "felixrs_apply_seconds_count") - applies0;
    let updates = metric(w.agent(), "felixrs_datastore_updates_total") - updates0;
    assert_eq!(updates, 1000, "every change reached the agent");
    assert!(
        applies <= 100,
        "{applies} applies for 1,000 changes: not coalesced"
    );
    let rss1 = rss_kib(pid);
    assert!(
        rss1 <= rss0 + 64 * 1024,
        "agent RSS grew from {rss0} KiB to {rss1} KiB over the burst"
    );
    let mut lat: Vec<Duration> = Vec::new();
    let mut last = rev;
    for n in 0..50 {
        let (k, v) = churn("burst", 100, 1000 + n * 7);
        last = w.cluster.put_rev(&k, &v);
        lat.push(w.time_to_apply(last, Duration::from_secs(10)));
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
    let p99 = pct(0.99);
    assert!(p99 <= Duration::from_secs(2), "single-change p99 {p99:?}");
    let rss2 = rss_kib(pid);
    let figures = format!(
        "1,000 changes written in {:.2} s, converged {:.2} s after the last in {applies} applies; \
         RSS {} -> {} -> {} MiB (before, after the burst, after 50 singles); single changes: \
         p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        wrote.as_secs_f64(),
        converged.as_secs_f64(),
        rss0 / 1024,
        rss1 / 1024,
        rss2 / 1024,
        pct(0.5).as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        lat[lat.len() - 1].as_secs_f64() * 1e3
    );
    (last, figures)
}

#[test]
fn datastore_faults() {
    felixrs_test_support::require_root();
    let etcd_ns = Netns::with_tag("etcd");
    let cluster = EtcdCluster::start_in(3, Some(etcd_ns.name()), LOCALHOST);
    let members: Vec<SocketAddr> = (0..cluster.len())
        .map(|i| cluster.client_url(i)["http://".len()..].parse().unwrap())
        .collect();
    let seeded = seed(&cluster);
    let (_dir, state) = support::state_dir();
    let plane = AgentPlane {
        etcd_ns: etcd_ns.name().to_string(),
        members: members.clone(),
        state,
        seeded,
    };
    let node = NodeWorld::build(|_| plane);
    let intruder_pod = node::add_pod(&node.node, &iface("intruder"), "10.79.0.3", "fd79::3");
    // The intruder's path works (to the client, whom no policy isolates), so what keeps it from the
    // server is the policy.
    for addr in [node.client.v4, node.client.v6] {
        node::serve(&node.client.ns, addr, ALLOWED_PORT);
        assert!(
            (0..5).any(|_| node::connects(&intruder_pod.ns, addr, ALLOWED_PORT)),
            "intruder cannot reach the client at {addr}"
        );
    }
    let timeout = Duration::from_millis(150);
    let intruder = [node.server.v4, node.server.v6]
        .map(|a| {
            Prober::start(
                intruder_pod.ns.name(),
                SocketAddr::new(a, ALLOWED_PORT),
                2,
                timeout,
            )
        })
        .into();
    let client = Prober::start(
        node.client.ns.name(),
        SocketAddr::new(node.server.v4, ALLOWED_PORT),
        1,
        Duration::from_millis(500),
    );
    let mut w = World {
        cluster,
        etcd_ns,
        members,
        node,
        intruder,
        client,
        _intruder_pod: intruder_pod,
    };
    w.scenario("compaction", compaction);
    w.scenario("member kills", member_kills);
    w.scenario("60 s cut", long_cut);
    w.scenario("burst", burst_then_singles);
}
