//! The proposed objects of `felixrs preview --manifests`: converted as the controller would
//! (Kubernetes NetworkPolicy, the admin kinds, Calico v3 kinds), with the staged kinds promoted to
//! the kind they stage (previewed as if enforced: `stagedAction: Set` sets the policy, `Delete`
//! removes it, `Learn`/`Ignore` preview nothing), as an [`Overlay`] on the node's objects: an
//! object with the key of an existing one replaces it.

use std::path::PathBuf;

use anyhow::Context;
use calc_graph::model::{
    GlobalNetworkPolicy, NetworkPolicy, Resource, StagedAction, StagedPolicySpec, Validated,
};
use k8s_convert::{ConvertOptions, load_manifests, manifests::convert_value};
use serde_json::{Value, json};

use crate::cmd::shared::node_view::{Entry, Loaded, Overlay};

/// The proposal, laid over the node's objects.
pub struct Proposal {
    pub overlay: Overlay,
    /// One line per proposed object: what it is, and whether it is new or replaces/removes one.
    pub summary: Vec<String>,
    /// Documents that were skipped (also on stderr).
    pub problems: Vec<String>,
}

/// What a staged object stands for.
enum Promoted {
    Set(Box<Validated>),
    Delete(String),
    Nothing(&'static str),
}

/// Loads the proposed manifests; `base` tells a new object from one it replaces.
pub fn load(paths: &[PathBuf], opts: &ConvertOptions, base: &Loaded) -> anyhow::Result<Proposal> {
    let set = load_manifests(paths, opts).context("loading the proposed --manifests")?;
    let mut out = Proposal {
        overlay: Overlay::default(),
        summary: Vec::new(),
        problems: set.skipped.iter().map(|s| format!("skipped {s}")).collect(),
    };
    for (key, r) in set.resources {
        let Some(valid) = r.into_valid() else {
            continue;
        };
        let name = describe(valid.resource());
        let promoted = match valid.resource() {
            Resource::StagedNetworkPolicy(p) => staged_calico(&p.spec, |spec| {
                Resource::NetworkPolicy(NetworkPolicy {
                    metadata: p.metadata.clone(),
                    spec,
                })
            }),
            Resource::StagedGlobalNetworkPolicy(p) => staged_calico(&p.spec, |spec| {
                Resource::GlobalNetworkPolicy(GlobalNetworkPolicy {
                    metadata: p.metadata.clone(),
                    spec,
                })
            }),
            Resource::StagedKubernetesNetworkPolicy(p) => {
                let meta = json!({"name": p.metadata.name, "namespace": p.metadata.namespace});
                staged_kubernetes(p.spec.staged_action, meta, &p.spec.rest, opts)?
            }
            _ => Promoted::Set(Box::new(valid)),
        };
        match promoted {
            Promoted::Set(v) => {
                let k = v.key().etcd_key();
                let how = if matches!(base.entries.get(&k), Some(Entry::Valid(_))) {
                    "replaces the node's"
                } else {
                    "new"
                };
                let what = describe(v.resource());
                let staged = if k == key {
                    String::new()
                } else {
                    format!(" (staged {name}, previewed as enforced)")
                };
                out.summary.push(format!("{what}: {how}{staged}"));
                out.overlay.set.insert(k, *v);
            }
            Promoted::Delete(k) => {
                let how = if base.entries.contains_key(&k) {
                    "removes"
                } else {
                    "would remove, but the node has no"
                };
                out.summary
                    .push(format!("staged {name} (stagedAction Delete): {how} {k}"));
                out.overlay.delete.insert(k);
            }
            Promoted::Nothing(why) => out.summary.push(format!("staged {name}: {why}")),
        }
    }
    if out.summary.is_empty() {
        anyhow::bail!("--manifests holds no object felixrs enforces");
    }
    Ok(out)
}

/// `Kind ns/name`.
fn describe(r: &Resource) -> String {
    let m = r.metadata();
    match &m.namespace {
        Some(ns) => format!("{} {ns}/{}", r.kind(), m.name),
        None => format!("{} {}", r.kind(), m.name),
    }
}

fn staged_calico(
    spec: &StagedPolicySpec,
    build: impl Fn(calc_graph::model::PolicySpec) -> Resource,
) -> Promoted {
    match spec.staged_action.unwrap_or(StagedAction::Set) {
        StagedAction::Set => match Validated::of(build(spec.policy.clone())) {
            Ok(v) => Promoted::Set(Box::new(v)),
            Err(_) => {
                Promoted::Nothing("its spec is not a valid enforced policy: previews nothing")
            }
        },
        StagedAction::Delete => Promoted::Delete(build(spec.policy.clone()).key().etcd_key()),
        StagedAction::Learn | StagedAction::Ignore => {
            Promoted::Nothing("stagedAction Learn/Ignore changes no verdict: previews nothing")
        }
    }
}

/// A staged Kubernetes NetworkPolicy: the NetworkPolicy it stages, converted as the controller
/// converts one (`knp.default.<name>`).
fn staged_kubernetes(
    action: Option<StagedAction>,
    metadata: Value,
    rest: &serde_json::Map<String, Value>,
    opts: &ConvertOptions,
) -> anyhow::Result<Promoted> {
    let action = action.unwrap_or(StagedAction::Set);
    let spec = match action {
        StagedAction::Set => Value::Object(rest.clone()),
        StagedAction::Delete => json!({"podSelector": {}}),
        StagedAction::Learn | StagedAction::Ignore => {
            return Ok(Promoted::Nothing(
                "stagedAction Learn/Ignore changes no verdict: previews nothing",
            ));
        }
    };
    let np = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                    "metadata": metadata, "spec": spec});
    let converted = convert_value(&np, opts);
    let valid = (converted.resource.and_then(|r| r.into_valid())).with_context(|| {
        let why: Vec<String> = converted.skips.iter().map(ToString::to_string).collect();
        format!(
            "the staged Kubernetes NetworkPolicy does not convert: {}",
            why.join("; ")
        )
    })?;
    Ok(match action {
        StagedAction::Delete => Promoted::Delete(valid.key().etcd_key()),
        _ => Promoted::Set(Box::new(valid)),
    })
}
