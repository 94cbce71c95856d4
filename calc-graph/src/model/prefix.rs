//! Where a cluster's Calico data lives in etcd (`--etcd-prefix`), so several clusters can share one
//! etcd without seeing each other's keys.
//!
//! A prefix is the part Calico spells `/calico`: resources live under
//! `<prefix>/resources/v3/projectcalico.org/`. The default is Calico's own (`/calico`), whose keys
//! are exactly [`CALICO_PREFIX`]'s. Everything inside felixrs (the graph, the snapshot, the
//! operator tools) speaks *canonical* keys (under [`CALICO_PREFIX`]); only the etcd edges translate
//! with [`EtcdPrefix::to_canonical`] / [`EtcdPrefix::from_canonical`].
//!
//! Invariants: `to_canonical(from_canonical(k)) == Some(k)` for every canonical key `k`; a key
//! outside this prefix's resources maps to `None`. Two clusters are isolated exactly when neither
//! resource prefix starts with the other (checked by [`EtcdPrefix::overlaps`]).

use std::fmt;

use super::key::CALICO_PREFIX;

/// Calico's own prefix.
pub const DEFAULT_ETCD_PREFIX: &str = "/calico";

/// What follows the prefix in every resource key.
const RESOURCES: &str = "/resources/v3/projectcalico.org/";

/// A validated etcd prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EtcdPrefix {
    root: String,
    resources: String,
}

impl Default for EtcdPrefix {
    fn default() -> Self {
        EtcdPrefix::new(DEFAULT_ETCD_PREFIX).expect("the default prefix is valid")
    }
}

impl fmt::Display for EtcdPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.root)
    }
}

impl std::str::FromStr for EtcdPrefix {
    type Err = EtcdPrefixError;
    fn from_str(s: &str) -> Result<Self, EtcdPrefixError> {
        EtcdPrefix::new(s)
    }
}

/// Why a root is not a usable etcd prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("etcd prefix {root:?}: {reason}")]
pub struct EtcdPrefixError {
    pub root: String,
    pub reason: String,
}

impl EtcdPrefix {
    /// Checks `root`: starts with `/`, no trailing `/`, no empty segment, only printable ASCII
    /// without spaces, at most 200 bytes (it becomes part of every key and of log lines).
    pub fn new(root: &str) -> Result<EtcdPrefix, EtcdPrefixError> {
        let bad = |why: &str| {
            Err(EtcdPrefixError {
                root: root.to_string(),
                reason: why.to_string(),
            })
        };
        if !root.starts_with('/') {
            return bad("must start with '/'");
        }
        if root.len() < 2 {
            return bad("must name at least one path segment");
        }
        if root.ends_with('/') {
            return bad("must not end with '/'");
        }
        if root.len() > 200 {
            return bad("longer than 200 bytes");
        }
        if root.split('/').skip(1).any(str::is_empty) {
            return bad("has an empty path segment");
        }
        if let Some(c) = root.chars().find(|c| !c.is_ascii_graphic()) {
            return bad(&format!(
                "contains {c:?} (only printable ASCII without spaces)"
            ));
        }
        let resources = format!("{root}{RESOURCES}");
        let default_resources = CALICO_PREFIX;
        if resources != default_resources && resources.starts_with(default_resources) {
            return bad(&format!(
                "lies inside the default cluster's keys ({default_resources})"
            ));
        }
        Ok(EtcdPrefix {
            root: root.to_string(),
            resources,
        })
    }

    /// The prefix as given (`/calico`).
    pub fn as_str(&self) -> &str {
        &self.root
    }

    /// Whether this is Calico's default.
    pub fn is_default(&self) -> bool {
        self.root == DEFAULT_ETCD_PREFIX
    }

    /// The prefix every resource key of this cluster starts with (what the agent lists and watches).
    pub fn resources(&self) -> &str {
        &self.resources
    }

    /// A key of this cluster → the canonical key; `None` for a key outside its resources.
    pub fn to_canonical(&self, key: &str) -> Option<String> {
        let rest = key.strip_prefix(&self.resources)?;
        Some(format!("{CALICO_PREFIX}{rest}"))
    }

    /// A canonical key → this cluster's key. A key that is not canonical is returned unchanged.
    pub fn from_canonical(&self, key: &str) -> String {
        match key.strip_prefix(CALICO_PREFIX) {
            Some(rest) => format!("{}{rest}", self.resources),
            None => key.to_string(),
        }
    }

    /// Whether the two clusters' resource keys can collide (one prefix contains the other's keys).
    pub fn overlaps(&self, other: &EtcdPrefix) -> bool {
        self.resources.starts_with(&other.resources) || other.resources.starts_with(&self.resources)
    }

    /// Where a non-Calico component keeps its own keys for this cluster: `base` itself for the
    /// default prefix (compatible with what it used before prefixes existed), else under the prefix.
    pub fn private_key(&self, base: &str) -> String {
        if self.is_default() {
            base.to_string()
        } else {
            format!("{}{base}", self.root)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_default_is_calicos_layout() {
        let p = EtcdPrefix::default();
        assert_eq!(p.resources(), CALICO_PREFIX);
        let k = format!("{CALICO_PREFIX}profiles/kns.a");
        assert_eq!(p.to_canonical(&k).as_deref(), Some(k.as_str()));
        assert_eq!(p.from_canonical(&k), k);
        assert_eq!(p.private_key("/felixrs/x"), "/felixrs/x");
    }

    #[test]
    fn another_prefix_maps_both_ways_and_isolates() {
        let b = EtcdPrefix::new("/clusters/b/calico").unwrap();
        let canon = format!("{CALICO_PREFIX}workloadendpoints/ns/w");
        let real = b.from_canonical(&canon);
        assert_eq!(
            real,
            "/clusters/b/calico/resources/v3/projectcalico.org/workloadendpoints/ns/w"
        );
        assert_eq!(b.to_canonical(&real), Some(canon.clone()));
        assert_eq!(b.to_canonical(&canon), None, "the default cluster's key");
        assert!(!b.overlaps(&EtcdPrefix::default()));
        let c = EtcdPrefix::new("/clusters/c/calico").unwrap();
        assert!(!b.overlaps(&c));
        assert!(b.overlaps(&b.clone()));
        assert_eq!(b.private_key("/felixrs/l"), "/clusters/b/calico/felixrs/l");
    }

    #[test]
    fn bad_prefixes_are_named() {
        for (p, why) in [
            ("calico", "start with '/'"),
            ("/", "at least one"),
            ("/a/", "end with '/'"),
            ("/a//b", "empty path segment"),
            ("/a b", "printable"),
            (
                "/calico/resources/v3/projectcalico.org/x",
                "inside the default",
            ),
        ] {
            let e = EtcdPrefix::new(p).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(p), "{p}: {e}");
        }
    }

    proptest! {
        #[test]
        fn canonical_keys_round_trip(root in "(/[a-z0-9.-]{1,8}){1,3}", rest in "[a-z/.-]{0,30}") {
            if let Ok(p) = EtcdPrefix::new(&root) {
                let canon = format!("{CALICO_PREFIX}{rest}");
                prop_assert_eq!(p.to_canonical(&p.from_canonical(&canon)), Some(canon));
            }
        }
    }
}
