//! Egress by domain name (FQDN policy, issue 16) end to end on the real kernel: the real
//! `policy-controller` and `felixrs agent` binaries, a real etcd, real `dnsmasq` servers (one
//! trusted, one not) in pods, and an "outside" host with many addresses that all listen
//! (`felixrs_e2e::fqdn`). One shared cluster for every case.
//!
//! The agent on node-1 runs with `--dns-trusted-servers <dns pod> --dns-min-ttl 0`, the one on
//! node-2 with `--dns-min-ttl 30`. `fq/client` (node-1) and `fq/client-b` (node-2) may reach the
//! DNS servers and, by name only, the outside host; `free/free` has no policy and proves every
//! address listens (so a denied connection is the policy's doing).
//!
//! Prints a PASS/FAIL line per case and `N passed, M failed`.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use felixrs_e2e::cluster::Cluster;
use felixrs_e2e::dns;
use felixrs_e2e::driver::{
    Agent, Etcd, HEALTH_ADDR, Proc, binary, controller_sync, http_get, start_etcd, wait_for,
};
use felixrs_e2e::fqdn::{self, *};
use felixrs_e2e::nat::{PodSpec, WHOAMI_PORT, WhoAmI, seen_as};
use felixrs_e2e::report::Tally;
use felixrs_test_support::netns::Netns;
use felixrs_test_support::{require_root, require_tools};

const APPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection attempt's timeout: a denied SYN is dropped, so a denial costs this much.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long a DNS question waits for an answer that must come (generous: a loaded machine).
const DNS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait for something that must not arrive (an answer, a spoofed datagram).
const QUIET: Duration = Duration::from_secs(2);
/// How long a check polls for an outcome that must come (absorbs a loaded machine).
const SETTLE: Duration = Duration::from_secs(10);
/// The node-2 agent's `--dns-min-ttl`.
const MIN_TTL: u64 = 30;

const LABELS: &[PodSpec<'static>] = &[
    ("fq", "client", &[("app", "client")]),
    ("fq", "client-b", &[("app", "client")]),
];

/// One case of the shared cluster.
type Case = fn(&mut Env) -> Result<()>;

struct Env {
    cluster: Cluster,
    _outside: Netns,
    agents: Vec<Agent>,
    etcd: Etcd,
    work: tempfile::TempDir,
    _whoami: WhoAmI,
    recorder: Recorder,
    dnsmasq: Proc,
    _rogue: Proc,
    rev: i64,
}

impl Env {
    fn ns(&self, pod: &str) -> String {
        self.cluster.pod(pod).ns.name().to_string()
    }

    fn dns(&self) -> SocketAddr {
        (self.cluster.pod("kube-system/dns").ip, 53).into()
    }

    fn dns6(&self) -> SocketAddr {
        (self.cluster.pod("kube-system/dns").ip6, 53).into()
    }

    fn rogue(&self) -> SocketAddr {
        (self.cluster.pod("rogue/dns").ip, 53).into()
    }

    fn connects(&self, pod: &str, dst: impl Into<IpAddr>) -> Result<bool> {
        Ok(seen_as(&self.ns(pod), dst, WHOAMI_PORT, PROBE_TIMEOUT)?.is_some())
    }

    /// Polls until `pod` connects to `dst` (it must, within [`SETTLE`]).
    fn expect_allowed(&self, pod: &str, dst: impl Into<IpAddr>, why: &str) -> Result<()> {
        let dst = dst.into();
        if wait_for(SETTLE, || self.connects(pod, dst).ok().filter(|c| *c)).is_none() {
            bail!("{pod} -> {dst}:{WHOAMI_PORT} denied, want allowed ({why})");
        }
        Ok(())
    }

    /// One attempt: `pod` must not connect to `dst`.
    fn expect_denied(&self, pod: &str, dst: impl Into<IpAddr>, why: &str) -> Result<()> {
        let dst = dst.into();
        if self.connects(pod, dst)? {
            bail!("{pod} -> {dst}:{WHOAMI_PORT} connected, want denied ({why})");
        }
        Ok(())
    }

