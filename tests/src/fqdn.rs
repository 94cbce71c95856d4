//! Helpers of the FQDN (egress by domain name) end-to-end test (`tests/tests/e2e_fqdn.rs`): the
//! "outside" host (the internet host of [`crate::nat`]) with several addresses that all listen, a
//! whole range of local addresses for the race loop, the test's DNS zone served by `dnsmasq`, a UDP
//! recorder, forged DNS answers, and the policy of the test's world.
//!
//! ```text
//!   outside netns (nat::attach_internet): eth0 198.51.100.10-.29/24 + 2001:db8:100::10-::29/64,
//!                 `local 203.0.113.0/24 dev lo` (every address of the race range is its own),
//!                 who-am-I on TCP 8080 and a UDP recorder on 5001, on all of them
//!   infra netns:  203.0.113.0/24 via the outside host
//!   node-1: kube-system/dns (dnsmasq, trusted) .10, rogue/dns (dnsmasq, untrusted) .11,
//!           fq/client .12, evil/attacker .13, free/free .14 (no policy: the reachability control)
//!   node-2: fq/client-b .10 (its agent runs with --dns-min-ttl)
//! ```
//! Only addresses assigned inside the test's namespaces are used; nothing leaves the machine.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use felixrs_test_support::netns::{Netns, enter};

use crate::cluster::Cluster;
use crate::driver::Proc;
use crate::{dns, nat};

/// The TTL every record of the zone has unless it says otherwise (long: never expires in a run).
pub const LONG_TTL: u32 = 600;
/// The TTL of [`SHORT`].
pub const SHORT_TTL: u32 = 2;
/// The UDP port of the outside host's recorder.
pub const RECORDER_PORT: u16 = 5001;
/// How many fresh names the race loop resolves (`r<i>.race.fqdn.test` → `203.0.113.<i>`).
pub const RACE_NAMES: u8 = 220;

/// `198.51.100.<n>`: an address of the outside host.
pub const fn outside(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 51, 100, n)
}

/// `2001:db8:100::<n>` (hex digits as written): an IPv6 address of the outside host.
pub const fn outside6(n: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, n)
}

/// `203.0.113.<i>`: the race range, all local to the outside host.
pub const fn race_addr(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(203, 0, 113, i)
}

/// The race loop's `i`-th name.
pub fn race_name(i: u8) -> String {
    format!("r{i}.race.fqdn.test")
}

// The zone. Each case has addresses of its own, so no case can pass on another's learning.
pub const API: &str = "api.fqdn.test";
pub const API_IP: Ipv4Addr = outside(11);
pub const API_IP6: Ipv6Addr = outside6(0x11);
pub const KEEP: &str = "keep.fqdn.test";
pub const KEEP_IP: Ipv4Addr = outside(12);
pub const WILD_A: &str = "a.wild.fqdn.test";
pub const WILD_A_IP: Ipv4Addr = outside(13);
pub const WILD_DEEP: &str = "x.y.wild.fqdn.test";
pub const WILD_DEEP_IP: Ipv4Addr = outside(14);
/// The wildcard's apex: `*.wild.fqdn.test` does not match it.
pub const WILD_APEX: &str = "wild.fqdn.test";
pub const WILD_APEX_IP: Ipv4Addr = outside(15);
/// `alias.fqdn.test` CNAME `mid.elsewhere.test` CNAME `target.elsewhere.test` A [`CHAIN_IP`];
/// only the alias is in the policy.
pub const ALIAS: &str = "alias.fqdn.test";
pub const CHAIN_TARGET: &str = "target.elsewhere.test";
pub const CHAIN_IP: Ipv4Addr = outside(16);
/// [`SHORT_TTL`] seconds.
pub const SHORT: &str = "short.fqdn.test";
pub const SHORT_IP: Ipv4Addr = outside(17);
/// What the untrusted (rogue) server answers for [`API`].
pub const ROGUE_IP: Ipv4Addr = outside(18);
/// What a pod forges for [`API`] in an answer it sends another pod from its own address.
pub const FORGED_POD_IP: Ipv4Addr = outside(19);
/// What a pod forges for [`API`] in an answer sent with the trusted server's address.
pub const FORGED_SPOOF_IP: Ipv4Addr = outside(20);
/// An address of the outside host no answer ever holds.
pub const NEVER_IP: Ipv4Addr = outside(21);
pub const NEVER_IP6: Ipv6Addr = outside6(0x21);
/// Not in any policy: only used to see answers dropped while the agent is away.
pub const CLOSED: &str = "closed.fqdn.test";
pub const CLOSED_IP: Ipv4Addr = outside(22);

