//! The DNS learner on the real kernel's NFQUEUE, in isolation (the whole FQDN policy with dnsmasq
//! is the e2e suite's): three throwaway namespaces, a "pod" (`client`), a "node" that routes
//! (`router`, the pod's veth is `cali…`) and a DNS "server" whose UDP and TCP sockets answer every
//! query for `*.example.com` with fixed addresses. The router has the mangle POSTROUTING rule the
//! renderer writes (trusted server, `--ctdir REPLY`, NFQUEUE without `--queue-bypass`) and a domain
//! set `hash:ip timeout 0`.
//!
//! * No learner bound: the answer never arrives (fail closed), over IPv4 and IPv6.
//! * Learner bound: the answer arrives, and when it does the set already holds the address with
//!   the TTL as timeout (UDP and TCP, IPv4 and IPv6).
//! * A set the learner cannot write (no timeout support): the answer is dropped, counted with
//!   its reason, never released.
//! * Responses from an untrusted source port (a forged "DNS answer" the rule queues because an
//!   operator trusted the whole address) are released but teach nothing.
//!
//! Root (CI is root); fails loudly otherwise.

mod dns_support;

use std::net::IpAddr;
use std::time::Duration;

use dns_support::*;
use felixrs::dns::metrics::DROP_WRITE_FAILED;

#[test]
fn responses_are_held_until_their_addresses_are_in_the_sets() {
    let w = world();
    let short = Duration::from_secs(2);
    let long = Duration::from_secs(20);
    // Nobody bound to the queue: the kernel drops every response.
    for (v6, tcp) in [(false, false), (true, false), (false, true)] {
        assert_eq!(
            resolve(&w, "api.example.com.", v6, tcp, short),
            None,
            "an answer got through with no learner bound (v6 {v6}, tcp {tcp})"
        );
    }
    assert!(members(&w, "cali40d:test").is_empty());

    let learner = bind_learner(&w, 53);
    learner.set_active(vec![domain_set(
        "*.example.com",
        "cali40d:test",
        Some("cali60d:test"),
    )]);
    for (name, v6, tcp, set, want) in [
        ("api.example.com.", false, false, "cali40d:test", ANSWER4),
        ("www.example.com.", true, false, "cali60d:test", ANSWER6),
        ("tcp.example.com.", false, true, "cali40d:test", ANSWER4),
        ("tcp6.example.com.", true, true, "cali60d:test", ANSWER6),
    ] {
        let got = resolve(&w, name, v6, tcp, long)
            .unwrap_or_else(|| panic!("no answer for {name} (v6 {v6}, tcp {tcp})"));
        let want: IpAddr = want.parse().unwrap();
        assert_eq!(got, vec![want]);
        // The answer is out: the set holds its address already, with the record's TTL.
        let m = members(&w, set);
        let (_, timeout) = m
            .iter()
            .find(|(a, _)| *a == want)
            .unwrap_or_else(|| panic!("{want} not in {set} when the answer arrived: {m:?}"));
        assert!((50..=60).contains(timeout), "timeout {timeout}");
    }
    let map = learner.map();
    for n in [
        "api.example.com",
        "www.example.com",
        "tcp.example.com",
        "tcp6.example.com",
    ] {
        assert!(
            map.iter_lru().any(|(name, _, _)| name == n),
            "{n} not learned"
        );
    }
    assert!(learner.metrics.responses_held.get() >= 4);

    // A name no active set matches is released without learning.
    assert!(resolve(&w, "other.example.org.", false, false, long).is_some());
    assert!(
        !learner
            .map()
            .iter_lru()
            .any(|(n, _, _)| n == "other.example.org")
    );

    // A set the kernel refuses the member for: the response is dropped, never released.
    learner.set_active(vec![domain_set(
        "broken.example.com",
        "cali40d:broken",
        None,
    )]);
    assert_eq!(
        resolve(&w, "broken.example.com.", false, false, short),
        None
    );
    let dropped = learner
        .metrics
        .responses_dropped
        .get_or_create(&vec![("reason".into(), DROP_WRITE_FAILED.into())])
        .get();
    assert!(dropped >= 1, "no drop counted");
}

#[test]
fn answers_from_an_untrusted_port_teach_nothing() {
    let w = world();
    // The rule queues the server's port 53, but the learner trusts only port 5353 of it.
    let learner = bind_learner(&w, 5353);
    learner.set_active(vec![domain_set(
        "*.example.com",
        "cali40d:test",
        Some("cali60d:test"),
    )]);
    let got = resolve(
        &w,
        "api.example.com.",
        false,
        false,
        Duration::from_secs(20),
    );
    assert!(got.is_some(), "released");
    assert!(members(&w, "cali40d:test").is_empty());
    assert!(learner.map().is_empty());
}
