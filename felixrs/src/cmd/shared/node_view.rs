//! The node view the operator commands share: the cluster's objects (manifests, or with
//! `--state-dir` the running agent's applied view, else its snapshot file) converted as the controller would, fed through the calculation
//! graph for one node and rendered with the agent's dataplane flags. `render` prints it, `trace`
//! runs a packet through it, `stats` and `flows` attribute the kernel's rules and logs with it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use calc_graph::model::{Resource, Validated};
use calc_graph::proto::Output;
use iptables::render::Renderer;
use k8s_convert::{ConvertOptions, load_manifests};

use crate::agent::kernel::GraphPipeline;
use crate::agent::snapshot::{Snapshot, SnapshotStore};
use crate::agent::state::Pipeline;
use crate::agent::view::{self, Fetched};
use crate::cmd::shared::dataplane_args::DataplaneArgs;
use crate::dns::trace::LearnedFile;

/// Where the cluster's objects come from: manifests, or the agent's snapshot.
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub struct SourceArgs {
    /// Manifest files or directories (YAML/JSON, multi-document).
    #[arg(long, num_args = 1..)]
    pub manifests: Vec<PathBuf>,
    /// The agent's state directory (its `--state-dir`): ask the agent running on it for the
    /// datastore view it has applied (over `agent.sock` there, root), or, when none answers,
    /// read the snapshot it persisted, which is what it last programmed.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

impl SourceArgs {
    pub fn manifests(paths: Vec<PathBuf>) -> Self {
        SourceArgs {
            manifests: paths,
            state_dir: None,
        }
    }
}

/// The cluster's objects run through the calculation graph for one node and rendered, as the
/// agent would (shared by `render` and `trace`).
pub struct NodeView {
    pub renderer: Renderer,
    /// Every valid local resource the graph was given, by etcd key, decoded once (as the
    /// controller would write it, or as the snapshot holds it).
    pub resources: BTreeMap<String, Resource>,
    /// The snapshot's datastore revision, when read from one.
    pub revision: Option<i64>,
    /// The graph's outputs for the node, in order.
    pub outputs: Vec<Output>,
    /// One line per object that was skipped or rendered fail-closed.
    pub problems: Vec<String>,
    /// One line per rule that failed safe (`failed safe: <resource> spec.ingress[0]: ...`); also
    /// in `problems`.
    pub failed_safe: Vec<String>,
    /// The learned DNS map the domain sets were filled from (`trace`).
    pub learned: Option<Arc<LearnedFile>>,
    /// With `--state-dir`: which view it was (the running agent's, or the snapshot file).
    pub stamp: Option<ViewStamp>,
    /// The calculation graph the view was computed with, kept with it so that a command that
    /// prints and exits (`render`) can leave its teardown to the kernel with the rest.
    pub graph: GraphPipeline,
}

/// Loads the objects and renders them for `node_name` with the agent's dataplane flags.
pub fn render_node(
    source: &SourceArgs,
    node_name: &str,
    dataplane: &DataplaneArgs,
) -> anyhow::Result<NodeView> {
    render_node_learned(source, node_name, dataplane, None)
}

/// [`render_node`] with domain sets filled from a learned DNS map, as the agent's are.
pub fn render_node_learned(
    source: &SourceArgs,
    node_name: &str,
    dataplane: &DataplaneArgs,
    learned: Option<Arc<LearnedFile>>,
) -> anyhow::Result<NodeView> {
    let loaded = load_source(source, dataplane)?;
    render_loaded(loaded, node_name, dataplane, learned, &Overlay::default())
}

/// One object of a loaded source: validated once, or (a snapshot's key the model does not
/// decode: a remote cluster's, an invalid value) its raw value for the pipeline to judge.
#[derive(Debug, Clone)]
pub enum Entry {
    Valid(Box<Validated>),
    Raw(Vec<u8>),
}

/// The cluster's objects as read from a [`SourceArgs`], before they go through the graph: read
/// once, so two views of the same read (`preview`'s before and after) see the same objects.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// By etcd key.
    pub entries: BTreeMap<String, Entry>,
    pub revision: Option<i64>,
    pub stamp: Option<ViewStamp>,
    /// Objects that were skipped while reading.
    pub problems: Vec<String>,
}

