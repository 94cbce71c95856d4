//! Outgoing NAT, services and DNS end to end: the real `policy-controller` and `felixrs agent`
//! binaries, a real etcd, a real `dnsmasq`, and the kernel datapath of a two-node cluster with an
//! "internet" host behind it (`felixrs_e2e::nat`). kube-proxy (iptables mode) and Docker shaped
//! nat rules are written into both nodes before the agents start, as on a real node.
//!
//! Its own cluster (not the conformance test's): the internet host needs forwarding in the infra
//! namespace, and the pools need pods placed in chosen address ranges.
//!
//! Pods (node-1: 10.78.1.x, node-2: 10.78.2.x) and pools:
//! * `pool-node1` 10.78.1.0/24 natOutgoing: `nat/out` .10, `svc/client` .11, `dnsc/isolated` .12
//! * `pool-plain` 10.78.2.8/30 no NAT: `nat/peer` .10, `nat/plain` .11
//! * `pool-old` 10.78.2.12/30 natOutgoing, disabled: `nat/old` .12, `svc/backend` .13, `dns/dns` .14
//! * IPv6: `pool-node1-v6` fd78:1::/64 natOutgoing, `pool-node2-v6` fd78:2::/64 no NAT
//!
//! Prints a PASS/FAIL line per check and `N passed, M failed`.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use felixrs_e2e::cluster::Cluster;
use felixrs_e2e::driver::{Agent, Etcd, Proc, binary, controller_sync, start_etcd, wait_for};
use felixrs_e2e::nat::{
    self, INTERNET_IP, INTERNET_IP6, PodSpec, ServicePort, WHOAMI_PORT, WhoAmI, foreign_nat_lines,
    ip_pool, resolve_a, resolve_a_tcp, seen_as,
};
use felixrs_e2e::report::Tally;
use felixrs_e2e::traffic::{Probe, Proto, Servers, probe_once};
use felixrs_test_support::{require_root, require_tools};

const APPLY_TIMEOUT: Duration = Duration::from_secs(30);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a check polls for the expected outcome (the agents have applied by then; this only
/// absorbs a loaded machine).
const SETTLE: Duration = Duration::from_secs(10);

const NODE1_IP: &str = "10.77.0.11";
const NODE2_IP: &str = "10.77.0.12";
const WEB_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const DNS_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const WEB_NAME: &str = "web.svc.cluster.test";

const LABELS: &[PodSpec<'static>] = &[
    ("svc", "client", &[("app", "client")]),
    ("svc", "backend", &[("app", "backend")]),
    ("dns", "dns", &[("k8s-app", "kube-dns")]),
];

struct Env {
    cluster: Cluster,
    _internet: felixrs_test_support::netns::Netns,
    agents: Vec<Agent>,
    etcd: Etcd,
    work: tempfile::TempDir,
    _servers: Vec<Servers>,
    _whoami: Vec<WhoAmI>,
    _dnsmasq: Proc,
    /// Each node's foreign nat lines as written before the agents started.
    foreign: Vec<Vec<String>>,
    /// The datastore revision of the last sync.
    rev: i64,
}

fn services() -> Vec<ServicePort> {
    let backend = Ipv4Addr::new(10, 78, 2, 13);
    let dns = Ipv4Addr::new(10, 78, 2, 14);
    vec![
        ServicePort {
            name: "svc/web:http",
            id: "WEBHTTP4OJJ2PQ5S",
            vip: WEB_VIP,
            port: 80,
            proto: "tcp",
            backend,
            target: 80,
        },
        ServicePort {
            name: "svc/web:whoami",
            id: "WEBWHOAMIQX7TM2A",
            vip: WEB_VIP,
            port: WHOAMI_PORT,
            proto: "tcp",
            backend,
            target: WHOAMI_PORT,
        },
        ServicePort {
            name: "kube-system/kube-dns:dns",
            id: "TCOU7JCQXEZGVUNU",
            vip: DNS_VIP,
            port: 53,
            proto: "udp",
            backend: dns,
            target: 53,
        },
        ServicePort {
            name: "kube-system/kube-dns:dns-tcp",
            id: "ERIFXISQEP7F7OF4",
            vip: DNS_VIP,
            port: 53,
            proto: "tcp",
            backend: dns,
            target: 53,
        },
    ]
}

/// The world's pools and policies; `plain_nat` turns natOutgoing on for `pool-plain`,
/// `node1_pool` keeps `pool-node1`, `backend_from` is the app label the backend admits.
fn extra(plain_nat: bool, node1_pool: bool, backend_from: &str) -> Vec<String> {
    let mut docs = Vec::new();
    if node1_pool {
        docs.push(ip_pool("pool-node1", "10.78.1.0/24", true, false));
    }
    docs.push(ip_pool("pool-plain", "10.78.2.8/30", plain_nat, false));
    docs.push(ip_pool("pool-node1-v6", "fd78:1::/64", true, false));
    docs.push(ip_pool("pool-node2-v6", "fd78:2::/64", false, false));
    docs.push(ip_pool("pool-old", "10.78.2.12/30", true, true));
    docs.push(format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: backend, namespace: svc}}\n\
         spec:\n  podSelector: {{matchLabels: {{app: backend}}}}\n  ingress:\n  - from: [{{podSelector: {{matchLabels: {{app: {backend_from}}}}}}}]\n"
    ));
    docs.push(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: default-deny-ingress, namespace: dnsc}\n\
         spec:\n  podSelector: {}\n  policyTypes: [Ingress]\n"
            .to_string(),
    );
    docs
}

