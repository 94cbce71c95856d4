//! The upstream Kubernetes e2e NetworkPolicy cases (test/e2e/network/netpol/network_policy.go),
//! re-expressed as data, plus Calico-native cases (GlobalNetworkPolicy, tiers, Pass, Deny before Allow).
//!
//! Model: namespaces x, y, z labelled `ns: <name>`; pods a, b, c labelled `pod: <name>` in each,
//! serving TCP and UDP on 80 and 81 with container ports `serve-<port>-<proto>`. Each step lists the
//! policies in force (the controller deletes the rest), label changes, the probes, and the expected
//! reachability written the upstream way: start from "all allowed" and narrow.

use crate::traffic::{Probe, Proto};

pub const T80: Probe = Probe {
    port: 80,
    proto: Proto::Tcp,
};
pub const T81: Probe = Probe {
    port: 81,
    proto: Proto::Tcp,
};
pub const U80: Probe = Probe {
    port: 80,
    proto: Proto::Udp,
};
pub const U81: Probe = Probe {
    port: 81,
    proto: Proto::Udp,
};

pub const PING: Probe = Probe {
    port: 0,
    proto: Proto::Icmp,
};

pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const PODS: [&str; 3] = ["a", "b", "c"];

pub struct Case {
    pub name: &'static str,
    pub steps: Vec<Step>,
}

pub struct Step {
    /// Policy documents in force during this step (k8s NetworkPolicy or projectcalico.org/v3 YAML).
    pub policies: Vec<&'static str>,
    /// Extra namespace labels: (namespace, key, value).
    pub ns_labels: Vec<(&'static str, &'static str, &'static str)>,
    /// Pod label overrides: ("ns/pod", key, Some(value) to set, None to remove).
    pub pod_labels: Vec<(&'static str, &'static str, Option<&'static str>)>,
    /// Pod annotations: ("ns/pod", key, value). They do not change what the evaluator expects.
    pub pod_annotations: Vec<(&'static str, &'static str, &'static str)>,
    pub probes: Vec<Probe>,
    /// Narrows the all-allowed matrix to what this step expects.
    pub expect: fn(&mut Expect),
}

impl Step {
    pub fn new(policies: Vec<&'static str>, probes: Vec<Probe>, expect: fn(&mut Expect)) -> Step {
        Step {
            policies,
            ns_labels: vec![],
            pod_labels: vec![],
            pod_annotations: vec![],
            probes,
            expect,
        }
    }
}

/// The expected reachability of one step: (from, to, probe) → allowed. Patterns are `ns/pod` with `*`
/// for either part.
pub struct Expect {
    pub cells: Vec<(String, String, Probe, bool)>,
}

fn pat_matches(pat: &str, id: &str) -> bool {
    let (pn, pp) = pat.split_once('/').expect("pattern is ns/pod");
    let (n, p) = id.split_once('/').expect("id is ns/pod");
    (pn == "*" || pn == n) && (pp == "*" || pp == p)
}

impl Expect {
    pub fn all_allowed(pods: &[String], probes: &[Probe]) -> Expect {
        let mut cells = Vec::new();
        for probe in probes {
            for from in pods {
                for to in pods {
                    if from != to {
                        cells.push((from.clone(), to.clone(), *probe, true));
                    }
                }
            }
        }
        Expect { cells }
    }

    /// Sets every cell from `from` to `to` (patterns) for the given probes (empty = all) to `allowed`.
    pub fn set(&mut self, from: &str, to: &str, probes: &[Probe], allowed: bool) {
        for c in &mut self.cells {
            if pat_matches(from, &c.0)
                && pat_matches(to, &c.1)
                && (probes.is_empty() || probes.contains(&c.2))
            {
                c.3 = allowed;
            }
        }
    }

    pub fn deny(&mut self, from: &str, to: &str) {
        self.set(from, to, &[], false);
    }

    pub fn allow(&mut self, from: &str, to: &str) {
        self.set(from, to, &[], true);
    }

    /// Probes every cell with `probe` (given cell indices, whether each got through); cells that
    /// disagree with the expectation are probed twice more before they count. Returns the
    /// disagreements, one line each.
    pub fn disagreements(
        &self,
        mut probe: impl FnMut(&[usize]) -> anyhow::Result<Vec<bool>>,
    ) -> anyhow::Result<Vec<String>> {
        let all: Vec<usize> = (0..self.cells.len()).collect();
        let mut results = probe(&all)?;
        for _ in 0..2 {
            let bad: Vec<usize> = all
                .iter()
                .copied()
                .filter(|&i| results[i] != self.cells[i].3)
                .collect();
            if bad.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
            for (i, r) in bad.iter().zip(probe(&bad)?) {
                results[*i] = r;
            }
        }
        Ok(self
            .cells
            .iter()
            .zip(&results)
            .filter(|(c, got)| c.3 != **got)
            .map(|((f, t, p, want), _)| {
                format!(
                    "{f} -> {t} {p}: expected {}, got {}",
                    if *want { "allow" } else { "deny" },
                    if *want { "deny" } else { "allow" }
                )
            })
            .collect())
    }
}

const DENY_INGRESS_X: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-ingress, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
"#;

const DENY_ALL_X: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
"#;

const ALLOW_XA_FROM_XB: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-x-a-from-x-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]
"#;

const ALLOW_XA_FROM_NS_Y: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-ns-y, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
"#;

const ALLOW_XA_FROM_EXPR_B: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-expr, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchExpressions: [{key: pod, operator: In, values: [b]}]}}]}]
"#;

