//! The admin-policy cases (AdminNetworkPolicy, BaselineAdminNetworkPolicy, ClusterNetworkPolicy), pure:
//! every hand-written expectation must agree with the independent admin evaluator, and `felixrs trace`
//! (the rules `render` produces for each node, evaluated) must agree with them too. The root run
//! (`tests/e2e_admin.rs`) checks the same expectations against the kernel.

use felixrs::cmd::trace::{Verdict, trace_packet};
use felixrs_e2e::admin_cases;
use felixrs_e2e::admin_evaluator::admin_world;
use felixrs_e2e::cases::{self, Case, Expect, Step, T80, U81};
use felixrs_e2e::report::assert_no_mismatches;
use felixrs_e2e::trace_cells::{NODES, NodeVerdict, case_steps, trace_every_cell};
use felixrs_e2e::world::{Family, PlacedPod};

/// The cells of `cases` whose expectation disagrees with the evaluator over `family`, and the count.
fn evaluator_mismatches(cases: &[Case], family: Family) -> (Vec<String>, usize) {
    let pods = cases::standard_layout();
    let ids: Vec<String> = pods.iter().map(PlacedPod::id).collect();
    let mut bad = Vec::new();
    let mut checked = 0;
    for case in cases {
        for (i, step) in case.steps.iter().enumerate() {
            let w = admin_world(step, &pods, family);
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
    (bad, checked)
}

#[test]
fn admin_expectations_match_the_evaluator() {
    let (bad, checked) = evaluator_mismatches(&admin_cases::all(), Family::V4);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(checked > 3000, "only {checked} cells checked");
}

#[test]
fn ipv6_admin_expectations_match_the_evaluator_over_ipv6() {
    let (bad, checked) = evaluator_mismatches(&admin_cases::all_v6(), Family::V6);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(checked > 3000, "only {checked} cells checked");
    // The IPv6 CIDR case judged over IPv4 must be wrong, or it would not test IPv6 matching.
    let v6_cidr: Vec<Case> = admin_cases::all_v6()
        .into_iter()
        .filter(|c| c.name.contains("IPv6 networks"))
        .collect();
    assert_eq!(v6_cidr.len(), 1);
    assert!(!evaluator_mismatches(&v6_cidr, Family::V4).0.is_empty());
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

/// The cells of `steps` where the trace (both nodes' rendered rules) disagrees with the expectation
/// (or, with `expect_from_evaluator`, with the evaluator), and how many cells were checked.
fn trace_mismatches<N: AsRef<str>>(
    steps: &[(N, &Step)],
    from_evaluator: bool,
    family: Family,
) -> (Vec<String>, usize) {
    let pods = cases::standard_layout();
    let ids: Vec<String> = pods.iter().map(PlacedPod::id).collect();
    trace_every_cell(
        steps,
        family,
        |step, expect| {
            if from_evaluator {
                let w = admin_world(step, &pods, family);
                for c in &mut expect.cells {
                    let f = &w.base.pods[ids.iter().position(|x| *x == c.0).unwrap()];
                    let t = &w.base.pods[ids.iter().position(|x| *x == c.1).unwrap()];
                    c.3 = w.allowed(f, t, c.2);
                }
            } else {
                (step.expect)(expect);
            }
        },
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

fn trace_cases(cases: &[Case], family: Family) -> (Vec<String>, usize) {
    trace_mismatches(&case_steps(cases), false, family)
}

#[test]
fn trace_agrees_with_every_admin_case() {
    assert_no_mismatches(trace_cases(&admin_cases::all(), Family::V4), 3000);
}

#[test]
fn trace_agrees_with_every_ipv6_admin_case() {
    assert_no_mismatches(trace_cases(&admin_cases::all_v6(), Family::V6), 3000);
}

/// Random admin policies (every kind and action, namespace/pod/CIDR peers, numbered, ranged and named
/// ports) over the standard cluster, with or without a NetworkPolicy: the rules felixrs renders, traced,
/// decide every pod pair as the independent evaluator does.
mod random {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn ns_sel() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!({})),
            prop::sample::select(vec!["x", "y", "z"])
                .prop_map(|n| json!({"matchLabels": {"ns": n}})),
            Just(
                json!({"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["y"]}]})
            ),
        ]
    }

    fn pod_sel() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!({})),
            prop::sample::select(vec!["a", "b", "c"])
                .prop_map(|p| json!({"matchLabels": {"pod": p}})),
        ]
    }

    fn peer(egress: bool) -> BoxedStrategy<Value> {
        let ns = ns_sel().prop_map(|s| json!({"namespaces": s}));
        let pods = (ns_sel(), pod_sel())
            .prop_map(|(n, p)| json!({"pods": {"namespaceSelector": n, "podSelector": p}}));
        if egress {
            let nets = prop::sample::select(vec![
                "10.78.1.0/24",
                "10.78.2.0/24",
                "10.78.0.0/16",
                "10.78.2.10/32",
                "10.78.1.12/32",
            ])
            .prop_map(|c| json!({"networks": [c]}));
            let nodes = prop_oneof![
                Just(json!({"nodes": {}})),
                prop::sample::select(vec!["node-a", "node-b"])
                    .prop_map(|n| json!({"nodes": {"matchLabels": {"kubernetes.io/hostname": n}}})),
            ];
            prop_oneof![ns, pods, nets, nodes].boxed()
        } else {
            prop_oneof![ns, pods].boxed()
        }
    }

    /// v1alpha1 ports (or v1alpha2 protocols when `v2`); `named` allows named ports.
    fn ports(v2: bool, named: bool) -> BoxedStrategy<Option<Value>> {
        let number =
            (prop::sample::select(vec!["TCP", "UDP"]), 80u16..82).prop_map(move |(p, n)| {
                if v2 {
                    json!({p.to_lowercase(): {"destinationPort": {"number": n}}})
                } else {
                    json!({"portNumber": {"protocol": p, "port": n}})
                }
            });
        let range = prop::sample::select(vec!["TCP", "UDP"]).prop_map(move |p| {
            if v2 {
                json!({p.to_lowercase(): {"destinationPort": {"range": {"start": 79, "end": 80}}}})
            } else {
                json!({"portRange": {"protocol": p, "start": 79, "end": 80}})
            }
        });
        let name = prop::sample::select(vec!["serve-80-tcp", "serve-81-udp", "serve-81-tcp"])
            .prop_map(move |n| {
                if v2 {
                    json!({"destinationNamedPort": n})
                } else {
                    json!({"namedPort": n})
                }
            });
        let one = if named {
            prop_oneof![number, range, name].boxed()
        } else {
            prop_oneof![number, range].boxed()
        };
        prop::option::of(prop::collection::vec(one, 1..3).prop_map(Value::Array)).boxed()
    }

    /// One rule: action, peers and ports (no named ports next to a networks peer, which the API forbids).
    fn rule(actions: Vec<&'static str>, egress: bool, v2: bool) -> BoxedStrategy<Value> {
        (
            prop::sample::select(actions),
            prop::collection::vec(peer(egress), 1..3),
            ports(v2, true),
            ports(v2, false),
        )
            .prop_map(move |(action, peers, named_ports, plain_ports)| {
                let has_networks = peers
                    .iter()
                    .any(|p| p.get("networks").is_some() || p.get("nodes").is_some());
                let ports = if has_networks {
                    plain_ports
                } else {
                    named_ports
                };
                let mut r = json!({"action": action, if egress { "to" } else { "from" }: peers});
                if let Some(p) = ports {
                    r[if v2 { "protocols" } else { "ports" }] = p;
                }
                r
            })
            .boxed()
    }

    fn subject() -> impl Strategy<Value = Value> {
        prop_oneof![
            ns_sel().prop_map(|s| json!({"namespaces": s})),
            (ns_sel(), pod_sel())
                .prop_map(|(n, p)| json!({"pods": {"namespaceSelector": n, "podSelector": p}})),
        ]
    }

    /// A policy of `kind` (0 ANP, 1 BANP, 2 CNP Admin, 3 CNP Baseline) at `priority`.
    fn policy(kind: u8, priority: u32, index: usize) -> BoxedStrategy<Value> {
        let v2 = kind >= 2;
        let actions = match kind {
            0 => vec!["Allow", "Deny", "Pass"],
            1 => vec!["Allow", "Deny"],
            _ => vec!["Accept", "Deny", "Pass"],
        };
        (
            subject(),
            prop::collection::vec(rule(actions.clone(), false, v2), 0..3),
            prop::collection::vec(rule(actions, true, v2), 0..3),
        )
            .prop_map(move |(subject, ingress, egress)| {
                let (api, k, name) = match kind {
                    0 => ("v1alpha1", "AdminNetworkPolicy", format!("anp-{index}")),
                    1 => (
                        "v1alpha1",
                        "BaselineAdminNetworkPolicy",
                        "default".to_string(),
                    ),
                    _ => ("v1alpha2", "ClusterNetworkPolicy", format!("cnp-{index}")),
                };
                let mut spec = json!({"subject": subject, "ingress": ingress, "egress": egress});
                if kind != 1 {
                    spec["priority"] = json!(priority);
                }
                if v2 {
                    spec["tier"] = json!(if kind == 2 { "Admin" } else { "Baseline" });
                }
                json!({"apiVersion": format!("policy.networking.k8s.io/{api}"), "kind": k,
                       "metadata": {"name": name}, "spec": spec})
            })
            .boxed()
    }

    /// Two "nodes" whose status addresses are pod addresses (x/b's and y/b's), as host-networked pods
    /// share their node's: nodes peers must match exactly those, and no pod by its labels.
    const NODES: [&str; 2] = [
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-a, labels: {kubernetes.io/hostname: node-a}}\nstatus: {addresses: [{type: InternalIP, address: 10.78.2.10}]}\n",
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-b, labels: {kubernetes.io/hostname: node-b, pod: a}}\nstatus: {addresses: [{type: ExternalIP, address: 10.78.1.12}, {type: Hostname, address: node-b}]}\n",
    ];

    const NPS: [&str; 2] = [
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: x}\nspec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Ingress, Egress]}\n",
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-y, namespace: y}\nspec: {podSelector: {}, ingress: [{from: [{namespaceSelector: {matchLabels: {ns: x}}}]}]}\n",
    ];

    fn world() -> impl Strategy<Value = Vec<String>> {
        // Kinds: at most one BANP; distinct priorities (equal ones are ambiguous by the API).
        (
            prop::collection::vec(prop::sample::select(vec![0u8, 0, 2, 3]), 1..4),
            any::<bool>(),
            prop::sample::subsequence(vec![0usize, 1], 0..=2),
        )
            .prop_flat_map(|(kinds, banp, nps)| {
                let mut strategies: Vec<BoxedStrategy<Value>> = kinds
                    .iter()
                    .enumerate()
                    .map(|(i, k)| policy(*k, 10 * (i as u32 + 1), i))
                    .collect();
                if banp {
                    strategies.push(policy(1, 0, 99));
                }
                (strategies, Just(nps))
            })
            .prop_map(|(policies, nps)| {
                let mut docs: Vec<String> = policies
                    .iter()
                    .map(|p| serde_yaml::to_string(p).unwrap())
                    .collect();
                docs.extend(nps.iter().map(|i| NPS[*i].to_string()));
                docs.extend(NODES.iter().map(|n| n.to_string()));
                docs
            })
    }

    proptest! {
        // 24 cases in CI (each renders two nodes and traces 144 packets); ADMIN_PROPTEST_CASES=N for more.
        #![proptest_config(ProptestConfig {
            cases: std::env::var("ADMIN_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
            ..ProptestConfig::default()
        })]
        #[test]
        fn trace_agrees_with_the_evaluator_on_random_admin_policies(docs in world()) {
            let policies: Vec<&'static str> =
                docs.iter().map(|d| &*Box::leak(d.clone().into_boxed_str())).collect();
            let step = Step::new(policies, vec![T80, U81], |_| {});
            let (bad, checked) = trace_mismatches(&[("random", &step)], true, Family::V4);
            prop_assert!(checked > 100);
            prop_assert!(bad.is_empty(), "{} of {checked} for\n{}\n{}", bad.len(), docs.join("---\n"), bad.join("\n"));
        }
    }
}
