//! Source-address scenarios of the main e2e run (`tests/e2e.rs`): a pod spoofing another pod's
//! address is dropped before conntrack (raw-table reverse-path check), and
//! `allowedSourcePrefixes` opens exactly the annotated prefixes. Observed through conntrack on the
//! nodes, so both the drop and its control are visible.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cases::{Step, T80};
use crate::env::Env;

/// A policy that denies x/a -> x/b (x/b accepts only from x/c), used by the reliability scenarios.
pub const PROTECT_XB: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: protect-x-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: c}}}]}]
"#;

pub fn protect_step() -> Step {
    Step::new(vec![PROTECT_XB], vec![T80], |e| {
        e.deny("*/*", "x/b");
        e.allow("x/c", "x/b");
    })
}

/// Runs `conntrack <command>` (`-L` or `-D`) in namespace `ns` on the flows whose original
/// direction is UDP `src`:`sport` -> `dst`:80, returning the flow lines it printed.
fn on_udp_flows(
    ns: &felixrs_test_support::netns::Netns,
    command: &str,
    src: IpAddr,
    sport: u16,
    dst: IpAddr,
) -> Result<Vec<String>> {
    let (src, dst, sport) = (src.to_string(), dst.to_string(), sport.to_string());
    let family = if dst.contains(':') { "ipv6" } else { "ipv4" };
    // Exit status 1 with "0 flow entries" is the normal answer when nothing matches.
    let out = ns.exec_unchecked(&[
        "conntrack",
        command,
        "-f",
        family,
        "-p",
        "udp",
        "--orig-src",
        &src,
        "--orig-dst",
        &dst,
        "--sport",
        &sport,
        "--dport",
        "80",
    ])?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("sport={sport} dport=80")))
        .map(str::to_string)
        .collect())
}

/// The conntrack flows of UDP `src`:`sport` -> `dst`:80 in `ns`, one line each.
fn udp_flows(
    ns: &felixrs_test_support::netns::Netns,
    src: IpAddr,
    sport: u16,
    dst: IpAddr,
) -> Result<Vec<String>> {
    on_udp_flows(ns, "-L", src, sport, dst)
}

/// Deletes the flows [`udp_flows`] would list.
fn delete_udp_flows(
    ns: &felixrs_test_support::netns::Netns,
    src: IpAddr,
    sport: u16,
    dst: IpAddr,
) -> Result<()> {
    on_udp_flows(ns, "-D", src, sport, dst).map(drop)
}