    /// [`Env::expect_denied`] for many (pod, address) pairs at once (a denial costs a timeout).
    fn expect_all_denied(&self, pairs: &[(&str, IpAddr)], why: &str) -> Result<()> {
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = pairs
                .iter()
                .map(|(pod, dst)| s.spawn(move || self.expect_denied(pod, *dst, why)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("probe panicked")))
                })
                .collect()
        });
        let errors: Vec<String> = results
            .into_iter()
            .filter_map(|r| r.err().map(|e| e.to_string()))
            .collect();
        if !errors.is_empty() {
            bail!("{}", errors.join("; "));
        }
        Ok(())
    }

    /// Resolves `name` through `server` from `pod`; the answer must hold `want`.
    fn resolve(&self, pod: &str, server: SocketAddr, name: &str, want: IpAddr) -> Result<()> {
        let qtype = if want.is_ipv4() { dns::A } else { dns::AAAA };
        let got = dns::ask(&self.ns(pod), server, name, qtype, DNS_TIMEOUT)?;
        if !got
            .as_deref()
            .is_some_and(|a| a.iter().any(|a| a.addr == want))
        {
            bail!("{pod}: {name} ({qtype}) via {server} answered {got:?}, want {want}");
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        let dir = self.work.path().join("manifests");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("world.yaml"),
            fqdn::manifests(&self.cluster, LABELS),
        )?;
        let rev = controller_sync(&self.cluster.infra, &self.etcd.client_url(), &dir)?;
        for a in &mut self.agents {
            a.wait_applied(rev, APPLY_TIMEOUT)?;
        }
        self.rev = rev;
        Ok(())
    }
}

fn start_env() -> Result<Env> {
    let work = tempfile::Builder::new()
        .prefix("felixrs-e2e-fqdn")
        .tempdir()?;
    let mut cluster = Cluster::new(2)?;
    for (ns, name) in [
        ("kube-system", "dns"),
        ("rogue", "dns"),
        ("fq", "client"),
        ("evil", "attacker"),
        ("free", "free"),
    ] {
        cluster.add_pod(ns, name, 0)?;
    }
    cluster.add_pod("fq", "client-b", 1)?;
    let outside = fqdn::attach_outside(&cluster)?;
    let whoami = WhoAmI::start(outside.name())?;
    let recorder = Recorder::start(outside.name(), RECORDER_PORT)?;
    let dns_pod = cluster.pod("kube-system/dns");
    let dnsmasq = fqdn::start_dns(
        &dns_pod.ns,
        &[dns_pod.ip.into(), dns_pod.ip6.into()],
        &fqdn::trusted_zone(work.path())?,
        work.path(),
    )?;
    let rogue_pod = cluster.pod("rogue/dns");
    let rogue = fqdn::start_dns(
        &rogue_pod.ns,
        &[rogue_pod.ip.into()],
        &fqdn::rogue_zone(),
        work.path(),
    )?;
    let etcd = start_etcd(&cluster.infra, "10.77.0.1", work.path());
    let mut env = Env {
        agents: Vec::new(),
        cluster,
        _outside: outside,
        etcd,
        work,
        _whoami: whoami,
        recorder,
        dnsmasq,
        _rogue: rogue,
        rev: 0,
    };
    env.sync()?;
    let trusted = format!("{},[{}]:53", env.dns().ip(), env.dns6().ip());
    for (i, min_ttl) in [(0, "0".to_string()), (1, MIN_TTL.to_string())] {
        let n = &env.cluster.nodes[i];
        env.agents.push(Agent::start_with(
            &n.ns,
            &n.name,
            &env.etcd.client_url(),
            env.work.path(),
            &["--dns-trusted-servers", &trusted, "--dns-min-ttl", &min_ttl],
        )?);
    }
    let rev = env.rev;
    for a in &mut env.agents {
        a.wait_applied(rev, APPLY_TIMEOUT)?;
    }
    Ok(env)
}

/// Before any answer: the outside host listens on every address (the control pod reaches them
/// all, and the DNS servers answer it), and the clients reach none of them.
fn baseline(env: &mut Env) -> Result<()> {
    for a in outside_addrs() {
        env.expect_allowed("free/free", a, "no policy")?;
    }
    let mut pairs = Vec::new();
    for a in [API_IP, KEEP_IP, WILD_A_IP, CHAIN_IP, SHORT_IP] {
        pairs.push(("fq/client", IpAddr::from(a)));
        pairs.push(("fq/client-b", IpAddr::from(a)));
    }
    pairs.push(("fq/client", API_IP6.into()));
    env.expect_all_denied(&pairs, "nothing resolved yet")
}