impl Env {
    fn sync(&mut self, extra: &[String]) -> Result<()> {
        let dir = self.work.path().join("manifests");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("world.yaml"),
            nat::manifests(&self.cluster, LABELS, extra),
        )?;
        let rev = controller_sync(&self.cluster.infra, &self.etcd.client_url(), &dir)?;
        for a in &mut self.agents {
            a.wait_applied(rev, APPLY_TIMEOUT)?;
        }
        self.rev = rev;
        // Every apply leaves kube-proxy's and Docker's nat rules exactly as they were.
        let broken = self.foreign_intact()?;
        if !broken.is_empty() {
            bail!("after applying revision {rev}: {}", broken.join("\n"));
        }
        Ok(())
    }

    fn pod_ns(&self, id: &str) -> String {
        self.cluster.pod(id).ns.name().to_string()
    }

    fn pod_ip(&self, id: &str) -> Ipv4Addr {
        self.cluster.pod(id).ip
    }

    /// Polls until `from` reaches the who-am-I server at `dst` and is seen as `want` (`None`: must
    /// not connect at all).
    fn expect_seen(&self, from: &str, dst: impl Into<IpAddr>, want: Option<&str>) -> Result<()> {
        let dst: IpAddr = dst.into();
        let ns = self.pod_ns(from);
        let mut last = None;
        let ok = wait_for(SETTLE, || {
            let got = seen_as(&ns, dst, WHOAMI_PORT, PROBE_TIMEOUT).ok()?;
            let hit = got.as_deref() == want;
            last = Some(got);
            hit.then_some(())
        });
        if ok.is_none() {
            bail!("{from} -> {dst}:{WHOAMI_PORT}: want seen as {want:?}, got {last:?}");
        }
        Ok(())
    }

    fn expect_connect(&self, from: &str, dst: Ipv4Addr, port: u16, want: bool) -> Result<()> {
        let ns = self.pod_ns(from);
        let probe = Probe {
            port,
            proto: Proto::Tcp,
        };
        let mut last = None;
        let ok = wait_for(SETTLE, || {
            let got = probe_once(&ns, dst.into(), probe, PROBE_TIMEOUT).ok()?;
            last = Some(got);
            (got == want).then_some(())
        });
        if ok.is_none() {
            bail!("{from} -> {dst}:{port}/TCP: want connected={want}, got {last:?}");
        }
        Ok(())
    }

    /// Every node's foreign nat rules are still exactly those written before the agents started.
    fn foreign_intact(&self) -> Result<Vec<String>> {
        let mut failures = Vec::new();
        for (i, n) in self.cluster.nodes.iter().enumerate() {
            let now = foreign_nat_lines(&n.ns)?;
            if now != self.foreign[i] {
                failures.push(format!(
                    "{}: foreign nat rules changed:\nbefore {:#?}\nnow {:#?}",
                    n.name, self.foreign[i], now
                ));
            }
        }
        Ok(failures)
    }
}

