//! L3 default deny and Calico ICMP rules on the datapath, IPv4 and IPv6 (issue 11): a pod isolated
//! by policy is isolated for every protocol (TCP, UDP, ICMP/ICMPv6 echo and a bare IP protocol,
//! [`RAW`]), and Calico v3 rules with `protocol: ICMP`/`ICMPv6`, `icmp: {type, code}`, `notICMP`,
//! `notProtocol` and a protocol by number admit exactly what they say. The user story: "allow only
//! ICMP to these pods, for health monitoring, and deny everything else" as one GlobalNetworkPolicy.
//!
//! The same model as [`crate::cases`] (namespaces x, y, z; pods a, b, c). Each case runs over the
//! family it is listed with; an ICMP probe is an ICMPv6 echo over IPv6, and [`PING_CODE3`] is an
//! echo request with code 3 (the kernel answers it like any echo), which type/code rules tell apart.

use crate::cases::{Case, Step, T80, U80};
use crate::traffic::{Probe, Proto, RAW_PROTO};
use crate::world::Family;

/// ICMP echo (ICMPv6 echo over IPv6), code 0: a normal ping.
pub const PING: Probe = crate::cases::PING;

/// An echo request with ICMP code 3.
pub const PING_CODE3: Probe = Probe {
    port: 3,
    proto: Proto::Icmp,
};

/// One datagram of the bare IP protocol [`RAW_PROTO`].
pub const RAW: Probe = Probe {
    port: RAW_PROTO as u16,
    proto: Proto::Ip,
};

/// One datagram of IP protocol 99.
pub const RAW99: Probe = Probe {
    port: 99,
    proto: Proto::Ip,
};

/// Every protocol the cases probe.
pub const EVERY: [Probe; 4] = [T80, U80, PING, RAW];

const DENY_INGRESS_X: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-ingress, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
"#;

const DENY_EGRESS_X: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress, namespace: x}
spec: {podSelector: {}, policyTypes: [Egress]}
"#;

const ALLOW_XA_TCP_80_ONLY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: tcp-80-only, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{ports: [{port: 80, protocol: TCP}]}]
"#;

/// The user story: pods in namespace y answer health checks (ICMP and ICMPv6 echo, any code) and
/// nothing else, in or out. README.md shows this very policy (a test keeps them equal).
pub const GNP_HEALTH_ICMP_ONLY_Y: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: health-icmp-only}
spec:
  selector: projectcalico.org/namespace == 'y'
  types: [Ingress, Egress]          # no egress rules: nothing out (replies ride on conntrack)
  ingress:
  - {action: Allow, protocol: ICMP, icmp: {type: 8}}      # echo request, IPv4
  - {action: Allow, protocol: ICMPv6, icmp: {type: 128}}  # echo request, IPv6
"#;

const GNP_ECHO_CODE0_INTO_Z: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: echo-code-0-z}
spec:
  order: 10
  selector: projectcalico.org/namespace == 'z'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: ICMP
    icmp: {type: 8, code: 0}
  - action: Allow
    protocol: ICMPv6
    icmp: {type: 128, code: 0}
"#;

const GNP_NOT_ECHO_CODE3_INTO_Z: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: not-echo-code-3-z}
spec:
  order: 10
  selector: projectcalico.org/namespace == 'z'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: ICMP
    notICMP: {type: 8, code: 3}
  - action: Allow
    protocol: ICMPv6
    notICMP: {type: 128, code: 3}
"#;

const GNP_ECHO_REPLY_ONLY_INTO_Z: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: echo-reply-only-z}
spec:
  order: 10
  selector: projectcalico.org/namespace == 'z'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: ICMP
    icmp: {type: 0}
  - action: Allow
    protocol: ICMPv6
    icmp: {type: 129}
"#;

const GNP_NOT_TCP_INTO_Z: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: not-tcp-z}
spec:
  order: 10
  selector: projectcalico.org/namespace == 'z'
  types: [Ingress]
  ingress:
  - action: Allow
    notProtocol: TCP
"#;

const GNP_PROTOCOL_253_INTO_Z: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: protocol-253-z}
spec:
  order: 10
  selector: projectcalico.org/namespace == 'z'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: 253
"#;

const GNP_PROTOCOL_99_INTO_Z: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: protocol-99-z}
spec:
  order: 10
  selector: projectcalico.org/namespace == 'z'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: 99
"#;

const TIER_MONITORING: &str = r#"
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: monitoring}
spec: {order: 100}
"#;

/// In tier monitoring (default action Deny): ICMP from x is denied, other ICMP allowed, and every
/// other packet passed on to the default tier.
const GNP_MONITORING_ICMP_INTO_Z: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: monitoring.icmp-into-z}
spec:
  tier: monitoring
  order: 10
  selector: projectcalico.org/namespace == 'z'
  types: [Ingress]
  ingress:
  - {action: Deny, protocol: ICMP, source: {namespaceSelector: ns == 'x'}}
  - {action: Deny, protocol: ICMPv6, source: {namespaceSelector: ns == 'x'}}
  - {action: Allow, protocol: ICMP}
  - {action: Allow, protocol: ICMPv6}
  - {action: Pass}
