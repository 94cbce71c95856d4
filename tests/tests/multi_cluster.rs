//! Multi-cluster on the real datapath (issue 14): node-1 is cluster A, node-2 is cluster B, each
//! with its own controller and agent; A federates B through a RemoteClusterConfiguration.
//!
//! Run twice over one netns cluster: one etcd holding both clusters under two prefixes, then one
//! etcd per cluster. In both, a policy of A allows B's clients by labels (and the
//! `projectcalico.org/cluster` label) across the datapath, a relabel in B reaches A's IP sets, and
//! deleting the configuration removes B's members. With two etcds, B's etcd is also stopped: A keeps
//! enforcing with B's last members, also across an agent restart (from its snapshot).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use felixrs_e2e::cluster::Cluster;
use felixrs_e2e::driver::{Agent, Etcd, binary, wait_for};
use felixrs_e2e::traffic::{Probe, Proto, Servers, probe_once};
use felixrs_test_support::netns::Netns;
use felixrs_test_support::require_root;
use serde_json::Value;

const TCP80: Probe = Probe {
    port: 80,
    proto: Proto::Tcp,
};
const WAIT: Duration = Duration::from_secs(60);
const RCC_KEY: &str = "/calico/resources/v3/projectcalico.org/remoteclusterconfigurations/b";

const CLUSTER_A: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: a, labels: {app: server}}
spec: {nodeName: node-1, containers: [{name: s, image: i}]}
status: {phase: Running, podIP: __SERVER__}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: server-from-b-clients}
spec:
  selector: app == 'server'
  types: [Ingress]
  ingress:
  - action: Allow
    source: {selector: "projectcalico.org/cluster == 'b' && role == 'client'"}
"#;

fn cluster_b(other_role: &str, ips: (&str, &str)) -> String {
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: b}}
---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: b, labels: {{role: client}}}}
spec: {{nodeName: node-2, containers: [{{name: c, image: i}}]}}
status: {{phase: Running, podIP: {}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: other, namespace: b, labels: {{role: {other_role}}}}}
spec: {{nodeName: node-2, containers: [{{name: c, image: i}}]}}
status: {{phase: Running, podIP: {}}}
"#,
        ips.0, ips.1
    )
}

fn rcc(endpoint: &str, prefix: Option<&str>) -> String {
    let prefix = prefix
        .map(|p| format!(r#","etcdPrefix":"{p}""#))
        .unwrap_or_default();
    format!(
        r#"{{"apiVersion":"projectcalico.org/v3","kind":"RemoteClusterConfiguration","metadata":{{"name":"b"}},"spec":{{"datastoreType":"etcdv3","etcdEndpoints":"{endpoint}"{prefix}}}}}"#
    )
}

/// `policy-controller sync --once` for one cluster; returns the revision it printed.
fn controller(
    ns: &Netns,
    endpoint: &str,
    prefix: Option<&str>,
    manifests: &str,
    dir: &Path,
) -> Result<i64> {
    let file = dir.join(format!(
        "m-{}.yaml",
        prefix.unwrap_or("default").replace('/', "_")
    ));
    std::fs::write(&file, manifests)?;
    let bin = binary("policy-controller");
    let mut argv = vec![
        bin.to_str().context("utf-8 path")?.to_string(),
        "sync".into(),
        "--once".into(),
        "--etcd-endpoints".into(),
        endpoint.into(),
        "--manifests".into(),
        file.to_str().context("utf-8 path")?.into(),
    ];
    if let Some(p) = prefix {
        argv.extend(["--etcd-prefix".into(), p.into()]);
    }
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = ns.exec_unchecked(&argv)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "controller failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value = serde_json::from_str(stdout.lines().last().context("no output")?)?;
    v["revision"].as_i64().context("no revision")
}

struct Pods<'a> {
    cluster: &'a Cluster,
}

impl Pods<'_> {
    fn ns(&self, id: &str) -> &str {
        self.cluster.pod(id).ns.name()
    }
    fn ip(&self, id: &str) -> IpAddr {
        IpAddr::V4(self.cluster.pod(id).ip)
    }
    /// Polls until `from` → a/server is `want` (policy propagation is asynchronous).
    fn expect(&self, from: &str, want: bool, what: &str) -> Result<()> {
        let (ns, dst) = (self.ns(from).to_string(), self.ip("a/server"));
        let got = wait_for(WAIT, || {
            let ok = probe_once(&ns, dst, TCP80, Duration::from_millis(500)).ok()?;
            (ok == want).then_some(())
        });
        ensure!(
            got.is_some(),
            "{what}: {from} -> a/server should be {}",
            if want { "allowed" } else { "denied" }
        );
        Ok(())
    }
    /// `from` → a/server is `want` now and stays so over several probes.
    fn holds(&self, from: &str, want: bool, what: &str) -> Result<()> {
        for _ in 0..3 {
            let got = probe_once(
                self.ns(from),
                self.ip("a/server"),
                TCP80,
                Duration::from_secs(1),
            )?;
            ensure!(
                got == want,
                "{what}: {from} -> a/server was {got}, expected {want}"
            );
        }
        Ok(())
    }
}

