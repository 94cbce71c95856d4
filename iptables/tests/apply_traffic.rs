//! Packets prove it: two namespaces joined by a veth pair, policy applied in the server's
//! namespace, TCP connects from the client. An allowed source connects, a denied one is dropped,
//! and a set membership change flips the verdict without touching the rules.

mod support;

use felixrs_test_support::netns::VethPair;
use iptables::apply::{Applier, ApplierConfig, Backend};
use iptables::desired::{
    DesiredState, DesiredTable, HookPosition, IpSetKind, IpSetSpec, IpVersion, TableName,
};
use support::desired::{mk_hook, mk_net, mk_rules};
use support::tcp;
use support::{require_kernel_tools, runner};

const ALLOWED: &str = "cali40s:allowed-clients";
const PORT: u16 = 8080;

/// Server-side policy: established back in, port 8080 only from the allowed set, drop the rest
/// of the port; other ports are left alone (the rules only cover 8080 and 8081).
fn mk_policy(allowed: &[&str]) -> DesiredState {
    let mut s = DesiredState::new(IpVersion::V4);
    let mut t = DesiredTable::default();
    let allow =
        format!("-p tcp -m set --match-set {ALLOWED} src -m multiport --dports {PORT} -j ACCEPT");
    t.chains.insert(
        "cali-INPUT".into(),
        mk_rules(
            "cali-INPUT",
            &[
                "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-j cali-pi-_allow-clients",
                "-p tcp -m multiport --dports 8080,8081 -m comment --comment \"default deny\" -j DROP",
            ],
        ),
    );
    t.chains.insert(
        "cali-pi-_allow-clients".into(),
        mk_rules("cali-pi-_allow-clients", &[allow.as_str()]),
    );
    t.hooks = vec![mk_hook("INPUT", "-j cali-INPUT", HookPosition::Top)];
    s.tables.insert(TableName::Filter, t);
    s.ip_sets.insert(
        ALLOWED.into(),
        IpSetSpec::new(IpSetKind::Net, allowed.iter().map(|a| mk_net(a))),
    );
    s
}

fn allow_and_deny(backend: Backend) {
    require_kernel_tools();
    let pair = VethPair::new();
    tcp::serve(&pair.b, VethPair::ADDR_B, PORT);
    tcp::serve(&pair.b, VethPair::ADDR_B, PORT + 1);
    tcp::serve(&pair.b, VethPair::ADDR_B, PORT + 2);
    assert!(
        tcp::connects_eventually(&pair.a, VethPair::ADDR_B, PORT),
        "no connectivity before any policy"
    );

    let mut applier = Applier::new(
        runner(&pair.b),
        ApplierConfig {
            backend,
            ..ApplierConfig::default()
        },
    );
    applier
        .apply(&mk_policy(&[&format!("{}/32", VethPair::ADDR_A)]))
        .unwrap();
    assert!(
        tcp::connects_eventually(&pair.a, VethPair::ADDR_B, PORT),
        "allowed client was dropped"
    );
    assert!(
        !tcp::connects(&pair.a, VethPair::ADDR_B, PORT + 1),
        "port outside the policy was not dropped"
    );
    assert!(
        tcp::connects_eventually(&pair.a, VethPair::ADDR_B, PORT + 2),
        "a port the rules do not cover was dropped"
    );

    // Only the set changes: the client is no longer allowed.
    let report = applier.apply(&mk_policy(&["10.99.0.200/32"])).unwrap();
    assert!(
        report.iptables.is_empty(),
        "rules rewritten for a member change"
    );
    assert!(
        !tcp::connects(&pair.a, VethPair::ADDR_B, PORT),
        "removed client still connects"
    );

    applier.apply(&mk_policy(&["10.99.0.0/24"])).unwrap();
    assert!(
        tcp::connects_eventually(&pair.a, VethPair::ADDR_B, PORT),
        "client in allowed subnet was dropped"
    );

    // Removing all of our state restores the namespace's open default.
    applier.apply(&DesiredState::new(IpVersion::V4)).unwrap();
    assert!(tcp::connects_eventually(
        &pair.a,
        VethPair::ADDR_B,
        PORT + 1
    ));
}

#[test]
fn allow_passes_and_deny_drops_nft() {
    allow_and_deny(Backend::Nft);
}

#[test]
fn allow_passes_and_deny_drops_legacy() {
    allow_and_deny(Backend::Legacy);
}
