//! What `felixrs trace` says about domain rules: the learned map read from a file (the agent's
//! `<state-dir>/dns-learned.json`, or `--dns-learned FILE`) fills the rendered domain sets as the
//! agent's were filled, and a packet allowed through a domain set is explained as "allowed by
//! domain rule example.com (learned 12 s ago, TTL 60 s)".

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use calc_graph::model::DomainPattern;
use iptables::render::{ActiveDomainSet, DomainMembers, LearnedAddr};

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

/// The kernel set names a rule's text matches destinations against (`--match-set NAME dst`).
fn dst_sets(rule: &str) -> Vec<&str> {
    let t: Vec<&str> = rule.split_whitespace().collect();
    t.windows(3)
        .filter(|w| w[0] == "--match-set" && w[2] == "dst")
        .map(|w| w[1].trim_matches('"'))
        .collect()
}

fn secs(ms: u64) -> u64 {
    ms / 1000
}

/// "domain rule example.com (learned 12 s ago, TTL 60 s)" for the first domain set among
/// `rules` (the rules the packet matched in the deciding chain, as iptables-save prints them)
/// that `dst` is learned for; `None` when no domain set decided.
pub fn explain(
    learned: Option<&LearnedFile>,
    sets: &[ActiveDomainSet],
    rules: &[String],
    dst: IpAddr,
) -> Option<String> {
    let set = rules.iter().flat_map(|r| dst_sets(r)).find_map(|name| {
        sets.iter()
            .find(|s| s.v4_set.as_deref() == Some(name) || s.v6_set.as_deref() == Some(name))
    })?;
    let patterns: Vec<&str> = set.patterns.iter().map(DomainPattern::as_str).collect();
    let Some(file) = learned else {
        return Some(format!(
            "domain rule {} (no learned DNS map read: give --state-dir or --dns-learned)",
            patterns.join(", ")
        ));
    };
    // The name that keeps the address allowed longest.
    let best = file
        .map
        .entries_of(dst, file.now_ms)
        .into_iter()
        .filter(|(n, _)| set.patterns.iter().any(|p| p.matches(n)))
        .max_by_key(|(_, e)| e.expires_at_ms);
    Some(match best {
        Some((name, e)) => {
            let pattern = set
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
        None => format!(
            "domain rule {} ({dst} is not learned for it in {})",
            patterns.join(", "),
            file.path.display()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(p: &[&str]) -> ActiveDomainSet {
        ActiveDomainSet {
            patterns: p.iter().map(|p| DomainPattern::parse(p).unwrap()).collect(),
            v4_set: Some("cali40d:abc".into()),
            v6_set: None,
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
        let rules = vec![
            "-m set --match-set cali40d:abc dst -j MARK --set-xmark 0x10000/0x10000".to_string(),
        ];
        assert_eq!(
            explain(Some(&file), &[set(&["example.com"])], &rules, dst).unwrap(),
            "domain rule example.com (learned 12 s ago, TTL 60 s)"
        );
        assert_eq!(
            explain(Some(&file), &[set(&["*.example.com"])], &rules, dst).unwrap(),
            "domain rule *.example.com (api.example.com learned 12 s ago, TTL 30 s)"
        );
        let other: IpAddr = "192.0.2.9".parse().unwrap();
        assert!(
            explain(Some(&file), &[set(&["example.com"])], &rules, other)
                .unwrap()
                .contains("not learned")
        );
        assert!(
            explain(None, &[set(&["example.com"])], &rules, dst)
                .unwrap()
                .contains("no learned DNS map")
        );
        assert_eq!(
            explain(
                Some(&file),
                &[set(&["example.com"])],
                &["-j ACCEPT".into()],
                dst
            ),
            None
        );
    }
}
