//! `projectcalico.org/v3` RemoteClusterConfiguration: another cluster whose workload endpoints,
//! profiles and network sets this cluster's agents sync read-only (federation).
//!
//! Kept outside [`super::Resource`]: the calculation graph never sees it; the agent reads it to
//! decide which remote stores to sync. Decoding is strict (an unknown field is an error naming it),
//! because a field we silently ignored (a kubeconfig, a password) would leave the remote
//! unsynced without saying why.
//!
//! Fields: Calico's `datastoreType` (only `etcdv3`), `etcdEndpoints` (comma separated URLs),
//! `etcdCACertFile`, `etcdCertFile`, `etcdKeyFile`; and felixrs's `etcdPrefix` (the remote
//! cluster's `--etcd-prefix`, default `/calico`).

use serde::Deserialize;

use super::key::CALICO_PREFIX;
use super::names::validate_name;
use super::prefix::EtcdPrefix;

/// The plural in etcd keys.
pub const REMOTE_CLUSTER_PLURAL: &str = "remoteclusterconfigurations";

/// A decoded, validated RemoteClusterConfiguration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCluster {
    /// The cluster's name (`metadata.name`): the value of the `projectcalico.org/cluster` label
    /// its endpoints get.
    pub name: String,
    pub endpoints: Vec<String>,
    pub prefix: EtcdPrefix,
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Doc {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    metadata: Meta,
    spec: Spec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    datastore_type: Option<String>,
    #[serde(default)]
    etcd_endpoints: String,
    #[serde(default)]
    etcd_prefix: Option<String>,
    #[serde(default, rename = "etcdCACertFile")]
    etcd_ca_cert_file: Option<String>,
    #[serde(default)]
    etcd_cert_file: Option<String>,
    #[serde(default)]
    etcd_key_file: Option<String>,
}

/// The etcd key of the RemoteClusterConfiguration `name` (canonical layout).
pub fn remote_cluster_key(name: &str) -> String {
    format!("{CALICO_PREFIX}{REMOTE_CLUSTER_PLURAL}/{name}")
}

/// The name in a canonical RemoteClusterConfiguration key, if `key` is one.
pub fn remote_cluster_name(key: &str) -> Option<&str> {
    key.strip_prefix(CALICO_PREFIX)?
        .strip_prefix(REMOTE_CLUSTER_PLURAL)?
        .strip_prefix('/')
        .filter(|n| !n.is_empty() && !n.contains('/'))
}

/// Why a RemoteClusterConfiguration is unusable: the object and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteClusterError {
    #[error("{key}: not a RemoteClusterConfiguration key")]
    NotAKey { key: String },
    /// `remoteclusterconfigurations/<name>: <field>: <problem>`.
    #[error("{resource}: {path}: {message}")]
    Field {
        resource: String,
        path: String,
        message: String,
    },
}

