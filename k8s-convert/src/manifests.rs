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
    let mut texts = Vec::with_capacity(files.len());
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|source| ManifestError::Io {
            path: f.clone(),
            source,
        })?;
        texts.push(text);
    }
    // Every document of every file, in order: (file, index in the file, text).
    let docs: Vec<(usize, usize, &str)> = (texts.iter().enumerate())
        .flat_map(|(f, text)| {
            (split_documents(text).into_iter().enumerate()).map(move |(i, doc)| (f, i, doc))
        })
        .collect();
    let prepared = prepare_all(&docs, opts);
    let mut set = ManifestSet::default();
    for ((f, i, _), doc) in docs.iter().zip(prepared) {
        merge_document(&files[*f], *i, doc, &mut set);
    }
    convert::admin::add_admin_tiers(&mut set.resources, |r| r.to_json().into(), |t| t);
    Ok(set)
}

/// Below this many bytes of documents, loading stays on the calling thread.
const PARALLEL_MIN_BYTES: usize = 256 * 1024;
/// At most this many threads decode documents.
const PARALLEL_MAX_THREADS: usize = 8;

/// [`prepare_document`] of every document, in order. A large input is cut into contiguous runs of
/// documents of about equal size, one per core, each decoded and converted on a scoped thread:
/// a document's decode and conversion depend on no other document, and everything that does (the
/// duplicate check, the order of skips) happens in [`merge_document`], in document order, so the
/// result is the same as the sequential one. A thread that cannot be started leaves its run to
/// the calling thread.
fn prepare_all(docs: &[(usize, usize, &str)], opts: &ConvertOptions) -> Vec<PreparedDoc> {
    let bytes: usize = docs.iter().map(|(_, _, d)| d.len()).sum();
    let threads = if bytes < PARALLEL_MIN_BYTES {
        1
    } else {
        (std::thread::available_parallelism().map_or(1, usize::from)).min(PARALLEL_MAX_THREADS)
    };
    prepare_on(docs, opts, threads)
}

/// [`prepare_all`] on `threads` threads.
fn prepare_on(
    docs: &[(usize, usize, &str)],
    opts: &ConvertOptions,
    threads: usize,
) -> Vec<PreparedDoc> {
    let prepare_run = |run: &[(usize, usize, &str)]| -> Vec<PreparedDoc> {
        run.iter()
            .map(|(_, _, d)| prepare_document(d, opts))
            .collect()
    };
    if threads < 2 || docs.len() < 2 {
        return prepare_run(docs);
    }
    let runs = runs_of_equal_size(docs, threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (runs.iter().skip(1))
            .map(|run| {
                std::thread::Builder::new()
                    .name("manifests".into())
                    .spawn_scoped(s, || prepare_run(run))
                    .map_err(|_| run)
            })
            .collect();
        let mut out = prepare_run(runs[0]);
        for h in handles {
            match h {
                Ok(h) => out.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))),
                Err(run) => out.extend(prepare_run(run)),
            }
        }
        out
    })
}