/// (packets, rule) of the MASQUERADE rule in a node's `cali-nat-outgoing`.
fn masq_rule(node: &felixrs_test_support::netns::Netns) -> Result<Option<(u64, String)>> {
    let out = node.exec(&["iptables-save", "-c", "-t", "nat"])?;
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(rest) = l.strip_prefix('[')
            && l.contains("-A cali-nat-outgoing ")
            && let Some((counts, rule)) = rest.split_once("] ")
        {
            let packets = counts.split(':').next().unwrap_or("0").parse()?;
            return Ok(Some((packets, rule.to_string())));
        }
    }
    Ok(None)
}

fn set_members(node: &felixrs_test_support::netns::Netns, set: &str) -> Result<Vec<String>> {
    let out = node.exec_unchecked(&["ipset", "list", set])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut m: Vec<String> = text
        .split("Members:")
        .nth(1)
        .unwrap_or("")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    m.sort();
    Ok(m)
}

fn start_env() -> Result<Env> {
    let work = tempfile::Builder::new()
        .prefix("felixrs-e2e-nat")
        .tempdir()?;
    let mut cluster = Cluster::new(2)?;
    for (ns, name) in [("nat", "out"), ("svc", "client"), ("dnsc", "isolated")] {
        cluster.add_pod(ns, name, 0)?;
    }
    for (ns, name) in [
        ("nat", "peer"),
        ("nat", "plain"),
        ("nat", "old"),
        ("svc", "backend"),
        ("dns", "dns"),
    ] {
        cluster.add_pod(ns, name, 1)?;
    }
    assert_eq!(cluster.pod("svc/backend").ip, Ipv4Addr::new(10, 78, 2, 13));
    assert_eq!(cluster.pod("dns/dns").ip, Ipv4Addr::new(10, 78, 2, 14));
    let internet = nat::attach_internet(&cluster)?;
    let servers = cluster
        .pods
        .iter()
        .map(|p| Servers::start(p.ns.name()))
        .collect::<Result<Vec<_>>>()?;
    let whoami = vec![
        WhoAmI::start(internet.name())?,
        WhoAmI::start(cluster.pod("nat/peer").ns.name())?,
        WhoAmI::start(cluster.pod("svc/backend").ns.name())?,
    ];
    let dnsmasq = nat::start_dnsmasq(
        &cluster.pod("dns/dns").ns,
        cluster.pod("dns/dns").ip,
        &[(WEB_NAME, WEB_VIP)],
        work.path(),
    )?;
    // kube-proxy and Docker were there first.
    let payload = nat::foreign_nat_rules(&services(), "10.78.0.0/16");
    let mut foreign = Vec::new();
    for n in &cluster.nodes {
        n.ns.feed("iptables-restore", &["--noflush"], &payload);
        let lines = foreign_nat_lines(&n.ns)?;
        assert!(
            lines
                .iter()
                .any(|l| l.contains("-j DNAT --to-destination 10.78.2.13:80")),
            "kube-proxy rules not in place on {}: {lines:#?}",
            n.name
        );
        foreign.push(lines);
    }
    let etcd = start_etcd(&cluster.infra, "10.77.0.1", work.path());
    let mut env = Env {
        agents: Vec::new(),
        cluster,
        _internet: internet,
        etcd,
        work,
        _servers: servers,
        _whoami: whoami,
        _dnsmasq: dnsmasq,
        foreign,
        rev: 0,
    };
    env.sync(&extra(false, true, "client"))?;
    for n in &env.cluster.nodes {
        env.agents.push(Agent::start(
            &n.ns,
            &n.name,
            &env.etcd.client_url(),
            env.work.path(),
        )?);
    }
    let rev = controller_sync(
        &env.cluster.infra,
        &env.etcd.client_url(),
        &env.work.path().join("manifests"),
    )?;
    for a in &mut env.agents {
        a.wait_applied(rev, APPLY_TIMEOUT)?;
    }
    env.rev = rev;
    Ok(env)
}

fn nat_outgoing(env: &mut Env) -> Result<Vec<String>> {
    let inet = INTERNET_IP;
    env.expect_seen("nat/out", inet, Some(NODE1_IP))?;
    let peer = env.pod_ip("nat/peer");
    env.expect_seen("nat/out", peer, Some("10.78.1.10"))?;
    env.expect_seen("nat/plain", inet, Some("10.78.2.11"))?;
    env.expect_seen("nat/old", inet, Some(NODE2_IP))?;
    // Pod to pod inside one pool and across pools on one node: never masqueraded.
    env.expect_seen("nat/plain", peer, Some("10.78.2.11"))?;
    env.expect_seen("nat/old", peer, Some("10.78.2.12"))?;
    // IPv6 the same way, with the v6 pools and the cali60 sets.
    env.expect_seen("nat/out", INTERNET_IP6, Some("fd77::11"))?;
    env.expect_seen("nat/plain", INTERNET_IP6, Some("fd78:2::b"))?;
    let peer6 = env.cluster.pod("nat/peer").ip6;
    env.expect_seen("nat/out", peer6, Some("fd78:1::a"))?;
    env.foreign_intact()
}

