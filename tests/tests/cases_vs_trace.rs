//! `felixrs trace` must agree with every case's expectations, the ones the end-to-end run checks
//! against the real kernel: so the trace tells an operator what the kernel does. Pure: no kernel,
//! no root. A packet between pods on two nodes must get through both nodes' rules (each traced
//! on its node); one between pods on the same node through that node's.

use felixrs::dataplane_args::DataplaneArgs;
use felixrs::render_cmd::{NodeView, SourceArgs, render_node};
use felixrs::trace_cmd::{PacketArgs, Verdict, trace_packet};
use felixrs_e2e::cases::{self, Case, Expect};
use felixrs_e2e::cases_v6;
use felixrs_e2e::traffic::Proto;
use felixrs_e2e::world::{self, Family, PlacedPod};

const NODES: [&str; 2] = ["node-1", "node-2"];

/// The cells where the trace disagrees with the case, and how many cells were checked.
fn mismatches(cases: &[Case], family: Family) -> (Vec<String>, usize) {
    let pods = cases::standard_layout();
    let ids: Vec<String> = pods.iter().map(PlacedPod::id).collect();
    let node_of = |id: &str| {
        pods.iter()
            .find(|p| p.id() == id)
            .map(|p| p.node_name.clone())
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let source = SourceArgs::manifests(vec![dir.path().to_path_buf()]);
    let mut checked = 0;
    let mut bad = Vec::new();
    for case in cases {
        for (i, step) in case.steps.iter().enumerate() {
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
            let mut expect = Expect::all_allowed(&ids, &step.probes);
            (step.expect)(&mut expect);
            for (from, to, probe, allowed) in &expect.cells {
                let packet = PacketArgs {
                    from: from.clone(),
                    to: to.clone(),
                    protocol: match probe.proto {
                        Proto::Icmp => "icmp".into(),
                        Proto::Ip => probe.port.to_string(),
                        p => p.as_str().to_string(),
                    },
                    port: probe.port,
                    source_port: 40000,
                    icmp_type: None,
                    // An ICMP probe's port is its echo request's code.
                    icmp_code: if probe.proto == Proto::Icmp {
                        probe.port as u8
                    } else {
                        0
                    },
                    ipv6: family == Family::V6,
                };
                let mut nodes = vec![node_of(from), node_of(to)];
                nodes.dedup();
                let verdicts: Vec<(String, Verdict)> = nodes
                    .iter()
                    .map(|n| {
                        let view = &views[NODES.iter().position(|x| x == n).unwrap()];
                        let t = trace_packet(view, n, &packet).unwrap();
                        (n.clone(), t.verdict)
                    })
                    .collect();
                let passes = verdicts.iter().all(|(_, v)| *v != Verdict::Drop);
                if passes != *allowed {
                    bad.push(format!(
                        "{} step {}: {from} -> {to} {probe}: the case (and the kernel) say {allowed}, the trace says {verdicts:?}",
                        case.name,
                        i + 1
                    ));
                }
                checked += 1;
            }
        }
    }
    (bad, checked)
}

#[test]
fn trace_agrees_with_every_ipv4_case() {
    let (bad, checked) = mismatches(&cases::all(), Family::V4);
    assert!(
        bad.is_empty(),
        "{} of {checked}:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(checked > 1000, "only {checked} cells checked");
}

#[test]
fn trace_agrees_with_every_ipv6_case() {
    let (bad, checked) = mismatches(&cases_v6::all(), Family::V6);
    assert!(
        bad.is_empty(),
        "{} of {checked}:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(checked > 500, "only {checked} cells checked");
}

#[test]
fn trace_agrees_with_every_icmp_and_l3_case() {
    use felixrs_e2e::cases_icmp;
    let mut checked = 0;
    for family in [Family::V4, Family::V6] {
        let (bad, n) = mismatches(&cases_icmp::of(family), family);
        assert!(
            bad.is_empty(),
            "{family:?}: {} of {n}:\n{}",
            bad.len(),
            bad.join("\n")
        );
        checked += n;
    }
    assert!(checked > 2000, "only {checked} cells checked");
}
