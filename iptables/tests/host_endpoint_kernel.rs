//! Host endpoints on the real kernel. A namespace the test creates is the "host" (`fxv-b`); a
//! peer namespace joined by a veth plays "outside" (`fxv-a`), and a third namespace behind a
//! second veth (`fxh-far`) is a network the host routes to. Resources (HostEndpoint,
//! GlobalNetworkPolicy) go through the real calculation graph, renderer and applier:
//! * a deny-all host policy (after one allowing ICMPv6, which IPv6 neighbour discovery needs)
//!   blocks inbound TCP to a port on the host's interface while TCP 22
//!   (a failsafe port, with a listener the test starts) still connects, from the first apply;
//! * an allow policy for one port opens exactly that port;
//! * host egress is denied but for its policies' allows and the outbound failsafe ports;
//! * an `applyOnForward` policy decides forwarded traffic through the interface, while traffic
//!   forwarded through an interface without such a policy is allowed;
//! * `interfaceName: "*"` protects every interface;
//! * an agent restarted from its snapshot keeps the failsafes from its first apply;
//!
//! in IPv4 and IPv6, with the nft and legacy backends.

mod support;

use iptables::apply::Backend;
use serde_json::json;
use support::host_world::*;
use support::tcp;

fn host_policy_with_failsafes(backend: Backend) {
    let mut w = World::new(backend);
    assert_eq!(
        eventually(|| w.inbound(8080)),
        OPEN,
        "no connectivity before policy"
    );

    // First apply: the host endpoint and a deny-all ingress policy together. SSH survives.
    // (IPv6 needs neighbour discovery through host policy, as with Felix: one policy allows
    // ICMPv6 both ways, ahead of the deny-all.)
    w.apply(vec![
        (hep("fxv-b"), true),
        (
            gnp(
                "host-allow-ndp",
                json!({"order": 1, "types": ["Ingress", "Egress"],
                       "ingress": [{"action": "Allow", "protocol": "ICMPv6"}],
                       "egress": [{"action": "Allow", "protocol": "ICMPv6"}]}),
            ),
            true,
        ),
        (gnp("host-deny", json!({"types": ["Ingress"]})), true),
    ]);
    assert_eq!(w.inbound(8080), SHUT, "deny-all host policy left 8080 open");
    assert_eq!(
        eventually(|| w.inbound(22)),
        OPEN,
        "failsafe port 22 was blocked"
    );

    // An allow policy for one port, before the deny-all: that port only.
    w.apply(vec![(
        gnp(
            "host-allow-8080",
            json!({"order": 5, "types": ["Ingress"],
                   "ingress": [{"action": "Allow", "protocol": "TCP",
                                "destination": {"ports": [8080]}}]}),
        ),
        true,
    )]);
    assert_eq!(
        eventually(|| w.inbound(8080)),
        OPEN,
        "allowed port stayed shut"
    );
    assert_eq!(
        w.inbound(8081),
        SHUT,
        "a port the policy does not allow opened"
    );

    // Outbound: the endpoint's only egress policy allows ICMPv6, so TCP out is dropped except
    // to the outbound failsafe ports (BGP 179); an egress allow policy opens its port.
    assert_eq!(w.outbound(9000), SHUT, "host egress left 9000 open");
    assert_eq!(
        eventually(|| w.outbound(179)),
        OPEN,
        "outbound failsafe blocked"
    );
    w.apply(vec![(
        gnp(
            "host-allow-out",
            json!({"order": 5, "types": ["Egress"],
                   "egress": [{"action": "Allow", "protocol": "TCP",
                               "destination": {"ports": [9000]}}]}),
        ),
        true,
    )]);
    assert_eq!(
        eventually(|| w.outbound(9000)),
        OPEN,
        "egress allow policy failed"
    );
    assert_eq!(eventually(|| w.inbound(22)), OPEN);

    // Forwarded traffic: allowed through the host endpoint while no applyOnForward policy
    // selects it; an applyOnForward policy then decides it (9000 allowed, 9001 not).
    assert_eq!(
        eventually(|| w.forwarded(9001)),
        OPEN,
        "forwarding blocked by default"
    );
    w.apply(vec![(
        gnp(
            "host-forward",
            json!({"order": 1, "applyOnForward": true, "types": ["Ingress"],
                   "ingress": [{"action": "Allow", "protocol": "TCP",
                                "destination": {"ports": [9000]}}]}),
        ),
        true,
    )]);
    assert_eq!(
        eventually(|| w.forwarded(9000)),
        OPEN,
        "applyOnForward allow failed"
    );
    assert_eq!(
        w.forwarded(9001),
        SHUT,
        "applyOnForward policy did not apply"
    );

    // `interfaceName: "*"`: the same policies on every interface (the far side too: host
    // traffic to far is blocked now, 22 still open on both interfaces).
    w.apply(vec![(
        gnp("host-forward", json!({"applyOnForward": true})),
        false,
    )]);
    assert_eq!(
        eventually(|| [FAR4, FAR6].map(|a| tcp::connects(&w.pair.b, a, 9001))),
        OPEN,
        "fxh-far has no host endpoint yet"
    );
    w.apply(vec![(hep("*"), true)]);
    assert_eq!(w.inbound(8081), SHUT, "* endpoint left 8081 open");
    assert_eq!(
        eventually(|| w.inbound(22)),
        OPEN,
        "* endpoint blocked failsafe 22"
    );
    assert_eq!(
        [FAR4, FAR6].map(|a| tcp::connects(&w.pair.b, a, 9001)),
        SHUT,
        "* endpoint did not police the other interface"
    );
    // No applyOnForward policy on it: forwarded traffic is allowed.
    assert_eq!(eventually(|| w.forwarded(9001)), OPEN);

    // A restarted agent programs the same state from its snapshot in its first apply: the
    // failsafes are there with the host policy.
    w.restart();
    assert_eq!(w.inbound(8081), SHUT, "restart opened 8081");
    assert_eq!(
        eventually(|| w.inbound(22)),
        OPEN,
        "restart blocked failsafe 22"
    );

    // Deleting the host endpoint opens the host again (its chains and the failsafes go).
    w.apply(vec![(hep("*"), false)]);
    assert_eq!(eventually(|| w.inbound(8081)), OPEN);
    drop(w.far);
}

#[test]
fn host_policy_with_failsafes_nft() {
    host_policy_with_failsafes(Backend::Nft);
}

#[test]
fn host_policy_with_failsafes_legacy() {
    host_policy_with_failsafes(Backend::Legacy);
}
