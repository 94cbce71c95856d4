//! Manifest files → converted Calico resources, for `policy-controller sync --manifests` and the agent's
//! `felixrs render`.
//!
//! Files are multi-document YAML (or JSON). A directory is read recursively, taking `*.yaml`, `*.yml`
//! and `*.json` in name order. Each document is parsed on its own (files are split at `---` lines), so a
//! broken document is reported and every other document is still converted. Accepted kinds: v1
//! `Namespace`, `Node`, `Pod`, `ServiceAccount`, `networking.k8s.io/v1` `NetworkPolicy`, `policy.networking.k8s.io` `AdminNetworkPolicy`,
//! `BaselineAdminNetworkPolicy` (v1alpha1) and `ClusterNetworkPolicy` (v1alpha2), `v1` `List`, and
//! `projectcalico.org/v3` resources, which are stored as written (after validation).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::strict_k8s::StrictNetworkPolicy;
use serde_json::Value;

use crate::convert::{self, CalicoResource, ConvertOptions, Converted, ObjectRef, SkipReport};

/// Errors that stop loading altogether (a path that cannot be read). Bad documents are not errors:
/// they become [`ManifestSkip`]s.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A file or directory could not be read.
    #[error("cannot read manifest path {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A document (or part of one) that was not converted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ManifestSkip {
    pub path: PathBuf,
    /// 0-based index of the document within its file.
    pub document: usize,
    #[serde(flatten)]
    pub report: SkipReport,
}

impl std::fmt::Display for ManifestSkip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} document {}: {}",
            self.path.display(),
            self.document,
            self.report
        )
    }
}

/// Everything loaded from a set of manifest paths.
#[derive(Debug, Clone, Default)]
pub struct ManifestSet {
    /// Converted resources by etcd key (a later document with the same key is reported, not used).
    pub resources: BTreeMap<String, CalicoResource>,
    /// Per-document problems.
    pub skipped: Vec<ManifestSkip>,
    /// Keys of skipped objects: kept in the store if already there (fail closed).
    pub retain: BTreeSet<String>,
    /// The automatic host endpoints of the manifests' Nodes (with their reports), for a controller
    /// asked to create them; not in `resources`, which are stored unconditionally.
    pub auto_host_endpoints: Vec<Converted>,
}

/// Loads and converts every document under `paths`.
pub fn load_manifests(
    paths: &[PathBuf],
    opts: &ConvertOptions,
) -> Result<ManifestSet, ManifestError> {
    let mut files = Vec::new();
    for p in paths {
        collect_files(p, &mut files)?;
    }
    let mut set = ManifestSet::default();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|source| ManifestError::Io {
            path: f.clone(),
            source,
        })?;
        for (i, doc) in split_documents(&text).into_iter().enumerate() {
            load_document(&f, i, doc, opts, &mut set);
        }
    }
    convert::admin::add_admin_tiers(&mut set.resources, |r| r.to_json().into(), |t| t);
    Ok(set)
}

