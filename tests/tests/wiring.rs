//! The harness's own wiring, without any policy agent: every pod reaches every other pod on every
//! served port, over IPv4 and IPv6, within and across nodes. If this fails, no policy result means anything.

use std::net::IpAddr;
use std::time::Duration;

use felixrs_e2e::cases::PING;
use felixrs_e2e::cluster::Cluster;
use felixrs_e2e::traffic::{SERVED, Servers, probe_many};
use felixrs_test_support::require_root;

#[test]
fn pods_reach_each_other_without_policy_agents() {
    require_root();
    let mut cluster = Cluster::new(2).expect("cluster");
    for (i, (ns, pod)) in [("x", "a"), ("x", "b"), ("y", "a")].iter().enumerate() {
        cluster.add_pod(ns, pod, i % 2).expect("pod");
    }
    let _servers: Vec<Servers> = cluster
        .pods
        .iter()
        .map(|p| Servers::start(p.ns.name()).expect("servers"))
        .collect();
    let mut jobs = Vec::new();
    for from in &cluster.pods {
        for to in &cluster.pods {
            if from.id() != to.id() {
                for probe in SERVED.into_iter().chain([PING]) {
                    for ip in [IpAddr::V4(to.ip), IpAddr::V6(to.ip6)] {
                        jobs.push((from.ns.name().to_string(), ip, probe));
                    }
                }
            }
        }
    }
    let results = probe_many(&jobs, Duration::from_secs(2)).expect("probes");
    let failed: Vec<_> = jobs
        .iter()
        .zip(&results)
        .filter(|(_, ok)| !**ok)
        .map(|((ns, ip, p), _)| format!("{ns} -> {ip} {p}"))
        .collect();
    assert!(failed.is_empty(), "unreachable without policy: {failed:?}");
    assert_eq!(results.len(), 3 * 2 * 5 * 2);
}

#[test]
fn etcd_serves_inside_the_infra_namespace_and_restarts_on_its_data() {
    require_root();
    let cluster = Cluster::new(1).expect("cluster");
    let work = tempfile::tempdir().expect("tempdir");
    let mut etcd = felixrs_e2e::driver::start_etcd(&cluster.infra, "10.77.0.1", work.path());
    let put = cluster
        .infra
        .exec(&[
            "etcdctl",
            "--endpoints",
            &etcd.client_url(),
            "put",
            "/k",
            "v1",
        ])
        .expect("put");
    assert!(String::from_utf8_lossy(&put.stdout).contains("OK"));
    etcd.stop();
    etcd.restart();
    let get = cluster
        .infra
        .exec(&[
            "etcdctl",
            "--endpoints",
            &etcd.client_url(),
            "get",
            "/k",
            "--print-value-only",
        ])
        .expect("get");
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "v1");
}
