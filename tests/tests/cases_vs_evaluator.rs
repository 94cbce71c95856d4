//! Every case's hand-written expectation must agree with the independent evaluator, so a typo in a
//! case cannot hide (or fake) an agent bug. Pure: no kernel, no root.

use felixrs_e2e::cases::{self, Case, Expect};
use felixrs_e2e::cases_v6;
use felixrs_e2e::world::{self, Family, PlacedPod};

/// The cells of `cases` whose hand-written expectation disagrees with the evaluator over `family`,
/// and how many cells were checked.
fn mismatches(cases: &[Case], family: Family) -> (Vec<String>, usize) {
    let pods = cases::standard_layout();
    let ids: Vec<String> = pods.iter().map(PlacedPod::id).collect();
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for case in cases {
        for (i, step) in case.steps.iter().enumerate() {
            let Some(w) = world::world(step, &pods, family) else {
                continue;
            };
            let mut expect = Expect::all_allowed(&ids, &step.probes);
            (step.expect)(&mut expect);
            for (from, to, probe, allowed) in &expect.cells {
                let f = &w.pods[ids.iter().position(|x| x == from).unwrap()];
                let t = &w.pods[ids.iter().position(|x| x == to).unwrap()];
                if w.allowed(f, t, *probe) != *allowed {
                    mismatches.push(format!(
                        "{} step {}: {from} -> {to} {probe}: case says {allowed}",
                        case.name,
                        i + 1
                    ));
                }
                checked += 1;
            }
        }
    }
    (mismatches, checked)
}

#[test]
fn hand_written_expectations_match_the_evaluator() {
    let (bad, checked) = mismatches(&cases::all(), Family::V4);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(checked > 1000, "only {checked} cells checked");
}

#[test]
fn ipv6_expectations_match_the_evaluator_over_ipv6() {
    let (bad, checked) = mismatches(&cases_v6::all(), Family::V6);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(checked > 500, "only {checked} cells checked");
}

#[test]
fn ipv6_ip_block_cases_depend_on_the_family() {
    // These cases' ipBlocks match one family only: judged on IPv4 addresses their expectations must be
    // wrong, or they would not be testing IPv6 matching at all.
    let family_specific = [
        "egress to an IPv6 ipBlock with except",
        "ingress from an IPv6 ipBlock (node-1's pod range)",
        "an IPv4 ipBlock admits no IPv6 traffic",
    ];
    let cases: Vec<Case> = cases_v6::all()
        .into_iter()
        .filter(|c| family_specific.contains(&c.name))
        .collect();
    assert_eq!(cases.len(), family_specific.len());
    for case in cases {
        let name = case.name;
        let (bad, _) = mismatches(&[case], Family::V4);
        assert!(!bad.is_empty(), "{name}: same verdicts over IPv4");
    }
}

#[test]
fn the_evaluator_catches_a_wrong_expectation() {
    let pods = cases::standard_layout();
    let ids: Vec<String> = pods.iter().map(PlacedPod::id).collect();
    let case = &cases::all()[0];
    let step = &case.steps[0];
    let w = world::world(step, &pods, Family::V4).expect("k8s-only case");
    // Deliberately wrong: claim y/a -> x/a is allowed under default-deny-ingress.
    let mut expect = Expect::all_allowed(&ids, &step.probes);
    (step.expect)(&mut expect);
    expect.allow("y/a", "x/a");
    let wrong = expect
        .cells
        .iter()
        .filter(|(from, to, probe, allowed)| {
            let f = &w.pods[ids.iter().position(|x| x == from).unwrap()];
            let t = &w.pods[ids.iter().position(|x| x == to).unwrap()];
            w.allowed(f, t, *probe) != *allowed
        })
        .count();
    assert_eq!(wrong, 1);
}
