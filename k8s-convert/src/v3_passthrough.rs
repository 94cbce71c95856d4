//! `projectcalico.org/v3` resources written directly in manifests (GlobalNetworkPolicy, Tier,
//! NetworkPolicy, ...): validated and stored as written.
//!
//! Server-managed metadata (`resourceVersion`, `selfLink`, `generation`, `managedFields`) is dropped,
//! because in etcd the revision is the resource version. Namespaced kinds without a namespace go to
//! `default`, as calicoctl does. Validation (names, labels, selectors, rules) is the model's, applied by
//! [`crate::validate::checked`] to every resource.

use calc_graph::model::Kind;
use serde_json::{Map, Value};

use crate::convert::{self, Body, CalicoResource, Converted, ObjectRef, SkipReport, etcd_key};
use crate::validate::{checked, decode, needs_as_written};

/// A RemoteClusterConfiguration, validated strictly by the model the agents read it with (an
/// unknown field, e.g. `kubeconfig`, is an error naming it).
fn remote_cluster(v: &Value, obj: &ObjectRef, name: &str) -> Converted {
    let key = match etcd_key(convert::REMOTE_CLUSTER_KIND, None, name) {
        Ok(k) => k,
        Err(e) => return Converted::skipped(SkipReport::new(obj, "metadata", e), None),
    };
    let mut meta = Map::new();
    meta.insert("name".into(), Value::String(name.to_string()));
    if let Some(labels) = v.pointer("/metadata/labels") {
        meta.insert("labels".into(), labels.clone());
    }
    let mut doc = Map::new();
    doc.insert(
        "apiVersion".into(),
        Value::String(calc_graph::model::API_VERSION.into()),
    );
    doc.insert(
        "kind".into(),
        Value::String(convert::REMOTE_CLUSTER_KIND.into()),
    );
    doc.insert("metadata".into(), Value::Object(meta));
    doc.insert("spec".into(), v.get("spec").cloned().unwrap_or(Value::Null));
    let json = Value::Object(doc).to_string();
    // The model's messages start with the object and carry the field path.
    if let Err(e) = calc_graph::model::RemoteCluster::from_etcd(&key, json.as_bytes()) {
        let e = e.to_string();
        let msg = e
            .split_once(": ")
            .map_or(e.as_str(), |(_, m)| m)
            .to_string();
        return Converted::skipped(SkipReport::new(obj, "spec", msg), Some(key));
    }
    Converted {
        resource: Some(CalicoResource {
            kind: convert::REMOTE_CLUSTER_KIND.to_string(),
            namespace: None,
            name: name.to_string(),
            body: Body::RemoteCluster(json),
        }),
        skips: Vec::new(),
        retain_key: None,
    }
}

/// Validates one v3 document and turns it into a storable resource.
pub fn convert_v3(v: &Value) -> Converted {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
    let meta = v
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let model = Kind::from_kind_name(kind);
    let ns = model.is_some_and(|k| k.is_namespaced()).then(|| {
        let ns = meta.get("namespace").and_then(Value::as_str);
        ns.unwrap_or("default").to_string()
    });
    let obj = ObjectRef::new(kind, ns.as_deref(), &name);
    if kind == convert::REMOTE_CLUSTER_KIND {
        return remote_cluster(v, &obj, &name);
    }
    if model.is_none() {
        return Converted::skipped(
            SkipReport::new(
                &obj,
                "kind",
                format!("unsupported projectcalico.org/v3 kind {kind:?}"),
            ),
            None,
        );
    }
    let key = match etcd_key(kind, ns.as_deref(), &name) {
        Ok(k) => k,
        Err(e) => return Converted::skipped(SkipReport::new(&obj, "metadata", e), None),
    };
    let spec = match v.get("spec") {
        None => Value::Object(Map::new()),
        Some(s @ Value::Object(_)) => s.clone(),
        Some(_) => {
            return Converted::skipped(
                SkipReport::new(&obj, "spec", "spec must be an object"),
                Some(key),
            );
        }
    };
    let mut out_meta = Map::new();
    for (k, val) in meta {
        if !matches!(
            k.as_str(),
            "resourceVersion" | "selfLink" | "generation" | "managedFields" | "namespace"
        ) {
            out_meta.insert(k, val);
        }
    }
    if let Some(ns) = &ns {
        out_meta.insert("namespace".into(), Value::String(ns.clone()));
    }
    let mut doc = Map::new();
    doc.insert("kind".into(), Value::String(kind.to_string()));
    doc.insert(
        "apiVersion".into(),
        Value::String(calc_graph::model::API_VERSION.into()),
    );
    doc.insert("metadata".into(), Value::Object(out_meta));
    doc.insert("spec".into(), spec);
    let json = Value::Object(doc).to_string();
    let res = match decode(&json) {
        Ok(res) => res,
        Err(e) => return Converted::skipped(e.report(&obj), Some(key)),
    };
    // A StagedKubernetesNetworkPolicy is a Kubernetes NetworkPolicy in waiting: checked as one.
    if let calc_graph::model::Resource::StagedKubernetesNetworkPolicy(p) = &res
        && let Err(e) = crate::staged::check_staged_kubernetes(p)
    {
        return Converted::skipped(SkipReport::new(&obj, "spec", e), Some(key));
    }
    let as_written = needs_as_written(&res).then_some(json);
    checked(res, as_written, Vec::new())
}
