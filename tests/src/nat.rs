//! Helpers of the outgoing-NAT and service end-to-end test (`tests/tests/e2e_nat.rs`): an
//! "internet" host behind the infra namespace, a who-am-I server that answers with the peer
//! address it sees, kube-proxy (iptables mode) and Docker shaped nat rules written into a node's
//! namespace, `dnsmasq` in a pod, a minimal DNS client, and the manifests of the test's world.
//!
//! ```text
//!   internet netns: eth0 198.51.100.10/24 + 2001:db8:100::10/64, routes to the nodes' and pods'
//!      │            ranges (10.77.0.0/24, 10.78.0.0/16, fd77::/64, fd78::/16) via the infra side
//!      └── veth ── infra netns: inet0 198.51.100.1/24 + 2001:db8:100::1/64, br0 also fd77::1/64,
//!                  forwarding, 10.78.<n>.0/24 and fd78:<n>::/64 via node n
//!   nodes: IPv6 default route via fd77::1 (IPv4 already via 10.77.0.1)
//! ```
//! The internet host routes the pod range back (as a cluster whose pools are advertised would), so
//! an un-masqueraded pod reaches it with its own address: what it sees is the test's observable.
//! Only addresses assigned inside the test's namespaces are used; nothing leaves the machine.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use felixrs_test_support::netns::{Netns, enter, unique_name};

use crate::cluster::Cluster;
use crate::dns;
use crate::driver::Proc;

/// The internet host's address (TEST-NET-2).
pub const INTERNET_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
/// The internet host's IPv6 address (documentation prefix).
pub const INTERNET_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x10);
const INFRA_INET_IP: &str = "198.51.100.1";
const INFRA_INET_IP6: &str = "2001:db8:100::1";
const INFRA_BR_IP6: &str = "fd77::1";
/// The port of every who-am-I server.
pub const WHOAMI_PORT: u16 = 8080;

/// Attaches the internet host to the cluster's infra namespace (see the module docs).
pub fn attach_internet(cluster: &Cluster) -> Result<Netns> {
    let inet = Netns::create(unique_name("w"))?;
    let infra = &cluster.infra;
    infra.exec(&[
        "ip",
        "link",
        "add",
        "inet0",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        inet.name(),
    ])?;
    infra.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{INFRA_INET_IP}/24"),
        "dev",
        "inet0",
    ])?;
    infra.exec(&[
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{INFRA_INET_IP6}/64"),
        "dev",
        "inet0",
        "nodad",
    ])?;
    infra.exec(&[
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{INFRA_BR_IP6}/64"),
        "dev",
        "br0",
        "nodad",
    ])?;
    infra.exec(&["ip", "link", "set", "inet0", "up"])?;
    infra.sysctl("net.ipv4.ip_forward", "1")?;
    infra.sysctl("net.ipv6.conf.all.forwarding", "1")?;
    infra.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
    infra.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
    for (i, n) in cluster.nodes.iter().enumerate() {
        infra.exec(&[
            "ip",
            "route",
            "add",
            &format!("10.78.{}.0/24", i + 1),
            "via",
            &n.ip.to_string(),
        ])?;
        infra.exec(&[
            "ip",
            "-6",
            "route",
            "add",
            &format!("fd78:{}::/64", i + 1),
            "via",
            &n.ip6.to_string(),
        ])?;
        n.ns.exec(&["ip", "-6", "route", "add", "default", "via", INFRA_BR_IP6])?;
    }
    // Servers bind IPv4 and IPv6 separately (v6-only), so IPv4 peers are not seen as ::ffff:a.b.c.d.
    inet.sysctl("net.ipv6.bindv6only", "1")?;
    for scope in ["all", "default"] {
        inet.sysctl(&format!("net.ipv6.conf.{scope}.accept_dad"), "0")?;
    }
    inet.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{INTERNET_IP}/24"),
        "dev",
        "eth0",
    ])?;
    inet.exec(&["ip", "link", "set", "eth0", "up"])?;
    inet.exec(&[
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{INTERNET_IP6}/64"),
        "dev",
        "eth0",
        "nodad",
    ])?;
    for dst in ["10.77.0.0/24", "10.78.0.0/16"] {
        inet.exec(&["ip", "route", "add", dst, "via", INFRA_INET_IP])?;
    }
    for dst in ["fd77::/64", "fd78::/16"] {
        inet.exec(&["ip", "-6", "route", "add", dst, "via", INFRA_INET_IP6])?;
    }
    Ok(inet)
}

