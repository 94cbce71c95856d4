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

#[test]
fn icmp_and_l3_expectations_match_the_evaluator() {
    use felixrs_e2e::cases_icmp;
    let mut checked = 0;
    for family in [Family::V4, Family::V6] {
        let (bad, n) = mismatches(&cases_icmp::of(family), family);
        assert!(bad.is_empty(), "{family:?}:\n{}", bad.join("\n"));
        checked += n;
    }
    assert!(checked > 2000, "only {checked} cells checked");
}

#[test]
fn the_evaluator_models_every_calico_case() {
    // Calico-native steps are checked too: none may fall back to its hand-written expectation.
    let pods = cases::standard_layout();
    let mut all: Vec<Case> = cases::all();
    all.extend(felixrs_e2e::cases_icmp::of(Family::V4));
    let mut calico = 0;
    for case in &all {
        for step in &case.steps {
            if step
                .policies
                .iter()
                .any(|p| p.contains("projectcalico.org/v3"))
            {
                calico += 1;
                assert!(
                    world::world(step, &pods, Family::V4).is_some(),
                    "{}: the evaluator does not model its policies",
                    case.name
                );
            }
        }
    }
    assert!(calico >= 10, "only {calico} Calico steps");
}

#[test]
fn the_evaluator_tells_icmp_types_codes_and_protocols_apart() {
    use felixrs_e2e::cases_icmp::{PING, PING_CODE3, RAW};
    // Under "echo with code 0 only" into z, code 3 and a bare IP protocol are denied; flipping
    // either expectation must be caught.
    let pods = cases::standard_layout();
    let ids: Vec<String> = pods.iter().map(PlacedPod::id).collect();
    let case = felixrs_e2e::cases_icmp::of(Family::V6)
        .into_iter()
        .find(|c| c.name == "calico: icmp type and code admit only that echo")
        .unwrap();
    let step = &case.steps[0];
    let w = world::world(step, &pods, Family::V6).expect("modelled");
    let pod = |id: &str| &w.pods[ids.iter().position(|x| x == id).unwrap()];
    assert!(w.allowed(pod("x/a"), pod("z/b"), PING));
    assert!(!w.allowed(pod("x/a"), pod("z/b"), PING_CODE3));
    assert!(!w.allowed(pod("x/a"), pod("z/b"), RAW));
    assert!(w.allowed(pod("z/b"), pod("x/a"), RAW), "only z is selected");
}

#[test]
fn the_readme_shows_the_health_check_policy_the_datapath_proves() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let section = readme
        .split("## ICMP and other protocols")
        .nth(1)
        .expect("README has the ICMP section");
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a yaml block in the ICMP section");
    let shown: serde_yaml::Value = serde_yaml::from_str(yaml).expect("README yaml");
    let proven: serde_yaml::Value =
        serde_yaml::from_str(felixrs_e2e::cases_icmp::GNP_HEALTH_ICMP_ONLY_Y).unwrap();
    assert_eq!(shown, proven);
}