impl RemoteCluster {
    /// Decodes and validates the value of `key`. Errors read
    /// `remoteclusterconfigurations/<name>: <field>: <problem>`.
    pub fn from_etcd(key: &str, value: &[u8]) -> Result<RemoteCluster, RemoteClusterError> {
        let key_name = remote_cluster_name(key).ok_or_else(|| RemoteClusterError::NotAKey {
            key: key.to_string(),
        })?;
        let who = format!("{REMOTE_CLUSTER_PLURAL}/{key_name}");
        let field = |path: &str, message: String| RemoteClusterError::Field {
            resource: who.clone(),
            path: path.to_string(),
            message,
        };
        let mut de = serde_json::Deserializer::from_slice(value);
        let doc: Doc = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            field(&path, e.into_inner().to_string())
        })?;
        if let Some(v) = doc.api_version.as_deref()
            && v != super::API_VERSION
        {
            return Err(field(
                "apiVersion",
                format!("{v:?} is not {}", super::API_VERSION),
            ));
        }
        if let Some(k) = doc.kind.as_deref()
            && k != "RemoteClusterConfiguration"
        {
            return Err(field(
                "kind",
                format!("{k:?} is not RemoteClusterConfiguration"),
            ));
        }
        if doc.metadata.name != key_name {
            return Err(field(
                "metadata.name",
                format!("{:?} does not match the key", doc.metadata.name),
            ));
        }
        validate_name(key_name).map_err(|e| field("metadata.name", e.to_string()))?;
        let spec = doc.spec;
        if let Some(t) = spec.datastore_type.as_deref()
            && t != "etcdv3"
        {
            return Err(field(
                "spec.datastoreType",
                format!("{t:?} is not supported (only etcdv3)"),
            ));
        }
        let endpoints: Vec<String> = spec
            .etcd_endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(String::from)
            .collect();
        if endpoints.is_empty() {
            return Err(field("spec.etcdEndpoints", "is empty".into()));
        }
        for e in &endpoints {
            let ok = (e.starts_with("http://") || e.starts_with("https://"))
                && e.chars().all(|c| c.is_ascii_graphic());
            if !ok {
                return Err(field(
                    "spec.etcdEndpoints",
                    format!("{e:?} is not an http(s) URL"),
                ));
            }
        }
        let prefix = match spec.etcd_prefix.as_deref() {
            None | Some("") => EtcdPrefix::default(),
            Some(p) => EtcdPrefix::new(p).map_err(|e| field("spec.etcdPrefix", e.to_string()))?,
        };
        let file = |path: &str, v: Option<String>| -> Result<Option<String>, RemoteClusterError> {
            match v.filter(|v| !v.is_empty()) {
                Some(f) if !f.starts_with('/') => {
                    Err(field(path, format!("{f:?} is not absolute")))
                }
                other => Ok(other),
            }
        };
        let ca_file = file("spec.etcdCACertFile", spec.etcd_ca_cert_file)?;
        let cert_file = file("spec.etcdCertFile", spec.etcd_cert_file)?;
        let key_file = file("spec.etcdKeyFile", spec.etcd_key_file)?;
        if cert_file.is_some() != key_file.is_some() {
            return Err(field(
                "spec.etcdCertFile",
                "etcdCertFile and etcdKeyFile go together".into(),
            ));
        }
        Ok(RemoteCluster {
            name: key_name.to_string(),
            endpoints,
            prefix,
            ca_file,
            cert_file,
            key_file,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(name: &str, json: &str) -> Result<RemoteCluster, String> {
        RemoteCluster::from_etcd(&remote_cluster_key(name), json.as_bytes())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_full_configuration_decodes() {
        let r = decode(
            "west",
            r#"{"apiVersion":"projectcalico.org/v3","kind":"RemoteClusterConfiguration",
                "metadata":{"name":"west"},
                "spec":{"datastoreType":"etcdv3","etcdEndpoints":"https://10.0.0.1:2379, https://10.0.0.2:2379",
                        "etcdPrefix":"/west/calico","etcdCACertFile":"/etc/w/ca.pem",
                        "etcdCertFile":"/etc/w/c.pem","etcdKeyFile":"/etc/w/k.pem"}}"#,
        )
        .unwrap();
        assert_eq!(r.name, "west");
        assert_eq!(r.endpoints.len(), 2);
        assert_eq!(r.prefix.as_str(), "/west/calico");
        assert_eq!(r.ca_file.as_deref(), Some("/etc/w/ca.pem"));
    }

    #[test]
    fn the_default_prefix_is_calicos() {
        let r = decode(
            "b",
            r#"{"metadata":{"name":"b"},"spec":{"etcdEndpoints":"http://e:2379"}}"#,
        )
        .unwrap();
        assert!(r.prefix.is_default());
    }

    #[test]
    fn errors_name_the_object_and_the_field() {
        for (json, want) in [
            (
                r#"{"metadata":{"name":"b"},"spec":{"etcdEndpoints":"http://e","kubeconfig":"/k"}}"#,
                "remoteclusterconfigurations/b: spec.kubeconfig: unknown field `kubeconfig`",
            ),
            (
                r#"{"metadata":{"name":"b"},"spec":{"datastoreType":"kubernetes","etcdEndpoints":"http://e"}}"#,
                "remoteclusterconfigurations/b: spec.datastoreType:",
            ),
            (
                r#"{"metadata":{"name":"b"},"spec":{}}"#,
                "remoteclusterconfigurations/b: spec.etcdEndpoints: is empty",
            ),
            (
                r#"{"metadata":{"name":"b"},"spec":{"etcdEndpoints":"e:2379"}}"#,
                "spec.etcdEndpoints: \"e:2379\" is not an http(s) URL",
            ),
            (
                r#"{"metadata":{"name":"b"},"spec":{"etcdEndpoints":"http://e","etcdPrefix":"x"}}"#,
                "spec.etcdPrefix: etcd prefix \"x\"",
            ),
            (
                r#"{"metadata":{"name":"c"},"spec":{"etcdEndpoints":"http://e"}}"#,
                "metadata.name: \"c\" does not match the key",
            ),
            (
                r#"{"metadata":{"name":"b"},"spec":{"etcdEndpoints":"http://e","etcdCertFile":"/c"}}"#,
                "spec.etcdCertFile: etcdCertFile and etcdKeyFile go together",
            ),
            (r#"[1]"#, "remoteclusterconfigurations/b"),
        ] {
            let e = decode("b", json).unwrap_err();
            assert!(e.contains(want), "{json}\n{e}");
        }
        let e = decode("Bad_Name", r#"{"metadata":{"name":"Bad_Name"},"spec":{}}"#).unwrap_err();
        assert!(e.contains("metadata.name"), "{e}");
    }

    #[test]
    fn keys() {
        assert_eq!(remote_cluster_name(&remote_cluster_key("b")), Some("b"));
        assert_eq!(
            remote_cluster_name(&format!("{CALICO_PREFIX}remoteclusterconfigurations/")),
            None
        );
        assert_eq!(
            remote_cluster_name(&format!("{CALICO_PREFIX}profiles/b")),
            None
        );
    }
}
