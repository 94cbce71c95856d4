//! `felixrs trace` must agree with every case's expectations, the ones the end-to-end run checks
//! against the real kernel: so the trace tells an operator what the kernel does. Pure: no kernel,
//! no root. A packet between pods on two nodes must get through both nodes' rules (each traced
//! on its node); one between pods on the same node through that node's.

use felixrs::cmd::trace::{Verdict, trace_packet};
use felixrs_e2e::cases::{self, Case};
use felixrs_e2e::cases_v6;
use felixrs_e2e::report::assert_no_mismatches;
use felixrs_e2e::trace_cells::{NODES, NodeVerdict, case_steps, trace_every_cell};
use felixrs_e2e::world::Family;

/// The cells where the trace disagrees with the case (and the kernel), and how many cells were
/// checked.
fn mismatches(cases: &[Case], family: Family) -> (Vec<String>, usize) {
    trace_every_cell(
        &case_steps(cases),
        family,
        |step, expect| (step.expect)(expect),
        |_, _| (),
        |_, k, view, packet| {
            let verdict = trace_packet(view, NODES[k], packet).unwrap().verdict;
            NodeVerdict {
                passes: verdict != Verdict::Drop,
                agrees: true,
                detail: Box::new(verdict),
            }
        },
    )
}

#[test]
fn trace_agrees_with_every_ipv4_case() {
    assert_no_mismatches(mismatches(&cases::all(), Family::V4), 1000);
}

#[test]
fn trace_agrees_with_every_ipv6_case() {
    assert_no_mismatches(mismatches(&cases_v6::all(), Family::V6), 500);
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
