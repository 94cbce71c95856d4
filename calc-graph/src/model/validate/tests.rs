//! Unit tests of resource validation: exact messages and paths for each rule.

use super::*;
use serde_json::{Value, json};

fn mk_resource(v: Value) -> Resource {
    Resource::from_json(&serde_json::to_vec(&v).unwrap()).unwrap()
}

fn mk_np(ingress: Value) -> Resource {
    mk_resource(json!({
        "apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {"selector": "app == 'web'", "ingress": ingress}
    }))
}

fn errors(r: &Resource) -> Vec<String> {
    r.validate()
        .err()
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn reversed_port_range_names_resource_and_path() {
    let r = mk_np(json!([
        {"action": "Allow"},
        {"action": "Allow"},
        {"action": "Allow", "protocol": "TCP", "destination": {"ports": ["90:80"]}}
    ]));
    assert_eq!(
        errors(&r),
        vec![
            "networkpolicies/prod/web: spec.ingress[2].destination.ports[0]: port range 90:80 is reversed"
        ]
    );
}

#[test]
fn valid_policy_passes() {
    let r = mk_np(json!([{
        "action": "Allow", "protocol": "TCP", "ipVersion": 4,
        "source": {"nets": ["10.0.0.0/8"], "selector": "role == 'fe'",
                   "serviceAccounts": {"names": ["api"]}},
        "destination": {"ports": [80, "8000:8080", "http"], "notPorts": [8001]},
        "http": {"methods": ["GET"], "paths": [{"prefix": "/api"}]},
        "metadata": {"annotations": {"owner": "team a"}}
    }, {
        "action": "Deny", "protocol": "ICMPv6", "icmp": {"type": 128, "code": 0},
        "destination": {"nets": ["fd00::/8"]}
    }]));
    assert_eq!(r.validate(), Ok(()));
}

fn assert_errors(r: &Resource, prefix: &str, want: &[&str]) {
    let got = errors(r);
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            g.starts_with(&format!("{prefix}: {w}")),
            "{g}\n  wanted {w}"
        );
    }
}

#[test]
fn every_problem_is_reported() {
    let r = mk_np(json!([
        {"action": "Allow", "destination": {"ports": [80]}},
        {"action": "Allow", "protocol": "ICMP", "source": {"ports": [1]}},
        {"action": "Allow", "protocol": "UDP", "icmp": {"type": 8}},
        {"action": "Allow", "protocol": "ICMP", "icmp": {"code": 1}},
        {"action": "Allow", "protocol": "ICMP", "ipVersion": 6},
        {"action": "Allow", "ipVersion": 6, "source": {"notNets": ["10.0.0.0/8"]}},
        {"action": "Allow", "source": {"nets": ["10.0.0.0/8"]}, "destination": {"nets": ["fd00::/8"]}},
        {"action": "Allow", "protocol": "TCP", "destination": {"ports": ["Bad_Name", 0, "0:10"]}},
        {"action": "Deny", "protocol": "UDP", "http": {"methods": ["GET", "GET"], "paths": [{}, {"exact": "x?y"}]}},
        {"action": "Allow", "source": {"services": {"name": "db"}, "selector": "a == 'b'"}},
        {"action": "Allow", "metadata": {"annotations": {"k": "line\nbreak"}}},
        {"action": "Allow", "protocol": "ICMP", "notICMP": {"type": 255}},
        {"action": "Allow", "protocol": 0, "notProtocol": "ICMPv6", "ipVersion": 4},
        {"action": "Allow", "source": {"selector": "global()", "namespaceSelector": "global() && a == 'b'"}},
        {"action": "Allow", "protocol": "TCP", "destination": {"services": {"name": "db"}, "ports": [80]}}
    ]));
    assert_errors(
        &r,
        "networkpolicies/prod/web",
        &[
            "spec.ingress[0].destination.ports: ports require protocol TCP, UDP, SCTP or UDPLite",
            "spec.ingress[1].source.ports: protocol ICMP does not support ports",
            "spec.ingress[2].icmp: icmp is only valid with protocol ICMP or ICMPv6",
            "spec.ingress[3].icmp.code: code requires type",
            "spec.ingress[4].ipVersion: ipVersion must be 4 with protocol ICMP",
            "spec.ingress[5].source.notNets[0]: 10.0.0.0/8 is IPv4 but the rule has ipVersion 6",
            "spec.ingress[6].destination.nets: rule contains both IPv4 and IPv6 CIDRs",
            "spec.ingress[7].destination.ports[0]: named port \"Bad_Name\"",
            "spec.ingress[7].destination.ports[1]: port 0 is invalid: port numbers must be 1-65535",
            "spec.ingress[7].destination.ports[2]: port 0:10 is invalid",
            "spec.ingress[8].http: http match is only valid on Allow rules",
            "spec.ingress[8].http: http match is only valid with protocol TCP or no protocol",
            "spec.ingress[8].http.methods[1]: method \"GET\" is listed more than once",
            "spec.ingress[8].http.paths[0]: exactly one of exact or prefix must be set",
            "spec.ingress[8].http.paths[1]: invalid path \"x?y\"",
            "spec.ingress[9].source.services: services cannot be combined with selector/notSelector",
            "spec.ingress[10].metadata.annotations[\"k\"]: annotation value must not contain control characters",
            "spec.ingress[11].notICMP.type: type must be 0-254, got 255",
            "spec.ingress[12].protocol: protocol number 0 is invalid",
            "spec.ingress[12].ipVersion: ipVersion must be 6 with notProtocol ICMPv6",
            "spec.ingress[13].source.selector: global() can only be used in a rule's namespaceSelector",
            "spec.ingress[13].source.namespaceSelector: global() cannot be combined with other selectors",
            "spec.ingress[14].destination.services: destination ports and notPorts cannot be combined with services",
            "spec.ingress[14].destination.services: services are not allowed in the destination of an ingress rule",
        ],
    );
}