const ALLOW_XA_FROM_NS_NOT_IN_X: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-ns-expr, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchExpressions: [{key: ns, operator: NotIn, values: [x]}]}}]}]
"#;

const ALLOW_XA_FROM_B_OR_NS_Y: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-or, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}, {namespaceSelector: {matchLabels: {ns: y}}}]}]
"#;

const ALLOW_XA_FROM_B_AND_NS_YZ: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-and, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - podSelector: {matchLabels: {pod: b}}
      namespaceSelector: {matchExpressions: [{key: ns, operator: In, values: [y, z]}]}
"#;

const ALLOW_XA_81_FROM_NS_Y: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-81, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}], ports: [{port: 81, protocol: TCP}]}]
"#;

const ALLOW_XA_80_ALL: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-81, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{ports: [{port: 80}]}]
"#;

const ALLOW_XA_NAMED_81: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-named, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{ports: [{port: serve-81-tcp, protocol: TCP}]}]
"#;

const EGRESS_X_NAMED_80: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-named, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: [{ports: [{port: serve-80-tcp, protocol: TCP}]}]
"#;

const ALLOW_XA_FROM_UPDATED_NS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-updated-ns, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns2: updated}}}]}]
"#;

const ALLOW_XA_FROM_UPDATED_POD: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-updated-pod, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod2: updated}}, namespaceSelector: {}}]}]
"#;

const DENY_EGRESS_XA: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress-a, namespace: x}
spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress]}
"#;

const ALLOW_EGRESS_XA_TO_XB_CIDR: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-cidr, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 10.78.0.0/16, except: [__XB__/32]}}]}]
"#;

const ALLOW_XA_INGRESS_RANGE_81_82: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: end-port, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{ports: [{port: 81, endPort: 82, protocol: TCP}]}]
"#;

const ALLOW_XA_UDP_81: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: udp-81, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{ports: [{port: 81, protocol: UDP}]}]
"#;

const ALLOW_XA_PROTOCOL_ONLY_UDP: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: udp-only, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{ports: [{protocol: UDP}]}]
"#;

const ALLOW_XA_SCTP_80: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: sctp-80, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{ports: [{port: 80, protocol: SCTP}]}]
"#;

const ALLOW_ALL_INGRESS_X: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all, namespace: x}
spec: {podSelector: {}, ingress: [{}]}
"#;

const ALLOW_EGRESS_ALL_X: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-egress-all, namespace: x}
spec: {podSelector: {}, policyTypes: [Egress], egress: [{}]}
"#;

const DENY_EGRESS_X: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress, namespace: x}
spec: {podSelector: {}, policyTypes: [Egress]}
"#;

const ALLOW_EGRESS_XA_CIDR_EXCEPT_AND_XB: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-cidr-overlap, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: 10.78.0.0/16, except: [__XB__/32]}
    - ipBlock: {cidr: __XB__/32}
"#;

const DENY_INGRESS_ISOLATED_X: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-isolated, namespace: x}
spec:
  podSelector: {matchLabels: {isolated: "true"}}
  policyTypes: [Ingress]
"#;

const ALLOW_XA_80_FROM_Y: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: stacked-80, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}], ports: [{port: 80}]}]
"#;