/// A, AAAA (over IPv4 and IPv6 transport, UDP and TCP): resolve, then connect; an address of the
/// same host never in an answer stays denied.
fn resolve_then_connect(env: &mut Env) -> Result<()> {
    env.resolve("fq/client", env.dns(), API, API_IP.into())?;
    env.expect_allowed("fq/client", API_IP, "A answer from the trusted server")?;
    env.resolve("fq/client", env.dns6(), API, API_IP6.into())?;
    env.expect_allowed("fq/client", API_IP6, "AAAA answer over IPv6")?;
    env.expect_all_denied(
        &[
            ("fq/client", NEVER_IP.into()),
            ("fq/client", NEVER_IP6.into()),
        ],
        "never in an answer",
    )?;
    // Over TCP on node-2 (the server is remote there).
    let got = dns::ask_tcp(&env.ns("fq/client-b"), env.dns(), KEEP, dns::A, DNS_TIMEOUT)?;
    if !got
        .as_deref()
        .is_some_and(|a| a.iter().any(|a| a.addr == IpAddr::from(KEEP_IP)))
    {
        bail!("fq/client-b: {KEEP} over TCP answered {got:?}");
    }
    env.expect_allowed("fq/client-b", KEEP_IP, "A answer over TCP")?;
    env.expect_denied("fq/client-b", API_IP, "resolved on the other node only")?;
    Ok(())
}

/// `*.wild.fqdn.test` admits names one and two labels below, never the apex.
fn wildcard(env: &mut Env) -> Result<()> {
    env.resolve("fq/client", env.dns(), WILD_APEX, WILD_APEX_IP.into())?;
    env.expect_denied("fq/client", WILD_APEX_IP, "the apex is not under *.")?;
    env.resolve("fq/client", env.dns(), WILD_A, WILD_A_IP.into())?;
    env.expect_allowed("fq/client", WILD_A_IP, "one label under *.")?;
    env.expect_denied("fq/client", WILD_DEEP_IP, "not resolved yet")?;
    env.resolve("fq/client", env.dns(), WILD_DEEP, WILD_DEEP_IP.into())?;
    env.expect_allowed("fq/client", WILD_DEEP_IP, "two labels under *.")?;
    env.expect_denied("fq/client", WILD_APEX_IP, "the apex is still not under *.")?;
    Ok(())
}

/// `alias.fqdn.test` → CNAME → CNAME → A: the final address counts for the listed alias; the
/// chain's target asked for directly does not.
fn cname_chain(env: &mut Env) -> Result<()> {
    env.resolve("fq/client-b", env.dns(), CHAIN_TARGET, CHAIN_IP.into())?;
    env.expect_denied(
        "fq/client-b",
        CHAIN_IP,
        "the target's own name is not listed",
    )?;
    env.resolve("fq/client", env.dns(), ALIAS, CHAIN_IP.into())?;
    env.expect_allowed("fq/client", CHAIN_IP, "CNAME chain from a listed name")?;
    Ok(())
}

/// A ClusterNetworkPolicy (Admin tier) `domainNames` peer, converted by the controller into
/// `destination.domains`, admits its name's address once resolved, and only then.
fn admin_domain_names(env: &mut Env) -> Result<()> {
    env.expect_denied("fq/client", CNP_IP, "not resolved yet")?;
    env.resolve("fq/client", env.dns(), CNP_NAME, CNP_IP.into())?;
    env.expect_allowed("fq/client", CNP_IP, "ClusterNetworkPolicy domainNames")?;
    Ok(())
}

/// `felixrs trace` on node-1's state dir (snapshot and learned map, as the agent persisted them)
/// explains an allowed packet by the domain rule and the learned name; an unanswered address of
/// the same host is dropped.
fn trace_explains(env: &mut Env) -> Result<()> {
    let state = env.agents[0].state_dir.clone();
    let trace = |to: IpAddr| -> Result<String> {
        let out = std::process::Command::new(binary("felixrs"))
            .args(["trace", "--state-dir"])
            .arg(&state)
            .args(["--node-name", "node-1", "--from", "fq/client", "--to"])
            .arg(to.to_string())
            .args(["--port", &WHOAMI_PORT.to_string()])
            .output()?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    };
    // The map is written at most a second after the answer.
    let mut last = String::new();
    let hit = wait_for(SETTLE, || {
        last = trace(API_IP.into()).ok()?;
        (last.contains("verdict: ACCEPT") && last.contains(&format!("domain rule {API}")))
            .then_some(())
    });
    if hit.is_none() {
        bail!("trace to {API_IP} does not name the domain rule {API}:\n{last}");
    }
    for l in last.lines().filter(|l| l.contains("domain rule")) {
        println!("    trace: {}", l.trim());
    }
    let never = trace(NEVER_IP.into())?;
    if !never.contains("verdict: DROP") {
        bail!("trace to never-answered {NEVER_IP}:\n{never}");
    }
    Ok(())
}

