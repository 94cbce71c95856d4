//! `felixrs render`: manifests -> the payloads the agent would apply to an empty kernel.
//!
//! No etcd and no root: the manifests are converted as the controller would (or the agent's
//! persisted snapshot of the datastore is read, with `--state-dir`), fed through the
//! calculation graph for one node and rendered; the ipset restore script and the iptables-restore
//! transactions (per family and table) are printed. Objects that cannot be converted, decoded or
//! rendered are reported on stderr (object and field) and the rest is still rendered.

use std::fmt::Write as _;

use anyhow::Context;
use calc_graph::proto::IpVersion;
use iptables::desired::Preview;

use crate::cmd::shared::dataplane_args::DataplaneArgs;
use crate::cmd::shared::node_view::{SourceArgs, origin_note, render_node};
use crate::cmd::shared::{Answer, finish};

/// `felixrs render`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The node to render for.
    #[arg(long)]
    pub node_name: String,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
}

impl Args {
    pub fn run(self) -> std::process::ExitCode {
        finish("render", self.render())
    }

    fn render(self) -> anyhow::Result<Answer> {
        let mut node = render_node(&self.source, &self.node_name, &self.dataplane)?;
        let mut out = Answer {
            problems: std::mem::take(&mut node.problems),
            ..Answer::default()
        };
        let renderer = &node.renderer;
        if let Some(rev) = node.revision {
            let _ = writeln!(
                out.text,
                "# from the agent's snapshot at datastore revision {rev}{}",
                origin_note(node.stamp.as_ref())
            );
        }
        for v in [IpVersion::V4, IpVersion::V6] {
            let preview = Preview::plan(renderer.desired_ref(v))
                .with_context(|| format!("planning IPv{}", v.number()))?;
            // Unlike an apply's preview, the ipset section is listed even when empty.
            out.text.push_str(&preview.ip_sets_header());
            out.text.push_str(&preview.ip_sets);
            out.text.push_str(&preview.tables_text());
        }
        // The process ends once the answer is printed: freeing the graph's and the renderer's
        // objects one by one (tens of thousands of endpoints and rules) is left to the kernel.
        std::mem::forget(node);
        Ok(out)
    }
}