/// Allowed by a network-policy-api ClusterNetworkPolicy `domainNames` peer (through the controller).
pub const CNP_NAME: &str = "cnp.fqdn.test";
pub const CNP_IP: Ipv4Addr = outside(23);

/// Every single address of the outside host the cases use (the race range aside).
pub fn outside_addrs() -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = (11..=23).map(|n| outside(n).into()).collect();
    v.push(API_IP6.into());
    v.push(NEVER_IP6.into());
    v
}

/// The outside host: the internet host of [`nat::attach_internet`] with the extra addresses of
/// [`outside_addrs`] and the race range as local addresses (`local` route on `lo`).
pub fn attach_outside(cluster: &Cluster) -> Result<Netns> {
    let inet = nat::attach_internet(cluster)?;
    for a in outside_addrs() {
        let (cidr, v6) = match a {
            IpAddr::V4(a) => (format!("{a}/24"), false),
            IpAddr::V6(a) => (format!("{a}/64"), true),
        };
        let mut argv = vec!["ip"];
        if v6 {
            argv.push("-6");
        }
        argv.extend(["addr", "add", &cidr, "dev", "eth0"]);
        if v6 {
            argv.push("nodad");
        }
        inet.exec(&argv)?;
    }
    inet.exec(&["ip", "route", "add", "local", "203.0.113.0/24", "dev", "lo"])?;
    cluster.infra.exec(&[
        "ip",
        "route",
        "add",
        "203.0.113.0/24",
        "via",
        &nat::INTERNET_IP.to_string(),
    ])?;
    Ok(inet)
}

/// The trusted server's zone as dnsmasq options (written to `work/fqdn-hosts` for the race names).
pub fn trusted_zone(work: &Path) -> Result<Vec<String>> {
    let hosts = work.join("fqdn-hosts");
    let mut text = String::new();
    for i in 1..=RACE_NAMES {
        text.push_str(&format!("{} {}\n", race_addr(i), race_name(i)));
    }
    std::fs::write(&hosts, text)?;
    Ok(vec![
        format!("--local-ttl={LONG_TTL}"),
        format!("--addn-hosts={}", hosts.display()),
        format!("--host-record={API},{API_IP},{API_IP6}"),
        format!("--host-record={KEEP},{KEEP_IP}"),
        format!("--host-record={WILD_A},{WILD_A_IP}"),
        format!("--host-record={WILD_DEEP},{WILD_DEEP_IP}"),
        format!("--host-record={WILD_APEX},{WILD_APEX_IP}"),
        format!("--host-record={CHAIN_TARGET},{CHAIN_IP}"),
        "--cname=mid.elsewhere.test,target.elsewhere.test".to_string(),
        format!("--cname={ALIAS},mid.elsewhere.test"),
        format!("--host-record={SHORT},{SHORT_IP},{SHORT_TTL}"),
        format!("--host-record={CLOSED},{CLOSED_IP}"),
        format!("--host-record={CNP_NAME},{CNP_IP}"),
    ])
}

/// The rogue server's zone: the policy's name with an address no trusted answer holds.
pub fn rogue_zone() -> Vec<String> {
    vec![
        format!("--local-ttl={LONG_TTL}"),
        format!("--host-record={API},{ROGUE_IP}"),
    ]
}

/// `dnsmasq` in `pod` on its addresses with `zone`.
pub fn start_dns(pod: &Netns, ips: &[IpAddr], zone: &[String], work: &Path) -> Result<Proc> {
    nat::start_dnsmasq_with(pod, ips, zone, work)
}

