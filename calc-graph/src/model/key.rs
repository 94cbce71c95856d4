//! Resource kinds and the etcd v3 key layout Calico uses for them.
//!
//! A key is `/calico/resources/v3/projectcalico.org/<plural>/<name>` for cluster-scoped kinds and
//! `/calico/resources/v3/projectcalico.org/<plural>/<namespace>/<name>` for namespaced kinds
//! (libcalico-go `backend/model/resource.go`). Invariant: for every `ResourceKey` whose namespace
//! is `Some` exactly when its kind is namespaced and whose segments are non-empty and free of `/`,
//! `parse_etcd_key(etcd_key(k)) == k`. Parsing checks structure only (prefix, plural, segment
//! count, non-empty segments); whether a name is a valid Calico name is `validate`'s job.

use std::fmt;

use super::ModelError;

/// Prefix of every Calico v3 resource key in etcd.
pub const CALICO_PREFIX: &str = "/calico/resources/v3/projectcalico.org/";

/// The `apiVersion` of every resource this module handles.
pub const API_VERSION: &str = "projectcalico.org/v3";

/// The resource kinds felixrs reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    NetworkPolicy,
    GlobalNetworkPolicy,
    Tier,
    Profile,
    WorkloadEndpoint,
    HostEndpoint,
    NetworkSet,
    GlobalNetworkSet,
    StagedNetworkPolicy,
    StagedGlobalNetworkPolicy,
    StagedKubernetesNetworkPolicy,
    IpPool,
}

impl Kind {
    /// Every kind, in declaration order.
    pub const ALL: [Kind; 12] = [
        Kind::NetworkPolicy,
        Kind::GlobalNetworkPolicy,
        Kind::Tier,
        Kind::Profile,
        Kind::WorkloadEndpoint,
        Kind::HostEndpoint,
        Kind::NetworkSet,
        Kind::GlobalNetworkSet,
        Kind::StagedNetworkPolicy,
        Kind::StagedGlobalNetworkPolicy,
        Kind::StagedKubernetesNetworkPolicy,
        Kind::IpPool,
    ];

    /// The lower-case plural used in etcd keys (`networkpolicies`).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::NetworkPolicy => "networkpolicies",
            Kind::GlobalNetworkPolicy => "globalnetworkpolicies",
            Kind::Tier => "tiers",
            Kind::Profile => "profiles",
            Kind::WorkloadEndpoint => "workloadendpoints",
            Kind::HostEndpoint => "hostendpoints",
            Kind::NetworkSet => "networksets",
            Kind::GlobalNetworkSet => "globalnetworksets",
            Kind::StagedNetworkPolicy => "stagednetworkpolicies",
            Kind::StagedGlobalNetworkPolicy => "stagedglobalnetworkpolicies",
            Kind::StagedKubernetesNetworkPolicy => "stagedkubernetesnetworkpolicies",
            Kind::IpPool => "ippools",
        }
    }

    /// The JSON `kind` (`NetworkPolicy`).
    pub fn kind_name(self) -> &'static str {
        match self {
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::GlobalNetworkPolicy => "GlobalNetworkPolicy",
            Kind::Tier => "Tier",
            Kind::Profile => "Profile",
            Kind::WorkloadEndpoint => "WorkloadEndpoint",
            Kind::HostEndpoint => "HostEndpoint",
            Kind::NetworkSet => "NetworkSet",
            Kind::GlobalNetworkSet => "GlobalNetworkSet",
            Kind::StagedNetworkPolicy => "StagedNetworkPolicy",
            Kind::StagedGlobalNetworkPolicy => "StagedGlobalNetworkPolicy",
            Kind::StagedKubernetesNetworkPolicy => "StagedKubernetesNetworkPolicy",
            Kind::IpPool => "IPPool",
        }
    }

    /// Whether resources of this kind live in a namespace (and so have one in their key).
    pub fn is_namespaced(self) -> bool {
        matches!(
            self,
            Kind::NetworkPolicy
                | Kind::WorkloadEndpoint
                | Kind::NetworkSet
                | Kind::StagedNetworkPolicy
                | Kind::StagedKubernetesNetworkPolicy
        )
    }

    /// Whether this is a staged (never enforced) policy kind.
    pub fn is_staged(self) -> bool {
        matches!(
            self,
            Kind::StagedNetworkPolicy
                | Kind::StagedGlobalNetworkPolicy
                | Kind::StagedKubernetesNetworkPolicy
        )
    }

    pub fn from_plural(plural: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.plural() == plural)
    }

    pub fn from_kind_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.kind_name() == name)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind_name())
    }
}