"#;

const NP_Z_FROM_Y: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-y, namespace: z}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
"#;

const GNP_DENY_ICMP_FROM_X_INTO_Z: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: deny-icmp-x-to-z}
spec:
  order: 10
  selector: projectcalico.org/namespace == 'z'
  types: [Ingress]
  ingress:
  - action: Deny
    protocol: ICMP
    source: {namespaceSelector: ns == 'x'}
  - action: Deny
    protocol: ICMPv6
    source: {namespaceSelector: ns == 'x'}
  - action: Allow
"#;

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "default-deny-ingress isolates every protocol",
            steps: vec![Step::new(vec![DENY_INGRESS_X], EVERY.to_vec(), |e| {
                e.deny("*/*", "x/*");
            })],
        },
        Case {
            name: "default-deny-egress isolates every protocol",
            steps: vec![Step::new(vec![DENY_EGRESS_X], EVERY.to_vec(), |e| {
                e.deny("x/*", "*/*");
            })],
        },
        Case {
            name: "a TCP-port policy admits no ICMP and no other IP protocol",
            steps: vec![Step::new(vec![ALLOW_XA_TCP_80_ONLY], EVERY.to_vec(), |e| {
                e.set("*/*", "x/a", &[U80, PING, RAW], false);
            })],
        },
        Case {
            name: "calico: health monitoring, only ICMP in and nothing out",
            steps: vec![Step::new(
                vec![GNP_HEALTH_ICMP_ONLY_Y],
                vec![T80, U80, PING, PING_CODE3, RAW],
                |e| {
                    e.set("*/*", "y/*", &[T80, U80, RAW], false);
                    e.deny("y/*", "*/*");
                },
            )],
        },
        Case {
            name: "calico: icmp type and code admit only that echo",
            steps: vec![Step::new(
                vec![GNP_ECHO_CODE0_INTO_Z],
                vec![T80, PING, PING_CODE3, RAW],
                |e| {
                    e.set("*/*", "z/*", &[T80, PING_CODE3, RAW], false);
                },
            )],
        },
        Case {
            name: "calico: notICMP excludes one type and code",
            steps: vec![Step::new(
                vec![GNP_NOT_ECHO_CODE3_INTO_Z],
                vec![T80, PING, PING_CODE3],
                |e| {
                    e.set("*/*", "z/*", &[T80, PING_CODE3], false);
                },
            )],
        },
        Case {
            name: "calico: an echo-reply rule admits no echo request",
            steps: vec![Step::new(
                vec![GNP_ECHO_REPLY_ONLY_INTO_Z],
                vec![T80, PING],
                |e| {
                    e.deny("*/*", "z/*");
                },
            )],
        },
        Case {
            name: "calico: notProtocol TCP admits UDP, ICMP and other protocols",
            steps: vec![Step::new(vec![GNP_NOT_TCP_INTO_Z], EVERY.to_vec(), |e| {
                e.set("*/*", "z/*", &[T80], false);
            })],
        },
        Case {
            name: "calico: a protocol by number admits only that protocol",
            steps: vec![
                Step::new(
                    vec![GNP_PROTOCOL_253_INTO_Z],
                    vec![T80, U80, PING, RAW, RAW99],
                    |e| {
                        e.set("*/*", "z/*", &[T80, U80, PING, RAW99], false);
                    },
                ),
                Step::new(vec![GNP_PROTOCOL_99_INTO_Z], vec![T80, RAW, RAW99], |e| {
                    e.set("*/*", "z/*", &[T80, RAW], false);
                }),
            ],
        },
        Case {
            name: "calico: a tier denies ICMP from one namespace, allows the rest, passes the others to NetworkPolicy",
            steps: vec![Step::new(
                vec![TIER_MONITORING, GNP_MONITORING_ICMP_INTO_Z, NP_Z_FROM_Y],
                vec![T80, PING, RAW],
                |e| {
                    e.deny("x/*", "z/*");
                    e.set("z/*", "z/*", &[T80, RAW], false);
                },
            )],
        },
        Case {
            name: "calico: Deny ICMP from one namespace before Allow",
            steps: vec![Step::new(
                vec![GNP_DENY_ICMP_FROM_X_INTO_Z],
                vec![T80, PING],
                |e| {
                    e.set("x/*", "z/*", &[PING], false);
                },
            )],
        },
    ]
}

/// Every case with the family it runs over: each case over IPv4, then over IPv6.
pub fn all() -> Vec<(Family, Case)> {
    let mut out: Vec<(Family, Case)> = cases().into_iter().map(|c| (Family::V4, c)).collect();
    out.extend(cases().into_iter().map(|c| (Family::V6, c)));
    out
}

/// The cases of one family.
pub fn of(family: Family) -> Vec<Case> {
    all()
        .into_iter()
        .filter(|(f, _)| *f == family)
        .map(|(_, c)| c)
        .collect()
}
