//! A node namespace with two pod namespaces (`stats/client`, `stats/server`) wired as Calico's CNI
//! wires pods, TCP servers in the server pod, and the node's rules programmed by the caller: the
//! kernel tests of `felixrs stats`, `felixrs trace --kernel` and `felixrs flows`, and any other
//! crate's tests that need a real two-pod node.
//!
//! The cluster is [`MANIFESTS`] (written to the world's work directory); the crate under test
//! renders it and programs the node through a [`Dataplane`], so this module stays free of felixrs,
//! iptables and their dependencies (see the crate's dependency rule).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::ops::Deref;
use std::path::Path;
use std::time::Duration;

use crate::netns::{Netns, unique_name};

pub const NODE: &str = "node-1";
pub const ALLOWED_PORT: u16 = 8080;
pub const DENIED_PORT: u16 = 9090;

pub const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: stats}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: stats, labels: {app: client}}
spec: {nodeName: node-1, containers: [{name: c, image: x}]}
status: {phase: Running, podIPs: [{ip: 10.79.0.1}, {ip: "fd79::1"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: stats, labels: {app: server}}
spec: {nodeName: node-1, containers: [{name: s, image: x}]}
status: {phase: Running, podIPs: [{ip: 10.79.0.2}, {ip: "fd79::2"}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-web, namespace: stats}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
    - from: [{podSelector: {matchLabels: {app: client}}}]
      ports: [{port: 8080, protocol: TCP}]
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: default.deny-telnet}
spec:
  tier: default
  order: 10
  selector: app == 'server'
  types: [Ingress]
  ingress:
    - action: Log
      protocol: TCP
      destination: {ports: [2323]}
    - action: Deny
      protocol: TCP
      destination: {ports: [2323]}
"#;

/// The port the `deny-telnet` GlobalNetworkPolicy logs (a Log rule) and denies (a Deny rule, not a
/// tier end).
pub const TELNET_PORT: u16 = 2323;

pub struct Pod {
    pub ns: Netns,
    pub v4: IpAddr,
    pub v6: IpAddr,
}

pub fn exec(ns: &Netns, argv: &[&str]) {
    ns.exec(argv)
        .unwrap_or_else(|e| panic!("{argv:?} in {}: {e}", ns.name()));
}

/// A pod namespace behind host interface `iface` of `node`, as Calico's CNI wires it.
pub fn add_pod(node: &Netns, iface: &str, v4: &str, v6: &str) -> Pod {
    let ns = Netns::create(unique_name("stp")).expect("pod netns");
    for scope in ["all", "default"] {
        ns.sysctl(&format!("net.ipv6.conf.{scope}.accept_dad"), "0")
            .unwrap();
    }
    ns.sysctl("net.ipv6.bindv6only", "1").unwrap();
    wire_pod(node, &ns, iface, v4, v6)
        .unwrap_or_else(|e| panic!("wiring {iface} of {}: {e}", node.name()));
    Pod {
        ns,
        v4: v4.parse().unwrap(),
        v6: v6.parse().unwrap(),
    }
}

/// The link-local IPv6 gateway of every pod, held by every host-side `cali` interface.
pub const GATEWAY6: &str = "fe80::1";

/// Wires pod namespace `pod` behind host interface `iface` of `node` as Calico's CNI does: a veth
/// pair (`eth0` in the pod), proxy ARP, no reverse-path filter and a /32 and /128 route on the
/// node's side, which holds [`GATEWAY6`]; the pod's `v4`/32 and `v6`/128 with default routes via
/// 169.254.1.1 and [`GATEWAY6`].
pub fn wire_pod(
    node: &Netns,
    pod: &Netns,
    iface: &str,
    v4: impl std::fmt::Display,
    v6: impl std::fmt::Display,
) -> std::io::Result<()> {
    let run = |ns: &Netns, cmd: String| {
        ns.exec(&cmd.split_whitespace().collect::<Vec<_>>())
            .map(drop)
    };
    let p = pod.name();
    run(
        node,
        format!("ip link add {iface} type veth peer name eth0 netns {p}"),
    )?;
    node.sysctl(&format!("net.ipv4.conf.{iface}.proxy_arp"), "1")?;
    node.sysctl(&format!("net.ipv4.neigh.{iface}.proxy_delay"), "0")?;
    node.sysctl(&format!("net.ipv4.conf.{iface}.rp_filter"), "0")?;
    run(node, format!("ip link set {iface} up"))?;
    run(node, format!("ip route add {v4}/32 dev {iface}"))?;
    run(
        node,
        format!("ip -6 addr add {GATEWAY6}/64 dev {iface} nodad"),
    )?;
    run(node, format!("ip -6 route add {v6}/128 dev {iface}"))?;
    run(pod, format!("ip addr add {v4}/32 dev eth0"))?;
    run(pod, format!("ip -6 addr add {v6}/128 dev eth0 nodad"))?;
    run(pod, "ip link set eth0 up".into())?;
    run(pod, "ip route add 169.254.1.1 dev eth0 scope link".into())?;
    run(pod, "ip route add default via 169.254.1.1 dev eth0".into())?;
    run(
        pod,
        format!("ip -6 route add default via {GATEWAY6} dev eth0"),
    )
}

pub fn serve(ns: &Netns, addr: IpAddr, port: u16) {
    let sock = SocketAddr::new(addr, port);
    let listener = ns.in_thread(move || TcpListener::bind(sock).expect("bind in pod netns"));
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let _ = conn.write_all(b"ok");
        }
    });
}

