//! The learner: queued DNS responses in, learned entries and kernel set members out, a verdict
//! per response.
//!
//! One lock guards the learned map, the list of active domain sets and the set writer, so the
//! queue thread (learning) and the apply thread (a new list of active sets after an apply) never
//! interleave: a set that becomes active is filled with everything learned before, and every
//! response learned after sees it in the list.
//!
//! Per batch of queued responses: each packet is parsed ([`super::packet`], [`super::answer`]);
//! one not from a trusted server (address and port) or not parseable is released unlearned (its
//! addresses stay denied: fail closed). Names matching a pattern of an active set are learned
//! with TTL = max(record TTL along the chain, `--dns-min-ttl`, 1 s), capped at a day; then for
//! every (active set, address) pair the member is written with the most time any matching name
//! has left (a shorter TTL of another name never cuts a longer one). Writes of the whole batch go
//! to the kernel together; a response any of whose writes failed is dropped (the client retries),
//! never released.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use calc_graph::model::DomainPattern;
use iptables::render::{ActiveDomainSet, DomainMembers, LearnedAddr};

use super::answer;
use super::learned::LearnedMap;
use super::metrics::{DROP_WRITE_FAILED, DnsMetrics};
use super::packet;
use super::persist;
use super::setwriter::{SetAdd, SetWriter};

/// Learned TTLs are capped at a day (unbound's default `cache-max-ttl`).
pub const MAX_TTL: u32 = 86_400;

/// Wall-clock time in unix milliseconds (a trait so tests drive it).
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> u64;
}

/// The system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock the tests set.
#[derive(Debug, Default)]
pub struct ManualClock(pub AtomicU64);

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The learner's settings (from the agent's flags).
#[derive(Debug, Clone)]
pub struct LearnerConfig {
    /// `--dns-trusted-servers`: responses from anything else teach nothing.
    pub trusted_servers: Vec<SocketAddr>,
    /// `--dns-min-ttl`, seconds.
    pub min_ttl: u32,
    /// `--dns-max-learned`.
    pub max_learned: usize,
    /// Where the map is persisted (`<state-dir>/dns-learned.json`); `None`: not persisted.
    pub persist_path: Option<PathBuf>,
}

/// What to do with a held response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Release,
    /// Dropped, with the metric reason.
    Drop(&'static str),
}

struct Inner {
    map: LearnedMap,
    active: Vec<ActiveDomainSet>,
    /// Kernel set names known to hold every learned member of their patterns.
    filled: HashSet<String>,
    writer: Box<dyn SetWriter>,
    /// Changed since the last persist.
    dirty: bool,
}

/// The learner (share it in an `Arc`: the queue thread, the apply thread and the renderer use it).
pub struct Learner {
    inner: Mutex<Inner>,
    cfg: LearnerConfig,
    clock: Arc<dyn Clock>,
    pub metrics: DnsMetrics,
    /// Set by the first [`Learner::set_active`]: the learner knows the kernel's domain sets.
    programmed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Learner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Learner").field("cfg", &self.cfg).finish()
    }
}

impl Learner {
    /// A learner starting from `map` (the persisted one, or empty).
    pub fn new(
        cfg: LearnerConfig,
        map: LearnedMap,
        writer: Box<dyn SetWriter>,
        clock: Arc<dyn Clock>,
        metrics: DnsMetrics,
    ) -> Self {
        let l = Learner {
            inner: Mutex::new(Inner {
                map,
                active: Vec::new(),
                filled: HashSet::new(),
                writer,
                dirty: false,
            }),
            cfg,
            clock,
            metrics,
            programmed: std::sync::atomic::AtomicBool::new(false),
        };
        l.update_gauges(&l.lock().map);
        l
    }