fn remote_b(agent: &Agent) -> Option<Value> {
    let s = agent.status()?;
    let b = s["remote_clusters"]["b"].clone();
    (!b.is_null()).then_some(b)
}

fn wait_remote(agent: &Agent, what: &str, pred: impl Fn(&Value) -> bool) -> Result<Value> {
    wait_for(WAIT, || remote_b(agent).filter(|b| pred(b))).with_context(|| {
        format!(
            "{what}: remote b status {:?}\n{}",
            remote_b(agent),
            agent.log_tail(30)
        )
    })
}

/// A TCP listener in `ns` on 10.77.0.1 that accepts connections and never answers; returns its
/// address. Its thread holds the connections for the rest of the test.
fn black_hole(ns: &Netns) -> Result<String> {
    let listener = felixrs_test_support::netns::in_netns(ns.name(), || {
        std::net::TcpListener::bind("10.77.0.1:0")
    })?;
    let addr = listener.local_addr()?.to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    Ok(addr)
}

enum Mode {
    /// One etcd, cluster B under `/clusters/b/calico`.
    SharedEtcd,
    /// One etcd per cluster.
    OwnEtcd,
}

fn scenario(cluster: &Cluster, mode: Mode, work: &Path) -> Result<()> {
    let pods = Pods { cluster };
    let ip = |id: &str| cluster.pod(id).ip.to_string();
    let (b_prefix, etcd_a, etcd_b): (Option<&str>, Etcd, Option<Etcd>) = match mode {
        Mode::SharedEtcd => (
            Some("/clusters/b/calico"),
            Etcd::builder()
                .netns(cluster.infra.name())
                .host("10.77.0.1".parse()?)
                .client_port(2379)
                .dir(&work.join("etcd"))
                .start(),
            None,
        ),
        Mode::OwnEtcd => (
            None,
            Etcd::builder()
                .netns(cluster.infra.name())
                .host("10.77.0.1".parse()?)
                .client_port(2379)
                .dir(&work.join("etcd-a"))
                .start(),
            Some(
                Etcd::builder()
                    .netns(cluster.infra.name())
                    .host("10.77.0.1".parse()?)
                    .client_port(22379)
                    .dir(&work.join("etcd-b"))
                    .start(),
            ),
        ),
    };
    let url_a = etcd_a.client_url();
    let url_b = etcd_b
        .as_ref()
        .map_or_else(|| url_a.clone(), Etcd::client_url);
    let infra = &cluster.infra;
    let rev_a = controller(
        infra,
        &url_a,
        None,
        &CLUSTER_A.replace("__SERVER__", &ip("a/server")),
        work,
    )?;
    let rev_b = controller(
        infra,
        &url_b,
        b_prefix,
        &cluster_b("other", (&ip("b/client"), &ip("b/other"))),
        work,
    )?;
    let rcc_rev = etcd_a.put(RCC_KEY, &rcc(&url_b, b_prefix));

    let (n1, n2) = (&cluster.nodes[0], &cluster.nodes[1]);
    let mut agent_a = Agent::start(&n1.ns, &n1.name, &url_a, work)?;
    let b_args: Vec<&str> = b_prefix
        .map(|p| vec!["--etcd-prefix", p])
        .unwrap_or_default();
    let mut agent_b = Agent::start_with(&n2.ns, &n2.name, &url_b, work, &b_args)?;
    agent_a.wait_applied(rev_a.max(rcc_rev), WAIT)?;
    // b's own writes, not 0: in sync with nothing applied yet would pass 0, and the status read below
    // would then catch b before its first program.
    agent_b.wait_applied(rev_b, WAIT)?;
    // Isolation: each agent sees only its own cluster's endpoints as local.
    let sa = agent_a.status().context("a status")?;
    let sb = agent_b.status().context("b status")?;
    ensure!(
        sa["local_endpoints"] == 1 && sb["local_endpoints"] == 2,
        "local endpoints: a {sa}, b {sb}"
    );
    ensure!(
        sb["remote_clusters"]
            .as_object()
            .is_none_or(|m| m.is_empty()),
        "b federates nothing: {sb}"
    );
    wait_remote(&agent_a, "b synced", |b| {
        b["connected"] == true && b["keys"].as_u64() >= Some(3)
    })?;

    pods.expect("b/client", true, "b's client allowed by A's policy")?;
    pods.holds("b/other", false, "b's other pod is not a client")?;

    // Relabel in B reaches A's IP sets.
    controller(
        infra,
        &url_b,
        b_prefix,
        &cluster_b("client", (&ip("b/client"), &ip("b/other"))),
        work,
    )?;
    pods.expect("b/other", true, "relabelled in B")?;

    if let Some(mut etcd_b) = etcd_b {
        etcd_b.stop();
        wait_remote(&agent_a, "b down", |b| {
            b["connected"] == false && b["error"].is_string()
        })?;
        pods.holds("b/client", true, "B down: last members stay")?;
        pods.holds("b/other", true, "B down: last members stay")?;
        // Restart A while B is down: its members come back from the snapshot.
        let st = agent_a.status().context("a status")?;
        let applied = st["applied_revision"].as_i64().unwrap_or(0);
        ensure!(
            st["snapshot_revision"].as_i64().is_some(),
            "a snapshot was written: {st}"
        );
        // (Snapshots are written at most once a second: wait until B's last change is in one, as
        // a crash right after a change would lose it until B answers again.)
        wait_remote(&agent_a, "b persisted", |b| {
            b["snapshot_revision"].as_i64().is_some() && b["snapshot_revision"] == b["revision"]
        })?;
        agent_a.kill();
        agent_a.restart(&n1.ns)?;
        agent_a.wait_applied(applied, WAIT)?;
        let b = wait_remote(&agent_a, "b from snapshot", |b| {
            b["keys"].as_u64() >= Some(3)
        })?;
        ensure!(
            b["source"] == "snapshot" && b["connected"] == false,
            "after restart: {b}"
        );
        let diag = || format!("status {:?}\n{}", agent_a.status(), agent_a.log_tail(60));
        pods.holds("b/client", true, "A restarted with B down")
            .with_context(diag)?;
        pods.holds("b/other", true, "A restarted with B down")
            .with_context(diag)?;
        etcd_b.restart();
        wait_remote(&agent_a, "b back", |b| {
            b["connected"] == true && b["source"] == "etcd"
        })?;
        pods.holds("b/client", true, "B back")?;
        // B removed: its members go.
        let rev = etcd_a.delete(RCC_KEY);
        agent_a.wait_applied(rev, WAIT)?;
        pods.expect("b/client", false, "B removed")?;
        pods.holds("b/other", false, "B removed")?;
        let st = agent_a.status().context("a status")?;
        ensure!(
            st["remote_clusters"].get("b").is_none(),
            "b gone from status: {st}"
        );
    } else {
        // A slow remote (accepts connections, never answers) never holds up local enforcement:
        // a change in A is applied while its syncer hangs.
        let hole = black_hole(infra)?;
        let slow_key = RCC_KEY.replace("/b", "/slow");
        etcd_a.put(
            &slow_key,
            &rcc(&format!("http://{hole}"), None).replace("\"name\":\"b\"", "\"name\":\"slow\""),
        );
        let doc = CLUSTER_A
            .replace("__SERVER__", &ip("a/server"))
            .replace("role == 'client'", "role in {'client', 'other'}");
        let rev = controller(infra, &url_a, None, &doc, work)?;
        agent_a.wait_applied(rev, Duration::from_secs(15))?;
        pods.holds("b/other", true, "A's change applied with a slow remote")?;
        let slow = wait_for(WAIT, || {
            let s = agent_a.status()?;
            let r = s["remote_clusters"]["slow"].clone();
            (r["connected"] == false && r["error"].is_string()).then_some(r)
        });
        ensure!(
            slow.is_some(),
            "slow remote not reported: {:?}",
            agent_a.status()
        );
        etcd_a.delete(&slow_key);
        let rev = etcd_a.delete(RCC_KEY);
        agent_a.wait_applied(rev, WAIT)?;
        pods.expect("b/client", false, "B removed")?;
        pods.holds("b/other", false, "B removed")?;
    }
    drop(agent_a);
    drop(agent_b);
    Ok(())
}

#[test]
fn federated_clusters_on_the_datapath() {
    require_root();
    binary("felixrs");
    binary("policy-controller");
    let work = tempfile::Builder::new()
        .prefix("felixrs-multi")
        .tempdir()
        .unwrap();
    let mut cluster = Cluster::new(2).expect("netns cluster");
    cluster.add_pod("a", "server", 0).unwrap();
    cluster.add_pod("b", "client", 1).unwrap();
    cluster.add_pod("b", "other", 1).unwrap();
    let _servers = Servers::start(cluster.pod("a/server").ns.name()).unwrap();
    for (name, mode) in [("shared", Mode::SharedEtcd), ("own", Mode::OwnEtcd)] {
        let dir = work.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        if let Err(e) = scenario(&cluster, mode, &dir) {
            panic!("{name} etcd: {e:#}");
        }
    }
}