#[test]
fn services_and_http_by_direction() {
    let r = mk_resource(json!({
        "kind": "GlobalNetworkPolicy", "metadata": {"name": "svc"},
        "spec": {
            "ingress": [{"action": "Allow", "source": {"services": {"name": "api"}}}],
            "egress": [
                {"action": "Allow", "source": {"services": {"name": "x", "namespace": "n"}}},
                {"action": "Allow", "destination": {"services": {"name": "db"}}},
                {"action": "Allow", "http": {"methods": ["GET"]}}
            ]
        }
    }));
    assert_errors(
        &r,
        "globalnetworkpolicies/svc",
        &[
            "spec.ingress[0].source.services.namespace: a global policy must give the service's namespace",
            "spec.egress[0].source.services: services are not allowed in the source of an egress rule",
            "spec.egress[1].destination.services.namespace: a global policy must give the service's namespace",
            "spec.egress[2].http: http match is not allowed in egress rules",
        ],
    );
    // Profiles carry no direction restrictions on services or http.
    let r = mk_resource(json!({
        "kind": "Profile", "metadata": {"name": "p"},
        "spec": {"egress": [{"action": "Allow", "http": {"methods": ["GET"]},
                             "source": {"services": {"name": "x"}}}]}
    }));
    assert_eq!(r.validate(), Ok(()));
}

#[test]
fn policy_names_per_kind() {
    let r = mk_resource(
        json!({"kind": "NetworkPolicy", "metadata": {"name": "a.b.c", "namespace": "n"}}),
    );
    assert_errors(
        &r,
        "networkpolicies/n/a.b.c",
        &["metadata.name: policy name \"a.b.c\" must be"],
    );
    let r =
        mk_resource(json!({"kind": "GlobalNetworkPolicy", "metadata": {"name": "knp.default.x"}}));
    assert_errors(
        &r,
        "globalnetworkpolicies/knp.default.x",
        &["metadata.name: policy name"],
    );
    let r = mk_resource(json!({"kind": "Profile", "metadata": {"name": "ksa.prod.sa.with.dots"}}));
    assert_eq!(r.validate(), Ok(()));
}

#[test]
fn network_sets_cannot_claim_a_namespace_label() {
    let r = mk_resource(json!({
        "kind": "GlobalNetworkSet",
        "metadata": {"name": "g", "labels": {"projectcalico.org/namespace": "prod"}}
    }));
    assert_errors(
        &r,
        "globalnetworksets/g",
        &[
            "metadata.labels[\"projectcalico.org/namespace\"]: projectcalico.org/namespace is reserved",
        ],
    );
}