    /// Loads `cfg.persist_path` (expired entries dropped). A missing file is an empty map; an
    /// unreadable one is logged and ignored.
    pub fn load_map(cfg: &LearnerConfig, clock: &dyn Clock) -> LearnedMap {
        let Some(path) = &cfg.persist_path else {
            return LearnedMap::new(cfg.max_learned);
        };
        match persist::load(path, cfg.max_learned, clock.now_ms()) {
            Ok(Some(map)) => {
                tracing::info!(entries = map.len(), path = %path.display(), "loaded the learned DNS map");
                map
            }
            Ok(None) => LearnedMap::new(cfg.max_learned),
            Err(error) => {
                tracing::error!(%error, "ignoring the learned DNS map; starting with nothing learned");
                LearnedMap::new(cfg.max_learned)
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every mutation is one call).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update_gauges(&self, map: &LearnedMap) {
        self.metrics.learned_names.set(map.name_count() as i64);
        self.metrics
            .learned_addresses
            .set(map.address_count() as i64);
    }

    fn trusted(&self, src: IpAddr, port: u16) -> bool {
        self.cfg
            .trusted_servers
            .iter()
            .any(|s| s.ip() == src && s.port() == port)
    }

    fn ttl(&self, record_ttl: u32) -> u32 {
        record_ttl.max(self.cfg.min_ttl).clamp(1, MAX_TTL)
    }

    /// Decides a batch of queued packets (L3, as NFQUEUE hands them over): learns, writes the
    /// kernel sets, returns one verdict per packet.
    pub fn handle(&self, packets: &[&[u8]]) -> Vec<Verdict> {
        // Parse outside the lock.
        let facts: Vec<Vec<answer::Fact>> = packets.iter().map(|p| self.facts(p)).collect();
        let mut inner = self.lock();
        let now = self.clock.now_ms();
        let inner = &mut *inner;
        let expired = inner.map.expire(now);
        let mut learned_any = expired > 0;
        let mut evicted = 0;
        // (set, addr) → the packets that need it.
        let mut needs: BTreeMap<(String, IpAddr), Vec<usize>> = BTreeMap::new();
        for (i, fs) in facts.iter().enumerate() {
            let mut by_addr: BTreeMap<IpAddr, Vec<&str>> = BTreeMap::new();
            for f in fs {
                let matching = inner
                    .active
                    .iter()
                    .any(|s| s.patterns.iter().any(|p| p.matches(&f.name)));
                if !matching {
                    continue;
                }
                evicted += inner.map.learn(&f.name, f.addr, self.ttl(f.ttl), now);
                learned_any = true;
                by_addr.entry(f.addr).or_default().push(&f.name);
            }
            for (addr, names) in by_addr {
                for set in &inner.active {
                    let Some(kernel) = (match addr {
                        IpAddr::V4(_) => &set.v4_set,
                        IpAddr::V6(_) => &set.v6_set,
                    }) else {
                        continue;
                    };
                    if names
                        .iter()
                        .any(|n| set.patterns.iter().any(|p| p.matches(n)))
                    {
                        needs.entry((kernel.clone(), addr)).or_default().push(i);
                    }
                }
            }
        }
        let mut verdicts = vec![Verdict::Release; packets.len()];
        let adds: Vec<SetAdd> = needs
            .keys()
            .map(|(set, addr)| SetAdd {
                set: set.clone(),
                addr: *addr,
                timeout_secs: self.timeout_for(&inner.map, &inner.active, set, *addr, now),
            })
            .collect();
        // Every writer takes an empty batch without touching the kernel.
        let results = inner.writer.add(&adds);
        for (r, pkts) in results.iter().zip(needs.values()) {
            if let Err(error) = r {
                tracing::warn!(%error, "dropping the held DNS response: its address could not be added");
                for &i in pkts {
                    verdicts[i] = Verdict::Drop(DROP_WRITE_FAILED);
                }
            }
        }
        if learned_any {
            inner.dirty = true;
            self.update_gauges(&inner.map);
        }
        self.metrics.evictions.inc_by(evicted as u64);
        verdicts
    }

    /// The member's timeout: the most any name matching the set's patterns has left.
    fn timeout_for(
        &self,
        map: &LearnedMap,
        active: &[ActiveDomainSet],
        set: &str,
        addr: IpAddr,
        now: u64,
    ) -> u32 {
        active
            .iter()
            .filter(|s| s.v4_set.as_deref() == Some(set) || s.v6_set.as_deref() == Some(set))
            .filter_map(|s| map.remaining(addr, &s.patterns, now))
            .max()
            .unwrap_or(1)
    }

    fn facts(&self, pkt: &[u8]) -> Vec<answer::Fact> {
        let e = match packet::extract(pkt) {
            Ok(e) => e,
            Err(error) => {
                tracing::debug!(%error, "queued packet released unlearned");
                return Vec::new();
            }
        };
        if !self.trusted(e.src, e.src_port) {
            tracing::debug!(src = %e.src, port = e.src_port, "queued packet not from a trusted DNS server: released unlearned");
            return Vec::new();
        }
        let mut out = Vec::new();
        for m in e.messages {
            match answer::facts(m) {
                Ok(fs) => out.extend(fs),
                Err(error) => {
                    tracing::debug!(%error, src = %e.src, "DNS response released unlearned")
                }
            }
        }
        out
    }

    /// The domain sets in the kernel after an apply. Sets not seen before are written with every
    /// member learned for their patterns (a set created by the apply already holds what was
    /// learned at render time; this adds what was learned since). A set whose fill fails is
    /// tried again after the next apply.
    pub fn set_active(&self, sets: Vec<ActiveDomainSet>) {
        let mut inner = self.lock();
        let now = self.clock.now_ms();
        let inner = &mut *inner;
        let names: BTreeSet<String> = sets
            .iter()
            .flat_map(|s| s.v4_set.iter().chain(&s.v6_set).cloned())
            .collect();
        inner.filled.retain(|n| names.contains(n));
        let mut adds = Vec::new();
        let mut new_sets = BTreeSet::new();
        for s in &sets {
            let learned = inner.map.learned(&s.patterns, now);
            for (kernel, v6) in [(&s.v4_set, false), (&s.v6_set, true)] {
                let Some(kernel) = kernel else { continue };
                if inner.filled.contains(kernel) {
                    continue;
                }
                new_sets.insert(kernel.clone());
                adds.extend(
                    learned
                        .iter()
                        .filter(|l| l.addr.is_ipv6() == v6)
                        .map(|l| SetAdd {
                            set: kernel.clone(),
                            addr: l.addr,
                            timeout_secs: l.remaining_secs,
                        }),
                );
            }
        }
        // Every writer takes an empty batch without touching the kernel.
        let results = inner.writer.add(&adds);
        let mut failed = BTreeSet::new();
        for (r, a) in results.iter().zip(&adds) {
            if let Err(error) = r {
                tracing::warn!(%error, "filling a newly active domain set failed; retried after the next apply");
                failed.insert(a.set.clone());
            }
        }
        inner
            .filled
            .extend(new_sets.into_iter().filter(|s| !failed.contains(s)));
        inner.active = sets;
        self.programmed.store(true, Ordering::SeqCst);
    }

    /// Expires entries (and updates the gauges); returns the map as JSON if it changed since the
    /// last call (for the persister).
    pub fn tick(&self) -> Option<Vec<u8>> {
        let mut inner = self.lock();
        if inner.map.expire(self.clock.now_ms()) > 0 {
            inner.dirty = true;
        }
        self.update_gauges(&inner.map);
        if !std::mem::take(&mut inner.dirty) {
            return None;
        }
        Some(persist::encode(&inner.map))
    }

    /// Writes the map to its file now if it changed (at shutdown, and from the persister).
    pub fn persist(&self) {
        let Some(path) = &self.cfg.persist_path else {
            return;
        };
        if let Some(bytes) = self.tick()
            && let Err(error) = persist::save(path, &bytes)
        {
            tracing::error!(%error, "writing the learned DNS map failed");
            self.lock().dirty = true;
        }
    }

    /// Whether an apply has told the learner which domain sets the kernel has. Before that the
    /// queue is not bound: a response held then would be released unlearned (no set known yet),
    /// while an unbound queue has the kernel drop it and the client retry.
    pub fn programmed(&self) -> bool {
        self.programmed.load(Ordering::SeqCst)
    }

    /// A copy of the map (trace, tests).
    pub fn map(&self) -> LearnedMap {
        self.lock().map.clone()
    }

    /// The kernel set names currently active.
    pub fn active(&self) -> Vec<ActiveDomainSet> {
        self.lock().active.clone()
    }
}

impl DomainMembers for Learner {
    fn learned(&self, patterns: &[DomainPattern]) -> Vec<LearnedAddr> {
        self.lock().map.learned(patterns, self.clock.now_ms())
    }
}

/// Persists the learner's map every `period` while it changes, until `stop` is set.
pub fn spawn_persister(
    learner: Arc<Learner>,
    period: std::time::Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("dns-persist".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::park_timeout(period);
                learner.persist();
            }
        })
        .expect("spawn dns persister thread")
}

#[cfg(test)]
#[path = "learner_tests.rs"]
mod tests;
