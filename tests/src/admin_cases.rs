//! The upstream network-policy-api conformance tests (kubernetes-sigs/network-policy-api `conformance/`,
//! v0.1.8 for AdminNetworkPolicy / BaselineAdminNetworkPolicy, v0.2.0 for ClusterNetworkPolicy),
//! re-authored as data on this suite's cluster: namespaces x, y, z (labelled `ns: <name>`) stand for
//! the houses, pods a, b, c in each, TCP/UDP 80 and 81 with container ports `serve-<port>-<proto>`.
//! Each upstream test's mutation pattern (swap a rule's action, change a priority, add or remove the
//! NetworkPolicy or the baseline) becomes a step. Expectations are written the upstream way (all
//! allowed, then narrowed) and checked against the independent [`crate::admin_evaluator`].
//!
//! Node-1 holds x/a, x/c, y/b, z/a, z/c (10.78.1.0/24); node-2 holds x/b, y/a, y/c, z/b (10.78.2.0/24).

use crate::cases::{Case, PING, Step, T80, T81, U80, U81};

const NP_X_INGRESS_FROM_Y: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ingress-from-y, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
"#;

const NP_X_DENY_INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-ingress, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
"#;

const NP_X_ALLOW_ALL_INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all-ingress, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{}]
"#;

/// upstream standard-anp-np-banp: the NetworkPolicy admits y in both directions (and so isolates x).
const NP_X_GRESS_Y: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-gress-y, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
  egress: [{to: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
"#;

const ANP_INGRESS_ORDER_1: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: ingress-tcp}
spec:
  priority: 3
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress:
  - {name: allow-from-y-everything, action: Allow, from: [{namespaces: {matchLabels: {ns: y}}}]}
  - {name: deny-from-y-everything, action: Deny, from: [{namespaces: {matchLabels: {ns: y}}}]}
  - name: deny-from-z-at-port-80
    action: Deny
    from: [{namespaces: {matchLabels: {ns: z}}}]
    ports: [{portNumber: {protocol: TCP, port: 80}}]
  - name: pass-from-z-at-port-80
    action: Pass
    from: [{namespaces: {matchLabels: {ns: z}}}]
    ports: [{portNumber: {protocol: TCP, port: 80}}]
"#;

/// The mutation: Deny first for y, Pass first for z.
const ANP_INGRESS_ORDER_2: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: ingress-tcp}
spec:
  priority: 3
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress:
  - {name: deny-from-y-everything, action: Deny, from: [{namespaces: {matchLabels: {ns: y}}}]}
  - {name: allow-from-y-everything, action: Allow, from: [{namespaces: {matchLabels: {ns: y}}}]}
  - name: pass-from-z-at-port-80
    action: Pass
    from: [{namespaces: {matchLabels: {ns: z}}}]
    ports: [{portNumber: {protocol: TCP, port: 80}}]
  - name: deny-from-z-at-port-80
    action: Deny
    from: [{namespaces: {matchLabels: {ns: z}}}]
    ports: [{portNumber: {protocol: TCP, port: 80}}]
"#;

const ANP_X_ALLOW_FROM_Y: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: allow-from-y}
spec:
  priority: 20
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress: [{action: Allow, from: [{namespaces: {matchLabels: {ns: y}}}]}]
"#;

const ANP_X_DENY_FROM_Y: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: deny-from-y}
spec:
  priority: 10
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress: [{action: Deny, from: [{namespaces: {matchLabels: {ns: y}}}]}]
"#;

/// The same policy, now after allow-from-y (priority 20).
const ANP_X_DENY_FROM_Y_LATER: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: deny-from-y}
spec:
  priority: 30
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress: [{action: Deny, from: [{namespaces: {matchLabels: {ns: y}}}]}]
"#;

const ANP_GRESS_Y_DENY: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: pass-example}
spec:
  priority: 10
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress: [{name: deny-all-ingress-from-y, action: Deny, from: [{namespaces: {matchLabels: {ns: y}}}]}]
  egress: [{name: deny-all-egress-to-y, action: Deny, to: [{namespaces: {matchLabels: {ns: y}}}]}]
