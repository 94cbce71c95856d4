//! The admin-policy cases (AdminNetworkPolicy, BaselineAdminNetworkPolicy, ClusterNetworkPolicy), pure:
//! every hand-written expectation must agree with the independent admin evaluator, and `felixrs trace`
//! (the rules `render` produces for each node, evaluated) must agree with them too. The root run
//! (`tests/e2e_admin.rs`) checks the same expectations against the kernel.

use felixrs::dataplane_args::DataplaneArgs;
use felixrs::render_cmd::{NodeView, SourceArgs, render_node};
use felixrs::trace_cmd::{PacketArgs, Verdict, trace_packet};
use felixrs_e2e::admin_cases;
use felixrs_e2e::admin_evaluator::admin_world;
use felixrs_e2e::cases::{self, Expect};
use felixrs_e2e::traffic::Proto;
use felixrs_e2e::world::{self, Family, PlacedPod};

const NODES: [&str; 2] = ["node-1", "node-2"];

#[test]
fn admin_expectations_match_the_evaluator() {
    let pods = cases::standard_layout();
    let ids: Vec<String> = pods.iter().map(PlacedPod::id).collect();
    let mut bad = Vec::new();
    let mut checked = 0;
    for case in admin_cases::all() {
        for (i, step) in case.steps.iter().enumerate() {
            let w = admin_world(step, &pods, Family::V4);
            let mut expect = Expect::all_allowed(&ids, &step.probes);
            (step.expect)(&mut expect);
            for (from, to, probe, allowed) in &expect.cells {
                let f = &w.base.pods[ids.iter().position(|x| x == from).unwrap()];
                let t = &w.base.pods[ids.iter().position(|x| x == to).unwrap()];
                if w.allowed(f, t, *probe) != *allowed {
                    bad.push(format!(
                        "{} step {}: {from} -> {to} {probe}: case says {allowed}",
                        case.name,
                        i + 1
                    ));
                }
                checked += 1;
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(checked > 3000, "only {checked} cells checked");
}

#[test]
fn admin_expectations_are_not_all_allow() {
    // Every step must deny something, or it would not test the policies at all.
    let pods = cases::standard_layout();
    let ids: Vec<String> = pods.iter().map(PlacedPod::id).collect();
    for case in admin_cases::all() {
        for (i, step) in case.steps.iter().enumerate() {
            let mut expect = Expect::all_allowed(&ids, &step.probes);
            (step.expect)(&mut expect);
            let denied = expect.cells.iter().filter(|c| !c.3).count();
            let is_all_allow_step = case.name.starts_with("admin priority") && i == 1;
            assert!(
                denied > 0 || is_all_allow_step,
                "{} step {} denies nothing",
                case.name,
                i + 1
            );
        }
    }
}

#[test]
fn trace_agrees_with_every_admin_case() {
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
    for case in admin_cases::all() {
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
                        p => p.as_str().to_string(),
                    },
                    port: probe.port,
                    source_port: 40000,
                    icmp_type: None,
                    icmp_code: 0,
                    ipv6: false,
                };
                let mut nodes = vec![node_of(from), node_of(to)];
                nodes.dedup();
                let verdicts: Vec<(String, Verdict)> = nodes
                    .iter()
                    .map(|n| {
                        let view = &views[NODES.iter().position(|x| x == n).unwrap()];
                        (n.clone(), trace_packet(view, n, &packet).unwrap().verdict)
                    })
                    .collect();
                let passes = verdicts.iter().all(|(_, v)| *v != Verdict::Drop);
                if passes != *allowed {
                    bad.push(format!(
                        "{} step {}: {from} -> {to} {probe}: the case says {allowed}, the trace says {verdicts:?}",
                        case.name,
                        i + 1
                    ));
                }
                checked += 1;
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {checked}:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(checked > 3000, "only {checked} cells checked");
}