#[test]
fn staged_delete_must_be_empty() {
    let r = mk_resource(json!({
        "kind": "StagedGlobalNetworkPolicy", "metadata": {"name": "s"},
        "spec": {"stagedAction": "Delete", "tier": "security"}
    }));
    assert_eq!(r.validate(), Ok(()));
    let r = mk_resource(json!({
        "kind": "StagedGlobalNetworkPolicy", "metadata": {"name": "s"},
        "spec": {"stagedAction": "Delete", "selector": "all()"}
    }));
    assert_errors(
        &r,
        "stagedglobalnetworkpolicies/s",
        &["spec: with stagedAction Delete every spec field except tier must be empty"],
    );
    let r = mk_resource(json!({
        "kind": "StagedKubernetesNetworkPolicy", "metadata": {"name": "k", "namespace": "n"},
        "spec": {"stagedAction": "Delete", "podSelector": {}}
    }));
    assert_errors(
        &r,
        "stagedkubernetesnetworkpolicies/n/k",
        &["spec: with stagedAction Delete"],
    );
}

#[test]
fn metadata_rules() {
    let r = mk_resource(json!({
        "kind": "NetworkPolicy",
        "metadata": {"name": "Web/x", "labels": {"ok": "v", "bad key": "v", "k": "bad value"},
                     "annotations": {"a/b/c": "x"}}
    }));
    let got = errors(&r);
    assert!(
        got[0].starts_with(
            "networkpolicies/\"Web/x\": metadata.name: \"Web/x\" must not contain '/'"
        ),
        "{got:#?}"
    );
    assert!(got[1].contains("metadata.namespace: namespace is required for a NetworkPolicy"));
    assert!(got[2].contains(
        "metadata.labels[\"bad key\"]: label key \"bad key\" must not contain whitespace"
    ));
    assert!(got[3].contains("metadata.labels[\"k\"]: label value \"bad value\" contains ' '"));
    assert!(
        got[4]
            .contains("metadata.annotations[\"a/b/c\"]: label key \"a/b/c\" has more than one '/'")
    );
    assert_eq!(got.len(), 5);

    let r = mk_resource(json!({
        "kind": "GlobalNetworkSet", "metadata": {"name": "g", "namespace": "x"}
    }));
    assert_eq!(
        errors(&r),
        vec![
            "globalnetworksets/g: metadata.namespace: a GlobalNetworkSet is cluster-scoped and cannot have a namespace (got \"x\")"
        ]
    );
}

#[test]
fn global_policy_flags() {
    let r = mk_resource(json!({
        "kind": "GlobalNetworkPolicy", "metadata": {"name": "host"},
        "spec": {"tier": "Security.Tier", "doNotTrack": true, "preDNAT": true,
                 "types": ["Ingress", "Egress", "Ingress"], "egress": [{"action": "Deny"}],
                 "performanceHints": ["Fast"]}
    }));
    let got = errors(&r);
    let want = [
        "globalnetworkpolicies/host: spec.tier: tier name \"Security.Tier\" contains 'S'",
        "globalnetworkpolicies/host: spec.types[2]: Ingress is listed more than once",
        "globalnetworkpolicies/host: spec.performanceHints[0]: unknown performance hint \"Fast\"",
        "globalnetworkpolicies/host: spec.preDNAT: preDNAT and doNotTrack cannot both be true",
        "globalnetworkpolicies/host: spec.egress: a preDNAT policy cannot have egress rules",
        "globalnetworkpolicies/host: spec.types[1]: a preDNAT policy cannot have type Egress",
        "globalnetworkpolicies/host: spec.applyOnForward: applyOnForward must be true",
    ];
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for (g, w) in got.iter().zip(want) {
        assert!(g.starts_with(w), "{g}\n  wanted {w}");
    }
}

/// Both policy kinds share one spec type; a NetworkPolicy built in code with a global-only field
/// is refused (a NetworkPolicy document with one is refused as an unknown field when decoded).
#[test]
fn network_policy_refuses_global_only_fields() {
    let Resource::NetworkPolicy(mut p) = mk_np(json!([])) else {
        unreachable!()
    };
    p.spec.do_not_track = true;
    p.spec.apply_on_forward = true;
    p.spec.namespace_selector = Some("all()".into());
    assert_eq!(
        errors(&Resource::NetworkPolicy(p)),
        vec![
            "networkpolicies/prod/web: spec.doNotTrack: only a GlobalNetworkPolicy has this field",
            "networkpolicies/prod/web: spec.applyOnForward: only a GlobalNetworkPolicy has this field",
            "networkpolicies/prod/web: spec.namespaceSelector: only a GlobalNetworkPolicy has this field",
        ]
    );
    let doc = json!({"kind": "NetworkPolicy", "metadata": {"name": "web", "namespace": "prod"},
                     "spec": {"preDNAT": true}});
    let e = Resource::from_json(&serde_json::to_vec(&doc).unwrap()).unwrap_err();
    assert!(e.to_string().contains("spec.preDNAT"), "{e}");
}

