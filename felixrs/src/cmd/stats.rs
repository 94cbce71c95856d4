//! `felixrs stats`: which policies are allowing and dropping traffic on this node, from the
//! kernel's own counters.
//!
//! The node's objects are rendered as `felixrs render` does (from the agent's snapshot with
//! `--state-dir`, or from manifests) to learn which of our rules belongs to which policy, tier,
//! direction and action ([`iptables::stats::Attribution`]); the kernel's filter tables are then
//! read with counters (`iptables-save -c`, both families, in the backend the agent uses) and
//! summed per policy. Needs root in the node's network namespace. Counters count since each rule
//! was written: a rule the agent rewrites starts again from zero.

use std::fmt::Write as _;

use anyhow::Context;
use calc_graph::proto::IpVersion;
use iptables::apply::backend::{self, Backend, Mode};
use iptables::apply::counters::read_filter_counters;
use iptables::apply::{ExecRunner, Runner};
use iptables::desired::TableName;
use iptables::render::Renderer;
use iptables::stats::{Attribution, CounterKey, Tally};
use serde::Serialize;

use crate::agent::IptablesBackend;
use crate::cmd::shared::dataplane_args::DataplaneArgs;
use crate::cmd::shared::node_view::{SourceArgs, render_node};
use crate::cmd::shared::{Answer, finish};
use crate::flowlog::collector::StagedRow;

/// `felixrs stats`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,
    /// This node's name.
    #[arg(long, env = "FELIXRS_NODE_NAME")]
    pub node_name: String,
    /// Which iptables binaries hold the agent's rules.
    #[arg(
        long,
        env = "FELIXRS_IPTABLES_BACKEND",
        value_enum,
        default_value = "auto"
    )]
    pub iptables_backend: IptablesBackend,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
}

/// One row: a policy's (or tier end's, or profile's) counters of one family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub packets: u64,
    pub bytes: u64,
    pub family: &'static str,
    pub kind: &'static str,
    pub tier: String,
    pub policy: String,
    pub direction: &'static str,
    pub action: &'static str,
}

/// The whole answer.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub backend: &'static str,
    /// Rules of ours whose counters were read.
    pub rules_found: usize,
    /// Rules the rendered state has and the kernel does not (not programmed, or tampered with).
    pub rules_missing: usize,
    /// Most packets first.
    pub counters: Vec<Row>,
    /// Connections each staged policy decided in the staged view (allow, deny or pass), counted
    /// by the running agent's flow collector (`--state-dir` of an agent with flow logs on).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub staged: Vec<StagedRow>,
}

fn family_name(v: IpVersion) -> &'static str {
    match v {
        IpVersion::V4 => "ipv4",
        IpVersion::V6 => "ipv6",
    }
}

pub fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Legacy => "legacy",
        Mode::Nft => "nft",
    }
}

/// Rows of one family's tally.
pub fn rows(v: IpVersion, tally: &Tally) -> Vec<Row> {
    tally
        .by_hits()
        .into_iter()
        .map(|(k, c): (&CounterKey, _)| Row {
            packets: c.packets,
            bytes: c.bytes,
            family: family_name(v),
            kind: k.source.as_str(),
            tier: k.tier.clone(),
            policy: k.name.clone(),
            direction: k.direction.as_str(),
            action: k.action.as_str(),
        })
        .collect()
}

/// Reads both families' counters through `runner` and attributes them with `renderer`'s rules.
pub fn collect(renderer: &Renderer, runner: &dyn Runner, mode: Mode) -> anyhow::Result<Stats> {
    let mut all = Vec::new();
    let (mut found, mut missing) = (0, 0);
    for v in [IpVersion::V4, IpVersion::V6] {
        let attribution = Attribution::new(renderer, v);
        let save = read_filter_counters(runner, mode, v)
            .with_context(|| format!("reading IPv{} counters", v.number()))?;
        let mut tally = attribution.attribute(&save);
        // Host endpoints' doNotTrack (raw) and preDNAT (mangle) policy count too; tables with
        // none of our policy rules are not read.
        for table in [TableName::Raw, TableName::Mangle] {
            let attribution = Attribution::for_table(renderer, v, table);
            if attribution.rule_count() == 0 {
                continue;
            }
            let save = read_counters(runner, mode, v, table)?;
            tally.merge(attribution.attribute(&save));
        }
        found += tally.rules_found;
        missing += tally.rules_missing;
        all.extend(rows(v, &tally));
    }
    all.sort_by(|a, b| {
        (b.packets, b.bytes)
            .cmp(&(a.packets, a.bytes))
            .then_with(|| {
                (a.family, &a.policy, a.direction).cmp(&(b.family, &b.policy, b.direction))
            })
    });
    Ok(Stats {
        backend: mode_name(mode),
        rules_found: found,
        rules_missing: missing,
        counters: all,
        staged: Vec::new(),
    })
}