fn pool_change_and_delete(env: &mut Env) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let node2 = &env.cluster.nodes[1].ns;
    let before =
        masq_rule(node2)?.ok_or_else(|| anyhow::anyhow!("no MASQUERADE rule on node-2"))?;
    if before.0 == 0 {
        failures.push(format!(
            "MASQUERADE rule never counted a packet: {before:?}"
        ));
    }
    env.sync(&extra(true, true, "client"))?;
    env.expect_seen("nat/plain", INTERNET_IP, Some(NODE2_IP))?;
    env.expect_seen("nat/plain", env.pod_ip("nat/peer"), Some("10.78.2.11"))?;
    let node2 = &env.cluster.nodes[1].ns;
    let after = masq_rule(node2)?.ok_or_else(|| anyhow::anyhow!("MASQUERADE rule gone"))?;
    // Incremental: the rule was not rewritten (same cali: id, its counters kept), only the set.
    if after.1 != before.1 || after.0 < before.0 {
        failures.push(format!(
            "pool change rewrote cali-nat-outgoing: before {before:?}, after {after:?}"
        ));
    }
    let masq = set_members(node2, "cali40masq-ipam-pools")?;
    if masq != ["10.78.1.0/24", "10.78.2.12/30", "10.78.2.8/30"] {
        failures.push(format!("cali40masq-ipam-pools on node-2: {masq:?}"));
    }

    // Deleting node-1's pool: its pods are no longer masqueraded (nor in the all-pools set).
    env.sync(&extra(true, false, "client"))?;
    env.expect_seen("nat/out", INTERNET_IP, Some("10.78.1.10"))?;
    let node1 = &env.cluster.nodes[0].ns;
    let all = set_members(node1, "cali40all-ipam-pools")?;
    if all != ["10.78.2.12/30", "10.78.2.8/30"] {
        failures.push(format!("cali40all-ipam-pools on node-1: {all:?}"));
    }
    // Back to the start for the next checks.
    env.sync(&extra(false, true, "client"))?;
    env.expect_seen("nat/out", INTERNET_IP, Some(NODE1_IP))?;
    env.expect_seen("nat/plain", INTERNET_IP, Some("10.78.2.11"))?;
    failures.extend(env.foreign_intact()?);
    Ok(failures)
}

fn service_vip_policy(env: &mut Env) -> Result<Vec<String>> {
    // kube-proxy DNATs the VIP on the client's node; the backend's policy admits app=client and
    // sees the client's own address (pod sources are not masqueraded by kube-proxy or by us).
    env.expect_connect("svc/client", WEB_VIP, 80, true)?;
    env.expect_seen("svc/client", WEB_VIP, Some("10.78.1.11"))?;
    env.expect_connect("nat/out", WEB_VIP, 80, false)?;
    env.expect_connect("nat/peer", WEB_VIP, 80, false)?;
    // The policy changes: the client is denied through the VIP too.
    env.sync(&extra(false, true, "nobody"))?;
    env.expect_connect("svc/client", WEB_VIP, 80, false)?;
    env.sync(&extra(false, true, "client"))?;
    env.expect_connect("svc/client", WEB_VIP, 80, true)?;
    env.foreign_intact()
}

