//! The learned map: (name, address) → when it was learned, its TTL and when it expires.
//!
//! Only names that match a pattern of some active domain set are put here (the learner checks),
//! so the map stays bounded by what policy asks for; on top of that it is capped at
//! `--dns-max-learned` entries, evicting the least recently learned (`evictions` counts them).
//! Time is passed in (unix milliseconds), so tests drive the clock. Evicting an entry does not
//! touch the kernel: its set member expires there by its own timeout.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use calc_graph::model::DomainPattern;
use iptables::render::LearnedAddr;
use serde::{Deserialize, Serialize};

/// One learned (name, address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// When the answer that set this expiry was seen (unix ms).
    pub learned_at_ms: u64,
    /// Its TTL as applied (the record's, raised to the minimum TTL), seconds.
    pub ttl_secs: u32,
    /// When the entry stops allowing anything (unix ms).
    pub expires_at_ms: u64,
}

/// Whole seconds left until `expires_at_ms`, rounded up (so never 0 while unexpired: a kernel
/// timeout of 0 would mean "forever").
pub fn remaining_secs(expires_at_ms: u64, now_ms: u64) -> Option<u32> {
    (expires_at_ms > now_ms)
        .then(|| u32::try_from((expires_at_ms - now_ms).div_ceil(1000)).unwrap_or(u32::MAX))
}

#[derive(Debug, Clone)]
struct Slot {
    entry: Entry,
    seq: u64,
}

/// The map. Cheap to query by address; eviction and expiry in O(log n).
#[derive(Debug, Clone)]
pub struct LearnedMap {
    cap: usize,
    by_addr: HashMap<IpAddr, BTreeMap<String, Slot>>,
    /// Recency: sequence number of the last learning → key.
    lru: BTreeMap<u64, (String, IpAddr)>,
    /// Expiry order: (expires_at_ms, seq).
    expiry: BTreeSet<(u64, u64)>,
    /// Addresses per name (the learned-names gauge).
    names: HashMap<String, usize>,
    next_seq: u64,
}

