//! Fan-out on the real datapath (issue 14): both nodes' agents connect through one `etcd grpc-proxy`
//! in front of a 3-member etcd cluster (all in the infra namespace) and keep enforcing the store's
//! policy while each member in turn is killed (SIGKILL) and restarted, with the policy changing
//! while a member is down.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use felixrs_e2e::cluster::Cluster;
use felixrs_e2e::driver::{Agent, binary, wait_for};
use felixrs_e2e::traffic::{Probe, Proto, Servers, probe_once};
use felixrs_test_support::etcd::cluster::{EtcdCluster, GrpcProxy};
use felixrs_test_support::netns::Netns;
use felixrs_test_support::require_root;
use serde_json::Value;

const TCP80: Probe = Probe {
    port: 80,
    proto: Proto::Tcp,
};
const WAIT: Duration = Duration::from_secs(60);

fn manifests(cluster: &Cluster, client_role: &str) -> String {
    let pod = |id: &str, labels: &str| {
        let p = cluster.pod(id);
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {}, namespace: {}, labels: {{{labels}}}}}\n\
             spec: {{nodeName: {}, containers: [{{name: c, image: i}}]}}\n\
             status: {{phase: Running, podIP: {}}}\n",
            p.name, p.namespace, cluster.nodes[p.node].name, p.ip
        )
    };
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: x}}\n{}{}---\n\
         apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: clients-only, namespace: x}}\n\
         spec:\n  podSelector: {{matchLabels: {{app: server}}}}\n  ingress: [{{from: [{{podSelector: {{matchLabels: {{role: client}}}}}}]}}]\n",
        pod("x/server", "app: server"),
        pod("x/client", &format!("role: {client_role}")),
    )
}

/// `policy-controller sync --once` straight to the members (the controller does not use the proxy).
fn controller(ns: &Netns, endpoints: &str, doc: &str, dir: &Path) -> Result<i64> {
    let file = dir.join("m.yaml");
    std::fs::write(&file, doc)?;
    let bin = binary("policy-controller");
    let out = ns.exec_unchecked(&[
        bin.to_str().context("utf-8")?,
        "sync",
        "--once",
        "--etcd-endpoints",
        endpoints,
        "--manifests",
        file.to_str().context("utf-8")?,
    ])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "controller: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value = serde_json::from_str(stdout.lines().last().context("no output")?)?;
    v["revision"].as_i64().context("no revision")
}

fn expect(cluster: &Cluster, want: bool, what: &str) -> Result<()> {
    let ns = cluster.pod("x/client").ns.name().to_string();
    let dst = IpAddr::V4(cluster.pod("x/server").ip);
    let got = wait_for(WAIT, || {
        let ok = probe_once(&ns, dst, TCP80, Duration::from_millis(500)).ok()?;
        (ok == want).then_some(())
    });
    ensure!(
        got.is_some(),
        "{what}: client -> server should be {}",
        if want { "allowed" } else { "denied" }
    );
    Ok(())
}

#[test]
fn agents_through_a_grpc_proxy_survive_member_kills() {
    require_root();
    binary("felixrs");
    binary("policy-controller");
    let work = tempfile::Builder::new()
        .prefix("felixrs-fanout")
        .tempdir()
        .unwrap();
    let mut cluster = Cluster::new(2).expect("netns cluster");
    cluster.add_pod("x", "server", 0).unwrap();
    cluster.add_pod("x", "client", 1).unwrap();
    let _servers = Servers::start(cluster.pod("x/server").ns.name()).unwrap();
    let host: IpAddr = "10.77.0.1".parse().unwrap();
    let mut etcd = EtcdCluster::start_in(3, Some(cluster.infra.name()), host);
    let proxy = GrpcProxy::start_in(&etcd.endpoints(), Some(cluster.infra.name()), host);
    let ok = |r: Result<()>| r.unwrap_or_else(|e| panic!("{e:#}"));
    let doc = manifests(&cluster, "client");
    let rev = controller(&cluster.infra, &etcd.endpoints(), &doc, work.path())
        .unwrap_or_else(|e| panic!("{e:#}"));
    let mut agents: Vec<Agent> = cluster
        .nodes
        .iter()
        .map(|n| {
            Agent::start(&n.ns, &n.name, &proxy.url(), work.path())
                .unwrap_or_else(|e| panic!("{e:#}"))
        })
        .collect();
    for a in &mut agents {
        ok(a.wait_applied(rev, WAIT));
    }
    ok(expect(&cluster, true, "through the proxy"));
    let mut role = "client";
    for member in 0..etcd.len() {
        etcd.kill(member);
        role = if role == "client" {
            "visitor"
        } else {
            "client"
        };
        let doc = manifests(&cluster, role);
        // The controller retries nothing: a write during the leader election may fail; try again.
        let rev = wait_for(WAIT, || {
            controller(&cluster.infra, &etcd.endpoints(), &doc, work.path()).ok()
        })
        .unwrap_or_else(|| panic!("controller cannot write with member {member} down"));
        for a in &mut agents {
            ok(a.wait_applied(rev, WAIT)
                .context(format!("member {member} down")));
        }
        ok(expect(
            &cluster,
            role == "client",
            &format!("member {member} down, role {role}"),
        ));
        etcd.restart(member);
        for a in &agents {
            let s = a.status().expect("status");
            assert_eq!(s["datastore_connected"], true, "member {member} back: {s}");
        }
    }
    drop(agents);
    drop(proxy);
}
