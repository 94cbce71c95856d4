//! `felixrs preview`: what a proposed policy change would do on a node, before it is applied.
//!
//! The node's objects come from where `trace` reads them ([`node_view`]: `--base-manifests`, or
//! `--state-dir`: the running agent's applied view, else its snapshot), read once; the proposed
//! objects (`--manifests`, [`proposal`]) are laid over them, and both views are rendered as the
//! agent would and evaluated with `trace`'s evaluator ([`trace::trace_packet_with`], the same
//! packet as `felixrs trace` builds for the same addresses, protocol and ports).
//!
//! * [`replay`]: recorded flows ([`crate::flowlog::FlowRecord`] JSON lines) re-evaluated before
//!   and after; the flows whose verdict would change, grouped by what decides them.
//! * [`matrix`]: without flows, the reachability matrix of the node's pods against every pod and
//!   network set of the view, per protocol/port the policies name, before and after.
//!
//! Exit status 0: nothing changes; 1: changes found (like `diff`); 2: an error.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;
use k8s_convert::ConvertOptions;
use serde::Serialize;

mod matrix;
mod proposal;
mod replay;

use crate::cmd::shared::dataplane_args::DataplaneArgs;
use crate::cmd::shared::node_view::{
    self, NodeView, SourceArgs, load_source, origin_note, render_loaded,
};
use crate::cmd::shared::pods::Pods;
use crate::cmd::shared::{Answer, finish_with};
use crate::cmd::trace::{self, Decision, Explainer, PacketArgs, Verdict};
use crate::dns::persist::FILE_NAME;
use crate::dns::trace::LearnedFile;

/// The flow log's file name in the agent's state directory (the default of `--flow-logs-file`).
pub const FLOWS_FILE: &str = "flows.jsonl";

/// `felixrs preview`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Exit status: 0 when nothing would change, 1 when something would \
    (like diff), 2 on an error."
)]
pub struct Args {
    /// The proposed objects: manifest files or directories (YAML/JSON; Kubernetes NetworkPolicy,
    /// the admin-policy kinds, Calico v3 kinds). An object with the name of one the node has
    /// replaces it; a staged kind is previewed as if enforced.
    #[arg(long, num_args = 1.., required = true)]
    pub manifests: Vec<PathBuf>,
    /// The node's current objects from manifest files or directories (instead of --state-dir).
    #[arg(long, num_args = 1.., required_unless_present = "state_dir", conflicts_with = "state_dir")]
    pub base_manifests: Vec<PathBuf>,
    /// The agent's state directory: the node's current objects as `trace --state-dir` reads them
    /// (the running agent's applied view over `agent.sock`, else its snapshot), and, without
    /// --flows, the recorded flows in its `flows.jsonl`.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Recorded flows to replay: JSON lines of flow records (the agent's flow log format).
    /// Without it (and without a flows.jsonl in --state-dir), the static reachability matrix.
    #[arg(long)]
    pub flows: Option<PathBuf>,
    /// The static reachability matrix even when --state-dir holds a flow log.
    #[arg(long = "static", conflicts_with = "flows")]
    pub static_matrix: bool,
    /// The node to preview.
    #[arg(long, env = "FELIXRS_NODE_NAME")]
    pub node_name: String,
    /// One JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print every changed flow, cell and matrix row (the text output is bounded otherwise).
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
}

/// How a node ends a packet, in the words `preview` prints.
pub(crate) fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Accept => "allow",
        Verdict::Drop => "deny",
        Verdict::NotOurs => "not-ours",
    }
}

/// The node's view before and after, and how to evaluate a packet in both.
pub(crate) struct Views {
    pub node: String,
    pub before: View,
    pub after: View,
}

/// One rendered view with what `trace` needs for many packets.
pub(crate) struct View {
    pub view: NodeView,
    pub pods: Pods,
    pub explainer: Explainer,
}

/// A packet's verdict in one view and what decided it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Outcome {
    pub verdict: &'static str,
    pub decided_by: Vec<String>,
}

impl View {
    fn new(view: NodeView) -> View {
        View {
            pods: Pods::of(&view),
            explainer: Explainer::new(&view),
            view,
        }
    }

    /// `felixrs trace`'s evaluation of `packet` in this view.
    pub fn evaluate(&self, node: &str, packet: &PacketArgs) -> anyhow::Result<Outcome> {
        let traced = trace::trace_packet_with(&self.view, &self.pods, node, packet)?;
        let decisions = self.explainer.decisions(&self.view, &traced);
        Ok(Outcome {
            verdict: verdict_word(traced.verdict),
            decided_by: summarize(&decisions),
        })
    }
}

/// The decisions worth naming: every pass, allow and drop by a policy, profile or tier end (not
/// FORWARD's accept of what policy accepted).
fn summarize(decisions: &[Decision]) -> Vec<String> {
    let named: Vec<String> = (decisions.iter())
        .filter(|d| d.verb != "accepted")
        .map(ToString::to_string)
        .collect();
    if named.is_empty() {
        decisions.iter().map(ToString::to_string).collect()
    } else {
        named
    }
}

