//! The renderer's real output applied to the kernel and proven with forwarded packets.
//!
//! Topology (three namespaces): client `A` (10.99.0.1) — `H`, the node, routing between its
//! uplink veth and the pod veth `cali12345` — pod `P` (10.98.0.2). The node gets the rendered
//! Felix-style ruleset; the pod's ingress policy allows TCP 8080 from the IP set `s:clients` only.

mod support;

use calc_graph::proto::*;
use felixrs_test_support::netns::{Netns, veth};
use iptables::apply::{Applier, ApplierConfig, Backend};
use iptables::desired::{IpVersion as V, TableName};
use iptables::render::{RenderConfig, Renderer};
use support::check::assert_in_sync;
use support::tcp;
use support::{kernel_netns, runner};

const POD: &str = "10.98.0.2";
const CLIENT: &str = "10.99.0.1";

struct Topology {
    client: Netns,
    node: Netns,
    pod: Netns,
}

fn mk_topology() -> Topology {
    let t = Topology {
        client: kernel_netns(),
        node: kernel_netns(),
        pod: kernel_netns(),
    };
    veth(&t.client, "fxa", &t.node, "fxh");
    veth(&t.pod, "eth0", &t.node, "cali12345");
    t.client
        .ok("ip", &["addr", "add", "10.99.0.1/24", "dev", "fxa"]);
    t.client
        .ok("ip", &["route", "add", "default", "via", "10.99.0.254"]);
    t.node
        .ok("ip", &["addr", "add", "10.99.0.254/24", "dev", "fxh"]);
    t.node
        .ok("ip", &["addr", "add", "10.98.0.1/24", "dev", "cali12345"]);
    t.node.ok("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    t.pod
        .ok("ip", &["addr", "add", "10.98.0.2/24", "dev", "eth0"]);
    t.pod
        .ok("ip", &["route", "add", "default", "via", "10.98.0.1"]);
    t
}

fn mk_policy_id() -> PolicyId {
    PolicyId {
        kind: PolicyKind::NetworkPolicy,
        tier: "default".into(),
        namespace: Some("default".into()),
        name: "allow-clients".into(),
    }
}

fn mk_outputs() -> Vec<Output> {
    let allow_all = ParsedRule {
        action: Some(Action::Allow),
        ..Default::default()
    };
    vec![
        Output::IpSetCreated {
            id: "s:clients".into(),
            kind: IpSetKind::Net,
            members: vec![IpSetMember::Net(format!("{CLIENT}/32").parse().unwrap())].into(),
        },
        Output::PolicyUpdated(ActivePolicy {
            id: mk_policy_id(),
            order: Some(1000.0),
            inbound_rules: vec![ParsedRule {
                action: Some(Action::Allow),
                protocol: Some(Protocol::Tcp),
                dst_ports: vec![PortRange {
                    first: 8080,
                    last: 8080,
                }],
                src_ip_set_ids: vec!["s:clients".into()],
                ..Default::default()
            }],
            outbound_rules: vec![],
            untracked: false,
            pre_dnat: false,
            apply_on_forward: false,
        }),
        Output::ProfileUpdated(ActiveProfile {
            id: "kns.default".into(),
            inbound_rules: vec![allow_all.clone()],
            outbound_rules: vec![allow_all],
        }),
        Output::EndpointUpdated(LocalEndpoint {
            id: EndpointId {
                namespace: "default".into(),
                name: "pod".into(),
            },
            interface_name: "cali12345".into(),
            ipv4_nets: vec![format!("{POD}/32").parse().unwrap()],
            ipv6_nets: vec![],
            tiers: vec![TierInfo {
                name: "default".into(),
                default_action: Action::Deny,
                ingress_policies: vec![mk_policy_id()],
                egress_policies: vec![],
            }],
            profile_ids: vec!["kns.default".into()],
            allow_spoofed_source_prefixes: vec![],
            staged_tiers: None,
        }),
        Output::InSync,
    ]
}

fn rendered_policy_enforces(backend: Backend) {
    let t = mk_topology();
    tcp::serve(&t.pod, POD, 8080);
    tcp::serve(&t.pod, POD, 8081);
    assert!(
        tcp::connects_eventually(&t.client, POD, 8081),
        "no routing before policy"
    );

    let mut renderer = Renderer::new(RenderConfig::default()).unwrap();
    assert!(renderer.apply_all(mk_outputs()).is_empty());
    assert!(renderer.flush().is_empty());
    let desired = renderer.desired(V::V4);
    assert!(desired.ip_sets.contains_key("cali40s:clients"));

    let mut applier = Applier::new(
        runner(&t.node),
        ApplierConfig {
            backend,
            ..ApplierConfig::default()
        },
    );
    let first = applier.apply(&desired).unwrap();
    assert!(first.iptables.contains_key(&TableName::Filter));
    let mode = applier.mode().unwrap();
    assert_in_sync(&t.node, mode, &desired);
    assert!(
        tcp::connects_eventually(&t.client, POD, 8080),
        "allowed port from allowed client dropped"
    );
    assert!(
        !tcp::connects(&t.client, POD, 8081),
        "port outside the policy not dropped"
    );
    assert!(applier.apply(&desired).unwrap().is_empty());

    // The client leaves the set: only the set changes, and the client is cut off.
    renderer
        .apply(Output::IpSetMembersRemoved {
            id: "s:clients".into(),
            members: vec![IpSetMember::Net(format!("{CLIENT}/32").parse().unwrap())],
        })
        .unwrap();
    assert!(renderer.flush().is_empty());
    let report = applier.apply(&renderer.desired(V::V4)).unwrap();
    assert!(report.iptables.is_empty(), "{report:?}");
    assert!(
        !tcp::connects(&t.client, POD, 8080),
        "client removed from the set still connects"
    );

    // The endpoint goes away: its interface now hits "Unknown interface" and stays dropped.
    renderer
        .apply(Output::EndpointRemoved(EndpointId {
            namespace: "default".into(),
            name: "pod".into(),
        }))
        .unwrap();
    renderer.flush();
    let gone = renderer.desired(V::V4);
    let report = applier.apply(&gone).unwrap();
    assert!(
        report.iptables[&TableName::Filter].contains("-X cali-tw-cali12345"),
        "{report:?}"
    );
    assert!(
        !tcp::connects(&t.client, POD, 8081),
        "unknown interface must be dropped"
    );
    assert_in_sync(&t.node, mode, &gone);
}

#[test]
fn rendered_policy_enforces_on_nft() {
    rendered_policy_enforces(Backend::Nft);
}

#[test]
fn rendered_policy_enforces_on_legacy() {
    rendered_policy_enforces(Backend::Legacy);
}

/// A node that real Felix programmed (corpus 002, a live Felix v3.30+ dump) is taken over: rules
/// whose ids equal Felix's are left alone (their counters survive), everything else of Calico's
/// (host-endpoint chains, the raw and mangle chains we do not program) is replaced or removed.
/// Of the raw table only our anti-spoofing `cali-PREROUTING` stays.
#[test]
fn takes_over_a_felix_node_keeping_identical_rules_and_their_counters() {
    let ns = kernel_netns();
    let path = felixrs_test_support::iptables_corpus_file(
        "002-calico-felix-cali-raw-nat-mangle-filter.kernel.txt",
    )
    .display()
    .to_string();
    let dump = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let dispatch = "-A cali-from-wl-dispatch -m comment --comment \"cali:zTj6P0TIgYvgz-md\"";
    assert!(dump.contains(dispatch), "corpus 002 changed");
    let with_counters = dump.replace(dispatch, &format!("[7:700] {dispatch}"));
    ns.feed("iptables-nft-restore", &["-c"], &with_counters);

    let mut renderer = Renderer::new(RenderConfig::default()).unwrap();
    renderer.apply(Output::InSync).unwrap();
    assert!(renderer.flush().is_empty());
    let desired = renderer.desired(V::V4);
    let mut applier = Applier::new(
        runner(&ns),
        ApplierConfig {
            backend: Backend::Nft,
            ..ApplierConfig::default()
        },
    );
    let report = applier.apply(&desired).unwrap();
    let filter = &report.iptables[&TableName::Filter];
    for kept in [
        "cali-from-wl-dispatch",
        "cali-to-wl-dispatch",
        "cali-wl-to-host",
    ] {
        assert!(
            !filter.contains(&format!("-R {kept} ")) && !filter.contains(&format!("-A {kept} ")),
            "{kept} rewritten although its ids equal Felix's:\n{filter}"
        );
    }
    assert!(filter.contains("-X cali-from-hep-forward"), "{filter}");
    assert!(report.iptables.contains_key(&TableName::Raw));
    assert!(report.iptables.contains_key(&TableName::Mangle));
    assert_in_sync(&ns, iptables::apply::Mode::Nft, &desired);
    let saved = ns.ok("iptables-nft-save", &["-c"]);
    assert!(saved.contains(&format!("[7:700] {dispatch}")), "{saved}");
    let mangle = ns.ok("iptables-nft-save", &["-t", "mangle"]);
    assert!(!mangle.contains("cali"), "{mangle}");
    // Of Felix's raw chains only ours remains: cali-PREROUTING with the anti-spoofing check.
    let raw = ns.ok("iptables-nft-save", &["-t", "raw"]);
    let ours: Vec<&str> = raw.lines().filter(|l| l.contains("cali")).collect();
    assert!(ours.iter().all(|l| l.contains("cali-PREROUTING")), "{raw}");
    assert!(
        raw.contains("-i cali+") && raw.contains("-m rpfilter --invert -j DROP"),
        "{raw}"
    );
    assert!(applier.refresh(&desired).unwrap().is_empty());
}