/// A TCP server in a namespace (IPv4 and IPv6; the namespace must have `bindv6only`) that writes
/// the peer's address (`a.b.c.d\n`, `fd78:1::a\n`) and closes; stopped on drop.
pub struct WhoAmI {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl WhoAmI {
    pub fn start(netns: &str) -> Result<WhoAmI> {
        let ns = netns.to_string();
        let listeners = std::thread::spawn(move || -> Result<Vec<TcpListener>> {
            enter(&ns)?;
            let any: [IpAddr; 2] = [Ipv4Addr::UNSPECIFIED.into(), Ipv6Addr::UNSPECIFIED.into()];
            any.into_iter()
                .map(|ip| {
                    let l = TcpListener::bind((ip, WHOAMI_PORT)).with_context(|| {
                        format!("binding who-am-I [{ip}]:{WHOAMI_PORT} in {ns}")
                    })?;
                    l.set_nonblocking(true)?;
                    Ok(l)
                })
                .collect()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("who-am-I setup panicked"))??;
        let stop = Arc::new(AtomicBool::new(false));
        let threads = listeners
            .into_iter()
            .map(|listener| {
                let s = stop.clone();
                std::thread::spawn(move || {
                    while !s.load(Ordering::Relaxed) {
                        match listener.accept() {
                            Ok((mut c, peer)) => {
                                let _ = c.set_nonblocking(false);
                                let _ = writeln!(c, "{}", peer.ip());
                            }
                            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                                std::thread::sleep(Duration::from_millis(10))
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(10)),
                        }
                    }
                })
            })
            .collect();
        Ok(WhoAmI { stop, threads })
    }
}

impl Drop for WhoAmI {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Connects from `netns` to a who-am-I server at `dst:port` and returns the address it saw, or
/// `None` when the connection fails (blocked, timed out).
pub fn seen_as(
    netns: &str,
    dst: impl Into<IpAddr>,
    port: u16,
    timeout: Duration,
) -> Result<Option<String>> {
    let dst = dst.into();
    let ns = netns.to_string();
    std::thread::spawn(move || -> Result<Option<String>> {
        enter(&ns)?;
        let addr = SocketAddr::from((dst, port));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, timeout) else {
            return Ok(None);
        };
        s.set_read_timeout(Some(timeout))?;
        let mut out = String::new();
        if s.read_to_string(&mut out).is_err() {
            return Ok(None);
        }
        Ok(Some(out.trim().to_string()))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("who-am-I client panicked"))?
}

/// One kube-proxy service port: `vip:port/proto` → `backend:target`.
#[derive(Debug, Clone)]
pub struct ServicePort {
    /// `namespace/name:port-name`, kube-proxy's comment.
    pub name: &'static str,
    /// Chain suffix, as kube-proxy's hash (16 upper-case base32 characters).
    pub id: &'static str,
    pub vip: Ipv4Addr,
    pub port: u16,
    pub proto: &'static str,
    pub backend: Ipv4Addr,
    pub target: u16,
}

/// kube-proxy iptables-mode nat rules for `services` (its exact shapes: KUBE-SERVICES from
/// PREROUTING and OUTPUT, KUBE-MARK-MASQ for traffic from outside the cluster CIDR and hairpin,
/// DNAT in KUBE-SEP-*, MASQUERADE of marked traffic in KUBE-POSTROUTING), plus Docker's nat rules,
/// as one `iptables-restore --noflush` payload. Written before the agent starts, as on a node
/// where kube-proxy and Docker run first.
pub fn foreign_nat_rules(services: &[ServicePort], cluster_cidr: &str) -> String {
    let mut chains = vec![
        ":KUBE-SERVICES - [0:0]".to_string(),
        ":KUBE-POSTROUTING - [0:0]".to_string(),
        ":KUBE-MARK-MASQ - [0:0]".to_string(),
        ":DOCKER - [0:0]".to_string(),
    ];
    let mut rules = vec![
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".to_string(),
        "-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER".to_string(),
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".to_string(),
        "-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER".to_string(),
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING".to_string(),
        "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE".to_string(),
        "-A DOCKER -i docker0 -j RETURN".to_string(),
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000".to_string(),
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN".to_string(),
        "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000".to_string(),
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully".to_string(),
    ];
    for s in services {
        let svc = format!("KUBE-SVC-{}", s.id);
        let sep = format!("KUBE-SEP-{}", s.id);
        let p = s.proto;
        chains.push(format!(":{svc} - [0:0]"));
        chains.push(format!(":{sep} - [0:0]"));
        rules.push(format!(
            "-A KUBE-SERVICES -d {}/32 -p {p} -m comment --comment \"{} cluster IP\" -m {p} --dport {} -j {svc}",
            s.vip, s.name, s.port
        ));
        rules.push(format!(
            "-A {svc} ! -s {cluster_cidr} -d {}/32 -p {p} -m comment --comment \"{} cluster IP\" -m {p} --dport {} -j KUBE-MARK-MASQ",
            s.vip, s.name, s.port
        ));
        rules.push(format!(
            "-A {svc} -m comment --comment \"{} -> {}:{}\" -j {sep}",
            s.name, s.backend, s.target
        ));
        rules.push(format!(
            "-A {sep} -s {}/32 -m comment --comment \"{}\" -j KUBE-MARK-MASQ",
            s.backend, s.name
        ));
        rules.push(format!(
            "-A {sep} -p {p} -m comment --comment \"{}\" -m {p} -j DNAT --to-destination {}:{}",
            s.name, s.backend, s.target
        ));
    }
    rules.push(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
            .to_string(),
    );
    chains.push(":KUBE-NODEPORTS - [0:0]".to_string());
    format!(
        "*nat\n{}\n{}\nCOMMIT\n",
        chains.join("\n"),
        rules.join("\n")
    )
}

/// The nat table's rules and chains that are not ours (`iptables-save -t nat`, counters and
/// comment lines dropped), in order: what must survive every apply byte for byte.
pub fn foreign_nat_lines(node: &Netns) -> Result<Vec<String>> {
    let out = node.exec(&["iptables-save", "-t", "nat"])?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.contains("cali"))
        .map(|l| match l.find(" [") {
            Some(i) if l.starts_with(':') => l[..i].to_string(),
            _ => l.to_string(),
        })
        .collect())
}

