//! The etcd launcher: plain, cut-off, inside a namespace and TLS with client-certificate auth.

use std::process::Stdio;

use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;

fn health(endpoint: &str, extra: &[&str]) -> bool {
    let mut cmd = std::process::Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            endpoint,
            "--dial-timeout",
            "1s",
            "--command-timeout",
            "2s",
        ])
        .args(extra)
        .args(["get", "/x"]);
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[test]
fn plain_etcd_keeps_data_across_restarts_and_can_hide_the_client_url() {
    let mut etcd = Etcd::start();
    let r1 = etcd.put("/k", "-starts-with-dash");
    assert!(r1 > 1);
    assert_eq!(etcd.get("/k").as_deref(), Some("-starts-with-dash"));
    assert!(health(&etcd.client_url(), &[]));
    etcd.restart_admin_only();
    assert!(!health(&etcd.client_url(), &[]), "client URL still open");
    let r2 = etcd.delete("/k");
    assert!(r2 > r1);
    etcd.compact(r2);
    etcd.restart();
    assert!(health(&etcd.client_url(), &[]));
    assert_eq!(etcd.get("/k"), None);
    assert_eq!(etcd.revision(), r2);
}

#[test]
fn tls_etcd_demands_a_client_certificate() {
    let etcd = Etcd::start_tls();
    let url = etcd.client_url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let t = etcd.tls_files().expect("tls files");
    let (ca, cert, key) = (
        t.ca.to_str().unwrap(),
        t.cert.to_str().unwrap(),
        t.key.to_str().unwrap(),
    );
    assert!(health(
        &url,
        &["--cacert", ca, "--cert", cert, "--key", key]
    ));
    assert!(
        !health(&url, &["--cacert", ca]),
        "served without a client cert"
    );
    assert!(!health(&url, &[]), "served without trusting its CA");
    assert!(etcd.put("/k", "v") > 1);
}

#[test]
fn etcd_in_a_namespace_is_reachable_only_there() {
    let ns = Netns::new();
    let etcd = Etcd::builder()
        .netns(ns.name())
        .host("127.0.0.1".parse().unwrap())
        .start();
    etcd.put("/k", "v");
    assert!(
        !health(&etcd.client_url(), &[]),
        "reachable from the host namespace"
    );
    let out = ns
        .exec(&[
            "etcdctl",
            "--endpoints",
            &etcd.client_url(),
            "get",
            "/k",
            "--print-value-only",
        ])
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "v");
}

#[test]
fn dropping_etcd_kills_it_and_removes_the_temp_dir() {
    let mut etcd = Etcd::start();
    assert!(etcd.is_running());
    let dir = etcd.dir().to_path_buf();
    let url = etcd.client_url();
    drop(etcd);
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(!health(&url, &[]), "etcd at {url} still answers");
}

/// A port taken between the pick and etcd's bind (the race that failed CI) is retried: etcd's first
/// attempt finds its client port held, a later one gets it.
#[test]
fn a_port_taken_at_start_is_retried() {
    // Another process may take a port between `free_port` and our bind; pick again until we hold one.
    let (port, held) = (0..100)
        .find_map(|_| {
            let port = felixrs_test_support::free_port();
            std::net::TcpListener::bind(("127.0.0.1", port))
                .ok()
                .map(|l| (port, l))
        })
        .expect("no port could be held for the test");
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(400));
        drop(held);
    });
    let etcd = Etcd::builder().client_port(port).start();
    release.join().unwrap();
    assert!(
        health(&etcd.client_url(), &[]),
        "etcd not serving on {port}"
    );
    let first = std::fs::read_to_string(etcd.dir().join("etcd-1.log")).unwrap();
    assert!(first.contains("address already in use"), "{first}");
}
