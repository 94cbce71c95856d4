//! The IPv6 pass: the same pods probed on their IPv6 addresses. A representative subset of
//! [`crate::cases::all`] runs unchanged (same policies, same expectations: NetworkPolicy is
//! family-agnostic except for ipBlock), plus ipBlock cases written for IPv6, whose expectations differ
//! from their IPv4 counterparts because an ipBlock only ever matches addresses of its own family, and
//! Calico-native ICMPv6 cases (an ICMPv6 rule admits ping6; an ICMP rule is IPv4-only).

use crate::cases::{self, Case, GNP_ICMP_ONLY_INTO_Z, PING, Step, T80, U80};

/// Cases of [`cases::all`] that also run over IPv6: default deny (TCP and ICMPv6 echo), podSelector,
/// namespaceSelector, numbered and named ports (named ports are IP-and-port sets), UDP, and egress
/// deny (with neighbour caches flushed, which proves neighbour discovery survives the deny).
pub const SHARED: [&str; 10] = [
    "default-deny-ingress",
    "default-deny-all",
    "allow from pods in the same namespace by podSelector",
    "allow from a namespace by namespaceSelector",
    "ingress on a specific port from a namespace",
    "named port ingress",
    "named port egress",
    "UDP port",
    "deny egress from one pod",
    "default-deny-ingress also drops ping",
];

const EGRESS_XA_TO_V6_CIDR_EXCEPT_XB: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-cidr-v6, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 'fd78::/16', except: ['__XB6__/128']}}]}]
"#;

const INGRESS_XA_FROM_V6_NODE1_PODS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ingress-cidr-v6, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{ipBlock: {cidr: 'fd78:1::/64'}}]}]
"#;

const EGRESS_XA_TO_V4_CIDR: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-cidr-v4, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}}]}]
"#;

const EGRESS_XA_TO_BOTH_FAMILIES_EXCEPT_XB: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-cidr-dual, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: 10.78.0.0/16, except: [__XB__/32]}
    - ipBlock: {cidr: 'fd78::/16', except: ['__XB6__/128']}
"#;

const GNP_ICMPV6_ONLY_INTO_Z: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: icmpv6-only-z}
spec:
  order: 10
  selector: projectcalico.org/namespace == 'z'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: ICMPv6
    icmp: {type: 128}
"#;

/// The IPv6 pass, in the order it runs.
pub fn all() -> Vec<Case> {
    let mut shared: Vec<Case> = cases::all()
        .into_iter()
        .filter(|c| SHARED.contains(&c.name))
        .collect();
    assert_eq!(
        shared.len(),
        SHARED.len(),
        "every SHARED name is a case of cases::all"
    );
    shared.extend([
        Case {
            name: "egress to an IPv6 ipBlock with except",
            steps: vec![Step::new(
                vec![EGRESS_XA_TO_V6_CIDR_EXCEPT_XB],
                vec![T80, PING],
                |e| {
                    e.deny("x/a", "x/b");
                },
            )],
        },
        Case {
            name: "ingress from an IPv6 ipBlock (node-1's pod range)",
            steps: vec![Step::new(
                vec![INGRESS_XA_FROM_V6_NODE1_PODS],
                vec![T80],
                |e| {
                    // x/a is on node-1; pods alternate nodes in layout order: x/a x/b x/c y/a ... z/c.
                    e.deny("*/*", "x/a");
                    for p in ["x/c", "y/b", "z/a", "z/c"] {
                        e.allow(p, "x/a");
                    }
                },
            )],
        },
        Case {
            name: "an IPv4 ipBlock admits no IPv6 traffic",
            steps: vec![Step::new(vec![EGRESS_XA_TO_V4_CIDR], vec![T80], |e| {
                e.deny("x/a", "*/*");
            })],
        },
        Case {
            name: "ipBlocks of both families with except",
            steps: vec![Step::new(
                vec![EGRESS_XA_TO_BOTH_FAMILIES_EXCEPT_XB],
                vec![T80],
                |e| {
                    e.deny("x/a", "x/b");
                },
            )],
        },
        Case {
            name: "calico: an ICMPv6-only policy admits ping and denies TCP and UDP",
            steps: vec![Step::new(
                vec![GNP_ICMPV6_ONLY_INTO_Z],
                vec![T80, U80, PING],
                |e| {
                    e.set("*/*", "z/*", &[T80, U80], false);
                },
            )],
        },
        Case {
            name: "calico: an ICMP (IPv4) rule admits no ICMPv6 echo",
            steps: vec![Step::new(
                vec![GNP_ICMP_ONLY_INTO_Z],
                vec![T80, PING],
                |e| {
                    e.deny("*/*", "z/*");
                },
            )],
        },
    ]);
    shared
}
