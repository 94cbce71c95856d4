//! Tests of the learner: verdicts, kernel writes, set activation, persistence, and a property
//! test against a model of the kernel's sets.
use super::*;
use crate::dns::answer::build::{Rr, response};
use crate::dns::packet::build::{framed, tcp, udp};
use crate::dns::setwriter::WriteError;

/// Records what would be written; fails members of sets named in `fail`.
#[derive(Default, Clone)]
struct Recorder {
    log: Arc<Mutex<Vec<SetAdd>>>,
    fail: Arc<Mutex<HashSet<String>>>,
}

impl SetWriter for Recorder {
    fn add(&mut self, adds: &[SetAdd]) -> Vec<Result<(), WriteError>> {
        let fail = self.fail.lock().unwrap().clone();
        adds.iter()
            .map(|a| {
                if fail.contains(&a.set) {
                    Err(WriteError {
                        set: a.set.clone(),
                        addr: a.addr,
                        reason: "no".into(),
                    })
                } else {
                    self.log.lock().unwrap().push(a.clone());
                    Ok(())
                }
            })
            .collect()
    }
}

const SERVER: &str = "10.0.0.53";

fn setup(min_ttl: u32) -> (Learner, Recorder, Arc<ManualClock>) {
    let rec = Recorder::default();
    let clock = Arc::new(ManualClock(AtomicU64::new(1_000_000)));
    let l = Learner::new(
        LearnerConfig {
            trusted_servers: vec![format!("{SERVER}:53").parse().unwrap()],
            min_ttl,
            max_learned: 100,
            persist_path: None,
        },
        LearnedMap::new(100),
        Box::new(rec.clone()),
        clock.clone(),
        DnsMetrics::default(),
    );
    (l, rec, clock)
}