/// `iptables-save -c -t TABLE` of family `v` (the filter table is read by the applier's
/// [`read_filter_counters`]).
fn read_counters(
    runner: &dyn Runner,
    mode: Mode,
    v: IpVersion,
    table: TableName,
) -> anyhow::Result<String> {
    let program = mode.save_program(v);
    let name = table.as_str();
    let out = (runner.run(&program, &["-c", "-t", name], None))
        .map_err(|e| anyhow::anyhow!("reading IPv{} {name} counters: {e}", v.number()))?;
    if !out.status.success() {
        anyhow::bail!(
            "reading IPv{} {name} counters: {program} -c -t {name} failed: {}",
            v.number(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A name as one table cell: control characters, spaces, quotes and backslashes escaped, so no
/// name can break a row or forge another one.
pub fn cell(s: &str) -> String {
    if s.is_empty() {
        return "-".to_string();
    }
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            ' ' => out.push_str("\\x20"),
            c if c.is_control() || c.is_whitespace() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Rows of cells, columns aligned; the first `right` columns right-aligned (numbers).
fn aligned(rows: &[Vec<String>], right: usize) -> String {
    let mut widths = vec![0usize; rows.first().map_or(0, Vec::len)];
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, (c, w)) in row.iter().zip(&widths).enumerate() {
            if i < right {
                let _ = write!(line, "{c:>w$}  ");
            } else {
                let _ = write!(line, "{c:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The human table, most packets first; then the staged policies' counts, if any.
pub fn table(stats: &Stats) -> String {
    let mut rows: Vec<Vec<String>> = vec![
        [
            "PACKETS",
            "BYTES",
            "FAMILY",
            "DIRECTION",
            "ACTION",
            "KIND",
            "TIER",
            "POLICY",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for r in &stats.counters {
        rows.push(vec![
            r.packets.to_string(),
            r.bytes.to_string(),
            r.family.to_string(),
            r.direction.to_string(),
            r.action.to_string(),
            r.kind.to_string(),
            cell(&r.tier),
            cell(&r.policy),
        ]);
    }
    let mut out = aligned(&rows, 2);
    let _ = writeln!(
        out,
        "({} backend; {} of our rules read{})",
        stats.backend,
        stats.rules_found,
        if stats.rules_missing > 0 {
            format!(
                ", {} rendered rules missing from the kernel",
                stats.rules_missing
            )
        } else {
            String::new()
        }
    );
    if !stats.staged.is_empty() {
        let mut rows: Vec<Vec<String>> = vec![
            ["CONNECTIONS", "STAGED ACTION", "KIND", "TIER", "POLICY"]
                .map(String::from)
                .to_vec(),
        ];
        for r in &stats.staged {
            let p = &r.policy;
            let name = if p.namespace.is_empty() {
                p.name.clone()
            } else {
                format!("{}/{}", p.namespace, p.name)
            };
            let action = serde_json::to_value(p.action)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            rows.push(vec![
                r.connections.to_string(),
                action,
                cell(&p.kind),
                cell(&p.tier),
                cell(&name),
            ]);
        }
        out.push_str("\nstaged policies (connections each would have decided so, from the agent's flow logs):\n");
        out.push_str(&aligned(&rows, 1));
    }
    out
}

impl Args {
    pub fn run(self) -> std::process::ExitCode {
        finish("stats", self.stats())
    }

    fn stats(&self) -> anyhow::Result<Answer> {
        let view = render_node(&self.source, &self.node_name, &self.dataplane)?;
        let runner = ExecRunner::new();
        let mode = backend::resolve(&runner, Backend::from(self.iptables_backend))
            .map_err(|e| anyhow::anyhow!("detecting the iptables backend: {e}"))?;
        let mut stats = collect(&view.renderer, &runner, mode)?;
        let mut problems = view.problems;
        if let Some(dir) = &self.source.state_dir {
            match crate::agent::view::fetch_staged(dir) {
                Ok(rows) => stats.staged = rows.unwrap_or_default(),
                Err(e) => problems.push(format!("staged policy counts: {e}")),
            }
        }
        let text = if self.json {
            let mut s = serde_json::to_string_pretty(&stats)?;
            s.push('\n');
            s
        } else {
            table(&stats)
        };
        Ok(Answer {
            text,
            problems,
            status: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_cannot_split_or_forge_rows() {
        assert_eq!(cell("a\nb c\"d\\"), "a\\u{a}b\\x20c\\\"d\\\\");
        assert_eq!(cell(""), "-");
        assert_eq!(cell("--policy=x"), "--policy=x");
    }

    #[test]
    fn the_table_is_sorted_as_given_and_aligned() {
        let row = |packets, policy: &str| Row {
            packets,
            bytes: packets * 60,
            family: "ipv4",
            kind: "networkpolicy",
            tier: "default".into(),
            policy: policy.into(),
            direction: "ingress",
            action: "allow",
        };
        let s = Stats {
            backend: "nft",
            rules_found: 2,
            rules_missing: 0,
            counters: vec![row(100, "ns/web"), row(3, "ns/evil\nrow")],
            staged: Vec::new(),
        };
        let t = table(&s);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].starts_with("PACKETS"), "{t}");
        assert!(lines[1].contains("ns/web") && lines[1].trim_start().starts_with("100"));
        assert!(lines[2].contains("ns/evil\\u{a}row"), "{t}");
    }
}
