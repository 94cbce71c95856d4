//! `felixrs render`: manifests -> the payloads the agent would apply to an empty kernel.
//!
//! No etcd and no root: the manifests are converted as the controller would, fed through the
//! calculation graph for one node and rendered; the ipset restore script and the iptables-restore
//! transactions (per family and table) are printed. Objects that cannot be converted, decoded or
//! rendered are reported on stderr (object and field) and the rest is still rendered.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use calc_graph::proto::{IpVersion, Output};
use iptables::apply::TableName;
use iptables::apply::diff::{plan_table, render as render_ops};
use iptables::apply::ipset::plan_updates;
use iptables::apply::kernel::ActualTable;
use iptables::render::Renderer;
use policy_controller::{ConvertOptions, load_manifests};

use crate::agent::kernel::GraphPipeline;
use crate::agent::state::Pipeline;
use crate::dataplane_args::DataplaneArgs;

/// `felixrs render`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Manifest files or directories (YAML/JSON, multi-document).
    #[arg(long, required = true, num_args = 1..)]
    pub manifests: Vec<PathBuf>,
    /// The node to render for.
    #[arg(long)]
    pub node_name: String,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
}

/// Manifests converted, run through the calculation graph for one node and rendered, as the
/// agent would (shared by `render` and `trace`).
pub struct NodeView {
    pub renderer: Renderer,
    /// Every resource the manifests converted to, by etcd key.
    pub resources: BTreeMap<String, policy_controller::CalicoResource>,
    /// The graph's outputs for the node, in order.
    pub outputs: Vec<Output>,
    /// One line per object that was skipped or rendered fail-closed.
    pub problems: Vec<String>,
}

/// Loads `manifests` and renders them for `node_name` with the agent's dataplane flags.
pub fn render_node(
    manifests: &[PathBuf],
    node_name: &str,
    dataplane: &DataplaneArgs,
) -> anyhow::Result<NodeView> {
    let convert = ConvertOptions {
        interface_prefix: dataplane.veth_prefix().to_string(),
    };
    let set = load_manifests(manifests, &convert).context("loading manifests")?;
    let mut problems: Vec<String> = set.skipped.iter().map(|s| format!("skipped {s}")).collect();
    let mut pipeline = GraphPipeline::new(node_name);
    for (key, res) in &set.resources {
        if let Err(e) = pipeline.update(key, Some(res.json.as_bytes())) {
            problems.push(format!("skipped {key}: {e}"));
        }
    }
    pipeline.in_sync();
    let outputs = pipeline.flush();
    let mut renderer =
        Renderer::new(dataplane.render_config()).map_err(|e| anyhow::anyhow!("renderer: {e}"))?;
    let mut errors = renderer.apply_all(outputs.clone());
    errors.extend(renderer.flush());
    problems.extend(errors.iter().map(|e| format!("render: {e}")));
    Ok(NodeView {
        renderer,
        resources: set.resources,
        outputs,
        problems,
    })
}

/// What `render` found, besides the text.
#[derive(Debug, Default)]
pub struct Rendered {
    pub text: String,
    /// One line per object that was skipped or rendered fail-closed.
    pub problems: Vec<String>,
}

impl Args {
    pub fn run(self) -> std::process::ExitCode {
        match self.render() {
            Ok(r) => {
                for p in &r.problems {
                    eprintln!("felixrs render: {p}");
                }
                print!("{}", r.text);
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("felixrs render: {e:#}");
                std::process::ExitCode::FAILURE
            }
        }
    }

    pub fn render(self) -> anyhow::Result<Rendered> {
        let Args {
            manifests,
            node_name,
            dataplane,
        } = self;
        let node = render_node(&manifests, &node_name, &dataplane)?;
        let renderer = node.renderer;
        let mut out = Rendered {
            problems: node.problems,
            ..Rendered::default()
        };
        for v in [IpVersion::V4, IpVersion::V6] {
            let desired = renderer.desired(v);
            let n = v.number();
            let plan = plan_updates(v, &desired.ip_sets, &BTreeMap::new())
                .with_context(|| format!("planning IPv{n} ip sets"))?;
            let _ = writeln!(out.text, "# ipset restore (IPv{n})");
            out.text.push_str(&plan.payload);
            for table in TableName::ALL {
                let ops = plan_table(table, desired.tables.get(&table), &ActualTable::default())
                    .with_context(|| format!("planning IPv{n} {table} table"))?;
                let payload = render_ops(table, &ops);
                if payload.is_empty() {
                    continue;
                }
                let _ = writeln!(out.text, "# iptables-restore --noflush (IPv{n}, {table})");
                out.text.push_str(&payload);
            }
        }
        Ok(out)
    }
}
