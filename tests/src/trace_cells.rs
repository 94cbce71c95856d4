//! "Trace every case cell": the loop shared by the tests that check `felixrs trace` against the
//! cases' expectations (`tests/cases_vs_trace.rs`, `tests/cases_vs_kernel_trace.rs`,
//! `tests/admin_cases.rs`). For every step it writes the step's manifests for the standard pod
//! layout, renders both nodes as `felixrs render` would, lets the caller prepare per-step state
//! (e.g. apply the rules to kernels), then traces every expected cell on the node of its source pod
//! and, for a pod on the other node, on that one too. A cell passes when every node lets it
//! through; the caller's tracer says what "lets through" means (the rendered rules, or the kernel).
//!
//! This module drives felixrs in process (like `driver` drives its binaries); the evaluators
//! (`evaluator`, `admin_evaluator`, `calico_eval`) stay independent of felixrs.

use std::fmt::Debug;

use felixrs::cmd::shared::dataplane_args::DataplaneArgs;
use felixrs::cmd::shared::node_view::{NodeView, SourceArgs, render_node};
use felixrs::cmd::trace::PacketArgs;

use crate::cases::{self, Case, Expect, Step};
use crate::traffic::{Probe, Proto};
use crate::world::{self, Family, PlacedPod};

/// The two nodes of the standard layout, in the order of the views handed to the callbacks.
pub const NODES: [&str; 2] = ["node-1", "node-2"];

/// One node's answer for one cell.
pub struct NodeVerdict {
    /// The packet gets through this node.
    pub passes: bool,
    /// The tracer's own cross-check held (the kernel trace agrees with the rules' trace); a
    /// cell where it does not is a mismatch whatever the verdict.
    pub agrees: bool,
    /// What the tracer found (printed in the mismatch report).
    pub detail: Box<dyn Debug>,
}

/// The steps of `cases`, each named `<case> step <n>` (n from 1).
pub fn case_steps(cases: &[Case]) -> Vec<(String, &Step)> {
    cases
        .iter()
        .flat_map(|c| {
            c.steps
                .iter()
                .enumerate()
                .map(move |(i, s)| (format!("{} step {}", c.name, i + 1), s))
        })
        .collect()
}

/// The packet `felixrs trace` gets for a probe from `from` to `to`: the probe's protocol (an IP
/// protocol probe by number), its port, source port 40000; an ICMP probe's port is its echo
/// request's code.
pub fn packet(from: &str, to: &str, probe: Probe, family: Family) -> PacketArgs {
    PacketArgs {
        from: from.to_string(),
        to: to.to_string(),
        protocol: match probe.proto {
            Proto::Icmp => "icmp".into(),
            Proto::Ip => probe.port.to_string(),
            p => p.as_str().to_string(),
        },
        port: probe.port,
        source_port: 40000,
        icmp_type: None,
        icmp_code: if probe.proto == Proto::Icmp {
            probe.port as u8
        } else {
            0
        },
        ipv6: family == Family::V6,
    }
}

/// Traces every cell of every step; returns the cells where the trace disagrees with the
/// expectation (one line each) and how many cells were checked.
///
/// - `expect(step, cells)` fills the expectation, starting from "all allowed" for the step's
///   probes (usually `(step.expect)(cells)`);
/// - `prepare(name, views)` runs once per step after both nodes are rendered (`views[k]` is
///   `NODES[k]`) and returns what `trace` needs besides the views;
/// - `trace(state, k, view, packet)` traces `packet` on node `NODES[k]`.
pub fn trace_every_cell<N: AsRef<str>, S>(
    steps: &[(N, &Step)],
    family: Family,
    mut expect: impl FnMut(&Step, &mut Expect),
    mut prepare: impl FnMut(&str, &[NodeView]) -> S,
    mut trace: impl FnMut(&S, usize, &NodeView, &PacketArgs) -> NodeVerdict,
) -> (Vec<String>, usize) {
    let pods = cases::standard_layout();
    let ids: Vec<String> = pods.iter().map(PlacedPod::id).collect();
    let node_of = |id: &str| {
        let node = &pods.iter().find(|p| p.id() == id).unwrap().node_name;
        NODES.iter().position(|n| n == node).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let source = SourceArgs::manifests(vec![dir.path().to_path_buf()]);
    let mut checked = 0;
    let mut bad = Vec::new();
    for (name, step) in steps {
        std::fs::write(
            dir.path().join("cluster.yaml"),
            world::manifests(step, &pods),
        )
        .unwrap();
        let views: Vec<NodeView> = NODES
            .iter()
            .map(|n| render_node(&source, n, &DataplaneArgs::default()))
            .collect::<Result<_, _>>()
            .unwrap();
        let name = name.as_ref();
        let state = prepare(name, &views);
        let mut cells = Expect::all_allowed(&ids, &step.probes);
        expect(step, &mut cells);
        for (from, to, probe, allowed) in &cells.cells {
            let packet = packet(from, to, *probe, family);
            let mut nodes = vec![node_of(from), node_of(to)];
            nodes.dedup();
            let verdicts: Vec<(&str, NodeVerdict)> = nodes
                .iter()
                .map(|&k| (NODES[k], trace(&state, k, &views[k], &packet)))
                .collect();
            let passes = verdicts.iter().all(|(_, v)| v.passes);
            if passes != *allowed || verdicts.iter().any(|(_, v)| !v.agrees) {
                let said: Vec<(&str, &dyn Debug)> =
                    verdicts.iter().map(|(n, v)| (*n, &*v.detail)).collect();
                bad.push(format!(
                    "{name}: {from} -> {to} {probe}: expected {allowed}, the trace says {said:?}"
                ));
            }
            checked += 1;
        }
    }
    (bad, checked)
}