const ALLOW_XA_81_FROM_Z: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: stacked-81, namespace: x}
spec:
  podSelector: {matchExpressions: [{key: pod, operator: In, values: [a, c]}]}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: z}}}], ports: [{port: 81}]}]
"#;

const ALLOW_YA_FROM_XA: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-from-x-a, namespace: y}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: a}}, namespaceSelector: {matchLabels: {ns: x}}}]
"#;

const EGRESS_XA_TO_B_IN_Y: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-to-y-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {matchLabels: {ns: y}}}]
"#;

const XA_INGRESS_FROM_Y_EGRESS_TO_Z: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: both-directions, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress, Egress]
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]}]
  egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}}]}]
"#;

const TIER_SECURITY: &str = r#"
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 100}
"#;

const GNP_DENY_Y_TO_X_THEN_PASS: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: security.deny-y-to-x}
spec:
  tier: security
  order: 10
  selector: projectcalico.org/namespace == 'x'
  types: [Ingress]
  ingress:
  - action: Deny
    source: {namespaceSelector: ns == 'y'}
  - action: Pass
"#;

const GNP_ALLOW_XB_TO_XA: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: security.allow-xb-to-xa}
spec:
  tier: security
  order: 5
  selector: projectcalico.org/namespace == 'x' && pod == 'a'
  types: [Ingress]
  ingress:
  - action: Allow
    source: {selector: pod == 'b', namespaceSelector: ns == 'x'}
  - action: Pass
"#;

pub const GNP_ICMP_ONLY_INTO_Z: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: icmp-only-z}
spec:
  order: 10
  selector: projectcalico.org/namespace == 'z'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: ICMP
    icmp: {type: 8}
"#;