/// Sends three UDP datagrams to `dst`:80 from `src`:`sport`, inside namespace `ns`.
fn send_udp(ns: &str, src: IpAddr, sport: u16, dst: IpAddr) -> Result<()> {
    let ns = ns.to_string();
    std::thread::spawn(move || -> Result<()> {
        felixrs_test_support::netns::enter(&ns)?;
        let sock = std::net::UdpSocket::bind((src, sport)).context("bind")?;
        for _ in 0..3 {
            sock.send_to(b"spoofed?", (dst, 80)).context("send")?;
        }
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("sender panicked"))?
}

/// Adds `src` to the eth0 of pod namespace `ns`, sends three UDP datagrams from `src`:`sport` to
/// `dst`:80, waits for them to cross the cluster and removes the address again.
fn send_from_extra_address(
    ns: &felixrs_test_support::netns::Netns,
    src: IpAddr,
    sport: u16,
    dst: IpAddr,
) -> Result<()> {
    let claimed = match src {
        IpAddr::V4(_) => format!("{src}/32"),
        IpAddr::V6(_) => format!("{src}/128"),
    };
    let mut add = vec!["ip", "addr", "add", claimed.as_str(), "dev", "eth0"];
    if src.is_ipv6() {
        add.push("nodad");
    }
    ns.exec(&add)?;
    let sent = send_udp(ns.name(), src, sport, dst);
    std::thread::sleep(Duration::from_millis(300));
    ns.exec(&["ip", "addr", "del", claimed.as_str(), "dev", "eth0"])?;
    sent
}

/// x/b accepts only x/c. Pod x/a takes x/c's address as its own source: the node must drop those
/// packets before conntrack or any policy sees them (raw-table reverse-path check), so nothing of
/// them is tracked on x/a's node nor reaches x/b's. The real x/c's datagrams are the control: they
/// are tracked on x/b's node, which shows the observation works.
///
/// Both source ports lie below the kernel's ephemeral range (32768-60999), and flows are matched by
/// their whole original tuple, so no earlier probe's flow can be mistaken for one of these.
pub fn spoofed_source_is_dropped(env: &mut Env) -> Result<Vec<String>> {
    env.apply_step(&protect_step())?;
    let (a, b, c) = (
        env.cluster.pod("x/a"),
        env.cluster.pod("x/b"),
        env.cluster.pod("x/c"),
    );
    let (a_node, b_node) = (&env.cluster.nodes[a.node].ns, &env.cluster.nodes[b.node].ns);
    let (spoofed, control) = (20678, 20679);
    let mut failures = Vec::new();
    for (family, c_ip, b_ip) in [
        ("v4", IpAddr::V4(c.ip), IpAddr::V4(b.ip)),
        ("v6", IpAddr::V6(c.ip6), IpAddr::V6(b.ip6)),
    ] {
        for ns in [a_node, b_node] {
            for port in [spoofed, control] {
                delete_udp_flows(ns, c_ip, port, b_ip)?;
            }
        }
        send_from_extra_address(&a.ns, c_ip, spoofed, b_ip)?;
        send_udp(c.ns.name(), c_ip, control, b_ip)?;
        std::thread::sleep(Duration::from_millis(300));
        if udp_flows(b_node, c_ip, control, b_ip)?.is_empty() {
            failures.push(format!(
                "{family}: x/c's own datagrams to x/b were not tracked on x/b's node: the check observes nothing"
            ));
        }
        let at_a = udp_flows(a_node, c_ip, spoofed, b_ip)?;
        let at_b = udp_flows(b_node, c_ip, spoofed, b_ip)?;
        if !at_a.is_empty() || !at_b.is_empty() {
            failures.push(format!(
                "{family}: x/a's datagrams claiming x/c's address passed its node ({} flows there, {} on x/b's node): {:?}",
                at_a.len(),
                at_b.len(),
                at_a.iter().chain(&at_b).collect::<Vec<_>>()
            ));
        }
        for ns in [a_node, b_node] {
            for port in [spoofed, control] {
                delete_udp_flows(ns, c_ip, port, b_ip)?;
            }
        }
    }
    Ok(failures)
}

/// x/a's `cni.projectcalico.org/allowedSourcePrefixes` allows it `10.78.200.0/24` and
/// `fd78:c8::/64` (the agents run with `--workload-source-spoofing Any`): its datagrams from an
/// address there cross both nodes, while x/c's address stays forbidden to it. Once the annotation
/// is gone, so is the allowance.
pub fn allowed_source_prefixes(env: &mut Env) -> Result<Vec<String>> {
    const PREFIXES: &str = r#"["10.78.200.0/24", "fd78:c8::/64"]"#;
    let annotated = Step {
        pod_annotations: vec![(
            "x/a",
            "cni.projectcalico.org/allowedSourcePrefixes",
            PREFIXES,
        )],
        ..Step::new(vec![], vec![T80], |_| {})
    };
    let plain = Step::new(vec![], vec![T80], |_| {});
    let extra_v4: IpAddr = "10.78.200.5".parse()?;
    let extra_v6: IpAddr = "fd78:c8::5".parse()?;
    let mut failures = Vec::new();
    for (annotation, port) in [(true, 20680), (false, 20681)] {
        env.apply_step(if annotation { &annotated } else { &plain })?;
        let (a, b, c) = (
            env.cluster.pod("x/a"),
            env.cluster.pod("x/b"),
            env.cluster.pod("x/c"),
        );
        let (a_node, b_node) = (&env.cluster.nodes[a.node].ns, &env.cluster.nodes[b.node].ns);
        for (family, extra, c_ip, b_ip) in [
            ("v4", extra_v4, IpAddr::V4(c.ip), IpAddr::V4(b.ip)),
            ("v6", extra_v6, IpAddr::V6(c.ip6), IpAddr::V6(b.ip6)),
        ] {
            for src in [extra, c_ip] {
                for ns in [a_node, b_node] {
                    delete_udp_flows(ns, src, port, b_ip)?;
                }
                send_from_extra_address(&a.ns, src, port, b_ip)?;
                let at_a = udp_flows(a_node, src, port, b_ip)?;
                let at_b = udp_flows(b_node, src, port, b_ip)?;
                let allowed = annotation && src == extra;
                let passed = !at_a.is_empty() && !at_b.is_empty();
                let stopped = at_a.is_empty() && at_b.is_empty();
                let state = if annotation { "with" } else { "without" };
                if allowed && !passed {
                    failures.push(format!(
                        "{family}: {state} the annotation, x/a's datagrams from {src} did not cross both nodes ({} flows on its node, {} on x/b's)",
                        at_a.len(),
                        at_b.len()
                    ));
                }
                if !allowed && !stopped {
                    failures.push(format!(
                        "{family}: {state} the annotation, x/a's datagrams from {src} passed its node: {:?}",
                        at_a.iter().chain(&at_b).collect::<Vec<_>>()
                    ));
                }
                for ns in [a_node, b_node] {
                    delete_udp_flows(ns, src, port, b_ip)?;
                }
            }
        }
    }
    Ok(failures)
}