/// Changes laid over a [`Loaded`] source before it is rendered (`preview`'s proposed objects):
/// `set` adds or replaces objects by etcd key, `delete` removes them.
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    pub set: BTreeMap<String, Validated>,
    pub delete: std::collections::BTreeSet<String>,
}

/// Reads the objects of `source` (manifests converted as the controller would, or the state
/// directory's view).
pub fn load_source(source: &SourceArgs, dataplane: &DataplaneArgs) -> anyhow::Result<Loaded> {
    let mut loaded = Loaded::default();
    match &source.state_dir {
        Some(dir) => {
            let read = read_state_dir(dir)?;
            loaded.problems.extend(read.note.clone());
            loaded.revision = Some(read.snapshot.revision);
            loaded.stamp = Some(read.stamp);
            for (k, v) in read.snapshot.kvs {
                let (key, value) = (k.to_string(), v.to_vec());
                // A remote cluster's key, a kind the graph does not consume or an invalid value:
                // the pipeline decides (and names the problem).
                let entry = match Validated::from_etcd(&key, &value) {
                    Ok(valid) => Entry::Valid(Box::new(valid)),
                    Err(_) => Entry::Raw(value),
                };
                loaded.entries.insert(key, entry);
            }
        }
        None => {
            let convert = ConvertOptions {
                interface_prefix: dataplane.veth_prefix().to_string(),
            };
            let set = load_manifests(&source.manifests, &convert).context("loading manifests")?;
            (loaded.problems).extend(set.skipped.iter().map(|s| format!("skipped {s}")));
            // The conversion's typed resources go to the graph as they are: each manifest is
            // decoded and validated once, by the conversion. (A RemoteClusterConfiguration is not
            // a graph resource.)
            for (key, r) in set.resources {
                if let Some(valid) = r.into_valid() {
                    loaded.entries.insert(key, Entry::Valid(Box::new(valid)));
                }
            }
        }
    }
    Ok(loaded)
}

/// Renders `loaded` with `overlay` laid over it for `node_name`, as the agent would. `loaded` is
/// consumed: its objects move into the graph and the view (a 20k-pod source was cloned object by
/// object, then freed, which was ~13% of `felixrs render`).
pub fn render_loaded(
    loaded: Loaded,
    node_name: &str,
    dataplane: &DataplaneArgs,
    learned: Option<Arc<LearnedFile>>,
    overlay: &Overlay,
) -> anyhow::Result<NodeView> {
    let Loaded {
        entries,
        revision,
        stamp,
        mut problems,
    } = loaded;
    let mut pipeline = GraphPipeline::new(node_name);
    let mut resources = BTreeMap::new();
    let kept = (entries.into_iter())
        .filter(|(k, _)| !overlay.delete.contains(k) && !overlay.set.contains_key(k));
    let laid = (overlay.set.iter()).map(|(k, v)| (k.clone(), Entry::Valid(Box::new(v.clone()))));
    for (key, entry) in kept.chain(laid) {
        let result = match entry {
            Entry::Valid(valid) => {
                let r = valid.resource().clone();
                let result = pipeline.update_valid(*valid);
                resources.insert(key.clone(), r);
                result
            }
            Entry::Raw(value) => pipeline.update(&key, Some(&value)),
        };
        if let Err(e) = result {
            problems.push(format!("skipped {key}: {e}"));
        }
    }
    pipeline.in_sync();
    let failed_safe: Vec<String> = (pipeline.failed_safe_rules().iter().map(|r| {
        let fields: Vec<String> = (r.unknown_fields.iter())
            .map(|f| format!("unknown field {f}"))
            .chain(
                r.unenforced_fields
                    .iter()
                    .map(|f| format!("unenforced field {f}")),
            )
            .chain(r.rejected_fields.iter().cloned())
            .collect();
        format!(
            "failed safe: {} {}: {} rule {}: {}",
            r.resource,
            r.rule,
            r.action,
            if r.rendered {
                "rendered with only its enforced matches"
            } else {
                "not rendered"
            },
            fields.join(", ")
        )
    }))
    .collect();
    problems.extend(failed_safe.iter().cloned());
    let outputs = pipeline.flush();
    let mut renderer =
        Renderer::new(dataplane.render_config()).map_err(|e| anyhow::anyhow!("renderer: {e}"))?;
    if let Some(l) = &learned {
        renderer.set_domain_members(l.clone());
    }
    let mut errors = renderer.apply_all(outputs.clone());
    errors.extend(renderer.flush());
    problems.extend(errors.iter().map(|e| format!("render: {e}")));
    Ok(NodeView {
        renderer,
        resources,
        revision,
        outputs,
        problems,
        failed_safe,
        learned,
        stamp,
        graph: pipeline,
    })
}