impl LearnedMap {
    /// An empty map holding at most `cap` entries (at least 1).
    pub fn new(cap: usize) -> Self {
        LearnedMap {
            cap: cap.max(1),
            by_addr: HashMap::new(),
            lru: BTreeMap::new(),
            expiry: BTreeSet::new(),
            names: HashMap::new(),
            next_seq: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.lru.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lru.is_empty()
    }

    /// Distinct names with an entry.
    pub fn name_count(&self) -> usize {
        self.names.len()
    }

    /// Distinct addresses with an entry.
    pub fn address_count(&self) -> usize {
        self.by_addr.len()
    }

    /// Records that `name` resolved to `addr` for `ttl_secs` at `now_ms`. An entry that already
    /// expires later keeps its expiry (a client may still use the earlier answer); either way it
    /// becomes the most recently learned. Returns how many entries the cap evicted.
    pub fn learn(&mut self, name: &str, addr: IpAddr, ttl_secs: u32, now_ms: u64) -> usize {
        self.expire(now_ms);
        let fresh = Entry {
            learned_at_ms: now_ms,
            ttl_secs,
            expires_at_ms: now_ms + u64::from(ttl_secs) * 1000,
        };
        let entry = match self.remove(name, addr) {
            Some(old) if old.expires_at_ms > fresh.expires_at_ms => old,
            _ => fresh,
        };
        self.insert(name, addr, entry);
        let mut evicted = 0;
        while self.lru.len() > self.cap {
            let (_, (n, a)) = self.lru.pop_first().expect("over the cap, so not empty");
            self.remove(&n, a);
            evicted += 1;
        }
        evicted
    }

    /// Inserts an entry as the most recently learned (used by `learn` and when loading).
    pub fn insert(&mut self, name: &str, addr: IpAddr, entry: Entry) {
        self.remove(name, addr);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_addr
            .entry(addr)
            .or_default()
            .insert(name.to_string(), Slot { entry, seq });
        self.lru.insert(seq, (name.to_string(), addr));
        self.expiry.insert((entry.expires_at_ms, seq));
        *self.names.entry(name.to_string()).or_default() += 1;
    }

    fn remove(&mut self, name: &str, addr: IpAddr) -> Option<Entry> {
        let names = self.by_addr.get_mut(&addr)?;
        let slot = names.remove(name)?;
        if names.is_empty() {
            self.by_addr.remove(&addr);
        }
        self.lru.remove(&slot.seq);
        self.expiry.remove(&(slot.entry.expires_at_ms, slot.seq));
        if let Some(n) = self.names.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                self.names.remove(name);
            }
        }
        Some(slot.entry)
    }

    /// Drops every entry expired at `now_ms`; returns how many.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let mut n = 0;
        while let Some(&(at, seq)) = self.expiry.first() {
            if at > now_ms {
                break;
            }
            let (name, addr) = self.lru.get(&seq).cloned().expect("expiry and lru agree");
            self.remove(&name, addr);
            n += 1;
        }
        n
    }

    /// Every unexpired address learned for a name matching any of `patterns`, each with the most
    /// seconds any such name has left; sorted by address.
    pub fn learned(&self, patterns: &[DomainPattern], now_ms: u64) -> Vec<LearnedAddr> {
        let mut out: Vec<LearnedAddr> = self
            .by_addr
            .keys()
            .filter_map(|&addr| {
                self.remaining(addr, patterns, now_ms)
                    .map(|remaining_secs| LearnedAddr {
                        addr,
                        remaining_secs,
                    })
            })
            .collect();
        out.sort();
        out
    }

    /// The most seconds any name matching `patterns` has left for `addr`.
    pub fn remaining(&self, addr: IpAddr, patterns: &[DomainPattern], now_ms: u64) -> Option<u32> {
        self.by_addr
            .get(&addr)?
            .iter()
            .filter(|(name, _)| patterns.iter().any(|p| p.matches(name)))
            .filter_map(|(_, s)| remaining_secs(s.entry.expires_at_ms, now_ms))
            .max()
    }

    /// The unexpired entries of `addr`, by name.
    pub fn entries_of(&self, addr: IpAddr, now_ms: u64) -> Vec<(String, Entry)> {
        self.by_addr
            .get(&addr)
            .into_iter()
            .flatten()
            .filter(|(_, s)| s.entry.expires_at_ms > now_ms)
            .map(|(n, s)| (n.clone(), s.entry))
            .collect()
    }

    /// Every entry, least recently learned first.
    pub fn iter_lru(&self) -> impl Iterator<Item = (&str, IpAddr, Entry)> + '_ {
        self.lru.values().map(|(name, addr)| {
            let slot = &self.by_addr[addr][name];
            (name.as_str(), *addr, slot.entry)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> DomainPattern {
        DomainPattern::parse(s).unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn learned_answers_by_pattern_with_the_longest_remaining_time() {
        let mut m = LearnedMap::new(100);
        m.learn("a.example.com", ip("192.0.2.1"), 60, 1_000);
        m.learn("b.example.com", ip("192.0.2.1"), 10, 1_000);
        m.learn("c.other.org", ip("192.0.2.2"), 60, 1_000);
        let got = m.learned(&[p("*.example.com")], 5_500);
        assert_eq!(
            got,
            vec![LearnedAddr {
                addr: ip("192.0.2.1"),
                remaining_secs: 56
            }]
        );
        // Only b's shorter TTL matches: it rounds up, never to 0 before it expires.
        assert_eq!(
            m.remaining(ip("192.0.2.1"), &[p("b.example.com")], 10_999),
            Some(1)
        );
        assert_eq!(
            m.remaining(ip("192.0.2.1"), &[p("b.example.com")], 11_000),
            None
        );
        assert_eq!((m.name_count(), m.address_count()), (3, 2));
        assert_eq!(m.expire(61_000), 3);
        assert!(m.is_empty() && m.name_count() == 0 && m.address_count() == 0);
    }

    #[test]
    fn relearning_keeps_the_later_expiry_and_the_cap_evicts_the_least_recent() {
        let mut m = LearnedMap::new(2);
        m.learn("a.x.com", ip("192.0.2.1"), 100, 0);
        m.learn("a.x.com", ip("192.0.2.1"), 5, 1_000);
        let e = m.entries_of(ip("192.0.2.1"), 1_000);
        assert_eq!(e[0].1.expires_at_ms, 100_000);
        m.learn("b.x.com", ip("192.0.2.2"), 100, 2_000);
        // a was touched at 1 s, b at 2 s: a is the least recent.
        assert_eq!(m.learn("c.x.com", ip("192.0.2.3"), 100, 3_000), 1);
        let names: Vec<&str> = m.iter_lru().map(|(n, _, _)| n).collect();
        assert_eq!(names, ["b.x.com", "c.x.com"]);
    }

    /// A step of the property test.
    #[derive(Debug, Clone)]
    enum Op {
        Learn(usize, usize, u32),
        Wait(u64),
    }

    const NAMES: [&str; 5] = [
        "a.example.com",
        "b.example.com",
        "example.com",
        "x.b.example.com",
        "a.other.org",
    ];

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..NAMES.len(), 0..4usize, 0..30u32).prop_map(|(n, a, t)| Op::Learn(n, a, t)),
            (0..20_000u64).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// The map answers exactly what a naive recomputation from the sequence of learnings
        /// and the clock gives: per (name, address) the latest-expiring learning, the cap keeping
        /// the most recently learned unexpired entries.
        #[test]
        fn answers_equal_a_naive_recomputation(ops in prop::collection::vec(op(), 0..60), cap in 1usize..8) {
            let addrs: Vec<IpAddr> = ["192.0.2.1", "192.0.2.2", "2001:db8::1", "2001:db8::2"].iter().map(|s| ip(s)).collect();
            let mut m = LearnedMap::new(cap);
            // Naive: (name, addr, expires, last_touch).
            let mut naive: Vec<(usize, usize, u64, u64)> = Vec::new();
            let mut now = 1_000_000u64;
            for (step, o) in ops.iter().enumerate() {
                match *o {
                    Op::Wait(ms) => now += ms,
                    Op::Learn(n, a, ttl) => {
                        m.learn(NAMES[n], addrs[a], ttl, now);
                        naive.retain(|e| e.2 > now);
                        let exp = now + u64::from(ttl) * 1000;
                        match naive.iter_mut().find(|e| e.0 == n && e.1 == a) {
                            Some(e) => { e.2 = e.2.max(exp); e.3 = step as u64; }
                            None => naive.push((n, a, exp, step as u64)),
                        }
                        while naive.len() > cap {
                            let oldest = naive.iter().enumerate().min_by_key(|(_, e)| e.3).unwrap().0;
                            naive.remove(oldest);
                        }
                    }
                }
                for pats in [vec![p("*.example.com")], vec![p("example.com"), p("a.other.org")], vec![p("b.example.com")]] {
                    let want: BTreeMap<IpAddr, u32> = naive.iter()
                        .filter(|e| e.2 > now && pats.iter().any(|pt| pt.matches(NAMES[e.0])))
                        .fold(BTreeMap::new(), |mut acc, e| {
                            let r = u32::try_from((e.2 - now).div_ceil(1000)).unwrap();
                            let v = acc.entry(addrs[e.1]).or_insert(0);
                            *v = (*v).max(r);
                            acc
                        });
                    let got: BTreeMap<IpAddr, u32> = m.learned(&pats, now).into_iter().map(|l| (l.addr, l.remaining_secs)).collect();
                    prop_assert_eq!(got, want);
                }
                prop_assert!(m.len() <= cap);
            }
        }
    }
}
