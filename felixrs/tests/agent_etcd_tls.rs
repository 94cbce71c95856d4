//! The agent binary against an etcd that serves only TLS and demands client certificates (made
//! with `openssl` by felixrs-test-support). etcd runs in one namespace, the agents in another, joined
//! by a veth pair, so the server certificate is checked against a real non-loopback address.
//!
//! With the right CA, certificate and key the agent syncs and programs the kernel. With a CA that did
//! not sign etcd's certificate, or without a client certificate, it never reaches in-sync, leaves the
//! kernel untouched (fail closed), keeps retrying and says on `/status` that etcd's TLS failed.

mod support;

use std::ffi::OsString;
use std::time::{Duration, Instant};

use felixrs_test_support::etcd::{Etcd, Pki};
use felixrs_test_support::netns::{Netns, VethPair};
use serde_json::json;
use support::{Agent, put_default_tier, put_json, put_web_endpoint};

const IFACE: &str = "cali0000000042";

/// A local endpoint and a policy allowing TCP to port 7201 into it; returns the last revision.
fn seed(etcd: &Etcd) -> i64 {
    put_default_tier(etcd);
    put_web_endpoint(etcd, IFACE, &[]);
    put_json(
        etcd,
        "networkpolicies/ns1/tls",
        json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
               "metadata":{"name":"tls","namespace":"ns1"},
               "spec":{"tier":"default","order":1000,"selector":"app == 'web'",
                       "types":["Ingress"],
                       "ingress":[{"action":"Allow","protocol":"TCP",
                                   "destination":{"ports":[7201]}}]}}),
    )
}

fn cali_lines(ns: &Netns) -> Vec<String> {
    ns.ok("iptables-nft-save", &["-t", "filter"])
        .lines()
        .filter(|l| l.contains("cali"))
        .map(str::to_string)
        .collect()
}

fn tls_args(
    ca: &std::path::Path,
    cert_key: Option<(&std::path::Path, &std::path::Path)>,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["--etcd-ca".into(), ca.into()];
    if let Some((cert, key)) = cert_key {
        a.extend([
            "--etcd-cert".into(),
            cert.into(),
            "--etcd-key".into(),
            key.into(),
        ]);
    }
    a
}

/// `felixrs_datastore_disconnects_total` from `/metrics`: failed connection attempts so far.
fn disconnects(agent: &Agent) -> u64 {
    let (_, m) = agent.get("/metrics").expect("GET /metrics");
    m.lines()
        .find_map(|l| l.strip_prefix("felixrs_datastore_disconnects_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no disconnect counter in:\n{m}"))
}

fn poll_until<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn agent_syncs_only_with_the_right_etcd_tls_material() {
    let pair = VethPair::new();
    let (etcd_ns, node) = (&pair.a, &pair.b);
    let etcd = Etcd::builder()
        .netns(etcd_ns.name())
        .host(VethPair::ADDR_A.parse().unwrap())
        .tls()
        .start();
    let url = etcd.client_url();
    assert!(url.starts_with("https://10.99.0.1:"), "{url}");
    let rev = seed(&etcd);
    let good = etcd.tls_files().unwrap();
    let state = tempfile::tempdir().unwrap();
    let other = Pki::generate(&state.path().join("other-pki"), "not-etcds-ca", &[]);

    // Wrong CA (and a client certificate etcd does not trust), and the right CA without a client
    // certificate: neither may sync or touch the kernel; both must say why.
    let bad = [
        (
            "wrong ca",
            tls_args(&other.ca, Some((&other.client_cert, &other.client_key))),
        ),
        ("no client cert", tls_args(&good.ca, None)),
    ];
    let agents: Vec<(&str, Agent)> = bad
        .iter()
        .map(|(what, args)| {
            let dir = state.path().join(what.replace(' ', "-"));
            (*what, Agent::start_with(node.name(), &url, &dir, args))
        })
        .collect();
    for (what, agent) in &agents {
        let s = agent.poll_status(Duration::from_secs(10), |s| {
            s["datastore_error"].is_string()
        });
        let err = s["datastore_error"].as_str().unwrap_or_default();
        assert!(err.contains(&url), "{what}: error does not name etcd: {s}");
        let want = match *what {
            "wrong ca" => ["TLS handshake failed", "certificate"],
            _ => ["TLS", "no client certificate configured"],
        };
        for w in want {
            assert!(err.contains(w), "{what}: error lacks {w:?}: {s}");
        }
        assert_eq!(
            (&s["in_sync"], &s["source"], &s["datastore_connected"]),
            (&json!(false), &json!("none"), &json!(false)),
            "{what}: {s}"
        );
        let (code, body) = agent.get("/readiness").unwrap();
        assert_eq!(code, 503, "{what}: {body}");
        assert!(
            body.contains("not in sync with the datastore: etcd at"),
            "{what}: readiness does not say why: {body}"
        );
        // It keeps retrying (and keeps failing) rather than giving up or exiting.
        let first = disconnects(agent);
        let later = poll_until(Duration::from_secs(10), || {
            let n = disconnects(agent);
            (n > first).then_some(n)
        });
        assert!(later.is_some(), "{what}: no retry after {first} failures");
        assert_eq!(agent.status()["in_sync"], false, "{what}");
    }
    assert_eq!(
        cali_lines(node),
        Vec::<String>::new(),
        "a failing agent touched the kernel"
    );
    drop(agents);

    // The right CA, certificate and key: in sync at the policy's revision, rules in the kernel.
    let agent = Agent::start_with(
        node.name(),
        &url,
        &state.path().join("good"),
        &tls_args(&good.ca, Some((&good.cert, &good.key))),
    );
    let s = agent.wait_applied(rev);
    assert_eq!(
        (s["in_sync"].clone(), s["source"].clone()),
        (json!(true), json!("etcd")),
        "{s}"
    );
    assert_eq!(s["datastore_connected"], true, "{s}");
    assert_eq!(s["datastore_error"], serde_json::Value::Null, "{s}");
    assert_eq!(agent.get("/readiness").unwrap().0, 200);
    assert_eq!(
        (s["local_endpoints"].clone(), s["active_policies"].clone()),
        (json!(1), json!(1)),
        "{s}"
    );
    let rules = cali_lines(node).join("\n");
    assert!(rules.contains(&format!("cali-tw-{IFACE}")), "{rules}");
    assert!(rules.contains("--dports 7201 "), "{rules}");
}