/// A packet as `felixrs trace --from SRC --to DST --protocol P --port D --source-port S` builds it.
pub(crate) fn packet(src: &str, dst: &str, proto: u8, sport: u16, dport: u16) -> PacketArgs {
    PacketArgs {
        from: src.to_string(),
        to: dst.to_string(),
        protocol: proto.to_string(),
        port: dport,
        source_port: sport,
        icmp_type: None,
        icmp_code: 0,
        ipv6: false,
    }
}

/// The whole preview.
#[derive(Debug, Serialize)]
struct Report {
    node: String,
    /// `replay` or `static`.
    mode: &'static str,
    /// Where the node's objects came from.
    source: String,
    proposed: Vec<String>,
    /// Whether anything would change (exit status 1).
    changes: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    replay: Option<replay::ReplayReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    matrix: Option<matrix::MatrixReport>,
}

impl Args {
    pub fn run(self) -> std::process::ExitCode {
        finish_with("preview", self.preview(), 2)
    }

    fn preview(&self) -> anyhow::Result<Answer> {
        let source = match &self.state_dir {
            Some(dir) => SourceArgs {
                manifests: Vec::new(),
                state_dir: Some(dir.clone()),
            },
            None => SourceArgs::manifests(self.base_manifests.clone()),
        };
        let learned_path = (self.state_dir.as_ref())
            .map(|d| d.join(FILE_NAME))
            .filter(|p| p.exists());
        let learned = (learned_path.map(|p| LearnedFile::load(&p).map(Arc::new))).transpose()?;
        let loaded = load_source(&source, &self.dataplane)?;
        let convert = ConvertOptions {
            interface_prefix: self.dataplane.veth_prefix().to_string(),
        };
        let proposal = proposal::load(&self.manifests, &convert, &loaded)?;
        let empty = node_view::Overlay::default();
        let before = render_loaded(
            loaded.clone(),
            &self.node_name,
            &self.dataplane,
            learned.clone(),
            &empty,
        )?;
        let after = render_loaded(
            loaded,
            &self.node_name,
            &self.dataplane,
            learned,
            &proposal.overlay,
        )?;
        let mut problems = before.problems.clone();
        problems.extend(proposal.problems.iter().cloned());
        // What only the proposal brings (its own fail-safe rules, skipped objects).
        problems.extend(
            (after.problems.iter())
                .filter(|p| !before.problems.contains(p))
                .map(|p| format!("after the proposal: {p}")),
        );
        let source_text = match (&self.state_dir, before.revision) {
            (Some(dir), Some(rev)) => format!(
                "{} at datastore revision {rev}{}",
                dir.display(),
                origin_note(before.stamp.as_ref())
            ),
            _ => (self.base_manifests.iter())
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        };
        let views = Views {
            node: self.node_name.clone(),
            before: View::new(before),
            after: View::new(after),
        };
        let flows = match (&self.flows, &self.state_dir) {
            (Some(f), _) => Some(f.clone()),
            (None, Some(dir)) if !self.static_matrix => {
                Some(dir.join(FLOWS_FILE)).filter(|p| p.exists())
            }
            _ => None,
        };
        let mut report = Report {
            node: self.node_name.clone(),
            mode: if flows.is_some() { "replay" } else { "static" },
            source: source_text,
            proposed: proposal.summary,
            changes: false,
            replay: None,
            matrix: None,
        };
        match &flows {
            Some(path) => {
                let r = replay::replay(&views, path)?;
                report.changes = !r.groups.is_empty();
                report.replay = Some(r);
            }
            None => {
                let m = matrix::matrix(&views)?;
                report.changes = !m.changes.is_empty();
                report.matrix = Some(m);
            }
        }
        let text = if self.json {
            let mut s = serde_json::to_string_pretty(&report)?;
            s.push('\n');
            s
        } else {
            text(&report, self.all)
        };
        if report.proposed.is_empty() {
            bail!("nothing proposed");
        }
        Ok(Answer {
            text,
            problems,
            status: u8::from(report.changes),
        })
    }
}

fn text(r: &Report, all: bool) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "preview on node {}: the node's objects from {}",
        r.node, r.source
    );
    let _ = writeln!(s, "proposed:");
    for p in &r.proposed {
        let _ = writeln!(s, "  {p}");
    }
    if let Some(rep) = &r.replay {
        s.push_str(&replay::text(rep, all));
    }
    if let Some(m) = &r.matrix {
        s.push_str(&matrix::text(m, all));
    }
    let _ = writeln!(
        s,
        "{}",
        if r.changes {
            "verdicts would change (exit status 1)"
        } else {
            "no verdict would change (exit status 0)"
        }
    );
    s
}