/// `docs` cut into at most `n` contiguous, non-empty runs of about equal byte size.
fn runs_of_equal_size<'d, 't>(
    docs: &'d [(usize, usize, &'t str)],
    n: usize,
) -> Vec<&'d [(usize, usize, &'t str)]> {
    let total: usize = docs.iter().map(|(_, _, d)| d.len()).sum();
    let per_run = total.div_ceil(n.max(1)).max(1);
    let mut runs = Vec::with_capacity(n);
    let (mut start, mut acc) = (0, 0);
    for (i, (_, _, d)) in docs.iter().enumerate() {
        acc += d.len();
        if acc >= per_run && runs.len() + 1 < n {
            runs.push(&docs[start..=i]);
            (start, acc) = (i + 1, 0);
        }
    }
    if start < docs.len() {
        runs.push(&docs[start..]);
    }
    runs
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

/// One document as a JSON value. A document that is JSON (what `kubectl get -o json` and generators
/// write) is read by the JSON parser, several times faster than the YAML one; any other document is
/// read by the YAML parser straight into the JSON value. Whatever either fast path refuses (a
/// duplicate key, a tag, a key that is not a string, an error) goes to the YAML parser's
/// `serde_yaml::Value` tree and its conversion as before, so what is accepted, the value it
/// becomes and the error a bad document gets do not depend on the fast paths. An empty document is
/// `Null`.
fn decode_document(doc: &str) -> Result<Value, SkipReport> {
    let unknown = ObjectRef::new("", None, "");
    let trimmed = doc.trim_start();
    if trimmed.starts_with('{') {
        let mut de = serde_json::Deserializer::from_str(trimmed);
        if let Ok(v) = serde::de::DeserializeSeed::deserialize(StrictJson, &mut de)
            && de.end().is_ok()
        {
            return Ok(v);
        }
    } else if let Ok(v) =
        serde::de::DeserializeSeed::deserialize(StrictJson, serde_yaml::Deserializer::from_str(doc))
    {
        return Ok(v);
    }
    match serde_yaml::from_str::<serde_yaml::Value>(doc) {
        Ok(serde_yaml::Value::Null) => Ok(Value::Null),
        Ok(v) => serde_json::to_value(v)
            .map_err(|e| SkipReport::new(&unknown, "", format!("not representable as JSON: {e}"))),
        Err(e) => Err(SkipReport::new(&unknown, "", format!("invalid YAML: {e}"))),
    }
}

/// A JSON value with every object's keys unique, as the YAML reader demands (serde_json's own
/// `Value` keeps the last of duplicate keys silently). From YAML it takes only what the
/// `serde_yaml::Value` path turns into the same JSON value: plain data with string keys; a tagged
/// value (`visit_enum`) or a key that is a number, bool, null or collection is an error, which
/// sends the document to that path.
struct StrictJson;

/// A map key that is a string scalar (not one that only converts to a string).
struct StrKey;

impl<'de> serde::de::DeserializeSeed<'de> for StrKey {
    type Value = String;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl serde::de::Visitor<'_> for StrKey {
    type Value = String;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_string<E>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for StrictJson {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for StrictJson {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictJson)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(k) = map.next_key_seed(StrKey)? {
            match out.entry(k) {
                serde_json::map::Entry::Occupied(e) => {
                    return Err(serde::de::Error::custom(format!(
                        "duplicate key {}",
                        e.key()
                    )));
                }
                serde_json::map::Entry::Vacant(e) => {
                    e.insert(map.next_value_seed(StrictJson)?);
                }
            }
        }
        Ok(Value::Object(out))
    }
}

/// One document decoded and its objects converted: for each object (a `List` gives its items), the
/// automatic host endpoint of a Node and the conversion; or why the document was not read.
type PreparedDoc = Result<Vec<(Option<Converted>, Converted)>, SkipReport>;

/// The part of loading a document that depends on no other document.
fn prepare_document(doc: &str, opts: &ConvertOptions) -> PreparedDoc {
    let mut value = match decode_document(doc)? {
        Value::Null => return Ok(Vec::new()),
        v => v,
    };
    let items = if value.get("kind").and_then(Value::as_str) == Some("List") {
        match value.get_mut("items").map(Value::take) {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        }
    } else {
        vec![value]
    };
    Ok(items
        .iter()
        .map(|item| {
            (
                auto_host_endpoint_value(item, opts),
                convert_value(item, opts),
            )
        })
        .collect())
}

/// Adds one prepared document to `set`, in document order: its skips, and its resources unless an
/// earlier document has the same key.
fn merge_document(path: &Path, index: usize, doc: PreparedDoc, set: &mut ManifestSet) {
    let skip = |set: &mut ManifestSet, report: SkipReport| {
        set.skipped.push(ManifestSkip {
            path: path.to_path_buf(),
            document: index,
            report,
        })
    };
    let items = match doc {
        Ok(items) => items,
        Err(report) => return skip(set, report),
    };
    for (hep, converted) in items {
        if let Some(hep) = hep {
            set.auto_host_endpoints.push(hep);
        }
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
    // Straight from the borrowed value: no copy of the document before decoding it.
    match T::deserialize(v) {
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
    if !is_node {
        // Every object passes here: only a Node is decoded (and from the borrowed value).
        return None;
    }
    let node = <k8s_openapi::api::core::v1::Node as serde::Deserialize>::deserialize(v).ok()?;
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
        ("networking.k8s.io/v1", "NetworkPolicy") => match StrictNetworkPolicy::from_value_ref(v) {
            Ok(o) => o.convert(opts),
            Err(e) => Converted::skipped(
                SkipReport::new(&obj, "", format!("cannot decode: {e}")),
                None,
            ),
        },
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

    /// Only a v1 `Node` has an automatic host endpoint; any other object passes by undecoded.
    #[test]
    fn auto_host_endpoint_only_for_v1_nodes() {
        let opts = ConvertOptions {
            interface_prefix: "cali".into(),
        };
        let node = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "node-1", "labels": {"zone": "a"}},
        });
        let hep = auto_host_endpoint_value(&node, &opts).expect("a node's host endpoint");
        let key = hep.resource.expect("converted").etcd_key().expect("key");
        assert!(key.contains("node-1"), "{key}");
        let mut pod = node.clone();
        pod["kind"] = "Pod".into();
        assert!(auto_host_endpoint_value(&pod, &opts).is_none());
        let mut other = node.clone();
        other["apiVersion"] = "v2".into();
        assert!(auto_host_endpoint_value(&other, &opts).is_none());
        // A Node that does not decode is reported by `convert_value`, not here.
        let mut bad = node;
        bad["metadata"]["labels"] = "not a map".into();
        assert!(auto_host_endpoint_value(&bad, &opts).is_none());
    }

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

    /// The JSON fast path decodes what the YAML reader decodes, and refuses what it refuses with
    /// the YAML reader's error.
    #[test]
    fn json_documents_decode_as_yaml_does() {
        let yaml = |d: &str| {
            serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(d).unwrap()).unwrap()
        };
        for doc in [
            r#"{"a": 1, "b": [true, null, -2, 1.5, "x\u00e9\n"], "c": {"d": {}}}"#,
            "  {\"kind\": \"Pod\", \"n\": 18446744073709551615}\n\n",
        ] {
            assert_eq!(decode_document(doc).unwrap(), yaml(doc), "{doc}");
        }
        // YAML that starts like JSON but is not JSON: the YAML reader decodes it.
        let doc = "{a: 1, b: [x, y]}";
        assert_eq!(decode_document(doc).unwrap(), yaml(doc));
        // A duplicate key is refused, by the YAML reader, with its message.
        let doc = r#"{"a": 1, "a": 2}"#;
        let e = decode_document(doc).unwrap_err().to_string();
        assert!(e.contains("invalid YAML") && e.contains("duplicate"), "{e}");
        // A document holding JSON followed by more text is not taken as its first value.
        let doc = "{\"a\": 1}\nb: 2";
        assert!(decode_document(doc).is_err());
        assert_eq!(decode_document("\n# nothing\n").unwrap(), Value::Null);
    }

    /// YAML read straight into the JSON value gives what the `serde_yaml::Value` tree and its
    /// conversion give; what only that path takes (tags, non-string keys) still goes there, and
    /// what it refuses is refused with its error.
    #[test]
    fn yaml_documents_decode_as_the_value_tree_does() {
        let tree = |d: &str| match serde_yaml::from_str::<serde_yaml::Value>(d) {
            Ok(v) => serde_json::to_value(v).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        for doc in [
            "kind: Pod\nmetadata:\n  name: a\n  labels: {app: x, 'n': \"1\"}\nspec:\n  ports: [80, -1, 1.5, .inf, 0x10, 18446744073709551615]\n",
            "a: ~\nb: null\nc: true\nd: yes\ne: [!!str 12, !!int \"7\"]\nf: |\n  two\n  lines\n",
            "base: &b {x: 1}\nuse: *b\nmerged:\n  <<: *b\n  y: 2\n",
            "1: a\ntrue: b\n0x10: c\n",
            "tagged: !Custom {a: 1}\n",
            "- a\n- {b: [c]}\n",
            "plain scalar\n",
            "",
        ] {
            let want = tree(doc).expect(doc);
            let got = decode_document(doc).unwrap_or_else(|e| panic!("{doc}: {e}"));
            assert_eq!(got, want, "{doc}");
        }
        // Which documents the direct read takes (the rest go to the tree).
        let direct = |d: &str| {
            serde::de::DeserializeSeed::deserialize(
                StrictJson,
                serde_yaml::Deserializer::from_str(d),
            )
            .is_ok()
        };
        assert!(direct(
            "kind: Pod\nmetadata: {name: a}\nspec:\n  ports: [80, 1.5]\n"
        ));
        assert!(direct("base: &b {x: 1}\nmerged:\n  <<: *b\n"));
        for doc in [
            "1: a\n",
            "true: b\n",
            "tagged: !Custom {a: 1}\n",
            "a: 1\na: 2\n",
        ] {
            assert!(!direct(doc), "{doc}");
        }
        // Refused as before, with the YAML reader's message.
        for (doc, part) in [
            ("a: 1\na: 2\n", "duplicate entry"),
            ("a: [1\n", "invalid YAML"),
            ("? [a]\n: b\n", "not representable as JSON"),
            ("a: *nope\n", "unknown anchor"),
        ] {
            let e = decode_document(doc).unwrap_err().to_string();
            assert!(e.contains(part), "{doc}: {e}");
            if let Err(want) = tree(doc) {
                assert!(e.contains(&want), "{doc}: {e} vs {want}");
            }
        }
    }

    /// Documents of every kind a manifest holds: converted, skipped, duplicated, listed, empty,
    /// broken, a Node with its host endpoint.
    fn palette(i: usize) -> String {
        let pod = |name: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: ns\n  labels: {{app: a}}\nspec:\n  nodeName: n1\n  containers: [{{name: c, image: x}}]\nstatus:\n  podIP: 10.0.{}.{}\n",
                i / 250,
                i % 250
            )
        };
        match i % 9 {
            0 => pod(&format!("p{i}")),
            1 => pod("same"),
            2 => format!(
                "{{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{{\"name\":\"ns{i}\"}}}}"
            ),
            3 => format!(
                "apiVersion: v1\nkind: List\nitems:\n- {{apiVersion: v1, kind: ServiceAccount, metadata: {{name: sa{i}, namespace: ns}}}}\n- {{apiVersion: v1, kind: Pod, metadata: {{name: bad{i}}}, spec: 7}}\n"
            ),
            4 => String::new(),
            5 => "a: [unclosed\n".to_string(),
            6 => format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: node{i}\n  labels: {{zone: z}}\n"
            ),
            7 => format!(
                "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: np{i}, namespace: ns}}\nspec:\n  podSelector: {{}}\n  ingress: [{{from: [{{podSelector: {{matchLabels: {{app: a}}}}}}]}}]\n"
            ),
            _ => "apiVersion: v1\nkind: Mystery\nmetadata: {name: m}\n".to_string(),
        }
    }

    /// Decoding on several threads gives the set the calling thread alone gives: the same
    /// resources, skips (with their documents) and host endpoints, in the same order.
    #[test]
    fn parallel_load_is_the_sequential_load() {
        let opts = ConvertOptions::default();
        let load = |docs: &[(usize, usize, &str)], threads: usize| {
            let files = [PathBuf::from("a.yaml"), PathBuf::from("b.yaml")];
            let mut set = ManifestSet::default();
            for ((f, i, _), doc) in docs.iter().zip(prepare_on(docs, &opts, threads)) {
                merge_document(&files[*f], *i, doc, &mut set);
            }
            format!("{set:?}")
        };
        let texts: Vec<String> = (0..60).map(palette).collect();
        for len in [0, 1, 2, 7, 31, 60] {
            let docs: Vec<(usize, usize, &str)> = (texts[..len].iter().enumerate())
                .map(|(i, t)| (usize::from(i >= len / 2), i, t.as_str()))
                .collect();
            let sequential = load(&docs, 1);
            for threads in [2, 3, 8] {
                assert_eq!(
                    load(&docs, threads),
                    sequential,
                    "{len} documents, {threads} threads"
                );
            }
        }
        let all: Vec<(usize, usize, &str)> = (texts.iter().enumerate())
            .map(|(i, t)| (0, i, t.as_str()))
            .collect();
        let s = load(&all, 1);
        for want in [
            "duplicate of an earlier document",
            "invalid YAML",
            "p9",
            "node6",
            "sa3",
            "np7",
        ] {
            assert!(s.contains(want), "{want} in {s}");
        }
    }

    #[test]
    fn runs_cover_the_documents_in_order() {
        let texts: Vec<String> = (0..40).map(|i| "x".repeat(1 + (i * 37) % 50)).collect();
        let docs: Vec<(usize, usize, &str)> = (texts.iter().enumerate())
            .map(|(i, t)| (0, i, t.as_str()))
            .collect();
        for len in 1..docs.len() {
            for n in 1..6 {
                let runs = runs_of_equal_size(&docs[..len], n);
                assert!(!runs.is_empty() && runs.len() <= n, "{len} docs, {n} runs");
                assert!(runs.iter().all(|r| !r.is_empty()));
                let joined: Vec<_> = runs.concat();
                assert_eq!(joined, docs[..len].to_vec());
            }
        }
    }
}