/// Forged answers open nothing: from an untrusted server the pod may query, from another pod
/// (its own address, source port 53), and from another pod spoofing the trusted server's address.
fn forged_answers(env: &mut Env) -> Result<()> {
    env.resolve("fq/client", env.rogue(), API, ROGUE_IP.into())?;
    env.expect_denied("fq/client", ROGUE_IP, "answer from an untrusted server")?;

    let client = env.cluster.pod("fq/client").ip;
    let attacker = env.ns("evil/attacker");
    let attacker_ip = env.cluster.pod("evil/attacker").ip;
    let forged = dns::response(0x4242, API, FORGED_POD_IP.into(), LONG_TTL)?;
    let rx = fqdn::receive_one(&env.ns("fq/client"), 5353, DNS_TIMEOUT)?;
    send_udp_from(
        &attacker,
        (attacker_ip, 53).into(),
        (client, 5353).into(),
        forged,
    )?;
    let got = rx
        .join()
        .map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    if got.is_none() {
        bail!("the pod-to-pod forged answer did not even arrive (the case proves nothing)");
    }
    env.expect_denied("fq/client", FORGED_POD_IP, "answer forged by a pod")?;

    // The trusted server's address on the attacker's interface: the node's reverse-path check
    // drops what it sends with it.
    let dns_ip = env.dns().ip();
    env.cluster.pod("evil/attacker").ns.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{dns_ip}/32"),
        "dev",
        "eth0",
    ])?;
    let forged = dns::response(0x4343, API, FORGED_SPOOF_IP.into(), LONG_TTL)?;
    let rx = fqdn::receive_one(&env.ns("fq/client"), 5354, QUIET)?;
    send_udp_from(
        &attacker,
        (dns_ip, 53).into(),
        (client, 5354).into(),
        forged,
    )?;
    let got = rx
        .join()
        .map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    env.expect_denied(
        "fq/client",
        FORGED_SPOOF_IP,
        &format!(
            "answer spoofing the trusted server (delivered: {})",
            got.is_some()
        ),
    )?;
    Ok(())
}

/// TTL 2 s: with `--dns-min-ttl 0` (node-1) the address is denied again after expiry; with
/// `--dns-min-ttl 30` (node-2) it stays allowed past the record's TTL.
fn ttl_expiry_and_min_ttl(env: &mut Env) -> Result<()> {
    let t0 = Instant::now();
    env.resolve("fq/client", env.dns(), SHORT, SHORT_IP.into())?;
    env.resolve("fq/client-b", env.dns(), SHORT, SHORT_IP.into())?;
    env.expect_allowed("fq/client", SHORT_IP, "just resolved")?;
    env.expect_allowed("fq/client-b", SHORT_IP, "just resolved")?;
    let expired = wait_for(Duration::from_secs(u64::from(SHORT_TTL) + 15), || {
        env.connects("fq/client", SHORT_IP)
            .ok()
            .filter(|c| !c)
            .map(|_| t0.elapsed())
    });
    let Some(after) = expired else {
        bail!(
            "{SHORT} (TTL {SHORT_TTL} s) still allowed on node-1 after {:?}; members {:?}",
            t0.elapsed(),
            domain_members(&env.cluster.nodes[0].ns)?
        );
    };
    // Past the record's TTL with room to spare, and still inside the minimum.
    while t0.elapsed() < Duration::from_secs(u64::from(SHORT_TTL) + 3) {
        std::thread::sleep(Duration::from_millis(100));
    }
    if t0.elapsed() >= Duration::from_secs(MIN_TTL - 5) {
        bail!(
            "the machine is too slow to check --dns-min-ttl ({:?})",
            t0.elapsed()
        );
    }
    env.expect_allowed(
        "fq/client-b",
        SHORT_IP,
        &format!(
            "--dns-min-ttl {MIN_TTL}, {:?} after the answer",
            t0.elapsed()
        ),
    )?;
    let left = domain_members(&env.cluster.nodes[1].ns)?
        .into_iter()
        .find(|(_, a, _)| *a == SHORT_IP.to_string())
        .map(|(_, _, t)| t);
    if !left.is_some_and(|t| t > u64::from(SHORT_TTL) && t <= MIN_TTL) {
        bail!(
            "node-2's set entry for {SHORT_IP}: timeout left {left:?}, want ({SHORT_TTL}, {MIN_TTL}]"
        );
    }
    println!("    {SHORT} denied on node-1 {after:?} after the answer");
    Ok(())
}