/// `dnsmasq` answering for `records` (name, address) on `ip:53` inside `pod`, logging to
/// `work/dnsmasq-<ip>.log`; killed on drop.
pub fn start_dnsmasq(
    pod: &Netns,
    ip: Ipv4Addr,
    records: &[(&str, Ipv4Addr)],
    work: &Path,
) -> Result<Proc> {
    let extra: Vec<String> = records
        .iter()
        .map(|(name, addr)| format!("--host-record={name},{addr}"))
        .collect();
    start_dnsmasq_with(pod, &[ip.into()], &extra, work)
}

/// `dnsmasq` (authoritative for nothing, no upstream, no hosts file) listening on `ips` port 53
/// inside `pod`, with `extra` options (records, TTLs), logging every query to
/// `work/dnsmasq-<first ip>.log`; killed on drop.
pub fn start_dnsmasq_with(
    pod: &Netns,
    ips: &[IpAddr],
    extra: &[String],
    work: &Path,
) -> Result<Proc> {
    let ip = ips.first().context("dnsmasq needs an address")?;
    let mut args: Vec<String> = [
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        "--user=root",
        "--log-facility=-",
        "--log-queries",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for a in ips {
        args.push(format!("--listen-address={a}"));
    }
    args.push(format!(
        "--pid-file={}",
        work.join(format!("dnsmasq-{ip}.pid")).display()
    ));
    args.extend(extra.iter().cloned());
    Proc::spawn(
        pod,
        Path::new("dnsmasq"),
        &args,
        work.join(format!("dnsmasq-{ip}.log")),
    )
}

/// One DNS query for `name`'s A record over UDP from `netns` to `server:53`: the first address of
/// the answer, `None` for no answer in time (or an answer without an A record).
pub fn resolve_a(
    netns: &str,
    server: Ipv4Addr,
    name: &str,
    timeout: Duration,
) -> Result<Option<Ipv4Addr>> {
    let got = dns::ask(netns, (server, 53).into(), name, dns::A, timeout)?;
    Ok(first_v4(got))
}

/// [`resolve_a`] over TCP.
pub fn resolve_a_tcp(
    netns: &str,
    server: Ipv4Addr,
    name: &str,
    timeout: Duration,
) -> Result<Option<Ipv4Addr>> {
    let got = dns::ask_tcp(netns, (server, 53).into(), name, dns::A, timeout)?;
    Ok(first_v4(got))
}

fn first_v4(answers: Option<Vec<dns::Answer>>) -> Option<Ipv4Addr> {
    answers?.into_iter().find_map(|a| match a.addr {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => None,
    })
}

/// A pod of the test's world: (namespace, name, labels).
pub type PodSpec<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

/// Namespaces, service accounts and pods (placed as in `cluster`) as manifests, plus `extra` raw
/// YAML documents (pools, policies).
pub fn manifests(cluster: &Cluster, labels: &[PodSpec<'_>], extra: &[String]) -> String {
    let mut docs: Vec<String> = Vec::new();
    let mut namespaces: Vec<&str> = cluster.pods.iter().map(|p| p.namespace.as_str()).collect();
    namespaces.sort();
    namespaces.dedup();
    for ns in namespaces {
        docs.push(yaml(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"ns": ns}}})));
        docs.push(yaml(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": ns}})));
    }
    for p in &cluster.pods {
        let pod_labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .filter(|(ns, name, _)| *ns == p.namespace && *name == p.name)
            .flat_map(|(_, _, l)| l.iter())
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        docs.push(yaml(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": p.name, "namespace": p.namespace, "labels": pod_labels},
            "spec": {"nodeName": cluster.nodes[p.node].name, "serviceAccountName": "default",
                     "containers": [{"name": "serve", "image": "agnhost"}]},
            "status": {"phase": "Running", "podIP": p.ip.to_string(),
                       "podIPs": [{"ip": p.ip.to_string()}, {"ip": p.ip6.to_string()}]},
        })));
    }
    docs.extend(extra.iter().cloned());
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(d.trim());
        out.push('\n');
    }
    out
}

