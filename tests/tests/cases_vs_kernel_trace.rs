//! `felixrs trace --kernel` must agree with every case's expectations, which the end-to-end run
//! checks against the real datapath: each step's rules are applied, as the agent would, to two
//! node namespaces this test creates (node-1 with iptables-legacy, node-2 with iptables-nft), and
//! every cell's packet is traced through each node's *kernel* state (iptables-save and ipset save
//! as parsed, from the top of the kernel chain). A packet between pods on two nodes must pass
//! both nodes' kernels. Root.

use calc_graph::proto::IpVersion;
use felixrs::cmd::trace::kernel::{KernelVerdict, read_kernel_state_with, trace_kernel};
use felixrs::cmd::trace::trace_packet;
use felixrs_e2e::cases::{self, Case};
use felixrs_e2e::cases_v6;
use felixrs_e2e::report::assert_no_mismatches;
use felixrs_e2e::trace_cells::{NODES, NodeVerdict, case_steps, trace_every_cell};
use felixrs_e2e::world::Family;
use felixrs_test_support::netns::Netns;
use iptables::apply::backend::Mode;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner};

const MODES: [Mode; 2] = [Mode::Legacy, Mode::Nft];

fn mismatches(cases: &[Case], family: Family) -> (Vec<String>, usize) {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&[
        "ip",
        "ipset",
        "iptables-legacy-save",
        "iptables-nft-save",
    ]);
    let v = if family == Family::V6 {
        IpVersion::V6
    } else {
        IpVersion::V4
    };
    let nss: Vec<Netns> = NODES.iter().map(|_| Netns::with_tag("kt")).collect();
    let runners: Vec<ExecRunner> = nss
        .iter()
        .map(|ns| ExecRunner::in_netns(ns.name()).unwrap())
        .collect();
    let mut appliers: Vec<Applier<ExecRunner>> = runners
        .iter()
        .zip(MODES)
        .map(|(r, m)| {
            Applier::new(
                r.clone(),
                ApplierConfig {
                    family: v,
                    backend: if m == Mode::Legacy {
                        Backend::Legacy
                    } else {
                        Backend::Nft
                    },
                    ..ApplierConfig::default()
                },
            )
        })
        .collect();
    trace_every_cell(
        &case_steps(cases),
        family,
        |step, expect| (step.expect)(expect),
        // Each step's rules are applied to both kernels, then each kernel's state is read back.
        |name, views| {
            let mut states = Vec::new();
            for (k, view) in views.iter().enumerate() {
                appliers[k]
                    .apply(view.renderer.desired_ref(v))
                    .unwrap_or_else(|e| panic!("{name}: apply: {e}"));
                states.push(read_kernel_state_with(&runners[k], MODES[k], v).unwrap());
            }
            states
        },
        |states, k, view, packet| {
            let traced = trace_packet(view, NODES[k], packet).unwrap();
            let kt = trace_kernel(&traced, &states[k]).unwrap();
            NodeVerdict {
                passes: kt.verdict == KernelVerdict::Accept,
                agrees: kt.agrees,
                detail: Box::new((kt.verdict, kt.agrees)),
            }
        },
    )
}

#[test]
fn kernel_trace_agrees_with_every_ipv4_case() {
    assert_no_mismatches(mismatches(&cases::all(), Family::V4), 1000);
}

#[test]
fn kernel_trace_agrees_with_every_ipv6_case() {
    assert_no_mismatches(mismatches(&cases_v6::all(), Family::V6), 500);
}