/// Where a state directory's view came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewOrigin {
    /// The running agent's applied view (its `agent.sock`): what the kernel holds now.
    Agent,
    /// The snapshot file (no agent answered): what the agent last persisted.
    SnapshotFile,
}

/// Which view of a state directory a node view was rendered from, to tell when it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewStamp {
    pub origin: ViewOrigin,
    pub revision: i64,
    /// The snapshot file's modification time, when read from it.
    pub modified: Option<std::time::SystemTime>,
}

/// The datastore contents of a state directory.
pub struct StateDirView {
    pub snapshot: Snapshot,
    pub stamp: ViewStamp,
    /// Why the running agent could not be asked, when it could not (the file was read instead).
    pub note: Option<String>,
}

/// The running agent's applied view (asked over `agent.sock`, so it is never older than the
/// `applied_revision` `/status` reports), or the snapshot file when no agent answers.
pub fn read_state_dir(dir: &Path) -> anyhow::Result<StateDirView> {
    let note = match view::fetch(dir, None) {
        Ok(Fetched::View(snapshot)) => {
            let revision = snapshot.revision;
            return Ok(StateDirView {
                snapshot,
                stamp: ViewStamp {
                    origin: ViewOrigin::Agent,
                    revision,
                    modified: None,
                },
                note: None,
            });
        }
        Ok(Fetched::NotRunning | Fetched::Unchanged) => None,
        Ok(Fetched::NothingApplied) => {
            Some("the running agent has applied nothing yet; reading its snapshot file".into())
        }
        Err(e) => Some(format!("{e}; reading the snapshot file")),
    };
    let store = SnapshotStore::new(dir);
    let path = store.path();
    let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    let snapshot = store
        .load()
        .with_context(|| format!("reading {}", path.display()))?
        .with_context(|| {
            format!(
                "no snapshot at {} (the agent writes it once it is in sync)",
                path.display()
            )
        })?;
    Ok(StateDirView {
        stamp: ViewStamp {
            origin: ViewOrigin::SnapshotFile,
            revision: snapshot.revision,
            modified,
        },
        snapshot,
        note,
    })
}

/// Whether the state directory's view differs from `stamp` (a cheap question: the agent answers
/// "unchanged", or the file's modification time and revision are the same).
pub fn state_dir_changed(dir: &Path, stamp: &ViewStamp) -> bool {
    match view::fetch(dir, Some(stamp.revision)) {
        Ok(Fetched::Unchanged) => false,
        Ok(Fetched::View(_)) => true,
        _ => {
            // No agent: the file, if it was not what we read.
            let path = SnapshotStore::new(dir).path();
            let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
            stamp.origin == ViewOrigin::Agent || modified != stamp.modified
        }
    }
}

/// What a header line adds after "the agent's snapshot at datastore revision R" to say where
/// the view came from (nothing for the snapshot file, as before).
pub fn origin_note(stamp: Option<&ViewStamp>) -> &'static str {
    match stamp.map(|s| s.origin) {
        Some(ViewOrigin::Agent) => " (asked the running agent: what it has applied)",
        _ => "",
    }
}