/// A counter or gauge from the agent's `/metrics` (0 when absent).
fn metric(agent: &Agent, name: &str) -> u64 {
    let Ok((200, body)) = http_get(&agent.netns, HEALTH_ADDR, "/metrics") else {
        return 0;
    };
    body.lines()
        .filter_map(|l| l.strip_prefix(name))
        .filter_map(|rest| rest.split_whitespace().last())
        .filter_map(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The first packet right after each answer is let through, for many fresh addresses
/// (`RACE_NAMES` names, each resolved once, one UDP datagram sent the moment the answer is in):
/// the hold makes the set hold the address before the pod sees it. A never-resolved address of
/// the same range stays closed.
fn first_packet_race(env: &mut Env) -> Result<()> {
    let server = env.dns();
    let pods = ["fq/client", "fq/client-b"];
    let mut sent = Vec::new();
    for i in 1..=RACE_NAMES {
        if i == RACE_NAMES {
            break; // the last one is never resolved: the control
        }
        let pod = pods[usize::from(i) % 2];
        let payload = format!("race-{i}");
        let got = resolve_and_send(&env.ns(pod), server, &race_name(i), &payload, DNS_TIMEOUT)?;
        if got != Some(race_addr(i).into()) {
            bail!("{pod}: {} answered {got:?}", race_name(i));
        }
        sent.push(payload);
    }
    // The control: a datagram to an address never answered.
    let control = "race-control";
    send_udp_from(
        &env.ns("fq/client"),
        (env.cluster.pod("fq/client").ip, 0).into(),
        (race_addr(RACE_NAMES), RECORDER_PORT).into(),
        control.as_bytes().to_vec(),
    )?;
    // Every datagram was sent once; wait for the last ones in flight.
    let all = wait_for(Duration::from_secs(5), || {
        sent.iter().all(|p| env.recorder.has(p)).then_some(())
    });
    let missing: Vec<&String> = sent.iter().filter(|p| !env.recorder.has(p)).collect();
    if all.is_none() {
        bail!(
            "{} of {} first packets after the answer were dropped (first ones: {:?})",
            missing.len(),
            sent.len(),
            &missing[..missing.len().min(10)]
        );
    }
    if env.recorder.has(control) {
        bail!(
            "a datagram to never-resolved {} arrived",
            race_addr(RACE_NAMES)
        );
    }
    // And each of those answers went through the hold (the agents counted them).
    let held: u64 = env
        .agents
        .iter()
        .map(|a| metric(a, "felixrs_dns_responses_held_total"))
        .sum();
    if held < sent.len() as u64 {
        bail!(
            "the agents held {held} responses, fewer than the {} answers",
            sent.len()
        );
    }
    println!(
        "    {} first packets, none lost; {held} responses held",
        sent.len()
    );
    Ok(())
}

/// Restarts: a crash keeps what was learned (kernel sets untouched); with the agent stopped DNS
/// answers are not delivered (fail closed); after `felixrs cleanup` a new agent re-creates the
/// sets from the persisted map, so unexpired addresses are allowed without a new answer.
fn restarts(env: &mut Env) -> Result<()> {
    // KEEP on node-1 (resolved over UDP here; node-2 has it from the TCP case).
    env.resolve("fq/client", env.dns(), KEEP, KEEP_IP.into())?;
    env.expect_allowed("fq/client", KEEP_IP, "just resolved")?;
    // Longer than the persistence debounce (≤ 1 s), so the crash below finds the map written.
    std::thread::sleep(Duration::from_millis(1500));

    let node1 = &env.cluster.nodes[0].ns;
    env.agents[0].kill();
    env.expect_allowed(
        "fq/client",
        KEEP_IP,
        "agent crashed: the kernel keeps the set",
    )?;
    env.agents[0].restart(node1)?;
    env.agents[0].wait_applied(env.rev, APPLY_TIMEOUT)?;
    env.expect_allowed("fq/client", KEEP_IP, "after a crash and restart")?;
    env.expect_allowed("fq/client", API_IP, "after a crash and restart")?;
    env.expect_denied("fq/client", NEVER_IP, "after a crash and restart")?;

    // Stopped: answers from the trusted server to this node's pods are held by nobody, so
    // dropped; node-2's pod still gets them (the server answers).
    env.agents[0].stop();
    let closed = dns::ask(&env.ns("fq/client"), env.dns(), CLOSED, dns::A, QUIET)?;
    if closed.is_some() {
        bail!("agent stopped, yet the answer for {CLOSED} was delivered: {closed:?}");
    }
    env.resolve("fq/client-b", env.dns(), CLOSED, CLOSED_IP.into())?;
    let log = std::fs::read_to_string(&env.dnsmasq.log).unwrap_or_default();
    let client_ip = env.cluster.pod("fq/client").ip;
    if !log.contains(&format!("query[A] {CLOSED} from {client_ip}")) {
        bail!("the stopped-agent query never reached the server (the case proves nothing)");
    }

    // Cleanup removes every chain and set of ours; the learned map on disk survives.
    let out =
        node1.exec_unchecked(&[binary("felixrs").to_str().expect("utf-8 path"), "cleanup"])?;
    if !out.status.success() {
        bail!(
            "felixrs cleanup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let left = domain_members(node1)?;
    if !left.is_empty() {
        bail!("felixrs cleanup left domain set members: {left:?}");
    }
    env.agents[0].restart(node1)?;
    env.agents[0].wait_applied(env.rev, APPLY_TIMEOUT)?;
    // No new answer: the persisted map alone re-opens what was learned and has not expired.
    env.expect_allowed("fq/client", KEEP_IP, "learned before cleanup, persisted")?;
    env.expect_allowed(
        "fq/client",
        API_IP6,
        "learned before cleanup, persisted (IPv6)",
    )?;
    env.expect_denied("fq/client", NEVER_IP, "after cleanup and restart")?;
    env.expect_denied("fq/client", SHORT_IP, "expired before the restart")?;
    env.expect_denied("fq/client", ROGUE_IP, "forged, never learned")?;
    // And answers flow again.
    env.resolve("fq/client", env.dns(), CLOSED, CLOSED_IP.into())?;
    Ok(())
}

#[test]
fn fqdn_egress_policy() {
    require_root();
    require_tools(&["dnsmasq", "iptables-restore", "iptables-save", "ipset"]);
    binary("felixrs");
    binary("policy-controller");
    let started = Instant::now();
    let mut env = start_env().expect("cluster, outside host, dnsmasq, etcd and agents start");
    println!("cluster up in {:?}", started.elapsed());
    let mut tally = Tally::default();
    let cases: [(&str, Case); 10] = [
        (
            "baseline: every address listens, clients reach none by default",
            baseline,
        ),
        (
            "resolve then connect (A, AAAA, UDP and TCP, v4 and v6 transport); unanswered address of the same host stays denied",
            resolve_then_connect,
        ),
        (
            "wildcard *.wild.fqdn.test: one and two labels below, never the apex",
            wildcard,
        ),
        ("CNAME chain from a listed name", cname_chain),
        (
            "ClusterNetworkPolicy domainNames through the controller",
            admin_domain_names,
        ),
        (
            "felixrs trace explains a domain hit from the agent's state dir",
            trace_explains,
        ),
        (
            "forged answers (untrusted server, pod to pod, spoofed trusted source) open nothing",
            forged_answers,
        ),
        (
            "TTL expiry denies again (--dns-min-ttl 0); --dns-min-ttl keeps it longer",
            ttl_expiry_and_min_ttl,
        ),
        (
            "first packet right after the answer always passes (race the hold removes)",
            first_packet_race,
        ),
        (
            "restarts keep learned addresses (crash; stop + felixrs cleanup); stopped agent fails closed",
            restarts,
        ),
    ];
    for (name, case) in cases {
        let t = Instant::now();
        let r = case(&mut env);
        tally.record(
            &format!("{name} [{:.1?}]", t.elapsed()),
            r.map(|()| Vec::new()),
        );
    }
    let Tally { passed, failed } = tally;
    println!(
        "{passed} passed, {failed} failed in {:?}",
        started.elapsed()
    );
    if failed > 0 {
        for a in &env.agents {
            println!("--- agent {} log tail ---\n{}", a.node_name, a.log_tail(40));
        }
        for n in &env.cluster.nodes {
            println!(
                "--- {} domain set members ---\n{:?}",
                n.name,
                domain_members(&n.ns).unwrap_or_default()
            );
        }
        println!("--- dnsmasq log ---\n{}", env.dnsmasq.log_tail(30));
    }
    assert_eq!(failed, 0, "{failed} FQDN checks failed");
}