fn set(pats: &[&str], v4: &str, v6: &str) -> ActiveDomainSet {
    ActiveDomainSet {
        patterns: pats
            .iter()
            .map(|p| DomainPattern::parse(p).unwrap())
            .collect(),
        v4_set: Some(v4.into()),
        v6_set: Some(v6.into()),
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A response to a query for `name` with one address record for it.
fn answer(name: &str, addr: &str, ttl: u32) -> Vec<u8> {
    response(name, &[Rr::Addr(name, addr, ttl)])
}

fn resp(from: &str, port: u16, payload: &[u8]) -> Vec<u8> {
    udp(ip(from), port, ip("10.0.0.9"), 40000, payload)
}

#[test]
fn a_response_writes_its_addresses_to_the_matching_sets_then_is_released() {
    let (l, rec, _) = setup(0);
    l.set_active(vec![
        set(&["*.example.com"], "cali40d:w", "cali60d:w"),
        set(&["api.example.com"], "cali40d:a", "cali60d:a"),
        set(&["other.org"], "cali40d:o", "cali60d:o"),
    ]);
    let dns = response(
        "api.example.com.",
        &[
            Rr::Addr("api.example.com.", "192.0.2.1", 30),
            Rr::Addr("api.example.com.", "2001:db8::1", 30),
        ],
    );
    let v = l.handle(&[&resp(SERVER, 53, &dns)]);
    assert_eq!(v, vec![Verdict::Release]);
    let mut log = rec.log.lock().unwrap().clone();
    log.sort();
    let want: Vec<SetAdd> = [
        ("cali40d:a", "192.0.2.1"),
        ("cali40d:w", "192.0.2.1"),
        ("cali60d:a", "2001:db8::1"),
        ("cali60d:w", "2001:db8::1"),
    ]
    .iter()
    .map(|(s, a)| SetAdd {
        set: s.to_string(),
        addr: ip(a),
        timeout_secs: 30,
    })
    .collect();
    assert_eq!(log, want);
    assert_eq!(l.metrics.learned_names.get(), 1);
    assert_eq!(l.metrics.learned_addresses.get(), 2);
}

#[test]
fn untrusted_sources_unmatched_names_and_garbage_teach_nothing() {
    let (l, rec, _) = setup(0);
    l.set_active(vec![set(&["api.example.com"], "cali40d:a", "cali60d:a")]);
    let dns = answer("api.example.com.", "192.0.2.1", 30);
    let other = answer("www.other.org.", "192.0.2.7", 30);
    let v = l.handle(&[
        &resp("10.0.0.66", 53, &dns),
        &resp(SERVER, 5353, &dns),
        &resp(SERVER, 53, &other),
        &resp(SERVER, 53, b"\xff\xff garbage"),
        b"not even ip",
    ]);
    assert!(v.iter().all(|v| *v == Verdict::Release));
    assert!(rec.log.lock().unwrap().is_empty());
    assert!(l.map().is_empty());
}

#[test]
fn a_failed_write_drops_only_the_responses_that_needed_it() {
    let (l, rec, _) = setup(0);
    l.set_active(vec![
        set(&["a.example.com"], "cali40d:a", "cali60d:a"),
        set(&["b.example.com"], "cali40d:b", "cali60d:b"),
    ]);
    rec.fail.lock().unwrap().insert("cali40d:b".into());
    let a = answer("a.example.com.", "192.0.2.1", 30);
    let b = answer("b.example.com.", "192.0.2.2", 30);
    let v = l.handle(&[&resp(SERVER, 53, &a), &resp(SERVER, 53, &b)]);
    assert_eq!(v, vec![Verdict::Release, Verdict::Drop(DROP_WRITE_FAILED)]);
}

#[test]
fn min_ttl_raises_and_the_longest_remaining_name_sets_the_timeout() {
    let (l, rec, clock) = setup(100);
    l.set_active(vec![set(&["*.example.com"], "cali40d:w", "cali60d:w")]);
    let a = answer("a.example.com.", "192.0.2.1", 5);
    l.handle(&[&resp(SERVER, 53, &a)]);
    assert_eq!(rec.log.lock().unwrap()[0].timeout_secs, 100);
    // 300 s for another name: the member gets 300; then b's 5 s (raised to 100) does not
    // cut it.
    let (l, rec, clock2) = setup(0);
    drop(clock);
    l.set_active(vec![set(&["*.example.com"], "cali40d:w", "cali60d:w")]);
    let a = answer("a.example.com.", "192.0.2.1", 300);
    let b = answer("b.example.com.", "192.0.2.1", 5);
    l.handle(&[&resp(SERVER, 53, &a)]);
    clock2.0.fetch_add(10_000, Ordering::SeqCst);
    l.handle(&[&resp(SERVER, 53, &b)]);
    let log = rec.log.lock().unwrap().clone();
    assert_eq!(
        log.iter().map(|a| a.timeout_secs).collect::<Vec<_>>(),
        [300, 290]
    );
}

#[test]
fn tcp_responses_teach_whole_messages_only() {
    let (l, rec, _) = setup(0);
    l.set_active(vec![set(&["*.example.com"], "cali40d:w", "cali60d:w")]);
    let a = answer("a.example.com.", "192.0.2.1", 30);
    let b = answer("b.example.com.", "192.0.2.2", 30);
    let mut body = framed(&a);
    let fb = framed(&b);
    body.extend_from_slice(&fb[..fb.len() - 1]);
    let pkt = tcp(ip(SERVER), 53, ip("10.0.0.9"), 40000, &body);
    assert_eq!(l.handle(&[&pkt]), vec![Verdict::Release]);
    let log = rec.log.lock().unwrap().clone();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].addr, ip("192.0.2.1"));
}

