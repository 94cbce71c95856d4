//! The agent protects its host without locking the operator out: real etcd and the real kernel
//! in a namespace the test creates (the "host"), a veth to a peer namespace playing "outside".
//! A HostEndpoint of the node and a deny-all GlobalNetworkPolicy in etcd: TCP to a port on the
//! host's interface is dropped while TCP 22 (a failsafe port; a listener the test starts) still
//! connects; so after a restart from the snapshot onto an empty kernel (etcd gone); and
//! `--failsafe-inbound-host-ports` replaces the failsafe list; deny-all preDNAT and doNotTrack
//! policies keep 22 open too, and the host endpoint is counted in `/status` and `/metrics`.

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::{Netns, in_netns, veth};
use serde_json::json;
use support::{Agent, put_default_tier, put_json};

const HOST: &str = "10.97.0.2";
const OUTSIDE: &str = "10.97.0.1";

/// A host namespace with `fxh-out` (HOST/24) joined to a fresh outside namespace, and
/// listeners on the host on ports 22 and 8080.
fn host_and_outside(host: &Netns) -> Netns {
    let out = Netns::new();
    veth(host, "fxh-out", &out, "fxo-h");
    host.ok(
        "ip",
        &["addr", "add", &format!("{HOST}/24"), "dev", "fxh-out"],
    );
    out.ok(
        "ip",
        &["addr", "add", &format!("{OUTSIDE}/24"), "dev", "fxo-h"],
    );
    for port in [22u16, 8080] {
        let addr: SocketAddr = format!("{HOST}:{port}").parse().unwrap();
        let listener = in_netns(host.name(), move || TcpListener::bind(addr).expect("bind"));
        std::thread::spawn(move || {
            for mut c in listener.incoming().flatten() {
                let _ = c.write_all(b"ok");
            }
        });
    }
    out
}

fn connects(from: &Netns, port: u16) -> bool {
    let addr: SocketAddr = format!("{HOST}:{port}").parse().unwrap();
    in_netns(from.name(), move || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(1000)).is_ok()
    })
}

fn connects_eventually(from: &Netns, port: u16) -> bool {
    (0..5).any(|_| connects(from, port))
}

fn seed(etcd: &Etcd) -> i64 {
    put_default_tier(etcd);
    put_json(
        etcd,
        "hostendpoints/node-1-fxh-out",
        json!({"apiVersion":"projectcalico.org/v3","kind":"HostEndpoint",
               "metadata":{"name":"node-1-fxh-out","labels":{"role":"host"}},
               "spec":{"node":"node-1","interfaceName":"fxh-out","expectedIPs":[HOST]}}),
    );
    put_json(
        etcd,
        "globalnetworkpolicies/default.host-deny-all",
        json!({"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkPolicy",
               "metadata":{"name":"default.host-deny-all"},
               "spec":{"tier":"default","order":10,"selector":"role == 'host'",
                       "types":["Ingress"]}}),
    )
}

#[test]
fn deny_all_host_policy_never_blocks_the_failsafe_ports() {
    let ns = Netns::new();
    let out = host_and_outside(&ns);
    assert!(
        connects_eventually(&out, 8080),
        "no connectivity before policy"
    );
    let mut etcd = Etcd::start_in(ns.name());
    let rev = seed(&etcd);
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    let agent = Agent::start(ns.name(), &etcd.client_url(), &state_dir);
    let s = agent.wait_applied(rev);
    assert_eq!(s["active_policies"], 1, "{s}");
    assert!(!connects(&out, 8080), "deny-all host policy left 8080 open");
    assert!(
        connects_eventually(&out, 22),
        "failsafe port 22 was blocked"
    );
    let dump = ns.ok("iptables-nft-save", &["-t", "filter"]);
    assert!(dump.contains("-A cali-fh-fxh-out"), "{dump}");
    assert!(dump.contains("-j cali-failsafe-in"), "{dump}");
    let s = agent.poll_status(Duration::from_secs(30), |s| {
        s["snapshot_revision"].as_i64().unwrap_or(-1) >= rev
    });
    assert!(s["snapshot_revision"].as_i64().unwrap() >= rev, "{s}");
    drop(agent);
    etcd.stop();

    // Restarted from its snapshot on a host with an empty kernel (etcd unreachable): the
    // first apply has the host policy and the failsafes together.
    let ns2 = Netns::new();
    let out2 = host_and_outside(&ns2);
    let agent = Agent::start(ns2.name(), &etcd.client_url(), &state_dir);
    let s = agent.wait_applied(rev);
    assert_eq!(s["source"], "snapshot", "{s}");
    assert!(!connects(&out2, 8080), "restart left 8080 open");
    assert!(
        connects_eventually(&out2, 22),
        "restart blocked failsafe 22"
    );
    drop(agent);

    // The failsafe list is the operator's: only 8080 now.
    let agent = Agent::start_with(
        ns2.name(),
        &etcd.client_url(),
        &state_dir,
        &["--failsafe-inbound-host-ports", "tcp:8080"],
    );
    agent.wait_applied(rev);
    assert!(
        connects_eventually(&out2, 8080),
        "configured failsafe 8080 blocked"
    );
    assert!(
        !connects(&out2, 22),
        "22 open though no longer a failsafe port"
    );
    drop(agent);

    // A bad entry is refused at startup, naming it.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["agent", "--failsafe-inbound-host-ports", "tcp:22,ssh"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("invalid failsafe port \"ssh\""), "{err}");
}

