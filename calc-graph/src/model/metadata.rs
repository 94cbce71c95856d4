//! Object metadata (the subset of Kubernetes `ObjectMeta` Calico resources use) and the serde
//! helpers shared by all resource types.
//!
//! Serde conventions of the model, matching Go's `omitempty`: empty strings, lists and maps and
//! `false` flags are omitted on output; an empty string on input is read as absent, so a
//! round trip gives Calico's canonical form. serde ignores unknown fields here; `Resource`'s decoding
//! checks them against `schema` (see the module docs) and never lets one pass silently.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `metadata` of a resource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Metadata {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace: Option<String>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,
    #[serde(
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub uid: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_version: Option<String>,
    #[serde(
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub creation_timestamp: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

impl Metadata {
    /// Metadata with just a name (cluster-scoped kinds).
    pub fn named(name: impl Into<String>) -> Metadata {
        Metadata {
            name: name.into(),
            ..Metadata::default()
        }
    }

    /// Metadata with a namespace and a name (namespaced kinds).
    pub fn namespaced(namespace: impl Into<String>, name: impl Into<String>) -> Metadata {
        Metadata {
            name: name.into(),
            namespace: Some(namespace.into()),
            ..Metadata::default()
        }
    }
}

/// Reads `null` and `""` as `None`.
pub(crate) fn empty_as_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.filter(|s| !s.is_empty()))
}

/// Reads `null` as the type's default (Go writes nil slices and maps as `null`).
pub(crate) fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Writes an `order` as Go's encoding/json writes a float64: integral values without a
/// fractional part (`1000`, not `1000.0`), so re-encoded Calico data compares equal.
pub(crate) fn order_as_go<S: Serializer>(order: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match order {
        Some(o) if o.fract() == 0.0 && o.abs() < 9_007_199_254_740_992.0 => {
            s.serialize_i64(*o as i64)
        }
        Some(o) => s.serialize_f64(*o),
        None => s.serialize_none(),
    }
}

pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}

/// Parses a CIDR the way Calico does: `10.0.0.0/8`, or a bare address meaning a host route
/// (`10.0.0.1` is `10.0.0.1/32`, `fd00::1` is `fd00::1/128`). Host bits are kept as written.
pub fn parse_net(s: &str) -> Result<IpNet, InvalidCidr> {
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(net);
    }
    if let Ok(addr) = s.parse::<IpAddr>() {
        return Ok(IpNet::from(addr));
    }
    Err(InvalidCidr(s.to_string()))
}

/// A text that is neither a CIDR nor an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {0:?}")]
pub struct InvalidCidr(pub String);

/// Serde for `Vec<IpNet>` fields (`nets`, `ipNetworks`, ...): lenient on input (bare addresses
/// become host networks, `null` is empty), canonical `a.b.c.d/n` strings on output.
pub(crate) mod nets {
    use super::*;

    pub fn serialize<S: Serializer>(nets: &[IpNet], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(nets.iter().map(ToString::to_string))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
        Option::<Vec<Net>>::deserialize(d)
            .map(|v| v.unwrap_or_default().into_iter().map(|n| n.0).collect())
    }

    /// One CIDR, deserialised leniently; a separate type so a bad entry's error carries its index.
    struct Net(IpNet);

    impl<'de> Deserialize<'de> for Net {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let s = String::deserialize(d)?;
            parse_net(&s).map(Net).map_err(serde::de::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_omits_empty_and_reads_null() {
        let m: Metadata = serde_json::from_str(
            r#"{"name":"web","namespace":"","labels":null,"creationTimestamp":null,"ownerReferences":[]}"#,
        )
        .unwrap();
        assert_eq!(m, Metadata::named("web"));
        assert_eq!(serde_json::to_string(&m).unwrap(), r#"{"name":"web"}"#);
        let m: Metadata = serde_json::from_str(
            r#"{"name":"a","namespace":"ns","labels":{"x":"1"},"resourceVersion":"7","generation":2}"#,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!({"name":"a","namespace":"ns","labels":{"x":"1"},"resourceVersion":"7","generation":2})
        );
    }

    #[test]
    fn nets_accept_bare_addresses() {
        assert_eq!(
            parse_net("10.0.0.1").unwrap(),
            "10.0.0.1/32".parse::<IpNet>().unwrap()
        );
        assert_eq!(
            parse_net("fd00::1").unwrap(),
            "fd00::1/128".parse::<IpNet>().unwrap()
        );
        assert_eq!(parse_net("10.1.2.3/16").unwrap().to_string(), "10.1.2.3/16");
        assert_eq!(
            parse_net("10.0.0.0/33").unwrap_err().to_string(),
            "invalid CIDR \"10.0.0.0/33\""
        );
        assert!(parse_net("").is_err());
        assert!(parse_net("10.0.0.0/8 ").is_err());
    }
}