#[test]
fn builtin_tier_orders_are_fixed() {
    let r = mk_resource(json!({"kind": "Tier", "metadata": {"name": "default"},
                               "spec": {"order": 100, "defaultAction": "Deny"}}));
    assert_errors(
        &r,
        "tiers/default",
        &["spec.order: the built-in tier default must have order 1000000"],
    );
    let r = mk_resource(json!({"kind": "Tier", "metadata": {"name": "default"},
                               "spec": {"order": 1000000}}));
    assert_eq!(r.validate(), Ok(()));
}

#[test]
fn tier_and_profile() {
    let r = mk_resource(json!({
        "kind": "Tier", "metadata": {"name": "security.x"},
        "spec": {"order": 100, "defaultAction": "Allow"}
    }));
    let got = errors(&r);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got[0]
            .starts_with("tiers/security.x: metadata.name: tier name \"security.x\" contains '.'")
    );
    assert_eq!(
        got[1],
        "tiers/security.x: spec.defaultAction: default action must be Deny or Pass, got Allow"
    );

    let r = mk_resource(json!({
        "kind": "Profile", "metadata": {"name": "kns.prod"},
        "spec": {"labelsToApply": {"pcns.projectcalico.org/name": "prod", "x": "a b"},
                 "egress": [{"action": "Allow", "protocol": "TCP", "source": {"ports": ["5:1"]}}]}
    }));
    let got = errors(&r);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert_eq!(
        got[0],
        "profiles/kns.prod: spec.egress[0].source.ports[0]: port range 5:1 is reversed"
    );
    assert!(
        got[1].starts_with("profiles/kns.prod: spec.labelsToApply[\"x\"]: label value \"a b\"")
    );
}

#[test]
fn endpoints() {
    let r = mk_resource(json!({
        "kind": "WorkloadEndpoint", "metadata": {"name": "n-k8s-p-eth0", "namespace": "ns"},
        "spec": {"node": "n", "pod": "p", "containerID": "abc def",
                 "ipNetworks": ["10.0.0.1", "10.1.0.0/24"],
                 "ipNATs": [{"internalIP": "10.0.0.2", "externalIP": "fd00::1"}],
                 "ipv4Gateway": "fe80::1", "profiles": ["kns.ns", "Bad"],
                 "interfaceName": "cali-this-is-too-long", "mac": "zz",
                 "ports": [{"name": "http", "protocol": "ICMP", "port": 0, "hostIP": "x"},
                           {"protocol": "TCP", "port": 80},
                           {"protocol": "UDP", "port": 53, "hostPort": 53}]}
    }));
    assert_errors(
        &r,
        "workloadendpoints/ns/n-k8s-p-eth0",
        &[
            "spec.containerID: container id \"abc def\" must be letters",
            "spec.ipNetworks[1]: 10.1.0.0/24 contains more than one address",
            "spec.ipNATs[0].externalIP: fd00::1 and internalIP 10.0.0.2 are of different IP versions",
            "spec.ipNATs[0].internalIP: 10.0.0.2 is not in the endpoint's ipNetworks",
            "spec.ipv4Gateway: invalid IPv4 address \"fe80::1\"",
            "spec.profiles[1]: name \"Bad\" contains 'B'",
            "spec.interfaceName: interface name \"cali-this-is-too-long\" is 21 characters long",
            "spec.mac: invalid MAC address \"zz\"",
            "spec.ports[0].protocol: protocol ICMP does not support ports",
            "spec.ports[0].port: port must be 1-65535, got 0",
            "spec.ports[0].hostIP: invalid IP address \"x\"",
            "spec.ports[1].name: name is required when no hostPort is set",
        ],
    );

    let r = mk_resource(json!({"kind": "HostEndpoint", "metadata": {"name": "h"}, "spec": {}}));
    assert_errors(
        &r,
        "hostendpoints/h",
        &[
            "spec.node: a host endpoint must name its node",
            "spec: a host endpoint must have an interfaceName or expectedIPs",
        ],
    );
    let r = mk_resource(json!({"kind": "HostEndpoint", "metadata": {"name": "h"},
                               "spec": {"node": "n", "interfaceName": "*",
                                        "ports": [{"protocol": "TCP", "port": 22}]}}));
    assert_errors(
        &r,
        "hostendpoints/h",
        &["spec.ports[0].name: name is required"],
    );
}