fn dns_for_isolated_pod(env: &mut Env) -> Result<Vec<String>> {
    // The isolation is real: nothing may open a connection to the pod ...
    env.expect_connect("nat/out", env.pod_ip("dnsc/isolated"), 80, false)?;
    env.expect_connect("nat/peer", env.pod_ip("dnsc/isolated"), 80, false)?;
    env.expect_connect("nat/out", env.pod_ip("nat/peer"), 80, true)?;
    // ... yet its DNS queries through the service address are answered (the reply is
    // ESTABLISHED in conntrack, accepted before any policy).
    let ns = env.pod_ns("dnsc/isolated");
    let mut last = None;
    let got = wait_for(SETTLE, || {
        let r = resolve_a(&ns, DNS_VIP, WEB_NAME, PROBE_TIMEOUT);
        let hit = matches!(r, Ok(Some(ip)) if ip == WEB_VIP);
        last = Some(r.map_err(|e| e.to_string()));
        hit.then_some(())
    });
    if got.is_none() {
        bail!("dnsc/isolated could not resolve {WEB_NAME} via {DNS_VIP}: {last:?}");
    }
    // Over TCP too: the SYN-ACK and the answer come back to the isolated pod through conntrack.
    let tcp = resolve_a_tcp(&ns, DNS_VIP, WEB_NAME, PROBE_TIMEOUT)?;
    if tcp != Some(WEB_VIP) {
        bail!("dnsc/isolated over TCP resolved {WEB_NAME} to {tcp:?}");
    }
    // And the name it got works for a pod the backend admits.
    let ns = env.pod_ns("svc/client");
    let ip = resolve_a(&ns, DNS_VIP, WEB_NAME, PROBE_TIMEOUT)?;
    if ip != Some(WEB_VIP) {
        bail!("svc/client resolved {WEB_NAME} to {ip:?}");
    }
    env.expect_connect("svc/client", WEB_VIP, 80, true)?;
    env.foreign_intact()
}

fn restart_keeps_nat(env: &mut Env) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    env.expect_seen("nat/out", INTERNET_IP, Some(NODE1_IP))?;
    let node1 = &env.cluster.nodes[0].ns;
    let before =
        masq_rule(node1)?.ok_or_else(|| anyhow::anyhow!("no MASQUERADE rule on node-1"))?;
    env.agents[0].kill();
    // The kernel keeps NAT while no agent runs.
    env.expect_seen("nat/out", INTERNET_IP, Some(NODE1_IP))?;
    let node1 = &env.cluster.nodes[0].ns;
    env.agents[0].restart(node1)?;
    env.agents[0].wait_applied(env.rev, APPLY_TIMEOUT)?;
    env.expect_seen("nat/out", INTERNET_IP, Some(NODE1_IP))?;
    let node1 = &env.cluster.nodes[0].ns;
    let after = masq_rule(node1)?.ok_or_else(|| anyhow::anyhow!("MASQUERADE rule gone"))?;
    if after.1 != before.1 || after.0 <= before.0 {
        failures.push(format!(
            "restart rewrote cali-nat-outgoing: before {before:?}, after {after:?}"
        ));
    }
    failures.extend(env.foreign_intact()?);
    Ok(failures)
}

#[test]
fn nat_outgoing_services_and_dns() {
    require_root();
    require_tools(&["dnsmasq", "iptables-restore", "iptables-save", "ipset"]);
    binary("felixrs");
    binary("policy-controller");
    let started = Instant::now();
    let mut env = start_env().expect("cluster, internet host, etcd, dnsmasq and agents start");
    let mut tally = Tally::default();
    let mut report = |name: &str, result: Result<Vec<String>>| tally.record(name, result);
    let r = nat_outgoing(&mut env);
    report(
        "nat-outgoing (IPv4 and IPv6): internet sees the node, pods see the pod; plain pool unmasqueraded; disabled pool keeps NAT",
        r,
    );
    let r = pool_change_and_delete(&mut env);
    report(
        "nat-outgoing: pool change and delete applied incrementally",
        r,
    );
    let r = service_vip_policy(&mut env);
    report(
        "service VIP (kube-proxy DNAT): allowed and denied by the backend's policy",
        r,
    );
    let r = dns_for_isolated_pod(&mut env);
    report(
        "DNS through a service VIP (dnsmasq) for an ingress-isolated pod",
        r,
    );
    let r = restart_keeps_nat(&mut env);
    report(
        "agent restart: NAT kept throughout, nat rules not rewritten",
        r,
    );
    let Tally { passed, failed } = tally;
    println!(
        "{passed} passed, {failed} failed in {:?}",
        started.elapsed()
    );
    if failed > 0 {
        for a in &env.agents {
            println!("--- agent {} log tail ---\n{}", a.node_name, a.log_tail(40));
        }
        println!("--- dnsmasq log ---\n{}", env._dnsmasq.log_tail(20));
    }
    assert_eq!(failed, 0, "{failed} nat/service/dns checks failed");
}
