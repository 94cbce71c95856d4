//! [`Resource`]: any supported resource, with JSON/etcd decoding dispatched on `kind` and
//! canonical encoding.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::endpoint::{HostEndpoint, WorkloadEndpoint};
use super::key::{API_VERSION, Kind, ResourceKey};
use super::metadata::Metadata;
use super::netset::{GlobalNetworkSet, NetworkSet};
use super::policy::{
    GlobalNetworkPolicy, NetworkPolicy, StagedGlobalNetworkPolicy, StagedKubernetesNetworkPolicy,
    StagedNetworkPolicy,
};
use super::profile::Profile;
use super::tier::Tier;
use super::{ModelError, ValidationError};

/// One Calico v3 resource of any supported kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Resource {
    NetworkPolicy(NetworkPolicy),
    GlobalNetworkPolicy(GlobalNetworkPolicy),
    Tier(Tier),
    Profile(Profile),
    WorkloadEndpoint(WorkloadEndpoint),
    HostEndpoint(HostEndpoint),
    NetworkSet(NetworkSet),
    GlobalNetworkSet(GlobalNetworkSet),
    StagedNetworkPolicy(StagedNetworkPolicy),
    StagedGlobalNetworkPolicy(StagedGlobalNetworkPolicy),
    StagedKubernetesNetworkPolicy(StagedKubernetesNetworkPolicy),
}

/// Applies `$body` to the inner value of every variant.
macro_rules! each_variant {
    ($self:expr, $inner:ident => $body:expr) => {
        match $self {
            Resource::NetworkPolicy($inner) => $body,
            Resource::GlobalNetworkPolicy($inner) => $body,
            Resource::Tier($inner) => $body,
            Resource::Profile($inner) => $body,
            Resource::WorkloadEndpoint($inner) => $body,
            Resource::HostEndpoint($inner) => $body,
            Resource::NetworkSet($inner) => $body,
            Resource::GlobalNetworkSet($inner) => $body,
            Resource::StagedNetworkPolicy($inner) => $body,
            Resource::StagedGlobalNetworkPolicy($inner) => $body,
            Resource::StagedKubernetesNetworkPolicy($inner) => $body,
        }
    };
}

macro_rules! impl_from {
    ($($t:ident),*) => {
        $(impl From<$t> for Resource {
            fn from(r: $t) -> Resource {
                Resource::$t(r)
            }
        })*
    };
}
impl_from!(
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
    StagedKubernetesNetworkPolicy
);

/// The output envelope: type meta first, then the resource's own `metadata` and `spec`.
#[derive(Serialize)]
struct Envelope<'a, T: Serialize> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

/// Just enough of a document to dispatch on and to name it in errors.
#[derive(Deserialize)]
struct Head {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
}

impl Head {
    fn meta_str(&self, field: &str) -> Option<&str> {
        self.metadata.as_ref()?.get(field)?.as_str()
    }

    /// A best-effort name for the resource in errors: `networkpolicies/prod/web`, or just
    /// `[<ns>/]<name>` when the kind is unknown.
    fn label(&self, kind: Option<Kind>) -> String {
        let name = self.meta_str("name").unwrap_or("<unnamed>");
        let ns = self.meta_str("namespace").filter(|s| !s.is_empty());
        let ns_part = match (ns, kind) {
            (Some(ns), None) => format!("{ns}/"),
            (Some(ns), Some(k)) if k.is_namespaced() => format!("{ns}/"),
            _ => String::new(),
        };
        match kind {
            Some(k) => format!("{}/{ns_part}{name}", k.plural()),
            None => format!("{ns_part}{name}"),
        }
    }
}

fn decode_as<T: DeserializeOwned>(json: &[u8], resource: &str) -> Result<T, ModelError> {
    let mut de = serde_json::Deserializer::from_slice(json);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ModelError::Decode {
            resource: resource.to_string(),
            path: if path == "." { String::new() } else { path },
            message: e.into_inner().to_string(),
        }
    })
}

impl Resource {
    pub fn kind(&self) -> Kind {
        match self {
            Resource::NetworkPolicy(_) => Kind::NetworkPolicy,
            Resource::GlobalNetworkPolicy(_) => Kind::GlobalNetworkPolicy,
            Resource::Tier(_) => Kind::Tier,
            Resource::Profile(_) => Kind::Profile,
            Resource::WorkloadEndpoint(_) => Kind::WorkloadEndpoint,
            Resource::HostEndpoint(_) => Kind::HostEndpoint,
            Resource::NetworkSet(_) => Kind::NetworkSet,
            Resource::GlobalNetworkSet(_) => Kind::GlobalNetworkSet,
            Resource::StagedNetworkPolicy(_) => Kind::StagedNetworkPolicy,
            Resource::StagedGlobalNetworkPolicy(_) => Kind::StagedGlobalNetworkPolicy,
            Resource::StagedKubernetesNetworkPolicy(_) => Kind::StagedKubernetesNetworkPolicy,
        }
    }

