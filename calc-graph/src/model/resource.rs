//! [`Resource`]: any supported resource, with JSON/etcd decoding dispatched on `kind` and
//! canonical encoding.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::endpoint::{HostEndpoint, WorkloadEndpoint};
use super::ippool::IpPool;
use super::key::{API_VERSION, Kind, ResourceKey, write_segment};
use super::metadata::Metadata;
use super::netset::{GlobalNetworkSet, NetworkSet};
use super::policy::{
    GlobalNetworkPolicy, NetworkPolicy, StagedGlobalNetworkPolicy, StagedKubernetesNetworkPolicy,
    StagedNetworkPolicy,
};
use super::profile::Profile;
use super::schema;
use super::tier::Tier;
use super::{ModelError, ValidationError};

/// Defines [`Resource`] from the one list of kinds, each a variant holding the type of the same
/// name (and a [`Kind`] of that name): the enum, `From` for each type, [`Resource::kind`], the
/// decoding dispatch, and `each_variant!`, which applies an expression to any variant's value.
macro_rules! resources {
    ($($t:ident),* $(,)?) => {
        /// One Calico v3 resource of any supported kind.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Resource {
            $($t($t),)*
        }

        $(impl From<$t> for Resource {
            fn from(r: $t) -> Resource {
                Resource::$t(r)
            }
        })*

        impl Resource {
            pub fn kind(&self) -> Kind {
                match self {
                    $(Resource::$t(_) => Kind::$t,)*
                }
            }

            /// Decodes `json` as the type of `kind` (inlined: the decoded value is then built in
            /// place instead of being moved out through a `Result`).
            #[inline(always)]
            fn decode_kind(
                kind: Kind,
                json: &[u8],
                label: &dyn Fn() -> String,
            ) -> Result<Resource, ModelError> {
                Ok(match kind {
                    $(Kind::$t => Resource::$t(decode_as(json, label)?),)*
                })
            }
        }

        macro_rules! each_variant {
            ($self:expr, $inner:ident => $body:expr) => {
                match $self {
                    $(Resource::$t($inner) => $body,)*
                }
            };
        }
    };
}
resources!(
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

/// Just enough of a document to dispatch on. Metadata is skipped here (no allocation); it is
/// only parsed again to name the resource when something fails.
#[derive(Deserialize)]
struct Head {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
}

/// A document's unknown fields: already read (the one-pass head), or read when asked.
trait UnknownPaths {
    fn paths(self) -> Vec<schema::FieldPath>;
}

impl UnknownPaths for Vec<schema::FieldPath> {
    fn paths(self) -> Vec<schema::FieldPath> {
        self
    }
}

impl<F: FnOnce() -> Vec<schema::FieldPath>> UnknownPaths for F {
    fn paths(self) -> Vec<schema::FieldPath> {
        self()
    }
}

/// The document's metadata, read only on the error path to name the resource.
#[derive(Deserialize)]
struct HeadMeta {
    #[serde(default)]
    metadata: Option<serde_json::Value>,
}

/// A best-effort name for a resource in errors: `networkpolicies/prod/web`, or just
/// `[<ns>/]<name>` when the kind is unknown.
fn label_of(json: &[u8], kind: Option<Kind>) -> String {
    let meta = serde_json::from_slice::<HeadMeta>(json)
        .ok()
        .and_then(|h| h.metadata);
    let field = |f: &str| {
        meta.as_ref()
            .and_then(|m| m.get(f))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let name = field("name").unwrap_or_else(|| "<unnamed>".to_string());
    let ns = field("namespace").filter(|s| !s.is_empty());
    let mut out = String::new();
    if let Some(k) = kind {
        out.push_str(k.plural());
        out.push('/');
    }
    if let Some(ns) = ns
        && kind.is_none_or(Kind::is_namespaced)
    {
        let _ = write_segment(&mut out, &ns);
        out.push('/');
    }
    let _ = write_segment(&mut out, &name);
    out
}

/// `spec.ingress[3].source.selectr` -> `(true, 3, "source.selectr")` (false for egress).
fn rule_field(path: &schema::FieldPath) -> Option<(bool, usize, String)> {
    use schema::PathSeg::{Index, Key};
    match path.0.as_slice() {
        [Key(spec), Key(dir), Index(i), rest @ ..]
            if spec == "spec" && (dir == "ingress" || dir == "egress") && !rest.is_empty() =>
        {
            let rest = schema::FieldPath(rest.to_vec()).to_string();
            Some((dir == "ingress", *i, rest))
        }
        _ => None,
    }
}

/// Decodes `json` as `T`. The fast path is plain serde_json; only when that fails is the
/// document decoded again with path tracking, to say which field was wrong.
fn decode_as<T: DeserializeOwned>(
    json: &[u8],
    label: &dyn Fn() -> String,
) -> Result<T, ModelError> {
    if let Ok(v) = serde_json::from_slice(json) {
        return Ok(v);
    }
    let mut de = serde_json::Deserializer::from_slice(json);
    let e = match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let path = e.path().to_string();
    Err(ModelError::Decode {
        resource: label(),
        path: if path == "." { String::new() } else { path },
        message: e.into_inner().to_string(),
    })
}

impl Resource {
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
        check_key(&rk, &resource)?;
        Ok((rk, resource))
    }

    fn decode(json: &[u8], key: Option<&ResourceKey>) -> Result<Resource, ModelError> {
        // serde also accepts a struct as a positional array; a resource is only ever an object.
        if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ModelError::Decode {
                resource: key.map_or_else(|| "resource".to_string(), ToString::to_string),
                path: String::new(),
                message: "a resource must be a JSON object".to_string(),
            });
        }
        // One pass for the head and the unknown fields when the document allows it (Calico's
        // own order: `apiVersion`, `kind`, then the rest); otherwise each read separately.
        if let Some(fused) = schema::head_and_unknown_paths(json) {
            let kind = fused.kind;
            let label = || key.map_or_else(|| label_of(json, Some(kind)), ToString::to_string);
            return Self::decode_checked(kind, fused.api_version, fused.unknown, json, &label);
        }
        let head: Head = serde_json::from_slice(json).map_err(|e| ModelError::Decode {
            resource: key.map_or_else(|| "resource".to_string(), ToString::to_string),
            path: String::new(),
            message: e.to_string(),
        })?;
        let kind = head.kind.as_deref().and_then(Kind::from_kind_name);
        let label = || key.map_or_else(|| label_of(json, kind), ToString::to_string);
        let Some(kind) = kind else {
            return Err(ModelError::UnknownKind {
                resource: label(),
                kind: head.kind.clone().unwrap_or_default(),
            });
        };
        let unknown = || schema::unknown_field_paths(schema::calico_document(kind), json);
        Self::decode_checked(kind, head.api_version, unknown, json, &label)
    }

    /// The rest of [`Resource::decode`] once the head is read: the `apiVersion` check, the typed
    /// decode, then the unknown fields (`unknown`, only read once the typed decode succeeded).
    fn decode_checked(
        kind: Kind,
        api_version: Option<String>,
        unknown: impl UnknownPaths,
        json: &[u8],
        label: &dyn Fn() -> String,
    ) -> Result<Resource, ModelError> {
        if let Some(v) = api_version.filter(|v| v != API_VERSION) {
            return Err(ModelError::ApiVersion {
                resource: label(),
                api_version: v,
            });
        }
        let mut resource = Self::decode_kind(kind, json, label)?;
        let unknown = unknown.paths();
        if !unknown.is_empty() {
            resource.attach_unknown_fields(unknown, label)?;
        }
        Ok(resource)
    }

    /// Gives each unknown field inside an enforced rule to that rule (which then fails safe);
    /// any other unknown field rejects the resource.
    fn attach_unknown_fields(
        &mut self,
        paths: Vec<schema::FieldPath>,
        label: &dyn Fn() -> String,
    ) -> Result<(), ModelError> {
        let (ingress, egress) = match self {
            Resource::NetworkPolicy(p) => (&mut p.spec.ingress, &mut p.spec.egress),
            Resource::GlobalNetworkPolicy(p) => (&mut p.spec.ingress, &mut p.spec.egress),
            Resource::Profile(p) => (&mut p.spec.ingress, &mut p.spec.egress),
            _ => {
                return Err(ModelError::UnknownFields {
                    resource: label(),
                    paths: paths.iter().map(ToString::to_string).collect(),
                });
            }
        };
        let mut rejected = Vec::new();
        for path in paths {
            let in_rule = rule_field(&path).and_then(|(is_ingress, i, rest)| {
                let rules = if is_ingress {
                    &mut *ingress
                } else {
                    &mut *egress
                };
                rules.get_mut(i).map(|r| (r, rest))
            });
            match in_rule {
                Some((rule, rest)) => rule.unknown_fields.push(rest),
                None => rejected.push(path.to_string()),
            }
        }
        if rejected.is_empty() {
            Ok(())
        } else {
            Err(ModelError::UnknownFields {
                resource: label(),
                paths: rejected,
            })
        }
    }

    /// The canonical JSON: what the controller writes to etcd.
    pub fn to_json(&self) -> String {
        // Infallible for this data: every map key is a string and serde_json writes a
        // non-finite f64 (an order set to NaN by code, never by JSON) as `null`.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Decodes a resource from an already-parsed JSON value (for example a YAML manifest read
    /// with serde_yaml into `serde_json::Value`).
    pub fn from_value(value: serde_json::Value) -> Result<Resource, ModelError> {
        let bytes = serde_json::to_vec(&value).map_err(|e| ModelError::Decode {
            resource: "resource".to_string(),
            path: String::new(),
            message: e.to_string(),
        })?;
        Self::from_json(&bytes)
    }

    /// Whether this is a staged policy (decoded, never enforced).
    pub fn is_staged(&self) -> bool {
        self.kind().is_staged()
    }

    /// Validates the resource; see the `validate` module for the rules. Returns every problem.
    pub fn validate(&self) -> Result<(), Vec<ValidationError>> {
        super::validate::validate_resource(self)
    }
}