#[test]
fn a_newly_active_set_is_filled_with_what_was_learned_before_and_once() {
    let (l, rec, _) = setup(0);
    l.set_active(vec![set(&["*.example.com"], "cali40d:w", "cali60d:w")]);
    let a = answer("a.example.com.", "192.0.2.1", 30);
    l.handle(&[&resp(SERVER, 53, &a)]);
    rec.log.lock().unwrap().clear();
    let both = vec![
        set(&["*.example.com"], "cali40d:w", "cali60d:w"),
        set(&["a.example.com"], "cali40d:a", "cali60d:a"),
    ];
    l.set_active(both.clone());
    assert_eq!(
        rec.log.lock().unwrap().clone(),
        vec![SetAdd {
            set: "cali40d:a".into(),
            addr: ip("192.0.2.1"),
            timeout_secs: 30
        }]
    );
    rec.log.lock().unwrap().clear();
    l.set_active(both);
    assert!(rec.log.lock().unwrap().is_empty());
    // The renderer's view.
    assert_eq!(
        l.learned(&[DomainPattern::parse("a.example.com").unwrap()]),
        vec![LearnedAddr {
            addr: ip("192.0.2.1"),
            remaining_secs: 30
        }]
    );
}

#[test]
fn a_failed_fill_is_retried_after_the_next_apply() {
    let (l, rec, _) = setup(0);
    l.set_active(vec![set(&["*.example.com"], "cali40d:w", "cali60d:w")]);
    let a = answer("a.example.com.", "192.0.2.1", 30);
    l.handle(&[&resp(SERVER, 53, &a)]);
    rec.log.lock().unwrap().clear();
    rec.fail.lock().unwrap().insert("cali40d:n".into());
    let sets = vec![
        set(&["*.example.com"], "cali40d:w", "cali60d:w"),
        set(&["a.example.com"], "cali40d:n", "cali60d:n"),
    ];
    l.set_active(sets.clone());
    assert!(rec.log.lock().unwrap().is_empty());
    rec.fail.lock().unwrap().clear();
    l.set_active(sets);
    assert_eq!(rec.log.lock().unwrap().len(), 1);
}

/// A kernel in miniature: `add -exist` replaces a member's expiry.
#[derive(Default, Clone)]
struct Kernel(
    Arc<Mutex<BTreeMap<(String, IpAddr), u64>>>,
    Arc<ManualClock>,
);

impl SetWriter for Kernel {
    fn add(&mut self, adds: &[SetAdd]) -> Vec<Result<(), WriteError>> {
        let now = self.1.now_ms();
        let mut k = self.0.lock().unwrap();
        for a in adds {
            assert!(a.timeout_secs >= 1, "timeout 0 means forever");
            k.insert(
                (a.set.clone(), a.addr),
                now + u64::from(a.timeout_secs) * 1000,
            );
        }
        adds.iter().map(|_| Ok(())).collect()
    }
}

#[derive(Debug, Clone)]
enum Step {
    Answer(usize, usize, u32),
    Wait(u64),
    Activate(Vec<bool>),
}

const NAMES: [&str; 4] = [
    "a.example.com",
    "b.example.com",
    "example.com",
    "x.other.org",
];
const ADDRS: [&str; 3] = ["192.0.2.1", "192.0.2.2", "2001:db8::1"];

fn all_sets() -> Vec<ActiveDomainSet> {
    vec![
        set(&["*.example.com"], "cali40d:w", "cali60d:w"),
        set(&["example.com", "x.other.org"], "cali40d:e", "cali60d:e"),
        ActiveDomainSet {
            patterns: vec![DomainPattern::parse("b.example.com").unwrap()],
            v4_set: Some("cali40d:b".into()),
            v6_set: None,
        },
    ]
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (0..NAMES.len(), 0..ADDRS.len(), 0..120u32).prop_map(|(n, a, t)| Step::Answer(n, a, t)),
        2 => (0..90_000u64).prop_map(Step::Wait),
        1 => prop::collection::vec(any::<bool>(), 3).prop_map(Step::Activate),
    ]
}

