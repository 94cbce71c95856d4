//! The promotion property of staged policies: for every cell of the trace case suite, the
//! verdict the staged view gives with every policy of the step staged (a Calico NetworkPolicy or
//! GlobalNetworkPolicy as its staged kind, a Kubernetes NetworkPolicy as a
//! StagedKubernetesNetworkPolicy; `stagedAction: Set`) equals the enforced verdict after
//! promoting them (the step as written, which `cases_vs_trace` checks against the kernel's
//! expectations). Pure: no kernel, no root.

use felixrs::cmd::trace::{Verdict, trace_packet};
use felixrs::flowlog::FlowAction;
use felixrs::staged::StagedView;
use felixrs_e2e::cases::{self, Case, Step};
use felixrs_e2e::report::assert_no_mismatches;
use felixrs_e2e::trace_cells::{NODES, NodeVerdict, case_steps, trace_every_cell};
use felixrs_e2e::world::Family;
use serde_yaml::Value;

/// One policy document in its staged form (other documents, e.g. tiers, as they are).
fn staged_doc(doc: &str) -> String {
    let mut out = Vec::new();
    for d in serde_yaml::Deserializer::from_str(doc) {
        let mut v: Value = serde::Deserialize::deserialize(d).expect("case yaml");
        if v.is_null() {
            continue;
        }
        let api = v["apiVersion"].as_str().unwrap_or("").to_string();
        let kind = v["kind"].as_str().unwrap_or("").to_string();
        let staged = match (api.as_str(), kind.as_str()) {
            ("networking.k8s.io/v1", "NetworkPolicy") => Some("StagedKubernetesNetworkPolicy"),
            ("projectcalico.org/v3", "NetworkPolicy") => Some("StagedNetworkPolicy"),
            ("projectcalico.org/v3", "GlobalNetworkPolicy") => Some("StagedGlobalNetworkPolicy"),
            _ => None,
        };
        if let Some(k) = staged {
            v["apiVersion"] = Value::from("projectcalico.org/v3");
            v["kind"] = Value::from(k);
            if !v["spec"].is_mapping() {
                v["spec"] = Value::Mapping(Default::default());
            }
            v["spec"]["stagedAction"] = Value::from("Set");
        }
        out.push(serde_yaml::to_string(&v).expect("yaml"));
    }
    out.join("---\n")
}

fn staged_step(step: &Step) -> Step {
    Step {
        policies: (step.policies.iter())
            .map(|d| &*Box::leak(staged_doc(d).into_boxed_str()))
            .collect(),
        ns_labels: step.ns_labels.clone(),
        pod_labels: step.pod_labels.clone(),
        pod_annotations: step.pod_annotations.clone(),
        probes: step.probes.clone(),
        expect: step.expect,
    }
}

fn mismatches(cases: &[Case], family: Family) -> (Vec<String>, usize) {
    let steps = case_steps(cases);
    let staged: Vec<(String, Step)> = (steps.iter())
        .map(|(n, s)| (n.clone(), staged_step(s)))
        .collect();
    let staged_refs: Vec<(&str, &Step)> = staged.iter().map(|(n, s)| (n.as_str(), s)).collect();
    trace_every_cell(
        &staged_refs,
        family,
        |step, expect| (step.expect)(expect),
        |_, views| {
            (views.iter())
                .map(|v| {
                    let cfg = felixrs::cmd::shared::dataplane_args::DataplaneArgs::default()
                        .render_config();
                    StagedView::from_outputs(cfg, &v.outputs).unwrap()
                })
                .collect::<Vec<_>>()
        },
        |staged, k, view, packet| {
            let traced = trace_packet(view, NODES[k], packet).unwrap();
            // Nothing in force: the staged view is everything. Where no staged policy changes
            // the packet's endpoints, the staged verdict is the enforced one.
            let s = &staged[k];
            let pkt = &traced.packet;
            let (passes, detail) = if s.applies_to(pkt.src, pkt.dst) {
                let (_, v) = s.trace(pkt, traced.path.our_chain()).unwrap();
                (
                    v.action != FlowAction::Deny,
                    format!("staged {:?}", v.action),
                )
            } else {
                (
                    traced.verdict != Verdict::Drop,
                    format!("not staged, enforced {:?}", traced.verdict),
                )
            };
            NodeVerdict {
                passes,
                agrees: true,
                detail: Box::new(detail),
            }
        },
    )
}

#[test]
fn staged_verdicts_equal_the_promoted_verdicts_of_every_ipv4_case() {
    // Every step of the suite stages at least one policy somewhere.
    assert!(
        cases::all()
            .iter()
            .any(|c| c.steps.iter().any(|s| !s.policies.is_empty()))
    );
    assert_no_mismatches(mismatches(&cases::all(), Family::V4), 1000);
}