"#;

const ANP_GRESS_Y_PASS: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: pass-example}
spec:
  priority: 10
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress: [{name: pass-all-ingress-from-y, action: Pass, from: [{namespaces: {matchLabels: {ns: y}}}]}]
  egress: [{name: pass-all-egress-to-y, action: Pass, to: [{namespaces: {matchLabels: {ns: y}}}]}]
"#;

const BANP_GRESS_Y_DENY: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress: [{name: deny-all-ingress-from-y, action: Deny, from: [{namespaces: {matchLabels: {ns: y}}}]}]
  egress: [{name: deny-all-egress-to-y, action: Deny, to: [{namespaces: {matchLabels: {ns: y}}}]}]
"#;

const ANP_XA_EGRESS_PODS: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: egress-pods}
spec:
  priority: 7
  subject:
    pods:
      namespaceSelector: {matchLabels: {ns: x}}
      podSelector: {matchLabels: {pod: a}}
  egress:
  - name: deny-to-y-b
    action: Deny
    to: [{pods: {namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchLabels: {pod: b}}}}]
  - name: allow-to-b-and-c-anywhere
    action: Allow
    to:
    - pods:
        namespaceSelector: {}
        podSelector: {matchExpressions: [{key: pod, operator: In, values: [b, c]}]}
  - name: deny-81-to-everyone
    action: Deny
    to: [{namespaces: {}}]
    ports: [{portNumber: {protocol: TCP, port: 81}}]
"#;

const ANP_X_PORTS: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: ports}
spec:
  priority: 4
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress:
  - name: allow-y-to-named-81-tcp
    action: Allow
    from: [{namespaces: {matchLabels: {ns: y}}}]
    ports: [{namedPort: serve-81-tcp}]
  - {name: deny-y, action: Deny, from: [{namespaces: {matchLabels: {ns: y}}}]}
  - name: allow-z-to-named-80-udp
    action: Allow
    from: [{namespaces: {matchLabels: {ns: z}}}]
    ports: [{namedPort: serve-80-udp}]
  - name: deny-z-tcp-range-and-udp-81
    action: Deny
    from: [{namespaces: {matchLabels: {ns: z}}}]
    ports: [{portRange: {start: 80, end: 81}}, {portRange: {protocol: UDP, start: 81, end: 90}}]
"#;

/// upstream standard-egress-inline-cidr-rules: `networks` peers.
const ANP_X_EGRESS_CIDR: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: inline-cidr-as-peers}
spec:
  priority: 85
  subject: {namespaces: {matchLabels: {ns: x}}}
  egress:
  - {name: allow-to-x-b, action: Allow, to: [{networks: [__XB__/32]}]}
  - {name: deny-to-node-1-pods, action: Deny, to: [{networks: [10.78.1.0/24, "fd00::/8"]}]}
"#;

/// The same over IPv6 (node-1's pods are fd78:1::/64); the IPv4 network in it matches no IPv6 packet.
const ANP_X_EGRESS_CIDR6: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: inline-cidr-as-peers}
spec:
  priority: 85
  subject: {namespaces: {matchLabels: {ns: x}}}
  egress:
  - {name: allow-to-x-b, action: Allow, to: [{networks: ["__XB6__/128"]}]}
  - {name: deny-to-node-1-pods, action: Deny, to: [{networks: ["fd78:1::/64", 10.78.2.0/24]}]}
"#;

const BANP_X_EGRESS_CIDR6: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject: {namespaces: {matchLabels: {ns: x}}}
  egress: [{name: deny-to-node-2-pods, action: Deny, to: [{networks: ["fd78:2::/64"]}]}]
"#;

const BANP_X_EGRESS_CIDR: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject: {namespaces: {matchLabels: {ns: x}}}
  egress: [{name: deny-to-node-2-pods, action: Deny, to: [{networks: [10.78.2.0/24]}]}]
