//! Deleting the conntrack flows of an address on the real kernel: flows the address started or
//! answered go, every other flow stays; IPv4 and IPv6; an address with no flows is not an error.

mod support;

use felixrs_test_support::netns::Netns;
use iptables::apply::conntrack::remove_flows;
use support::{kernel_netns, runner};

/// Creates a tracked flow in the namespace's conntrack table.
fn flow(ns: &Netns, proto: &str, src: &str, dst: &str, sport: u16, dport: u16) {
    let (sport, dport) = (sport.to_string(), dport.to_string());
    let mut args = vec![
        "-I", "-s", src, "-d", dst, "-p", proto, "--sport", &sport, "--dport", &dport, "-t", "300",
    ];
    if proto == "tcp" {
        args.extend(["--state", "ESTABLISHED"]);
    }
    ns.ok("conntrack", &args);
}

/// `src>dst:dport` of every flow (original tuple), sorted.
fn flows(ns: &Netns, family: &str) -> Vec<String> {
    let out = ns.ok("conntrack", &["-L", "-f", family]);
    let mut v: Vec<String> = out
        .lines()
        .filter_map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .map(str::to_string)
            };
            Some(format!(
                "{}>{}:{}",
                field("src=")?,
                field("dst=")?,
                field("dport=")?
            ))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn flows_started_or_answered_by_the_address_are_deleted_and_no_others() {
    let ns = kernel_netns();
    let pod = "10.70.0.1";
    flow(&ns, "tcp", pod, "10.70.0.9", 40000, 80); // the pod started it
    flow(&ns, "tcp", "10.70.0.9", pod, 40001, 8080); // the pod answered it
    flow(&ns, "udp", pod, "10.70.0.53", 5353, 53);
    flow(&ns, "tcp", "10.70.0.2", "10.70.0.9", 40002, 80); // another pod's
    flow(&ns, "tcp", "10.70.0.9", "10.70.0.10", 40003, 443);
    assert_eq!(flows(&ns, "ipv4").len(), 5);

    let deleted = remove_flows(&runner(&ns), pod.parse().unwrap()).unwrap();
    assert_eq!(deleted, 3);
    assert_eq!(
        flows(&ns, "ipv4"),
        ["10.70.0.2>10.70.0.9:80", "10.70.0.9>10.70.0.10:443"]
    );
    // Nothing left for that address: still a success.
    assert_eq!(remove_flows(&runner(&ns), pod.parse().unwrap()).unwrap(), 0);
}

#[test]
fn ipv6_flows_are_deleted_by_address() {
    let ns = kernel_netns();
    flow(&ns, "tcp", "fd70::1", "fd70::9", 40000, 80);
    flow(&ns, "tcp", "fd70::9", "fd70::1", 40001, 80);
    flow(&ns, "tcp", "fd70::2", "fd70::9", 40002, 80);
    let deleted = remove_flows(&runner(&ns), "fd70::1".parse().unwrap()).unwrap();
    assert_eq!(deleted, 2);
    assert_eq!(flows(&ns, "ipv6"), ["fd70::2>fd70::9:80"]);
}