/// Identity of one resource: kind, namespace (for namespaced kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: String,
}

impl ResourceKey {
    /// A key for a cluster-scoped kind.
    pub fn global(kind: Kind, name: impl Into<String>) -> ResourceKey {
        ResourceKey {
            kind,
            namespace: None,
            name: name.into(),
        }
    }

    /// A key for a namespaced kind.
    pub fn namespaced(
        kind: Kind,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> ResourceKey {
        ResourceKey {
            kind,
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }

    /// The etcd key. A namespace on a cluster-scoped kind is ignored (it cannot be stored).
    pub fn etcd_key(&self) -> String {
        match (&self.namespace, self.kind.is_namespaced()) {
            (Some(ns), true) => format!("{CALICO_PREFIX}{}/{ns}/{}", self.kind.plural(), self.name),
            _ => format!("{CALICO_PREFIX}{}/{}", self.kind.plural(), self.name),
        }
    }

    /// The etcd prefix under which all resources of `kind` live (for a ranged get or watch).
    pub fn kind_prefix(kind: Kind) -> String {
        format!("{CALICO_PREFIX}{}/", kind.plural())
    }

    /// Parses an etcd key, checking its structure: the prefix, a known plural, a namespace
    /// segment exactly for namespaced kinds, no empty or extra segments.
    pub fn parse_etcd_key(key: &str) -> Result<ResourceKey, ModelError> {
        let bad = |reason: &str| ModelError::InvalidKey {
            key: key.to_string(),
            reason: reason.to_string(),
        };
        let rest = key
            .strip_prefix(CALICO_PREFIX)
            .ok_or_else(|| bad(&format!("does not start with {CALICO_PREFIX}")))?;
        let mut segments = rest.split('/');
        let plural = segments.next().unwrap_or_default();
        if plural.is_empty() {
            return Err(bad("missing resource type"));
        }
        let kind = Kind::from_plural(plural)
            .ok_or_else(|| bad(&format!("unknown resource type {plural:?}")))?;
        let segments: Vec<&str> = segments.collect();
        let want = if kind.is_namespaced() { 2 } else { 1 };
        if segments.len() < want {
            return Err(bad(if kind.is_namespaced() {
                "missing namespace or name for a namespaced resource"
            } else {
                "missing name"
            }));
        }
        if segments.len() > want {
            return Err(bad(&format!(
                "too many segments for {} (expected {})",
                kind.plural(),
                if kind.is_namespaced() {
                    "<namespace>/<name>"
                } else {
                    "<name>"
                }
            )));
        }
        if segments.iter().any(|s| s.is_empty()) {
            return Err(bad("empty namespace or name segment"));
        }
        let (namespace, name) = if kind.is_namespaced() {
            (Some(segments[0].to_string()), segments[1].to_string())
        } else {
            (None, segments[0].to_string())
        };
        Ok(ResourceKey {
            kind,
            namespace,
            name,
        })
    }
}

/// Writes one key segment; a segment that is empty or holds `/`, `"`, whitespace or control
/// characters (only possible for an invalid name) is written quoted and escaped, so an error
/// prefix is unambiguous and cannot break a log line.
pub(crate) fn write_segment(f: &mut impl fmt::Write, s: &str) -> fmt::Result {
    let plain = !s.is_empty()
        && !s
            .chars()
            .any(|c| c == '/' || c == '"' || c.is_whitespace() || c.is_control());
    if plain {
        f.write_str(s)
    } else {
        write!(f, "{s:?}")
    }
}

impl fmt::Display for ResourceKey {
    /// `networkpolicies/prod/web`, `tiers/default`: the prefix of every error about the resource.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.plural())?;
        if let Some(ns) = &self.namespace {
            f.write_str("/")?;
            write_segment(f, ns)?;
        }
        f.write_str("/")?;
        write_segment(f, &self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plural_and_kind_name_round_trip() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_plural(kind.plural()), Some(kind));
            assert_eq!(Kind::from_kind_name(kind.kind_name()), Some(kind));
        }
        assert_eq!(Kind::from_plural("ipamblocks"), None);
        assert_eq!(Kind::from_plural("ippools"), Some(Kind::IpPool));
        assert_eq!(Kind::from_kind_name("networkpolicy"), None);
    }