fn collect_files(p: &Path, out: &mut Vec<PathBuf>) -> Result<(), ManifestError> {
    let io = |source| ManifestError::Io {
        path: p.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(p).map_err(io)?;
    if !meta.is_dir() {
        out.push(p.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    entries.sort();
    for e in entries {
        if e.is_dir() {
            collect_files(&e, out)?;
        } else if matches!(
            e.extension().and_then(|x| x.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(e);
        }
    }
    Ok(())
}

/// Splits a YAML stream at `---` separator lines. Every chunk counts as a document, empty or not, so
/// indices match what a reader counts.
fn split_documents(text: &str) -> Vec<&str> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed.starts_with("--- ") {
            if pos > 0 || !text[start..pos].trim().is_empty() {
                docs.push(&text[start..pos]);
            }
            start = pos + line.len();
        }
        pos += line.len();
    }
    docs.push(&text[start..]);
    docs
}

fn load_document(
    path: &Path,
    index: usize,
    doc: &str,
    opts: &ConvertOptions,
    set: &mut ManifestSet,
) {
    let unknown = ObjectRef::new("", None, "");
    let skip = |set: &mut ManifestSet, report: SkipReport| {
        set.skipped.push(ManifestSkip {
            path: path.to_path_buf(),
            document: index,
            report,
        })
    };
    let value: Value = match serde_yaml::from_str::<serde_yaml::Value>(doc) {
        Ok(serde_yaml::Value::Null) => return,
        Ok(v) => match serde_json::to_value(v) {
            Ok(v) => v,
            Err(e) => {
                return skip(
                    set,
                    SkipReport::new(&unknown, "", format!("not representable as JSON: {e}")),
                );
            }
        },
        Err(e) => {
            return skip(
                set,
                SkipReport::new(&unknown, "", format!("invalid YAML: {e}")),
            );
        }
    };
    let items = if value.get("kind").and_then(Value::as_str) == Some("List") {
        value
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    } else {
        vec![value]
    };
    for item in items {
        if let Some(hep) = auto_host_endpoint_value(&item, opts) {
            set.auto_host_endpoints.push(hep);
        }
        let converted = convert_value(&item, opts);
        for r in converted.skips {
            skip(set, r);
        }
        if let Some(k) = converted.retain_key {
            set.retain.insert(k);
        }
        if let Some(res) = converted.resource {
            match res.etcd_key() {
                Ok(key) if set.resources.contains_key(&key) => {
                    let obj = ObjectRef::new(&res.kind, res.namespace.as_deref(), &res.name);
                    skip(
                        set,
                        SkipReport::new(
                            &obj,
                            "metadata.name",
                            format!("duplicate of an earlier document with key {key}"),
                        ),
                    );
                }
                Ok(key) => {
                    set.resources.insert(key, res);
                }
                Err(e) => {
                    let obj = ObjectRef::new(&res.kind, res.namespace.as_deref(), &res.name);
                    skip(set, SkipReport::new(&obj, "metadata", e));
                }
            }
        }
    }
}

/// `v` decoded as `T` and converted by `convert`; an object that does not decode is skipped.
fn decoded<T: serde::de::DeserializeOwned>(
    v: &Value,
    obj: &ObjectRef,
    opts: &ConvertOptions,
    convert: fn(&T, &ConvertOptions) -> Converted,
) -> Converted {
    match serde_json::from_value(v.clone()) {
        Ok(o) => convert(&o, opts),
        Err(e) => Converted::skipped(
            SkipReport::new(obj, "", format!("cannot decode: {e}")),
            None,
        ),
    }
}

/// The automatic host endpoint of a v1 Node object (`None` for any other object, or a Node that
/// does not decode: [`convert_value`] reports that).
pub fn auto_host_endpoint_value(v: &Value, opts: &ConvertOptions) -> Option<Converted> {
    let is_node = v.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && v.get("kind").and_then(Value::as_str) == Some("Node");
    let node: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(v.clone()).ok().filter(|_| is_node)?;
    Some(convert::node_to_auto_host_endpoint(&node, opts))
}

/// Converts one JSON object of any accepted kind.
pub fn convert_value(v: &Value, opts: &ConvertOptions) -> Converted {
    let api = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
    let meta = v.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let ns = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str);
    let obj = ObjectRef::new(kind, ns, name);
    match (api, kind) {
        ("v1", "Namespace") => decoded(v, &obj, opts, convert::namespace_to_profile),
        ("v1", "ServiceAccount") => decoded(v, &obj, opts, convert::service_account_to_profile),
        ("v1", "Pod") => decoded(v, &obj, opts, convert::pod_to_workload_endpoint),
        ("v1", "Node") => decoded(v, &obj, opts, convert::node_to_network_set),
        ("networking.k8s.io/v1", "NetworkPolicy") => {
            match StrictNetworkPolicy::from_value(v.clone()) {
                Ok(o) => o.convert(opts),
                Err(e) => Converted::skipped(
                    SkipReport::new(&obj, "", format!("cannot decode: {e}")),
                    None,
                ),
            }
        }
        ("policy.networking.k8s.io/v1alpha1", "AdminNetworkPolicy") => {
            decoded(v, &obj, opts, convert::admin_network_policy_to_calico)
        }
        ("policy.networking.k8s.io/v1alpha1", "BaselineAdminNetworkPolicy") => decoded(
            v,
            &obj,
            opts,
            convert::baseline_admin_network_policy_to_calico,
        ),
        ("policy.networking.k8s.io/v1alpha2", "ClusterNetworkPolicy") => {
            decoded(v, &obj, opts, convert::cluster_network_policy_to_calico)
        }
        (calc_graph::model::API_VERSION, _) => crate::v3_passthrough::convert_v3(v),
        _ => Converted::skipped(
            SkipReport::new(
                &obj,
                "kind",
                format!("unsupported apiVersion/kind {api}/{kind}"),
            ),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_document_indices() {
        let docs = split_documents("a: 1\n---\nb: 2\n--- \n---\nc: 3\n");
        assert_eq!(docs.len(), 4);
        assert_eq!(docs[0].trim(), "a: 1");
        assert_eq!(docs[2].trim(), "");
        assert_eq!(docs[3].trim(), "c: 3");
        let docs = split_documents("---\na: 1\n");
        assert_eq!(docs.len(), 1);
    }
}
