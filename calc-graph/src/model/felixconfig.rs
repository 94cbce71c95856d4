//! `projectcalico.org/v3` FelixConfiguration: the agent's settings in the datastore, the
//! cluster-wide `default` and the per-node `node.<nodename>`.
//!
//! Kept outside [`super::Resource`] (like RemoteClusterConfiguration): the calculation graph never
//! sees it; the agent reads it for its own settings. Decoding checks the envelope (`apiVersion`,
//! `kind`, `metadata.name` equal to the key's name, `spec` an object) and keeps `spec`'s fields as
//! written, by Calico's field names: which of them the agent implements, and each one's value
//! syntax, is the agent's table (`felixrs::agent::felix_config`). [`parse_duration`] reads the
//! Go durations (`90s`, `1m30s`, `500ms`) Calico writes.

use std::collections::BTreeMap;
use std::time::Duration;

use super::key::CALICO_PREFIX;

/// The plural in etcd keys.
pub const FELIX_CONFIGURATION_PLURAL: &str = "felixconfigurations";

/// The name of the cluster-wide FelixConfiguration.
pub const GLOBAL_FELIX_CONFIGURATION: &str = "default";

/// The name of `node`'s own FelixConfiguration (`node.<nodename>`).
pub fn node_felix_configuration(node: &str) -> String {
    format!("node.{node}")
}

/// The etcd key of the FelixConfiguration `name` (canonical layout).
pub fn felix_configuration_key(name: &str) -> String {
    format!("{CALICO_PREFIX}{FELIX_CONFIGURATION_PLURAL}/{name}")
}

/// The name in a canonical FelixConfiguration key, if `key` is one.
pub fn felix_configuration_name(key: &str) -> Option<&str> {
    key.strip_prefix(CALICO_PREFIX)?
        .strip_prefix(FELIX_CONFIGURATION_PLURAL)?
        .strip_prefix('/')
        .filter(|n| !n.is_empty() && !n.contains('/'))
}

/// A decoded FelixConfiguration: its name and its `spec` fields as written.
#[derive(Debug, Clone, PartialEq)]
pub struct FelixConfiguration {
    pub name: String,
    pub spec: BTreeMap<String, serde_json::Value>,
}

/// Why a FelixConfiguration is unusable, or one of its fields: `felixconfigurations/<name>:
/// <field>: <problem>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FelixConfigurationError {
    #[error("{key}: not a FelixConfiguration key")]
    NotAKey { key: String },
    #[error("{resource}: {path}: {message}")]
    Field {
        resource: String,
        path: String,
        message: String,
    },
}

impl FelixConfiguration {
    /// Decodes the value of `key`. Errors read `felixconfigurations/<name>: <field>: <problem>`.
    pub fn from_etcd(
        key: &str,
        value: &[u8],
    ) -> Result<FelixConfiguration, FelixConfigurationError> {
        let name =
            felix_configuration_name(key).ok_or_else(|| FelixConfigurationError::NotAKey {
                key: key.to_string(),
            })?;
        let field = |path: &str, message: String| FelixConfigurationError::Field {
            resource: format!("{FELIX_CONFIGURATION_PLURAL}/{name}"),
            path: path.to_string(),
            message,
        };
        let doc: serde_json::Value =
            serde_json::from_slice(value).map_err(|e| field("", e.to_string()))?;
        let obj = doc
            .as_object()
            .ok_or_else(|| field("", "not a JSON object".into()))?;
        let text = |k: &str| obj.get(k).and_then(serde_json::Value::as_str);
        if let Some(v) = text("apiVersion")
            && v != super::API_VERSION
        {
            return Err(field(
                "apiVersion",
                format!("{v:?} is not {}", super::API_VERSION),
            ));
        }
        if let Some(k) = text("kind")
            && k != "FelixConfiguration"
        {
            return Err(field("kind", format!("{k:?} is not FelixConfiguration")));
        }
        let body_name = obj
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        if !body_name.is_empty() && body_name != name {
            return Err(field(
                "metadata.name",
                format!("{body_name:?} but the etcd key says {name:?}"),
            ));
        }
        let spec = match obj.get("spec") {
            None | Some(serde_json::Value::Null) => BTreeMap::new(),
            Some(serde_json::Value::Object(m)) => m.clone().into_iter().collect(),
            Some(_) => return Err(field("spec", "not an object".into())),
        };
        Ok(FelixConfiguration {
            name: name.to_string(),
            spec,
        })
    }
}

/// Why a Go duration was refused; each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("{0:?}: missing unit (e.g. 90s)")]
    MissingUnit(String),
    #[error("{0:?} is not a duration (e.g. 90s, 1m30s)")]
    Number(String),
    #[error("{text:?}: unknown unit {unit:?} (ns, us, ms, s, m, h)")]
    Unit { text: String, unit: String },
    #[error("{text:?}: {error}")]
    Range {
        text: String,
        error: std::time::TryFromFloatSecsError,
    },
}

/// A Go duration as Calico writes one (`90s`, `1m30s`, `1.5h`, `500ms`, `0`); negative ones are
/// refused.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| DurationError::MissingUnit(s.to_string()))?;
        let (num, tail) = rest.split_at(n);
        let value: f64 = num
            .parse()
            .map_err(|_| DurationError::Number(s.to_string()))?;
        let u = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(u);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(DurationError::Unit {
                    text: s.to_string(),
                    unit: unit.to_string(),
                });
            }
        };
        total += value * scale;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|error| DurationError::Range {
        text: s.to_string(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_names_and_envelope() {
        let key = felix_configuration_key("node.n1");
        assert_eq!(felix_configuration_name(&key), Some("node.n1"));
        assert_eq!(
            felix_configuration_name("/calico/resources/v3/projectcalico.org/tiers/x"),
            None
        );
        let c = FelixConfiguration::from_etcd(
            &key,
            br#"{"apiVersion":"projectcalico.org/v3","kind":"FelixConfiguration",
                 "metadata":{"name":"node.n1"},"spec":{"logSeverityScreen":"Debug"}}"#,
        )
        .unwrap();
        assert_eq!(c.spec["logSeverityScreen"], "Debug");
        let e = FelixConfiguration::from_etcd(
            &key,
            br#"{"kind":"FelixConfiguration","metadata":{"name":"other"},"spec":{}}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            r#"felixconfigurations/node.n1: metadata.name: "other" but the etcd key says "node.n1""#
        );
        let e = FelixConfiguration::from_etcd(&key, br#"{"spec":[]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("spec: not an object"), "{e}");
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(
            parse_duration("90")
                .unwrap_err()
                .to_string()
                .contains("missing unit")
        );
        assert!(parse_duration("-5s").is_err());
        assert!(
            parse_duration("5d")
                .unwrap_err()
                .to_string()
                .contains("unknown unit")
        );
    }
}