"#;

const ANP_X_EGRESS_ALLOW_Y: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: egress-allow-y}
spec:
  priority: 1
  subject: {namespaces: {matchLabels: {ns: x}}}
  egress: [{action: Allow, to: [{namespaces: {matchLabels: {ns: y}}}]}]
"#;

/// upstream standard-egress-inline-cidr-rules, verbatim in shape: pods first, then the whole internet
/// (both families) denied, which includes every other pod.
const ANP_X_EGRESS_INTERNET: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: inline-cidr-internet}
spec:
  priority: 85
  subject:
    pods:
      namespaceSelector: {matchLabels: {ns: x}}
      podSelector: {}
  egress:
  - name: allow-egress-to-y
    action: Allow
    to: [{pods: {namespaceSelector: {matchLabels: {ns: y}}, podSelector: {}}}]
  - {name: deny-egress-to-internet, action: Deny, to: [{networks: [0.0.0.0/0, "::/0"]}]}
"#;

/// Baseline rules in order: Allow y first, then Deny everyone.
const BANP_X_ALLOW_Y_DENY_ALL: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress:
  - {name: allow-y, action: Allow, from: [{namespaces: {matchLabels: {ns: y}}}]}
  - {name: deny-all, action: Deny, from: [{namespaces: {}}]}
"#;

const NP_X_INGRESS_FROM_Z: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ingress-from-z, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: z}}}]}]
"#;

const ANP_X_DENY_FROM_ZC: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: deny-from-z-c}
spec:
  priority: 50
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress:
  - action: Deny
    from: [{pods: {namespaceSelector: {matchLabels: {ns: z}}, podSelector: {matchLabels: {pod: c}}}}]
"#;

const CNP_ADMIN: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admin-x}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress:
  - name: accept-y-tcp-80
    action: Accept
    from: [{namespaces: {matchLabels: {ns: y}}}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]
  - {name: pass-y, action: Pass, from: [{namespaces: {matchLabels: {ns: y}}}]}
  - name: deny-z-tcp-80-81
    action: Deny
    from: [{namespaces: {matchLabels: {ns: z}}}]
    protocols: [{tcp: {destinationPort: {range: {start: 80, end: 81}}}}]
"#;

const CNP_BASELINE: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline-x}
spec:
  tier: Baseline
  priority: 10
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress:
  - {name: deny-y, action: Deny, from: [{namespaces: {matchLabels: {ns: y}}}]}
  - name: accept-z-udp-named
    action: Accept
    from: [{namespaces: {matchLabels: {ns: z}}}]
    protocols: [{destinationNamedPort: serve-80-udp}]
  - {name: deny-z, action: Deny, from: [{namespaces: {matchLabels: {ns: z}}}]}
"#;