    pub fn metadata(&self) -> &Metadata {
        each_variant!(self, r => &r.metadata)
    }

    pub fn metadata_mut(&mut self) -> &mut Metadata {
        each_variant!(self, r => &mut r.metadata)
    }

    /// The resource's identity from its metadata. The namespace is kept only for namespaced
    /// kinds; a namespaced resource without one has `namespace: None` (validation rejects it).
    pub fn key(&self) -> ResourceKey {
        let kind = self.kind();
        let meta = self.metadata();
        ResourceKey {
            kind,
            namespace: meta.namespace.clone().filter(|_| kind.is_namespaced()),
            name: meta.name.clone(),
        }
    }

    /// Decodes a resource document, dispatching on its `kind`. `apiVersion`, when present, must
    /// be `projectcalico.org/v3`.
    pub fn from_json(json: &[u8]) -> Result<Resource, ModelError> {
        Self::decode(json, None)
    }

    /// Decodes an etcd key/value pair and checks that the body's kind, namespace and name are
    /// the ones in the key.
    pub fn from_etcd(key: &str, value: &[u8]) -> Result<(ResourceKey, Resource), ModelError> {
        let rk = ResourceKey::parse_etcd_key(key)?;
        let resource = Self::decode(value, Some(&rk))?;
        let mismatch = |field: &'static str, key: &str, body: &str| ModelError::KeyMismatch {
            resource: rk.to_string(),
            field,
            key: key.to_string(),
            body: body.to_string(),
        };
        if resource.kind() != rk.kind {
            return Err(mismatch(
                "kind",
                rk.kind.kind_name(),
                resource.kind().kind_name(),
            ));
        }
        let meta = resource.metadata();
        let body_ns = meta.namespace.as_deref().unwrap_or("");
        let key_ns = rk.namespace.as_deref().unwrap_or("");
        if body_ns != key_ns {
            return Err(mismatch("metadata.namespace", key_ns, body_ns));
        }
        if meta.name != rk.name {
            return Err(mismatch("metadata.name", &rk.name, &meta.name));
        }
        Ok((rk, resource))
    }

    /// [`Resource::from_etcd`] followed by [`Resource::validate`], for callers that want only
    /// valid resources.
    pub fn from_etcd_validated(
        key: &str,
        value: &[u8],
    ) -> Result<(ResourceKey, Resource), ModelError> {
        let (rk, resource) = Self::from_etcd(key, value)?;
        resource.validate().map_err(ModelError::Invalid)?;
        Ok((rk, resource))
    }

    fn decode(json: &[u8], key: Option<&ResourceKey>) -> Result<Resource, ModelError> {
        let head: Head = serde_json::from_slice(json).map_err(|e| ModelError::Decode {
            resource: key.map_or_else(|| "resource".to_string(), ToString::to_string),
            path: String::new(),
            message: e.to_string(),
        })?;
        let kind = head.kind.as_deref().and_then(Kind::from_kind_name);
        let label = key.map_or_else(|| head.label(kind), ToString::to_string);
        let Some(kind) = kind else {
            return Err(ModelError::UnknownKind {
                resource: label,
                kind: head.kind.clone().unwrap_or_default(),
            });
        };
        if let Some(v) = head.api_version.as_deref().filter(|v| *v != API_VERSION) {
            return Err(ModelError::ApiVersion {
                resource: label,
                api_version: v.to_string(),
            });
        }
        Ok(match kind {
            Kind::NetworkPolicy => Resource::NetworkPolicy(decode_as(json, &label)?),
            Kind::GlobalNetworkPolicy => Resource::GlobalNetworkPolicy(decode_as(json, &label)?),
            Kind::Tier => Resource::Tier(decode_as(json, &label)?),
            Kind::Profile => Resource::Profile(decode_as(json, &label)?),
            Kind::WorkloadEndpoint => Resource::WorkloadEndpoint(decode_as(json, &label)?),
            Kind::HostEndpoint => Resource::HostEndpoint(decode_as(json, &label)?),
            Kind::NetworkSet => Resource::NetworkSet(decode_as(json, &label)?),
            Kind::GlobalNetworkSet => Resource::GlobalNetworkSet(decode_as(json, &label)?),
            Kind::StagedNetworkPolicy => Resource::StagedNetworkPolicy(decode_as(json, &label)?),
            Kind::StagedGlobalNetworkPolicy => {
                Resource::StagedGlobalNetworkPolicy(decode_as(json, &label)?)
            }
            Kind::StagedKubernetesNetworkPolicy => {
                Resource::StagedKubernetesNetworkPolicy(decode_as(json, &label)?)
            }
        })
    }

    /// The canonical JSON: what the controller writes to etcd.
    pub fn to_json(&self) -> String {
        let kind = self.kind().kind_name();
        let out = each_variant!(self, r => serde_json::to_string(&Envelope {
            api_version: API_VERSION,
            kind,
            body: r,
        }));
        // Serialising plain data (string-keyed maps, finite numbers from JSON) cannot fail; the
        // only f64 fields are orders, which never hold NaN when they came from JSON. Should a
        // caller put NaN there, serde_json writes `null` rather than failing.
        out.unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()))
    }

    /// Validates the resource; see the `validate` module for the rules. Returns every problem.
    pub fn validate(&self) -> Result<(), Vec<ValidationError>> {
        super::validate::validate_resource(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_np_json(ns: &str, name: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": "app == 'web'", "ingress": [{"action": "Allow"}]}
        }))
        .unwrap()
    }

    #[test]
    fn from_json_dispatches_and_round_trips() {
        let r = Resource::from_json(&mk_np_json("prod", "web")).unwrap();
        assert_eq!(r.kind(), Kind::NetworkPolicy);
        assert_eq!(r.key().to_string(), "networkpolicies/prod/web");
        let out = r.to_json();
        assert!(
            out.starts_with(
                r#"{"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy","metadata":"#
            ),
            "{out}"
        );
        assert_eq!(Resource::from_json(out.as_bytes()).unwrap(), r);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let want: serde_json::Value = serde_json::from_slice(&mk_np_json("prod", "web")).unwrap();
        assert_eq!(v, want);
    }

    #[test]
    fn decode_errors_name_resource_and_path() {
        let doc = json!({
            "kind": "NetworkPolicy", "metadata": {"name": "web", "namespace": "prod"},
            "spec": {"ingress": [{"action": "Allow"}, {"action": "Allow", "destination": {"ports": ["1:x"]}}]}
        });
        let err = Resource::from_json(&serde_json::to_vec(&doc).unwrap()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("networkpolicies/prod/web: spec.ingress[1].destination.ports[0]: invalid port range \"1:x\""),
            "{msg}"
        );
        let err = Resource::from_json(
            br#"{"kind":"Tier","metadata":{"name":"t"},"spec":{"defaultAction":"Drop"}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("tiers/t: spec.defaultAction: unknown variant `Drop`"),
            "{err}"
        );
        let err = Resource::from_json(b"{not json").unwrap_err().to_string();
        assert!(err.starts_with("resource: key must be a string"), "{err}");
        let err = Resource::from_json(br#"{"kind":"IPPool","metadata":{"name":"p"}}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "p: unknown kind \"IPPool\"");
        let err = Resource::from_json(
            br#"{"apiVersion":"crd.projectcalico.org/v1","kind":"Tier","metadata":{"name":"t"}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("unsupported apiVersion \"crd.projectcalico.org/v1\""),
            "{err}"
        );
    }

    #[test]
    fn from_etcd_checks_key_against_body() {
        let key = "/calico/resources/v3/projectcalico.org/networkpolicies/prod/web";
        let (rk, r) = Resource::from_etcd(key, &mk_np_json("prod", "web")).unwrap();
        assert_eq!(rk, r.key());
        assert_eq!(rk.etcd_key(), key);

        let err = Resource::from_etcd(key, &mk_np_json("dev", "web")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "networkpolicies/prod/web: metadata.namespace in the body is \"dev\" but the etcd key says \"prod\""
        );
        let err = Resource::from_etcd(key, &mk_np_json("prod", "api")).unwrap_err();
        assert!(
            err.to_string()
                .contains("metadata.name in the body is \"api\"")
        );
        let err = Resource::from_etcd(
            "/calico/resources/v3/projectcalico.org/networksets/prod/web",
            &mk_np_json("prod", "web"),
        )
        .unwrap_err();
        assert!(err.to_string().contains(
            "kind in the body is \"NetworkPolicy\" but the etcd key says \"NetworkSet\""
        ));
        let err = Resource::from_etcd(
            "/calico/resources/v3/projectcalico.org/networkpolicies/prod/web",
            b"{\"kind\": \"NetworkPolicy\", \"spec\": 5}",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("networkpolicies/prod/web: spec: invalid type"),
            "{err}"
        );
        assert!(matches!(
            Resource::from_etcd("/calico/resources/v3/projectcalico.org/bogus/x", b"{}"),
            Err(ModelError::InvalidKey { .. })
        ));
    }

    #[test]
    fn every_kind_encodes_its_kind_name() {
        for kind in Kind::ALL {
            let mut meta = json!({"name": "x"});
            if kind.is_namespaced() {
                meta["namespace"] = json!("ns");
            }
            let doc =
                json!({"apiVersion": API_VERSION, "kind": kind.kind_name(), "metadata": meta});
            let r = Resource::from_json(&serde_json::to_vec(&doc).unwrap()).unwrap();
            assert_eq!(r.kind(), kind);
            assert_eq!(
                r.key().etcd_key(),
                ResourceKey {
                    kind,
                    namespace: kind.is_namespaced().then(|| "ns".to_string()),
                    name: "x".into()
                }
                .etcd_key()
            );
            let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
            assert_eq!(v["kind"], kind.kind_name());
            assert_eq!(v["spec"], json!({}));
        }
    }
}