fn yaml(v: &serde_json::Value) -> String {
    serde_yaml::to_string(v).expect("yaml")
}

/// An IPPool document (block size /32 or /128, so that small pools are valid).
pub fn ip_pool(name: &str, cidr: &str, nat_outgoing: bool, disabled: bool) -> String {
    let block = if cidr.contains(':') { 128 } else { 32 };
    yaml(&json!({
        "apiVersion": "projectcalico.org/v3", "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"cidr": cidr, "natOutgoing": nat_outgoing, "disabled": disabled,
                 "blockSize": block, "nodeSelector": "all()"},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_rules_are_one_nat_payload() {
        let p = foreign_nat_rules(
            &[ServicePort {
                name: "svc/web:http",
                id: "ABCDEFGHIJKLMNOP",
                vip: Ipv4Addr::new(10, 96, 0, 10),
                port: 80,
                proto: "tcp",
                backend: Ipv4Addr::new(10, 78, 2, 13),
                target: 80,
            }],
            "10.78.0.0/16",
        );
        assert!(p.starts_with("*nat\n") && p.ends_with("COMMIT\n"));
        assert!(p.contains("-A KUBE-SEP-ABCDEFGHIJKLMNOP -p tcp -m comment --comment \"svc/web:http\" -m tcp -j DNAT --to-destination 10.78.2.13:80"));
    }
}