pub fn connects(ns: &Netns, addr: IpAddr, port: u16) -> bool {
    let sock = SocketAddr::new(addr, port);
    ns.in_thread(
        move || match TcpStream::connect_timeout(&sock, Duration::from_millis(1000)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                let mut buf = [0u8; 2];
                s.read_exact(&mut buf).is_ok() && &buf == b"ok"
            }
            Err(_) => false,
        },
    )
}

/// How the crate under test programs the node: rendered from the manifests before the namespaces
/// exist (the pods' interface names come from it), programmed once the pods are wired and reachable.
pub trait Dataplane {
    /// What the world keeps once the node is programmed (reachable through [`NodeWorld`]'s `Deref`).
    type Programmed;

    /// The host-side interface name of the pod whose name contains `pod` (`"client"`, `"server"`).
    fn interface_of(&self, pod: &str) -> String;

    /// Programs the node's rules inside `node`.
    fn program(self, node: &Netns) -> Self::Programmed;
}

/// The node, its pods and the programmed dataplane (dropped in this order: pods, then the node, then
/// what the dataplane kept, then the work directory). Derefs to the programmed dataplane, so its
/// fields read as the world's own (`w.renderer`).
pub struct NodeWorld<P> {
    pub client: Pod,
    pub server: Pod,
    pub node: Netns,
    pub programmed: P,
    pub work: tempfile::TempDir,
}

impl<P> Deref for NodeWorld<P> {
    type Target = P;

    fn deref(&self) -> &P {
        &self.programmed
    }
}

impl<P> NodeWorld<P> {
    /// Writes [`MANIFESTS`] to a fresh work directory as `cluster.yaml`, has `render` turn that
    /// directory into a [`Dataplane`], builds the node and its pods, checks the pods can talk
    /// before any rule, then programs the node.
    pub fn build<D: Dataplane<Programmed = P>>(render: impl FnOnce(&Path) -> D) -> NodeWorld<P> {
        let work = tempfile::tempdir().unwrap();
        std::fs::write(work.path().join("cluster.yaml"), MANIFESTS).unwrap();
        let dataplane = render(work.path());
        let node = Netns::with_tag("stats");
        for scope in ["all", "default"] {
            node.sysctl(&format!("net.ipv6.conf.{scope}.accept_dad"), "0")
                .unwrap();
        }
        node.sysctl("net.ipv4.ip_forward", "1").unwrap();
        node.sysctl("net.ipv4.conf.all.rp_filter", "0").unwrap();
        node.sysctl("net.ipv4.conf.default.rp_filter", "0").unwrap();
        // Proxy ARP answers for the pods' gateway 169.254.1.1 only if the node routes it elsewhere:
        // a default route out of a veth pair of its own (nothing is ever sent there).
        exec(
            &node,
            &[
                "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1",
            ],
        );
        exec(
            &node,
            &["ip", "addr", "add", "10.79.255.1/24", "dev", "up0"],
        );
        exec(&node, &["ip", "link", "set", "up0", "up"]);
        exec(&node, &["ip", "link", "set", "up1", "up"]);
        exec(
            &node,
            &["ip", "route", "add", "default", "via", "10.79.255.2"],
        );
        node.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
        let client = add_pod(
            &node,
            &dataplane.interface_of("client"),
            "10.79.0.1",
            "fd79::1",
        );
        let server = add_pod(
            &node,
            &dataplane.interface_of("server"),
            "10.79.0.2",
            "fd79::2",
        );
        for addr in [server.v4, server.v6] {
            serve(&server.ns, addr, ALLOWED_PORT);
            serve(&server.ns, addr, DENIED_PORT);
            serve(&server.ns, addr, TELNET_PORT);
        }

        assert!(
            (0..5).any(|_| connects(&client.ns, server.v4, ALLOWED_PORT)),
            "no connectivity before any rule"
        );
        let programmed = dataplane.program(&node);
        NodeWorld {
            client,
            server,
            node,
            programmed,
            work,
        }
    }
}