pub fn all() -> Vec<Case> {
    let p3 = || vec![T80, T81, U80];
    // A rule without ports matches every protocol: ICMP (ICMPv6 over IPv6) echo as well.
    let pings = || vec![T80, U80, PING];
    let p4 = || vec![T80, T81, U80, U81];
    vec![
        Case {
            name: "admin: ingress rules decide in order (Allow, Deny, Pass), then the mutation",
            steps: vec![
                Step::new(vec![ANP_INGRESS_ORDER_1], p3(), |e| {
                    e.set("z/*", "x/*", &[T80], false);
                }),
                // Pass for z on 80 hands it to the (absent) NetworkPolicy: allowed.
                Step::new(vec![ANP_INGRESS_ORDER_2], p3(), |e| e.deny("y/*", "x/*")),
                // Now a NetworkPolicy admits only y, which the admin Deny still blocks; z on TCP 80 is
                // passed to it and denied; x's own pods are denied by it.
                Step::new(vec![ANP_INGRESS_ORDER_2, NP_X_INGRESS_FROM_Y], p3(), |e| {
                    e.deny("*/*", "x/*");
                }),
            ],
        },
        Case {
            name: "admin over NetworkPolicy: Allow beats a NetworkPolicy deny, Deny beats an allow (ICMP too)",
            steps: vec![
                Step::new(vec![NP_X_DENY_INGRESS, ANP_X_ALLOW_FROM_Y], pings(), |e| {
                    e.deny("*/*", "x/*");
                    e.allow("y/*", "x/*");
                }),
                Step::new(
                    vec![NP_X_ALLOW_ALL_INGRESS, ANP_X_DENY_FROM_Y],
                    pings(),
                    |e| {
                        e.deny("y/*", "x/*");
                    },
                ),
            ],
        },
        Case {
            name: "admin priority: the lower priority decides; raising it flips the verdict",
            steps: vec![
                Step::new(vec![ANP_X_ALLOW_FROM_Y, ANP_X_DENY_FROM_Y], p3(), |e| {
                    e.deny("y/*", "x/*");
                }),
                Step::new(
                    vec![ANP_X_ALLOW_FROM_Y, ANP_X_DENY_FROM_Y_LATER],
                    p3(),
                    |_| {},
                ),
            ],
        },
        Case {
            name: "admin, NetworkPolicy, baseline: Deny, Pass to NetworkPolicy, Pass to baseline, baseline under a NetworkPolicy allow",
            steps: vec![
                Step::new(
                    vec![ANP_GRESS_Y_DENY, NP_X_GRESS_Y, BANP_GRESS_Y_DENY],
                    p3(),
                    |e| {
                        e.deny("*/*", "x/*");
                        e.deny("x/*", "*/*");
                    },
                ),
                Step::new(
                    vec![ANP_GRESS_Y_PASS, NP_X_GRESS_Y, BANP_GRESS_Y_DENY],
                    p3(),
                    |e| {
                        e.deny("*/*", "x/*");
                        e.deny("x/*", "*/*");
                        e.allow("y/*", "x/*");
                        e.allow("x/*", "y/*");
                    },
                ),
                Step::new(vec![ANP_GRESS_Y_PASS, BANP_GRESS_Y_DENY], p3(), |e| {
                    e.deny("y/*", "x/*");
                    e.deny("x/*", "y/*");
                }),
                Step::new(vec![NP_X_GRESS_Y, BANP_GRESS_Y_DENY], p3(), |e| {
                    e.deny("*/*", "x/*");
                    e.deny("x/*", "*/*");
                    e.allow("y/*", "x/*");
                    e.allow("x/*", "y/*");
                }),
            ],
        },
        Case {
            name: "admin: a policy that selects a pod but matches nothing leaves it to NetworkPolicy",
            steps: vec![
                Step::new(vec![ANP_X_DENY_FROM_ZC], p3(), |e| e.deny("z/c", "x/*")),
                Step::new(vec![ANP_X_DENY_FROM_ZC, NP_X_INGRESS_FROM_Y], p3(), |e| {
                    e.deny("*/*", "x/*");
                    e.allow("y/*", "x/*");
                }),
            ],
        },
        Case {
            name: "admin egress: pod subject, pod and namespace peers, rule order",
            steps: vec![Step::new(vec![ANP_XA_EGRESS_PODS], p3(), |e| {
                e.set("x/a", "*/*", &[T81], false);
                e.allow("x/a", "*/b");
                e.allow("x/a", "*/c");
                e.deny("x/a", "y/b");
            })],
        },
        Case {
            name: "admin ports: named ports, port ranges, protocols",
            steps: vec![Step::new(vec![ANP_X_PORTS], p4(), |e| {
                e.deny("y/*", "x/*");
                e.set("y/*", "x/*", &[T81], true);
                e.set("z/*", "x/*", &[T80, T81, U81], false);
            })],
        },
        Case {
            name: "admin and baseline egress to networks (CIDR peers)",
            steps: vec![
                Step::new(vec![ANP_X_EGRESS_CIDR], p3(), |e| {
                    for to in ["x/a", "x/c", "y/b", "z/a", "z/c"] {
                        e.deny("x/*", to);
                    }
                }),
                Step::new(vec![BANP_X_EGRESS_CIDR], p3(), |e| {
                    for to in ["x/b", "y/a", "y/c", "z/b"] {
                        e.deny("x/*", to);
                    }
                }),
                Step::new(vec![BANP_X_EGRESS_CIDR, ANP_X_EGRESS_ALLOW_Y], p3(), |e| {
                    for to in ["x/b", "z/b"] {
                        e.deny("x/*", to);
                    }
                }),
            ],
        },
        Case {
            name: "admin egress: a namespace's pods allowed, the internet (0.0.0.0/0 and ::/0) denied",
            steps: vec![Step::new(vec![ANP_X_EGRESS_INTERNET], p3(), |e| {
                e.deny("x/*", "*/*");
                e.allow("x/*", "y/*");
            })],
        },
        Case {
            name: "baseline: rules decide in order; a NetworkPolicy overrides the baseline",
            steps: vec![
                Step::new(vec![BANP_X_ALLOW_Y_DENY_ALL], p3(), |e| {
                    e.deny("*/*", "x/*");
                    e.allow("y/*", "x/*");
                }),
                Step::new(
                    vec![BANP_X_ALLOW_Y_DENY_ALL, NP_X_INGRESS_FROM_Z],
                    p3(),
                    |e| {
                        e.deny("*/*", "x/*");
                        e.allow("z/*", "x/*");
                    },
                ),
            ],
        },
        Case {
            name: "ClusterNetworkPolicy: Admin Accept/Pass/Deny over the Baseline tier",
            steps: vec![
                Step::new(vec![CNP_ADMIN, CNP_BASELINE], p4(), |e| {
                    e.deny("y/*", "x/*");
                    e.set("y/*", "x/*", &[T80], true);
                    e.deny("z/*", "x/*");
                    e.set("z/*", "x/*", &[U80], true);
                }),
                Step::new(
                    vec![CNP_ADMIN, CNP_BASELINE, NP_X_INGRESS_FROM_Y],
                    p4(),
                    |e| {
                        e.deny("*/*", "x/*");
                        e.allow("y/*", "x/*");
                    },
                ),
            ],
        },
    ]
}

