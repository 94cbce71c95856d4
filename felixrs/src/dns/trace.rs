//! What `felixrs trace` says about domain rules: the learned map read from a file (the agent's
//! `<state-dir>/dns-learned.json`, or `--dns-learned FILE`) fills the rendered domain sets as the
//! agent's were filled, and a packet allowed through a domain set is explained as "allowed by
//! domain rule example.com (learned 12 s ago, TTL 60 s)".

use std::path::{Path, PathBuf};

use calc_graph::model::DomainPattern;
use iptables::render::trace::DomainHit;
use iptables::render::{DomainMembers, LearnedAddr};

use super::learned::LearnedMap;
use super::learner::{Clock, SystemClock};
use super::persist;

/// A learned map read from its file, at one moment.
#[derive(Debug)]
pub struct LearnedFile {
    pub path: PathBuf,
    pub map: LearnedMap,
    pub now_ms: u64,
}

impl LearnedFile {
    /// Reads `path` now (expired entries dropped). A missing file is an error naming it.
    pub fn load(path: &Path) -> anyhow::Result<LearnedFile> {
        let now_ms = SystemClock.now_ms();
        let map = persist::load(path, usize::MAX, now_ms)?.ok_or_else(|| {
            anyhow::anyhow!("no learned DNS map at {} (--dns-learned)", path.display())
        })?;
        Ok(LearnedFile {
            path: path.to_path_buf(),
            map,
            now_ms,
        })
    }
}

impl DomainMembers for LearnedFile {
    fn learned(&self, patterns: &[DomainPattern]) -> Vec<LearnedAddr> {
        self.map.learned(patterns, self.now_ms)
    }
}

fn secs(ms: u64) -> u64 {
    ms / 1000
}

/// "domain rule example.com (learned 12 s ago, TTL 60 s)" for the domain set a packet was allowed
/// through (the evaluator's [`DomainHit`]), from the learned map when one was read, else from
/// what the evaluator knows (the address in the set and its time left).
pub fn explain(learned: Option<&LearnedFile>, hit: &DomainHit) -> String {
    let Some(file) = learned else {
        return hit.to_string();
    };
    // The name that keeps the address allowed longest.
    let best = file
        .map
        .entries_of(hit.addr, file.now_ms)
        .into_iter()
        .filter(|(n, _)| hit.patterns.iter().any(|p| p.matches(n)))
        .max_by_key(|(_, e)| e.expires_at_ms);
    match best {
        Some((name, e)) => {
            let pattern = hit
                .patterns
                .iter()
                .find(|p| p.matches(&name))
                .map_or(name.as_str(), |p| p.as_str());
            let via = if pattern == name {
                String::new()
            } else {
                format!("{name} ")
            };
            format!(
                "domain rule {pattern} ({via}learned {} s ago, TTL {} s)",
                secs(file.now_ms.saturating_sub(e.learned_at_ms)),
                e.ttl_secs
            )
        }
        None => format!("{hit}, not learned for it in {}", file.path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn hit(p: &[&str], addr: IpAddr) -> DomainHit {
        DomainHit {
            chain: "cali-po-x".into(),
            rule: 1,
            set: "cali40d:abc".into(),
            patterns: p.iter().map(|p| DomainPattern::parse(p).unwrap()).collect(),
            addr,
            remaining_secs: Some(48),
        }
    }

    #[test]
    fn explains_the_learned_name_age_and_ttl() {
        let mut map = LearnedMap::new(10);
        let dst: IpAddr = "192.0.2.1".parse().unwrap();
        map.learn("example.com", dst, 60, 1_000_000);
        map.learn("api.example.com", dst, 30, 1_000_000);
        let file = LearnedFile {
            path: "/x/dns-learned.json".into(),
            map,
            now_ms: 1_012_400,
        };
        assert_eq!(
            explain(Some(&file), &hit(&["example.com"], dst)),
            "domain rule example.com (learned 12 s ago, TTL 60 s)"
        );
        assert_eq!(
            explain(Some(&file), &hit(&["*.example.com"], dst)),
            "domain rule *.example.com (api.example.com learned 12 s ago, TTL 30 s)"
        );
        let other: IpAddr = "192.0.2.9".parse().unwrap();
        assert!(explain(Some(&file), &hit(&["example.com"], other)).contains("not learned"));
        assert_eq!(
            explain(None, &hit(&["example.com"], dst)),
            "domain rule example.com (192.0.2.1 in cali40d:abc, 48 s left)"
        );
    }
}