/// preDNAT (mangle) and doNotTrack (raw) host policy through the agent: a deny-all of each
/// still leaves failsafe 22 open, the chains are in mangle and raw, and the host endpoint is
/// counted in `/status` (`local_host_endpoints`) and `/metrics` (`felixrs_local_host_endpoints`,
/// and Felix's `felix_active_local_endpoints`, which counts host endpoints too).
#[test]
fn pre_dnat_and_do_not_track_deny_all_keep_the_failsafes_and_are_counted() {
    let ns = Netns::new();
    let out = host_and_outside(&ns);
    assert!(
        connects_eventually(&out, 8080),
        "no connectivity before policy"
    );
    let mut etcd = Etcd::start_in(ns.name());
    seed(&etcd);
    let mut rev = 0;
    for (name, field) in [
        ("host-pre-dnat", "preDNAT"),
        ("host-untracked", "doNotTrack"),
    ] {
        let mut spec = json!({"tier":"default","order":1,"selector":"role == 'host'",
                              "applyOnForward":true,"types":["Ingress"],
                              "ingress":[{"action":"Deny"}]});
        spec[field] = json!(true);
        rev = put_json(
            &etcd,
            &format!("globalnetworkpolicies/default.{name}"),
            json!({"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkPolicy",
                   "metadata":{"name":format!("default.{name}")},"spec":spec}),
        );
    }
    let (_state, state_dir) = support::state_dir();
    let agent = Agent::start(ns.name(), &etcd.client_url(), &state_dir);
    let s = agent.wait_applied(rev);
    assert_eq!(s["local_host_endpoints"], 1, "{s}");
    assert_eq!(s["local_endpoints"], 0, "{s}");
    assert!(
        !connects(&out, 8080),
        "deny-all preDNAT/doNotTrack left 8080 open"
    );
    assert!(
        connects_eventually(&out, 22),
        "failsafe port 22 was blocked"
    );
    let mangle = ns.ok("iptables-nft-save", &["-t", "mangle"]);
    assert!(mangle.contains("-A cali-fh-fxh-out -m comment"), "{mangle}");
    assert!(mangle.contains("-A cali-pi-"), "{mangle}");
    let raw = ns.ok("iptables-nft-save", &["-t", "raw"]);
    assert!(raw.contains("-A OUTPUT -m comment"), "{raw}");
    assert!(raw.contains("-A cali-pi-"), "{raw}");
    assert!(raw.contains("-j NOTRACK"), "{raw}");
    assert!(raw.contains("--sports 53 -j ACCEPT"), "{raw}");
    let (code, metrics) = agent.get("/metrics").unwrap();
    assert_eq!(code, 200);
    for line in [
        "felixrs_local_host_endpoints 1",
        "felix_active_local_endpoints 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in:\n{metrics}"
        );
    }
    drop(agent);
    etcd.stop();
}

/// Polls `f` for up to 30 s (the drift check that follows addresses runs every 2 s).
fn within_30s(f: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A HostEndpoint without `interfaceName` applies to the interface carrying one of its
/// `expectedIPs`, and follows the address: not programmed while the address is on no interface
/// (8080 open), applied when the address appears on `fxh-out` (8080 shut, failsafe 22 open,
/// `cali-fh-fxh-out` in the kernel), and gone again when the address goes.
#[test]
fn an_endpoint_without_interface_name_follows_its_expected_ips() {
    const MOVING: &str = "10.97.0.9";
    let ns = Netns::new();
    let out = host_and_outside(&ns);
    assert!(
        connects_eventually(&out, 8080),
        "no connectivity before policy"
    );
    let etcd = Etcd::start_in(ns.name());
    put_default_tier(&etcd);
    put_json(
        &etcd,
        "hostendpoints/node-1-by-ip",
        json!({"apiVersion":"projectcalico.org/v3","kind":"HostEndpoint",
               "metadata":{"name":"node-1-by-ip","labels":{"role":"host"}},
               "spec":{"node":"node-1","expectedIPs":[MOVING]}}),
    );
    let rev = put_json(
        &etcd,
        "globalnetworkpolicies/default.host-deny-all",
        json!({"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkPolicy",
               "metadata":{"name":"default.host-deny-all"},
               "spec":{"tier":"default","order":10,"selector":"role == 'host'",
                       "types":["Ingress"]}}),
    );
    let state = tempfile::tempdir().unwrap();
    let agent = Agent::start(ns.name(), &etcd.client_url(), &state.path().join("state"));
    agent.wait_applied(rev);
    assert!(
        connects_eventually(&out, 8080),
        "an endpoint whose address is on no interface was programmed"
    );
    let dump = ns.ok("iptables-nft-save", &["-t", "filter"]);
    assert!(!dump.contains("cali-fh-"), "{dump}");

    ns.ok(
        "ip",
        &["addr", "add", &format!("{MOVING}/32"), "dev", "fxh-out"],
    );
    assert!(
        within_30s(|| !connects(&out, 8080)),
        "the endpoint did not follow its address onto fxh-out"
    );
    assert!(
        connects_eventually(&out, 22),
        "failsafe port 22 was blocked"
    );
    let dump = ns.ok("iptables-nft-save", &["-t", "filter"]);
    assert!(dump.contains("-A cali-fh-fxh-out"), "{dump}");

    ns.ok(
        "ip",
        &["addr", "del", &format!("{MOVING}/32"), "dev", "fxh-out"],
    );
    assert!(
        within_30s(|| connects(&out, 8080)),
        "the endpoint stayed on fxh-out after its address left"
    );
    drop(agent);
}