#[test]
fn staged_policies_validate_their_policy_spec() {
    let r = mk_resource(json!({
        "kind": "StagedNetworkPolicy", "metadata": {"name": "s", "namespace": "n"},
        "spec": {"stagedAction": "Set", "ingress": [{"action": "Allow", "icmp": {"type": 1}}]}
    }));
    assert_eq!(
        errors(&r),
        vec![
            "stagednetworkpolicies/n/s: spec.ingress[0].icmp: icmp is only valid with protocol ICMP or ICMPv6"
        ]
    );
}

fn mk_pool(spec: Value) -> Resource {
    mk_resource(json!({"kind": "IPPool", "metadata": {"name": "pool-a"}, "spec": spec}))
}

#[test]
fn ip_pools_follow_calicos_rules() {
    for ok in [
        json!({"cidr": "10.244.0.0/16", "natOutgoing": true, "nodeSelector": "all()"}),
        json!({"cidr": "fd00:10:244::/48", "vxlanMode": "Always", "blockSize": 122}),
        json!({"cidr": "10.78.1.8/30", "blockSize": 32}),
        json!({"cidr": "10.78.1.8/30", "disabled": true}),
        json!({"cidr": "203.0.113.0/24", "allowedUses": ["LoadBalancer"]}),
    ] {
        assert_eq!(mk_pool(ok.clone()).validate(), Ok(()), "{ok}");
    }
    let cases = [
        (json!({}), vec!["spec.cidr: cidr is required"]),
        (
            json!({"cidr": "10.0.0.1/8"}),
            vec![
                "spec.cidr: IPPool CIDR must be strictly masked: 10.0.0.1/8 has host bits set (the network is 10.0.0.0/8)",
            ],
        ),
        (
            json!({"cidr": "nope"}),
            vec!["spec.cidr: invalid CIDR \"nope\""],
        ),
        (
            json!({"cidr": "169.254.0.0/16"}),
            vec![
                "spec.cidr: IPPool CIDR 169.254.0.0/16 overlaps with the link-local range 169.254.0.0/16",
            ],
        ),
        (
            json!({"cidr": "10.0.0.0/8", "blockSize": 33}),
            vec!["spec.blockSize: blockSize must be between 20 and 32 for an IPv4 pool, got 33"],
        ),
        (
            json!({"cidr": "10.0.0.0/28"}),
            vec![
                "spec.cidr: IP pool size is too small for use with Calico IPAM: /28 is smaller than the block size /26",
            ],
        ),
        (
            json!({"cidr": "fd00::/64", "ipipMode": "Always"}),
            vec!["spec.ipipMode: IPIP is not supported on IPv6 pools"],
        ),
        (
            json!({"cidr": "10.0.0.0/8", "ipipMode": "Always", "vxlanMode": "CrossSubnet"}),
            vec!["spec.vxlanMode: ipipMode and vxlanMode cannot both be enabled"],
        ),
        (
            json!({"cidr": "10.0.0.0/8", "allowedUses": ["LoadBalancer", "Workload"]}),
            vec![
                "spec.allowedUses: LoadBalancer cannot be combined with Workload or Tunnel allowed uses",
            ],
        ),
        (
            json!({"cidr": "10.0.0.0/8", "nodeSelector": "a ==="}),
            vec!["spec.nodeSelector: invalid selector"],
        ),
    ];
    for (spec, want) in cases {
        let got = errors(&mk_pool(spec.clone()));
        assert_eq!(got.len(), want.len(), "{spec}: {got:#?}");
        for (g, w) in got.iter().zip(&want) {
            assert!(
                g.starts_with(&format!("ippools/pool-a: {w}")),
                "{spec}: {g}"
            );
        }
    }
}