proptest::proptest! {
    /// Whatever the order of answers, time and set activations: every address the learner
    /// says a set allows (its `DomainMembers` answer) is in that kernel set for at least as
    /// long, no set is written that is not active, and every release came after its writes.
    #[test]
    fn the_kernel_always_allows_what_the_map_says(steps in proptest::collection::vec(step(), 1..40)) {
        let clock = Arc::new(ManualClock(AtomicU64::new(5_000_000)));
        let kernel = Kernel(Arc::default(), clock.clone());
        let l = Learner::new(
            LearnerConfig {
                trusted_servers: vec![
                    format!("{SERVER}:53").parse().unwrap(),
                    "[fd00::53]:53".parse().unwrap(),
                ],
                min_ttl: 0,
                max_learned: 1000,
                persist_path: None,
            },
            LearnedMap::new(1000),
            Box::new(kernel.clone()),
            clock.clone(),
            DnsMetrics::default(),
        );
        let mut active: Vec<ActiveDomainSet> = Vec::new();
        for s in steps {
            match s {
                Step::Answer(n, a, ttl) => {
                    let dns = response(&format!("{}.", NAMES[n]), &[Rr::Addr(&format!("{}.", NAMES[n]), ADDRS[a], ttl)]);
                    let pkt = if ADDRS[a].contains(':') {
                        udp(ip("fd00::53"), 53, ip("fd00::9"), 1, &dns)
                    } else {
                        resp(SERVER, 53, &dns)
                    };
                    proptest::prop_assert_eq!(l.handle(&[&pkt]), vec![Verdict::Release]);
                }
                Step::Wait(ms) => { clock.0.fetch_add(ms, Ordering::SeqCst); }
                Step::Activate(pick) => {
                    let next: Vec<ActiveDomainSet> = all_sets().into_iter().zip(pick).filter(|(_, p)| *p).map(|(s, _)| s).collect();
                    // A set that goes away is destroyed in the kernel (with its members).
                    let names: Vec<String> = next.iter().flat_map(|s| s.v4_set.iter().chain(&s.v6_set).cloned()).collect();
                    kernel.0.lock().unwrap().retain(|(set, _), _| names.contains(set));
                    active = next.clone();
                    l.set_active(next);
                }
            }
            let now = clock.now_ms();
            let k = kernel.0.lock().unwrap().clone();
            for (set, _) in k.keys() {
                proptest::prop_assert!(active.iter().any(|s| s.v4_set.as_deref() == Some(set) || s.v6_set.as_deref() == Some(set)), "{} written but not active", set);
            }
            for s in &active {
                for la in l.learned(&s.patterns) {
                    let name = if la.addr.is_ipv6() { &s.v6_set } else { &s.v4_set };
                    let Some(name) = name else { continue };
                    let exp = k.get(&(name.clone(), la.addr)).copied().unwrap_or(0);
                    proptest::prop_assert!(
                        exp >= now + u64::from(la.remaining_secs) * 1000 - 999,
                        "{} in {}: kernel until {}, map says {} s from {}", la.addr, name, exp, la.remaining_secs, now
                    );
                }
            }
        }
    }
}

#[test]
fn the_map_persists_and_reloads_without_expired_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(persist::FILE_NAME);
    let (mut l, _, clock) = setup(0);
    l.cfg.persist_path = Some(path.clone());
    l.set_active(vec![set(&["*.example.com"], "cali40d:w", "cali60d:w")]);
    let a = answer("a.example.com.", "192.0.2.1", 30);
    let b = answer("b.example.com.", "192.0.2.2", 300);
    l.handle(&[&resp(SERVER, 53, &a), &resp(SERVER, 53, &b)]);
    l.persist();
    assert!(l.tick().is_none(), "nothing changed since");
    clock.0.fetch_add(60_000, Ordering::SeqCst);
    let map = Learner::load_map(&l.cfg, clock.as_ref());
    let names: Vec<&str> = map.iter_lru().map(|(n, _, _)| n).collect();
    assert_eq!(names, ["b.example.com"]);
}