/// The test's world as manifests: namespaces, pods (with `labels`), the Calico v3 policy that lets
/// `app == 'client'` pods reach the DNS servers and, by name only, the outside host, and an admin
/// ClusterNetworkPolicy whose `domainNames` peer admits [`CNP_NAME`].
pub fn manifests(cluster: &Cluster, labels: &[nat::PodSpec<'_>]) -> String {
    let dns = cluster.pod("kube-system/dns");
    let rogue = cluster.pod("rogue/dns");
    let policy = format!(
        r#"apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {{name: fqdn-egress, namespace: fq}}
spec:
  selector: app == 'client'
  types: [Egress]
  egress:
  - action: Allow
    protocol: UDP
    destination: {{nets: [{dns}/32, {rogue}/32], ports: [53]}}
  - action: Allow
    protocol: TCP
    destination: {{nets: [{dns}/32], ports: [53]}}
  - action: Allow
    protocol: UDP
    destination: {{nets: ["{dns6}/128"], ports: [53]}}
  - action: Allow
    protocol: TCP
    destination:
      domains: [{API}, {KEEP}, {SHORT}, "*.wild.fqdn.test", {ALIAS}]
      ports: [{who}]
  - action: Allow
    protocol: UDP
    destination:
      domains: ["*.race.fqdn.test"]
      ports: [{RECORDER_PORT}]
"#,
        dns = dns.ip,
        rogue = rogue.ip,
        dns6 = dns.ip6,
        who = nat::WHOAMI_PORT,
    );
    let cnp = format!(
        r#"apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {{name: fqdn-admin}}
spec:
  tier: Admin
  priority: 10
  subject: {{pods: {{namespaceSelector: {{}}, podSelector: {{matchLabels: {{app: client}}}}}}}}
  egress:
  - action: Accept
    to: [{{domainNames: [{CNP_NAME}]}}]
    protocols: [{{tcp: {{destinationPort: {{number: {who}}}}}}}]
"#,
        who = nat::WHOAMI_PORT,
    );
    nat::manifests(cluster, labels, &[policy, cnp])
}

/// A UDP server on `0.0.0.0:port` in a namespace that records every datagram's payload; stopped
/// on drop.
pub struct Recorder {
    pub seen: Arc<Mutex<BTreeSet<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Recorder {
    pub fn start(netns: &str, port: u16) -> Result<Recorder> {
        let ns = netns.to_string();
        let sock = std::thread::spawn(move || -> Result<UdpSocket> {
            enter(&ns)?;
            let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port))
                .with_context(|| format!("binding the recorder on {port} in {ns}"))?;
            s.set_read_timeout(Some(Duration::from_millis(50)))?;
            Ok(s)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("recorder setup panicked"))??;
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, st2) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !st2.load(Ordering::Relaxed) {
                match sock.recv(&mut buf) {
                    Ok(n) => {
                        let text = String::from_utf8_lossy(&buf[..n]).to_string();
                        s2.lock().expect("recorder lock").insert(text);
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(Recorder {
            seen,
            stop,
            thread: Some(thread),
        })
    }

    pub fn has(&self, payload: &str) -> bool {
        self.seen.lock().expect("recorder lock").contains(payload)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Resolves `name` (A) through `server` from `netns` and at once sends one UDP datagram with
/// `payload` to the first address of the answer, port [`RECORDER_PORT`], from the same thread:
/// nothing runs between the answer's arrival and the pod's first packet. Returns the address, or
/// `None` when no answer came.
pub fn resolve_and_send(
    netns: &str,
    server: SocketAddr,
    name: &str,
    payload: &str,
    timeout: Duration,
) -> Result<Option<IpAddr>> {
    let ns = netns.to_string();
    let (name, payload) = (name.to_string(), payload.to_string());
    std::thread::spawn(move || -> Result<Option<IpAddr>> {
        enter(&ns)?;
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        sock.set_read_timeout(Some(timeout))?;
        let id: u16 = rand_id(&name);
        sock.send_to(&dns::query(id, &name, dns::A)?, server)?;
        let mut buf = [0u8; 1500];
        let n = loop {
            match sock.recv_from(&mut buf) {
                Ok((n, from)) if from == server => break n,
                Ok(_) => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            }
        };
        let Some(first) = dns::answers(&buf[..n], id)?.first().copied() else {
            return Ok(None);
        };
        sock.send_to(payload.as_bytes(), (first.addr, RECORDER_PORT))?;
        Ok(Some(first.addr))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("race client panicked"))?
}

fn rand_id(name: &str) -> u16 {
    let mut h: u16 = std::process::id() as u16;
    for b in name.bytes() {
        h = h.rotate_left(5) ^ u16::from(b);
    }
    h
}

/// Sends `msg` as one UDP datagram from `from` (bound: an address of `netns`) to `to`.
pub fn send_udp_from(netns: &str, from: SocketAddr, to: SocketAddr, msg: Vec<u8>) -> Result<()> {
    let ns = netns.to_string();
    std::thread::spawn(move || -> Result<()> {
        enter(&ns)?;
        let s = UdpSocket::bind(from).with_context(|| format!("binding {from} in {ns}"))?;
        s.send_to(&msg, to)?;
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("udp sender panicked"))?
}

/// A UDP socket bound in `netns` on `port` that waits up to `timeout` for one datagram and returns
/// it; started before the sender so nothing is missed.
pub fn receive_one(
    netns: &str,
    port: u16,
    timeout: Duration,
) -> Result<JoinHandle<Result<Option<Vec<u8>>>>> {
    let ns = netns.to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || -> Result<Option<Vec<u8>>> {
        enter(&ns)?;
        let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port))?;
        s.set_read_timeout(Some(timeout))?;
        let _ = ready_tx.send(());
        let mut buf = [0u8; 1500];
        match s.recv(&mut buf) {
            Ok(n) => Ok(Some(buf[..n].to_vec())),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(None),
            Err(e) => Err(e.into()),
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .context("receiver did not start")?;
    Ok(h)
}

/// The members of the node's domain IP sets (`cali40d:`/`cali60d:`), with their timeouts:
/// `(set, address, seconds left)`.
pub fn domain_members(node: &Netns) -> Result<Vec<(String, String, u64)>> {
    let out = node.exec_unchecked(&["ipset", "list"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut set = String::new();
    let mut in_members = false;
    let mut v = Vec::new();
    for l in text.lines() {
        if let Some(n) = l.strip_prefix("Name: ") {
            set = n.trim().to_string();
            in_members = false;
        } else if l.starts_with("Members:") {
            in_members = true;
        } else if l.trim().is_empty() {
            in_members = false;
        } else if in_members && (set.starts_with("cali40d:") || set.starts_with("cali60d:")) {
            let mut it = l.split_whitespace();
            let addr = it.next().unwrap_or_default().to_string();
            let timeout = it
                .skip_while(|t| *t != "timeout")
                .nth(1)
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            v.push((set.clone(), addr, timeout));
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zone_and_the_policy_name_every_case() {
        let dir = tempfile::tempdir().unwrap();
        let zone = trusted_zone(dir.path()).unwrap();
        for name in [
            API,
            KEEP,
            WILD_A,
            WILD_DEEP,
            WILD_APEX,
            CHAIN_TARGET,
            SHORT,
            CLOSED,
        ] {
            assert!(zone.iter().any(|o| o.contains(name)), "{name}");
        }
        assert!(zone.contains(&format!("--host-record={SHORT},{SHORT_IP},{SHORT_TTL}")));
        let hosts = std::fs::read_to_string(dir.path().join("fqdn-hosts")).unwrap();
        assert_eq!(hosts.lines().count(), usize::from(RACE_NAMES));
        assert!(hosts.contains("203.0.113.220 r220.race.fqdn.test\n"));
        // Every case's address is distinct, so no case passes on another's learning.
        let addrs = outside_addrs();
        let unique: BTreeSet<_> = addrs.iter().collect();
        assert_eq!(unique.len(), addrs.len());
    }
}