/// Serialises as the canonical document (`apiVersion`, `kind`, `metadata`, `spec`).
impl Serialize for Resource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let kind = self.kind().kind_name();
        each_variant!(self, r => Envelope { api_version: API_VERSION, kind, body: r }.serialize(s))
    }
}

/// Deserialises any supported kind, dispatching on `kind` as [`Resource::from_json`] does, so
/// `serde_yaml::from_str::<Resource>` reads Calico manifests.
impl<'de> Deserialize<'de> for Resource {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Resource::from_value(value).map_err(serde::de::Error::custom)
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
    fn validated_new_checks_the_key_and_validates() {
        let r = Resource::from_json(&mk_np_json("prod", "web")).unwrap();
        let v = Validated::new(r.key(), r.clone()).unwrap();
        assert_eq!(v.into_parts(), (r.key(), r.clone()));
        let mut other = r.key();
        other.name = "db".into();
        let e = Validated::new(other, r.clone()).unwrap_err().to_string();
        assert_eq!(
            e,
            r#"networkpolicies/prod/db: metadata.name in the body is "web" but the etcd key says "db""#
        );
        let bad = Resource::from_json(&mk_np_json("prod", "Bad_Name")).unwrap();
        assert!(matches!(
            Validated::new(bad.key(), bad),
            Err(ModelError::Invalid(_))
        ));
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
        let err = Resource::from_json(br#"["projectcalico.org/v3", "Tier", {"name": "t"}, {}]"#)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "resource: a resource must be a JSON object");
        let err = Resource::from_json(b"{not json").unwrap_err().to_string();
        assert!(err.starts_with("resource: key must be a string"), "{err}");
        let err = Resource::from_json(br#"{"kind":"IPAMBlock","metadata":{"name":"p"}}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "p: unknown kind \"IPAMBlock\"");
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
    fn unknown_fields_fail_the_rule_inside_rules_and_the_resource_elsewhere() {
        let doc = json!({
            "apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
            "metadata": {"name": "g"},
            "spec": {"ingress": [{"action": "Allow", "source": {"selectr": "x == 'y'"}},
                                 {"action": "Deny", "http": {"methods": ["GET"]}}],
                     "egress": [{"action": "Allow", "source": {"domains": ["example.com"]}}]}
        });
        let r = Resource::from_value(doc.clone()).unwrap();
        let Resource::GlobalNetworkPolicy(p) = &r else {
            panic!("{r:?}")
        };
        assert_eq!(p.spec.ingress[0].unknown_fields, vec!["source.selectr"]);
        assert!(p.spec.ingress[0].fails_safe());
        assert!(p.spec.ingress[1].unknown_fields.is_empty());
        assert_eq!(p.spec.ingress[1].unenforced_fields(), vec!["http"]);
        // `destination.domains` is enforced (in egress Allow rules, see the graph's scanner).
        assert_eq!(p.spec.egress[0].unenforced_fields(), vec!["source.domains"]);

        let mut bad = doc.clone();
        bad["spec"]["selectr"] = json!("all()");
        bad["metadata"]["lables"] = json!({});
        let err = Resource::from_value(bad).unwrap_err().to_string();
        assert_eq!(
            err,
            "globalnetworkpolicies/g: metadata.lables: unknown field; spec.selectr: unknown field"
        );
        // A spec key spelt like a rule's path is still a spec-level unknown field.
        let mut crafted = doc.clone();
        crafted["spec"]["ingress[0].x"] = json!(1);
        let err = Resource::from_value(crafted).unwrap_err().to_string();
        assert_eq!(
            err,
            "globalnetworkpolicies/g: spec.ingress[0].x: unknown field"
        );
        let err = Resource::from_json(
            br#"{"kind":"StagedNetworkPolicy","metadata":{"name":"s","namespace":"n"},
                 "spec":{"stagedAction":"Set","ingress":[{"action":"Allow","sourc":{}}]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "stagednetworkpolicies/n/s: spec.ingress[0].sourc: unknown field"
        );
        let err = Resource::from_etcd(
            "/calico/resources/v3/projectcalico.org/workloadendpoints/n/w",
            br#"{"kind":"WorkloadEndpoint","metadata":{"name":"w","namespace":"n"},
                 "spec":{"interfaceName":"cali1","ipNetwork":["10.0.0.1/32"]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(err, "workloadendpoints/n/w: spec.ipNetwork: unknown field");
    }

    #[test]
    fn head_in_any_order_decodes_and_errs_alike() {
        // Calico's order (one pass for the head and the unknown fields) and any other order
        // (separate passes) give the same resource and the same unknown-field errors.
        let canonical = br#"{"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkPolicy","metadata":{"name":"g"},"spec":{"ingress":[{"action":"Allow","sourc":{}}]}}"#;
        let reordered = br#"{"metadata":{"name":"g"},"spec":{"ingress":[{"action":"Allow","sourc":{}}]},"kind":"GlobalNetworkPolicy","apiVersion":"projectcalico.org/v3"}"#;
        let (a, b) = (
            Resource::from_json(canonical).unwrap(),
            Resource::from_json(reordered).unwrap(),
        );
        assert_eq!(a, b);
        let Resource::GlobalNetworkPolicy(p) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(p.spec.ingress[0].unknown_fields, vec!["sourc"]);
        for doc in [
            &br#"{"kind":"Tier","metadata":{"name":"t","lables":{}}}"#[..],
            br#"{"metadata":{"name":"t","lables":{}},"kind":"Tier"}"#,
        ] {
            assert_eq!(
                Resource::from_json(doc).unwrap_err().to_string(),
                "tiers/t: metadata.lables: unknown field"
            );
        }
        // Repeated head fields and trailing bytes are rejected, as by the separate head read.
        let err = Resource::from_json(br#"{"kind":"Tier","kind":"Tier","metadata":{"name":"t"}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("duplicate field `kind`"), "{err}");
        let err = Resource::from_json(br#"{"kind":"Tier","metadata":{"name":"t"}} x"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("trailing characters"), "{err}");
        let err = Resource::from_json(
            br#"{"apiVersion":"v1","kind":"Tier","metadata":{"name":"t"},"spec":{"order":"x"}}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "tiers/t: unsupported apiVersion \"v1\" (expected projectcalico.org/v3)"
        );
    }

    #[test]
    fn ports_and_protocols_are_numbers_or_strings() {
        let doc = |proto: &str, port: &str| {
            format!(
                r#"{{"kind":"GlobalNetworkPolicy","metadata":{{"name":"g"}},"spec":{{"ingress":[{{"action":"Allow","protocol":{proto},"destination":{{"ports":[{port}]}}}}]}}}}"#
            )
        };
        assert!(Resource::from_json(doc("\"TCP\"", "80, \"81:82\", \"http\"").as_bytes()).is_ok());
        assert!(Resource::from_json(doc("6", "80").as_bytes()).is_ok());
        for (proto, port, want) in [
            (
                "true",
                "80",
                "spec.ingress[0].protocol: invalid type: boolean `true`, expected a number or a string",
            ),
            (
                "6",
                "1.5",
                "spec.ingress[0].destination.ports[0]: invalid type: floating point `1.5`, expected a number or a string",
            ),
            (
                "6",
                "65536",
                "spec.ingress[0].destination.ports[0]: port 65536 is out of range 0-65535",
            ),
            (
                "6",
                "18446744073709551615",
                "spec.ingress[0].destination.ports[0]: invalid value: integer `18446744073709551615`, expected a number or a string",
            ),
        ] {
            let err = Resource::from_json(doc(proto, port).as_bytes())
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(&format!("globalnetworkpolicies/g: {want}")),
                "{err}"
            );
        }
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
    fn serde_impls_match_from_json_and_to_json() {
        let r: Resource = serde_json::from_slice(&mk_np_json("prod", "web")).unwrap();
        assert_eq!(r, Resource::from_json(&mk_np_json("prod", "web")).unwrap());
        assert_eq!(serde_json::to_string(&r).unwrap(), r.to_json());
        assert!(!r.is_staged());
        let err = serde_json::from_str::<Resource>(
            r#"{"kind":"Tier","metadata":{"name":"t"},"spec":{"order":"x"}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("tiers/t: spec.order: invalid type"),
            "{err}"
        );
        let v = serde_json::json!({"kind": "StagedNetworkPolicy", "metadata": {"name": "s", "namespace": "n"}});
        assert!(Resource::from_value(v).unwrap().is_staged());
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

/// Checks that the body's kind, namespace and name are the ones in `key`; the error names the
/// first that differs.
fn check_key(key: &ResourceKey, resource: &Resource) -> Result<(), ModelError> {
    let meta = resource.metadata();
    let (key_ns, body_ns) = (
        key.namespace.as_deref().unwrap_or(""),
        meta.namespace.as_deref().unwrap_or(""),
    );
    let (field, k, b) = if key.kind != resource.kind() {
        ("kind", key.kind.kind_name(), resource.kind().kind_name())
    } else if key_ns != body_ns {
        ("metadata.namespace", key_ns, body_ns)
    } else if key.name != meta.name {
        ("metadata.name", key.name.as_str(), meta.name.as_str())
    } else {
        return Ok(());
    };
    Err(ModelError::KeyMismatch {
        resource: key.to_string(),
        field,
        key: k.to_string(),
        body: b.to_string(),
    })
}

/// A resource that decoded under its etcd key, matches that key (kind, namespace, name) and
/// validated: the one place a resource from the datastore is validated. The graph takes it
/// ([`Update::Valid`](crate::graph::Update::Valid)) without checking it again.
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    key: ResourceKey,
    resource: Resource,
}

impl Validated {
    /// Decodes `value` under the etcd `key` ([`Resource::from_etcd`]) and validates it; the error
    /// names the resource and the field.
    pub fn from_etcd(key: &str, value: &[u8]) -> Result<Validated, ModelError> {
        let (key, resource) = Resource::from_etcd(key, value)?;
        resource.validate().map_err(ModelError::Invalid)?;
        Ok(Validated { key, resource })
    }

    /// A resource already decoded, checked against `key` (kind, namespace, name) as
    /// [`Resource::from_etcd`] checks it, and validated.
    pub fn new(key: ResourceKey, resource: Resource) -> Result<Validated, ModelError> {
        check_key(&key, &resource)?;
        resource.validate().map_err(ModelError::Invalid)?;
        Ok(Validated { key, resource })
    }

    /// A resource built in code (a conversion), validated under its own key; the error is every
    /// problem found.
    pub fn of(resource: Resource) -> Result<Validated, Vec<ValidationError>> {
        resource.validate()?;
        Ok(Validated {
            key: resource.key(),
            resource,
        })
    }

    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    pub fn resource(&self) -> &Resource {
        &self.resource
    }

    pub fn into_parts(self) -> (ResourceKey, Resource) {
        (self.key, self.resource)
    }
}
