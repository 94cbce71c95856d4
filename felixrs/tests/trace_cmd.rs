//! `felixrs trace` on the demo cluster: verdicts and the policies named for them.

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::trace::verdict;

/// Runs `felixrs trace` on the demo cluster for node-1 with `args` (split at spaces).
fn trace(args: &str) -> (bool, String, String) {
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-cluster");
    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["trace", "--node-name", "node-1", "--manifests"])
        .arg(demo)
        .args(args.split_whitespace())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_allowed_connection_names_the_policies_that_allowed_it() {
    let (ok, text, err) = trace("--from shop/web-0 --to shop/db-0 --port 5432");
    assert!(ok, "{err}");
    assert!(verdict(&text).starts_with("ACCEPT"), "{text}");
    for want in [
        "allowed by egress of NetworkPolicy shop/knp.default.web",
        "allowed by ingress of NetworkPolicy shop/knp.default.db-from-web",
        "in on cali",
        // Rules are shown as iptables-save prints them, with their ids.
        "(cali:",
        "-j MARK --set-xmark 0x10000/0x10000",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

#[test]
fn a_denied_connection_names_the_rule_that_dropped_it() {
    // web's egress allows only db:5432 and DNS: the end of the default tier drops it.
    let (ok, text, err) = trace("--from shop/web-0 --to shop/db-0 --port 22");
    assert!(ok, "{err}");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert!(
        text.contains("dropped by egress of endpoint shop/")
            && text.contains("End of tier default"),
        "{text}"
    );
    // The tier's drop is in web's shared policy chain, reached by a goto from its own chain.
    assert!(
        text.contains("(shared policy chain; ") && text.contains("=> goto cali-so-"),
        "{text}"
    );
    // An address the security tier blocks, towards web's http port.
    let (ok, text, err) = trace("--from 198.51.100.7 --to shop/web-0 --port 8080");
    assert!(ok, "{err}");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert!(
        text.contains("dropped by ingress of GlobalNetworkPolicy security.block-bad-ranges"),
        "{text}"
    );
    // The same port from elsewhere passes the security tier and web's ipBlock rule.
    let (ok, text, err) = trace("--from 203.0.113.9 --to shop/web-0 --port 8080");
    assert!(ok, "{err}");
    assert!(verdict(&text).starts_with("ACCEPT"), "{text}");
    assert!(
        text.contains("from 203.0.113.9: no pod of the manifests"),
        "{text}"
    );
}

#[test]
fn traffic_between_other_nodes_pods_is_not_ours() {
    let (ok, text, err) = trace("--from shop/web-1 --to monitoring/prometheus-0");
    assert!(ok, "{err}");
    assert!(verdict(&text).starts_with("NOT OURS"), "{text}");
    assert!(text.contains("(another node)"), "{text}");
}

#[test]
fn ipv6_and_icmp() {
    // db-0 is dual-stack; web-0 is not, so its IPv6 end is refused, naming it.
    let (ok, _, err) = trace("--from shop/web-0 --to shop/db-0 --ipv6");
    assert!(!ok);
    assert!(
        err.contains("--from \"shop/web-0\": the pod has no IPv6 address"),
        "{err}"
    );
    // Ping to db-0 over IPv6 from outside: db's ingress policy has no ICMP rule.
    let (ok, text, err) = trace("--from 2001:db8::1 --to shop/db-0 --ipv6 --protocol icmp");
    assert!(ok, "{err}");
    assert!(
        text.contains("icmpv6 type 128 code 0 2001:db8::1 -> fd00:65:1::11"),
        "{text}"
    );
    assert_eq!(verdict(&text), "DROP", "{text}");
}

#[test]
fn bad_arguments_are_named() {
    for (args, want) in [
        (
            "--from shop/nope --to shop/db-0",
            "--from \"shop/nope\": no such pod",
        ),
        (
            "--from web-0 --to shop/db-0",
            "--from \"web-0\": want namespace/pod",
        ),
        ("--from 10.0.0.1 --to fd00::1", "different families"),
        (
            "--from shop/web-0 --to shop/db-0 --protocol gre",
            "--protocol \"gre\"",
        ),
    ] {
        let (ok, _, err) = trace(args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// With `--state-dir`, render and trace read the agent's persisted snapshot instead of manifests,
/// and give the same answers for the same objects.
#[test]
fn the_agents_snapshot_is_a_source() {
    use felixrs::agent::snapshot::{Snapshot, SnapshotStore};
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-cluster");
    let set = k8s_convert::load_manifests(
        std::slice::from_ref(&demo),
        &k8s_convert::ConvertOptions::default(),
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let kvs = set
        .resources
        .into_iter()
        .map(|(k, r)| (k.as_str().into(), r.to_json().as_bytes().into()))
        .collect();
    SnapshotStore::new(state.path())
        .save(&Snapshot { revision: 42, kvs })
        .unwrap();
    let run = |source: &[&std::ffi::OsStr], extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
            .args(extra)
            .args(["--node-name", "node-1"])
            .args(source)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let snap = [
        std::ffi::OsStr::new("--state-dir"),
        state.path().as_os_str(),
    ];
    let manifests = [std::ffi::OsStr::new("--manifests"), demo.as_os_str()];
    let trace_args = [
        "trace",
        "--from",
        "shop/web-0",
        "--to",
        "shop/db-0",
        "--port",
        "5432",
    ];
    let from_snap = run(&snap, &trace_args);
    assert!(
        from_snap.contains("snapshot at datastore revision 42"),
        "{from_snap}"
    );
    assert!(verdict(&from_snap).starts_with("ACCEPT"), "{from_snap}");
    let rendered_snap = run(&snap, &["render"]);
    let rendered_manifests = run(&manifests, &["render"]);
    assert_eq!(
        rendered_snap.strip_prefix("# from the agent's snapshot at datastore revision 42\n"),
        Some(rendered_manifests.as_str())
    );

    // No snapshot yet, or both sources: refused, saying why.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["render", "--node-name", "node-1", "--state-dir"])
        .arg(empty.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no snapshot at"));
    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["render", "--node-name", "node-1", "--state-dir"])
        .arg(state.path())
        .arg("--manifests")
        .arg(&demo)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

#[test]
fn traffic_to_and_from_the_host() {
    // To the node: the pod's egress policy applies, then DefaultEndpointToHostAction.
    let (ok, text, err) = trace("--from shop/web-0 --to host:10.0.0.1 --port 10250");
    assert!(ok, "{err}");
    assert!(text.contains("to the node itself: INPUT"), "{text}");
    assert_eq!(verdict(&text), "DROP", "{text}");
    let (ok, text, err) = trace("--from shop/web-0 --to host:10.0.0.1 --protocol udp --port 53");
    assert!(ok, "{err}");
    assert_eq!(verdict(&text), "ACCEPT", "{text}");
    assert!(
        text.contains("allowed by egress of NetworkPolicy shop/knp.default.web")
            && text.contains("accepted by cali-wl-to-host"),
        "{text}"
    );
    let (ok, text, err) = trace(
        "--from shop/web-0 --to host:10.0.0.1 --protocol udp --port 53 \
         --default-endpoint-to-host-action drop",
    );
    assert!(ok, "{err}");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert!(text.contains("dropped by cali-wl-to-host"), "{text}");
    // From the node: not policed (as Felix).
    let (ok, text, err) = trace("--from host:10.0.0.1 --to shop/db-0 --port 5432");
    assert!(ok, "{err}");
    assert!(verdict(&text).starts_with("NOT OURS"), "{text}");
    let (ok, _, err) = trace("--from host:10.0.0.1 --to host:10.0.0.2");
    assert!(!ok);
    assert!(err.contains("both this host"), "{err}");
    let (ok, _, err) = trace("--from host:nope --to shop/db-0");
    assert!(!ok);
    assert!(err.contains("want host:ADDR"), "{err}");
}