    #[test]
    fn keys_as_calico_writes_them() {
        let k = ResourceKey::namespaced(Kind::NetworkPolicy, "prod", "knp.default.allow-db");
        assert_eq!(
            k.etcd_key(),
            "/calico/resources/v3/projectcalico.org/networkpolicies/prod/knp.default.allow-db"
        );
        assert_eq!(k.to_string(), "networkpolicies/prod/knp.default.allow-db");
        let k = ResourceKey::global(Kind::Profile, "kns.prod");
        assert_eq!(
            k.etcd_key(),
            "/calico/resources/v3/projectcalico.org/profiles/kns.prod"
        );
        assert_eq!(
            ResourceKey::parse_etcd_key(
                "/calico/resources/v3/projectcalico.org/workloadendpoints/prod/node--1-k8s-db--0-eth0"
            )
            .unwrap(),
            ResourceKey::namespaced(Kind::WorkloadEndpoint, "prod", "node--1-k8s-db--0-eth0")
        );
    }

    #[test]
    fn display_quotes_segments_that_are_not_plain() {
        let k = ResourceKey::namespaced(Kind::NetworkPolicy, "prod", "web/evil\nx");
        assert_eq!(k.to_string(), r#"networkpolicies/prod/"web/evil\nx""#);
        assert_eq!(
            ResourceKey::global(Kind::Tier, "").to_string(),
            r#"tiers/"""#
        );
    }

    #[test]
    fn malformed_keys_are_rejected_with_reasons() {
        let cases = [
            (
                "/calico/v1/policy/tier/default/policy/x",
                "does not start with",
            ),
            (
                "/calico/resources/v3/projectcalico.org/",
                "missing resource type",
            ),
            (
                "/calico/resources/v3/projectcalico.org/ipamblocks/p1",
                "unknown resource type \"ipamblocks\"",
            ),
            (
                "/calico/resources/v3/projectcalico.org/networkpolicies/web",
                "missing namespace",
            ),
            (
                "/calico/resources/v3/projectcalico.org/tiers",
                "missing name",
            ),
            ("/calico/resources/v3/projectcalico.org/tiers/", "empty"),
            (
                "/calico/resources/v3/projectcalico.org/tiers/a/b",
                "too many segments",
            ),
            (
                "/calico/resources/v3/projectcalico.org/networksets/ns//",
                "too many segments",
            ),
            (
                "/calico/resources/v3/projectcalico.org/networksets/ns/",
                "empty",
            ),
            (
                "/calico/resources/v3/projectcalico.org/networksets//n",
                "empty",
            ),
        ];
        for (key, want) in cases {
            let err = ResourceKey::parse_etcd_key(key).unwrap_err().to_string();
            assert!(err.contains(want), "{key}: {err}");
            assert!(err.contains(key), "{key}: error must name the key: {err}");
        }
    }

    fn name_strategy() -> impl Strategy<Value = String> {
        "[a-z0-9]([-a-z0-9.]{0,40}[a-z0-9])?"
    }

    proptest! {
        #[test]
        fn etcd_key_round_trips(
            kind_idx in 0usize..Kind::ALL.len(),
            ns in "[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?",
            name in name_strategy(),
        ) {
            let kind = Kind::ALL[kind_idx];
            let key = ResourceKey {
                kind,
                namespace: kind.is_namespaced().then_some(ns),
                name,
            };
            let parsed = ResourceKey::parse_etcd_key(&key.etcd_key()).unwrap();
            prop_assert_eq!(&parsed, &key);
            prop_assert!(key.etcd_key().starts_with(&ResourceKey::kind_prefix(kind)));
        }
    }
}