/// All cases, in the order they run.
pub fn all() -> Vec<Case> {
    let tcp = || vec![T80];
    vec![
        Case {
            name: "default-deny-ingress",
            steps: vec![Step::new(vec![DENY_INGRESS_X], tcp(), |e| {
                e.deny("*/*", "x/*")
            })],
        },
        Case {
            name: "default-deny-all",
            steps: vec![Step::new(vec![DENY_ALL_X], tcp(), |e| {
                e.deny("*/*", "x/*");
                e.deny("x/*", "*/*");
            })],
        },
        Case {
            name: "allow from pods in the same namespace by podSelector",
            steps: vec![Step::new(vec![ALLOW_XA_FROM_XB], tcp(), |e| {
                e.deny("*/*", "x/a");
                e.allow("x/b", "x/a");
            })],
        },
        Case {
            name: "allow from a namespace by namespaceSelector",
            steps: vec![Step::new(vec![ALLOW_XA_FROM_NS_Y], tcp(), |e| {
                e.deny("*/*", "x/a");
                e.allow("y/*", "x/a");
            })],
        },
        Case {
            name: "podSelector with matchExpressions",
            steps: vec![Step::new(vec![ALLOW_XA_FROM_EXPR_B], tcp(), |e| {
                e.deny("*/*", "x/a");
                e.allow("x/b", "x/a");
            })],
        },
        Case {
            name: "namespaceSelector with matchExpressions NotIn",
            steps: vec![Step::new(vec![ALLOW_XA_FROM_NS_NOT_IN_X], tcp(), |e| {
                e.deny("x/*", "x/a");
            })],
        },
        Case {
            name: "podSelector OR namespaceSelector",
            steps: vec![Step::new(vec![ALLOW_XA_FROM_B_OR_NS_Y], tcp(), |e| {
                e.deny("*/*", "x/a");
                e.allow("x/b", "x/a");
                e.allow("y/*", "x/a");
            })],
        },
        Case {
            name: "podSelector AND namespaceSelector",
            steps: vec![Step::new(vec![ALLOW_XA_FROM_B_AND_NS_YZ], tcp(), |e| {
                e.deny("*/*", "x/a");
                e.allow("y/b", "x/a");
                e.allow("z/b", "x/a");
            })],
        },
        Case {
            name: "ingress on a specific port from a namespace",
            steps: vec![Step::new(
                vec![ALLOW_XA_81_FROM_NS_Y],
                vec![T80, T81],
                |e| {
                    e.deny("*/*", "x/a");
                    e.set("y/*", "x/a", &[T81], true);
                },
            )],
        },
        Case {
            name: "named port ingress",
            steps: vec![Step::new(vec![ALLOW_XA_NAMED_81], vec![T80, T81], |e| {
                e.set("*/*", "x/a", &[T80], false);
            })],
        },
        Case {
            name: "named port egress",
            steps: vec![Step::new(vec![EGRESS_X_NAMED_80], vec![T80, T81], |e| {
                e.set("x/*", "*/*", &[T81], false);
            })],
        },
        Case {
            name: "updated policy: port 81 then port 80, then deleted",
            steps: vec![
                Step::new(vec![ALLOW_XA_81_FROM_NS_Y], vec![T80, T81], |e| {
                    e.deny("*/*", "x/a");
                    e.set("y/*", "x/a", &[T81], true);
                }),
                Step::new(vec![ALLOW_XA_80_ALL], vec![T80, T81], |e| {
                    e.set("*/*", "x/a", &[T81], false);
                }),
                Step::new(vec![], vec![T80, T81], |_| {}),
            ],
        },
        Case {
            name: "updated namespace labels",
            steps: vec![
                Step::new(vec![ALLOW_XA_FROM_UPDATED_NS], tcp(), |e| {
                    e.deny("*/*", "x/a")
                }),
                Step {
                    ns_labels: vec![("y", "ns2", "updated")],
                    ..Step::new(vec![ALLOW_XA_FROM_UPDATED_NS], tcp(), |e| {
                        e.deny("*/*", "x/a");
                        e.allow("y/*", "x/a");
                    })
                },
            ],
        },
        Case {
            name: "updated pod labels",
            steps: vec![
                Step::new(vec![ALLOW_XA_FROM_UPDATED_POD], tcp(), |e| {
                    e.deny("*/*", "x/a")
                }),
                Step {
                    pod_labels: vec![("z/b", "pod2", Some("updated"))],
                    ..Step::new(vec![ALLOW_XA_FROM_UPDATED_POD], tcp(), |e| {
                        e.deny("*/*", "x/a");
                        e.allow("z/b", "x/a");
                    })
                },
                Step {
                    pod_labels: vec![],
                    ..Step::new(vec![ALLOW_XA_FROM_UPDATED_POD], tcp(), |e| {
                        e.deny("*/*", "x/a")
                    })
                },
            ],
        },
        Case {
            name: "deny egress from one pod",
            steps: vec![Step::new(vec![DENY_EGRESS_XA], tcp(), |e| {
                e.deny("x/a", "*/*")
            })],
        },
        Case {
            name: "egress to ipBlock with except",
            steps: vec![Step::new(vec![ALLOW_EGRESS_XA_TO_XB_CIDR], tcp(), |e| {
                e.deny("x/a", "x/b");
            })],
        },
        Case {
            name: "endPort range",
            steps: vec![Step::new(
                vec![ALLOW_XA_INGRESS_RANGE_81_82],
                vec![T80, T81],
                |e| {
                    e.set("*/*", "x/a", &[T80], false);
                },
            )],
        },
        Case {
            name: "UDP port",
            steps: vec![Step::new(vec![ALLOW_XA_UDP_81], vec![U80, U81, T81], |e| {
                e.set("*/*", "x/a", &[U80, T81], false);
            })],
        },
        Case {
            name: "protocol-only rule",
            steps: vec![Step::new(
                vec![ALLOW_XA_PROTOCOL_ONLY_UDP],
                vec![T80, U80],
                |e| {
                    e.set("*/*", "x/a", &[T80], false);
                },
            )],
        },
        Case {
            name: "SCTP is not TCP",
            steps: vec![Step::new(vec![ALLOW_XA_SCTP_80], vec![T80, U80], |e| {
                e.deny("*/*", "x/a");
            })],
        },
        Case {
            name: "allow-all ingress alongside default-deny",
            steps: vec![Step::new(
                vec![DENY_INGRESS_X, ALLOW_ALL_INGRESS_X],
                tcp(),
                |_| {},
            )],
        },
        Case {
            name: "egress allow-all takes precedence over egress deny",
            steps: vec![Step::new(
                vec![DENY_EGRESS_X, ALLOW_EGRESS_ALL_X],
                tcp(),
                |_| {},
            )],
        },
        Case {
            name: "default-deny-ingress also drops ping",
            steps: vec![Step::new(vec![DENY_INGRESS_X], vec![PING], |e| {
                e.deny("*/*", "x/*")
            })],
        },
        Case {
            name: "ingress and egress are independent",
            steps: vec![Step::new(vec![DENY_INGRESS_X], vec![T80, U81], |e| {
                e.deny("*/*", "x/*");
            })],
        },
        Case {
            name: "an address in one ipBlock's except and in another ipBlock is allowed",
            steps: vec![Step::new(
                vec![ALLOW_EGRESS_XA_CIDR_EXCEPT_AND_XB],
                tcp(),
                |_| {},
            )],
        },
        Case {
            name: "deny ingress to a pod once it is relabelled into the policy",
            steps: vec![
                Step::new(vec![DENY_INGRESS_ISOLATED_X], tcp(), |_| {}),
                Step {
                    pod_labels: vec![("x/a", "isolated", Some("true"))],
                    ..Step::new(vec![DENY_INGRESS_ISOLATED_X], tcp(), |e| {
                        e.deny("*/*", "x/a")
                    })
                },
                Step::new(vec![DENY_INGRESS_ISOLATED_X], tcp(), |_| {}),
            ],
        },
        Case {
            name: "stacked policies with overlapping podSelectors allow the union",
            steps: vec![Step::new(
                vec![ALLOW_XA_80_FROM_Y, ALLOW_XA_81_FROM_Z],
                vec![T80, T81],
                |e| {
                    e.deny("*/*", "x/a");
                    e.deny("*/*", "x/c");
                    e.set("y/*", "x/a", &[T80], true);
                    e.set("z/*", "x/a", &[T81], true);
                    e.set("z/*", "x/c", &[T81], true);
                },
            )],
        },
        Case {
            name: "client-side egress deny wins even if the server allows",
            steps: vec![Step::new(
                vec![DENY_EGRESS_XA, ALLOW_YA_FROM_XA],
                tcp(),
                |e| {
                    e.deny("x/a", "*/*");
                    e.deny("*/*", "y/a");
                },
            )],
        },
        Case {
            name: "egress to a pod in another namespace by podSelector AND namespaceSelector",
            steps: vec![Step::new(vec![EGRESS_XA_TO_B_IN_Y], tcp(), |e| {
                e.deny("x/a", "*/*");
                e.allow("x/a", "y/b");
            })],
        },
        Case {
            name: "ingress and egress in one policy, namespaces by kubernetes.io/metadata.name",
            steps: vec![Step::new(vec![XA_INGRESS_FROM_Y_EGRESS_TO_Z], tcp(), |e| {
                e.deny("*/*", "x/a");
                e.allow("y/*", "x/a");
                e.deny("x/a", "*/*");
                e.allow("x/a", "z/*");
            })],
        },
        Case {
            name: "calico: tier with Deny before Allow, then Pass to k8s policy",
            steps: vec![Step::new(
                vec![TIER_SECURITY, GNP_DENY_Y_TO_X_THEN_PASS, ALLOW_XA_FROM_NS_Y],
                tcp(),
                |e| {
                    e.deny("*/*", "x/a");
                    e.deny("y/*", "x/*");
                },
            )],
        },
        Case {
            name: "calico: Allow in an earlier tier wins over default-deny",
            steps: vec![Step::new(
                vec![TIER_SECURITY, GNP_ALLOW_XB_TO_XA, DENY_INGRESS_X],
                tcp(),
                |e| {
                    e.deny("*/*", "x/*");
                    e.allow("x/b", "x/a");
                },
            )],
        },
        Case {
            name: "calico: an ICMP-only policy admits ping and denies TCP and UDP",
            steps: vec![Step::new(
                vec![GNP_ICMP_ONLY_INTO_Z],
                vec![T80, U80, PING],
                |e| {
                    e.set("*/*", "z/*", &[T80, U80], false);
                },
            )],
        },
    ]
}

/// The standard layout: pods a, b, c in x, y, z spread over two nodes, with the addresses
/// `Cluster::add_pod` assigns when pods are added in this order.
pub fn standard_layout() -> Vec<crate::world::PlacedPod> {
    let mut next = [10u8, 10u8];
    let mut v = Vec::new();
    for (i, (ns, pod)) in NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |p| (*ns, *p)))
        .enumerate()
    {
        let node = i % 2;
        v.push(crate::world::PlacedPod {
            namespace: ns.to_string(),
            name: pod.to_string(),
            node_name: format!("node-{}", node + 1),
            ip: std::net::Ipv4Addr::new(10, 78, node as u8 + 1, next[node]),
            ip6: crate::cluster::pod_ip6(node, next[node]),
        });
        next[node] += 1;
    }
    v
}
