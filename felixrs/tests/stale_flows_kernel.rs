//! `agent::stale_flows` on the kernel: one ctnetlink dump deletes the flows of removed endpoint
//! addresses, both families, by original or reply source (DNAT included) and in their zone, and
//! nothing else. Root; the flows live in a network namespace the test creates.

use std::collections::BTreeSet;
use std::net::IpAddr;

use felixrs::agent::stale_flows::{Cleaner, Removed, remove};
use felixrs_test_support::netns::{Netns, in_netns};
use iptables::apply::ExecRunner;
use prometheus_client::metrics::counter::Counter;

/// Inserts a TCP flow `src:sport → dst:80` (its family is the addresses'); `reply` is the reply direction's source when a DNAT
/// put it elsewhere than `dst`; `zone` a conntrack zone.
fn insert(ns: &Netns, src: &str, dst: &str, reply: &str, sport: &str, zone: &str) {
    let mut args = vec!["-I", "-s", src, "-d", dst, "-p", "tcp"];
    args.extend(["--sport", sport, "--dport", "80", "--state", "ESTABLISHED"]);
    args.extend(["-t", "300", "-w", zone]);
    if reply != dst {
        args.extend(["-r", reply, "-q", src, "--reply-port-src", "80"]);
        args.extend(["--reply-port-dst", sport]);
    }
    ns.ok("conntrack", &args);
}

/// The flows listed in `family` that mention `addr` as a source in either direction.
fn listed(ns: &Netns, family: &str, addr: &str) -> usize {
    ns.ok("conntrack", &["-L", "-f", family])
        .lines()
        .filter(|l| l.contains(&format!("src={addr} ")))
        .count()
}

#[test]
fn flows_of_removed_addresses_are_deleted_in_one_dump() {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&["ip", "conntrack"]);
    let ns = Netns::new();
    // Removed: 10.71.0.1 and fd71::1.
    insert(&ns, "10.71.0.1", "10.71.0.9", "10.71.0.9", "40000", "0");
    insert(&ns, "10.71.0.9", "10.71.0.1", "10.71.0.1", "40001", "0");
    insert(&ns, "10.71.0.9", "10.96.0.10", "10.71.0.1", "40002", "0");
    insert(&ns, "10.71.0.1", "10.71.0.8", "10.71.0.8", "40003", "7");
    insert(&ns, "fd71::1", "fd71::9", "fd71::9", "40004", "0");
    insert(&ns, "fd71::9", "fd71::1", "fd71::1", "40005", "0");
    // Kept: other addresses, one of them a neighbour talking to the removed one's peer.
    insert(&ns, "10.71.0.2", "10.71.0.9", "10.71.0.9", "40006", "0");
    insert(&ns, "fd71::2", "fd71::9", "fd71::9", "40007", "0");
    assert_eq!(listed(&ns, "ipv4", "10.71.0.1"), 4);
    assert_eq!(listed(&ns, "ipv6", "fd71::1"), 2);

    let addrs: BTreeSet<IpAddr> = ["10.71.0.1", "fd71::1"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let removed = in_netns(ns.name(), move || remove(&addrs)).expect("the table is read");
    assert_eq!(
        removed,
        Removed {
            deleted: 6,
            failed: 0
        }
    );
    assert_eq!(listed(&ns, "ipv4", "10.71.0.1"), 0, "v4 flows remain");
    assert_eq!(listed(&ns, "ipv6", "fd71::1"), 0, "v6 flows remain");
    assert_eq!(
        listed(&ns, "ipv4", "10.71.0.2"),
        1,
        "another address's flow went"
    );
    assert_eq!(
        listed(&ns, "ipv6", "fd71::2"),
        1,
        "another address's flow went"
    );

    // Nothing left to delete: a second removal finds nothing and fails nothing.
    let addrs: BTreeSet<IpAddr> = ["10.71.0.1".parse().unwrap()].into_iter().collect();
    let again = in_netns(ns.name(), move || remove(&addrs)).expect("the table is read");
    assert_eq!(again, Removed::default());
}

/// The agent's cleaner deletes on its own thread; an apply that gives an address to an endpoint
/// waits for the deletion still running for it, and then its old flows are gone.
#[test]
fn a_reused_address_waits_for_its_flows_to_be_deleted() {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&["ip", "conntrack"]);
    let ns = Netns::new();
    for k in 0..50 {
        insert(
            &ns,
            "10.72.0.1",
            "10.72.0.9",
            "10.72.0.9",
            &(41000 + k).to_string(),
            "0",
        );
    }
    insert(&ns, "10.72.0.2", "10.72.0.9", "10.72.0.9", "42000", "0");
    assert_eq!(listed(&ns, "ipv4", "10.72.0.1"), 50);
    let (deleted, errors) = (Counter::<u64>::default(), Counter::<u64>::default());
    let (d, e) = (deleted.clone(), errors.clone());
    in_netns(ns.name(), move || {
        let mut cleaner = Cleaner::new(ExecRunner::new()).with_metrics(d, e);
        let addr: IpAddr = "10.72.0.1".parse().unwrap();
        cleaner.start([addr].into_iter().collect());
        // The next apply gives 10.72.0.1 to a new endpoint.
        cleaner.wait_for([addr].iter());
    });
    assert_eq!(deleted.get(), 50, "counted when done");
    assert_eq!(errors.get(), 0);
    assert_eq!(
        listed(&ns, "ipv4", "10.72.0.1"),
        0,
        "the reused address kept flows"
    );
    assert_eq!(listed(&ns, "ipv4", "10.72.0.2"), 1);
}
