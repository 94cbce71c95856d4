//! Packets prove it: two namespaces joined by a veth pair, policy applied in the server's
//! namespace, TCP connects from the client. An allowed source connects, a denied one is dropped,
//! and a set membership change flips the verdict without touching the rules.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use iptables::apply::{
    Applier, ApplierConfig, Backend, DesiredState, DesiredTable, HookPosition, IpSetKind,
    IpSetSpec, IpVersion, TableName,
};
use support::desired::{mk_hook, mk_net, mk_rules};
use support::netns::{ADDR_A, ADDR_B, Netns, VethPair};

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

/// Starts an echo-once TCP server inside `ns` on `ADDR_B:port`, serving forever on a thread.
fn serve(ns: &Netns, port: u16) {
    let listener = ns.in_thread(move || {
        TcpListener::bind(SocketAddr::new(ADDR_B.parse().unwrap(), port)).expect("bind in netns")
    });
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let _ = conn.write_all(b"ok");
        }
    });
}

/// Whether a TCP connect from `ns` to `ADDR_B:port` completes (and the server answers).
fn connects(ns: &Netns, port: u16) -> bool {
    ns.in_thread(move || {
        let addr = SocketAddr::new(ADDR_B.parse().unwrap(), port);
        match TcpStream::connect_timeout(&addr, Duration::from_millis(700)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_millis(700)))
                    .unwrap();
                let mut buf = [0u8; 2];
                s.read_exact(&mut buf).is_ok() && &buf == b"ok"
            }
            Err(_) => false,
        }
    })
}

fn allow_and_deny(backend: Backend) {
    let pair = VethPair::new();
    serve(&pair.b, PORT);
    serve(&pair.b, PORT + 1);
    serve(&pair.b, PORT + 2);
    assert!(connects(&pair.a, PORT), "no connectivity before any policy");

    let mut applier = Applier::new(
        pair.b.runner(),
        ApplierConfig {
            backend,
            ..ApplierConfig::default()
        },
    );
    applier
        .apply(&mk_policy(&[&format!("{ADDR_A}/32")]))
        .unwrap();
    assert!(connects(&pair.a, PORT), "allowed client was dropped");
    assert!(
        !connects(&pair.a, PORT + 1),
        "port outside the policy was not dropped"
    );
    assert!(
        connects(&pair.a, PORT + 2),
        "a port the rules do not cover was dropped"
    );

    // Only the set changes: the client is no longer allowed.
    let report = applier.apply(&mk_policy(&["10.99.0.200/32"])).unwrap();
    assert!(
        report.iptables.is_empty(),
        "rules rewritten for a member change"
    );
    assert!(!connects(&pair.a, PORT), "removed client still connects");

    applier.apply(&mk_policy(&["10.99.0.0/24"])).unwrap();
    assert!(
        connects(&pair.a, PORT),
        "client in allowed subnet was dropped"
    );

    // Removing all of our state restores the namespace's open default.
    applier.apply(&DesiredState::new(IpVersion::V4)).unwrap();
    assert!(connects(&pair.a, PORT + 1));
}

#[test]
fn allow_passes_and_deny_drops_nft() {
    allow_and_deny(Backend::Nft);
}

#[test]
fn allow_passes_and_deny_drops_legacy() {
    allow_and_deny(Backend::Legacy);
}
