//! Fuzz target for the DNS learner's whole path: a queued L3 packet → parsed addresses, ports and
//! DNS messages → learned (name, address) entries → kernel set writes → a verdict.
//!
//! The input is used twice: as the queued packet itself (IPv4/IPv6, UDP/TCP, whatever the bytes
//! say), and as a DNS message wrapped in a well-formed IPv4/UDP packet from the trusted server
//! (so mutations of the DNS layer are not lost in the IP header). Properties: nothing panics;
//! one verdict per packet; every learned name is a plain lowercase DNS name that matches an
//! active pattern, with a TTL of at least 1 s and at most a day; every write goes to an active
//! set of the address's family, with a timeout of at least 1 s, for an address the map holds
//! for a name that set's patterns match (never garbage); a response is dropped only when a
//! write for it failed (never here: the recording writer accepts everything).
//!
//! Shared by the cargo-fuzz target (`fuzz/fuzz_targets/dns_response.rs`, nightly) and the bounded
//! stable run in CI (`tests/tests/fuzz_stable.rs`, `scripts/fuzz-stable.sh`).
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use calc_graph::model::DomainPattern;
use felixrs::dns::learned::LearnedMap;
use felixrs::dns::learner::{Learner, LearnerConfig, ManualClock, Verdict};
use felixrs::dns::metrics::DnsMetrics;
use felixrs::dns::setwriter::{SetAdd, SetWriter, WriteError};
use iptables::render::ActiveDomainSet;

/// Accepts every write and remembers it.
struct Recorder(Arc<Mutex<Vec<SetAdd>>>);

impl SetWriter for Recorder {
    fn add(&mut self, adds: &[SetAdd]) -> Vec<Result<(), WriteError>> {
        self.0.lock().unwrap().extend(adds.iter().cloned());
        adds.iter().map(|_| Ok(())).collect()
    }
}

const SERVER: [u8; 4] = [10, 0, 0, 53];

/// `dns` in an IPv4/UDP packet from the trusted server's port 53.
fn wrap(dns: &[u8]) -> Vec<u8> {
    let total = (20 + 8 + dns.len()).min(usize::from(u16::MAX));
    let dns = &dns[..total - 28];
    let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&SERVER);
    p.extend_from_slice(&[10, 0, 0, 9]);
    p.extend_from_slice(&53u16.to_be_bytes());
    p.extend_from_slice(&40000u16.to_be_bytes());
    p.extend_from_slice(&((8 + dns.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(dns);
    p
}

fn pattern(s: &str) -> DomainPattern {
    DomainPattern::parse(s).expect("valid pattern")
}

/// Checks the properties on one input; panics when one does not hold.
pub fn run(data: &[u8]) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let learner = Learner::new(
        LearnerConfig {
            trusted_servers: vec![
                "10.0.0.53:53".parse().unwrap(),
                "[fd00::53]:53".parse().unwrap(),
            ],
            min_ttl: 0,
            max_learned: 64,
            persist_path: None,
        },
        LearnedMap::new(64),
        Box::new(Recorder(log.clone())),
        Arc::new(ManualClock(1_000_000.into())),
        DnsMetrics::default(),
    );
    let sets = vec![
        ActiveDomainSet {
            patterns: vec![pattern("*.example.com")],
            v4_set: Some("cali40d:wild".into()),
            v6_set: Some("cali60d:wild".into()),
        },
        ActiveDomainSet {
            patterns: vec![pattern("www.example.com"), pattern("e.cdn.net")],
            v4_set: Some("cali40d:exact".into()),
            v6_set: None,
        },
    ];
    learner.set_active(sets.clone());
    let wrapped = wrap(data);
    let verdicts = learner.handle(&[data, &wrapped]);
    assert_eq!(verdicts.len(), 2);
    assert!(
        verdicts.iter().all(|v| *v == Verdict::Release),
        "{verdicts:?}"
    );
    let map = learner.map();
    for (name, _addr, e) in map.iter_lru() {
        assert!(
            !name.is_empty()
                && name.split('.').all(|l| !l.is_empty()
                    && l.bytes().all(|b| b.is_ascii_lowercase()
                        || b.is_ascii_digit()
                        || b == b'-'
                        || b == b'_')),
            "garbage name learned: {name:?}"
        );
        assert!(
            sets.iter()
                .any(|s| s.patterns.iter().any(|p| p.matches(name))),
            "{name} matches no active pattern"
        );
        assert!((1..=86_400).contains(&e.ttl_secs), "ttl {}", e.ttl_secs);
    }
    for w in log.lock().unwrap().iter() {
        let set = sets
            .iter()
            .find(|s| {
                let name = match w.addr {
                    IpAddr::V4(_) => &s.v4_set,
                    IpAddr::V6(_) => &s.v6_set,
                };
                name.as_deref() == Some(w.set.as_str())
            })
            .unwrap_or_else(|| {
                panic!(
                    "write to {} for {}: not an active set of its family",
                    w.set, w.addr
                )
            });
        assert!(w.timeout_secs >= 1, "timeout 0 means forever");
        assert!(
            map.entries_of(w.addr, 1_000_000)
                .iter()
                .any(|(n, _)| set.patterns.iter().any(|p| p.matches(n))),
            "{} written to {} without a learned name for it",
            w.addr,
            w.set
        );
    }
}
