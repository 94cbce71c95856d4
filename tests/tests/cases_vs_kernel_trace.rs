//! `felixrs trace --kernel` must agree with every case's expectations, which the end-to-end run
//! checks against the real datapath: each step's rules are applied, as the agent would, to two
//! node namespaces this test creates (node-1 with iptables-legacy, node-2 with iptables-nft), and
//! every cell's packet is traced through each node's *kernel* state (iptables-save and ipset save
//! as parsed, from the top of the kernel chain). A packet between pods on two nodes must pass
//! both nodes' kernels. Root.

use calc_graph::proto::IpVersion;
use felixrs::dataplane_args::DataplaneArgs;
use felixrs::render_cmd::{NodeView, SourceArgs, render_node};
use felixrs::trace_cmd::{PacketArgs, trace_packet};
use felixrs::trace_kernel::{KernelVerdict, read_kernel_state_with, trace_kernel};
use felixrs_e2e::cases::{self, Case, Expect};
use felixrs_e2e::cases_v6;
use felixrs_e2e::traffic::Proto;
use felixrs_e2e::world::{self, Family, PlacedPod};
use felixrs_test_support::netns::Netns;
use iptables::apply::backend::Mode;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner};

const NODES: [&str; 2] = ["node-1", "node-2"];
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
    let pods = cases::standard_layout();
    let ids: Vec<String> = pods.iter().map(PlacedPod::id).collect();
    let node_of = |id: &str| {
        pods.iter()
            .find(|p| p.id() == id)
            .map(|p| p.node_name.clone())
            .unwrap()
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
            let mut states = Vec::new();
            for (k, view) in views.iter().enumerate() {
                appliers[k]
                    .apply(view.renderer.desired_ref(v))
                    .unwrap_or_else(|e| panic!("{} step {}: apply: {e}", case.name, i + 1));
                states.push(read_kernel_state_with(&runners[k], MODES[k], v).unwrap());
            }
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
                    ipv6: family == Family::V6,
                };
                let mut nodes = vec![node_of(from), node_of(to)];
                nodes.dedup();
                let mut verdicts = Vec::new();
                for n in &nodes {
                    let k = NODES.iter().position(|x| x == n).unwrap();
                    let traced = trace_packet(&views[k], n, &packet).unwrap();
                    let kt = trace_kernel(&traced, &states[k]).unwrap();
                    verdicts.push((n.clone(), kt.verdict, kt.agrees));
                }
                let passes = verdicts.iter().all(|(_, v, _)| *v == KernelVerdict::Accept);
                if passes != *allowed || verdicts.iter().any(|(_, _, agrees)| !agrees) {
                    bad.push(format!(
                        "{} step {}: {from} -> {to} {probe}: the case (and the datapath) say {allowed}, the kernel trace says {verdicts:?}",
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
fn kernel_trace_agrees_with_every_ipv4_case() {
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
fn kernel_trace_agrees_with_every_ipv6_case() {
    let (bad, checked) = mismatches(&cases_v6::all(), Family::V6);
    assert!(
        bad.is_empty(),
        "{} of {checked}:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(checked > 500, "only {checked} cells checked");
}