/// The name of the case whose CIDRs are IPv4 only.
const V4_CIDR_CASE: &str = "admin and baseline egress to networks (CIDR peers)";

/// The IPv6 pass: every case whose verdicts do not depend on the family, and the CIDR case with IPv6
/// networks.
pub fn all_v6() -> Vec<Case> {
    let p3 = || vec![T80, T81, U80];
    let mut v: Vec<Case> = all()
        .into_iter()
        .filter(|c| c.name != V4_CIDR_CASE)
        .collect();
    v.push(Case {
        name: "admin and baseline egress to IPv6 networks (CIDR peers)",
        steps: vec![
            Step::new(vec![ANP_X_EGRESS_CIDR6], p3(), |e| {
                for to in ["x/a", "x/c", "y/b", "z/a", "z/c"] {
                    e.deny("x/*", to);
                }
            }),
            Step::new(vec![BANP_X_EGRESS_CIDR6], p3(), |e| {
                for to in ["x/b", "y/a", "y/c", "z/b"] {
                    e.deny("x/*", to);
                }
            }),
            Step::new(vec![BANP_X_EGRESS_CIDR6, ANP_X_EGRESS_ALLOW_Y], p3(), |e| {
                for to in ["x/b", "z/b"] {
                    e.deny("x/*", to);
                }
            }),
        ],
    });
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_case_has_steps_and_probes() {
        assert_eq!(super::all_v6().len(), super::all().len());
        for c in super::all().into_iter().chain(super::all_v6()) {
            assert!(!c.steps.is_empty(), "{}", c.name);
            assert!(c.steps.iter().all(|s| !s.probes.is_empty()), "{}", c.name);
        }
    }
}
