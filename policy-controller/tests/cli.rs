//! The `policy-controller` binary against a real etcd: `sync --once` output and effects, and leader
//! failover between two long-running replicas.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use policy_controller::convert::RESOURCE_PREFIX;
use serde_json::Value;
use support::etcd::TestEtcd;

const BIN: &str = env!("CARGO_BIN_EXE_policy-controller");

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: prod, labels: {team: ops}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-db, namespace: prod}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{ports: [{port: 5432}]}]
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: deny-metadata}
spec:
  selector: all()
  types: [Egress]
  egress: [{action: Deny, destination: {nets: [169.254.169.254/32]}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: broken, namespace: prod}
spec:
  podSelector: {matchLabels: {app: "a'b"}}
"#;

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: db-0, namespace: prod, labels: {app: db}}
spec: {nodeName: node-1, containers: [{name: db, image: postgres}]}
status: {phase: Running, podIP: 10.0.0.5}
"#;

fn sync_once(etcd: &TestEtcd, dir: &Path) -> Value {
    let out = Command::new(BIN)
        .args([
            "sync",
            "--once",
            "--etcd-endpoints",
            &etcd.endpoint,
            "--manifests",
        ])
        .arg(dir)
        .output()
        .expect("run policy-controller");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().expect("stdout has a line");
    assert_eq!(
        stdout.lines().count(),
        1,
        "only the JSON line on stdout: {stdout}"
    );
    serde_json::from_str(last).expect("last line is JSON")
}

async fn keys(c: &mut etcd_client::Client) -> Vec<String> {
    let r = c
        .get(
            RESOURCE_PREFIX,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    r.kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect()
}

async fn revision(c: &mut etcd_client::Client) -> i64 {
    c.get("/", None).await.unwrap().header().unwrap().revision()
}

#[tokio::test]
async fn sync_once_reports_revision_and_counts() {
    let etcd = TestEtcd::start().await;
    let mut c = etcd.client().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), MANIFESTS).unwrap();
    std::fs::write(dir.path().join("pod.yaml"), POD).unwrap();

    let r = sync_once(&etcd, dir.path());
    assert_eq!(r["created"], 4, "{r}");
    assert_eq!(r["updated"], 0);
    assert_eq!(r["deleted"], 0);
    assert_eq!(r["skipped"], 1, "{r}");
    assert_eq!(r["skips"][0]["name"], "broken");
    assert_eq!(r["revision"].as_i64().unwrap(), revision(&mut c).await);
    let p = RESOURCE_PREFIX;
    let mut want = vec![
        format!("{p}globalnetworkpolicies/deny-metadata"),
        format!("{p}networkpolicies/prod/knp.default.allow-db"),
        format!("{p}profiles/kns.prod"),
        format!("{p}workloadendpoints/prod/node--1-k8s-db--0-eth0"),
    ];
    want.sort();
    assert_eq!(keys(&mut c).await, want);

    // Nothing changed: nothing written, same revision.
    let rev = revision(&mut c).await;
    let r = sync_once(&etcd, dir.path());
    assert_eq!(
        (
            r["created"].as_u64(),
            r["updated"].as_u64(),
            r["deleted"].as_u64()
        ),
        (Some(0), Some(0), Some(0))
    );
    assert_eq!(r["revision"].as_i64().unwrap(), rev);
    assert_eq!(revision(&mut c).await, rev);

    // The pod finishes: its endpoint goes.
    std::fs::write(
        dir.path().join("pod.yaml"),
        POD.replace("Running", "Succeeded"),
    )
    .unwrap();
    let r = sync_once(&etcd, dir.path());
    assert_eq!(r["deleted"], 1, "{r}");
    assert!(
        !keys(&mut c)
            .await
            .iter()
            .any(|k| k.contains("workloadendpoints"))
    );
}

/// Kills the child on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_replica(etcd: &TestEtcd, dir: &Path, identity: &str) -> Proc {
    let child = Command::new(BIN)
        .args([
            "sync",
            "--etcd-endpoints",
            &etcd.endpoint,
            "--election-ttl",
            "2",
            "--resync-interval",
            "1",
        ])
        .args(["--identity", identity, "--manifests"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn replica");
    Proc(child)
}

async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

#[tokio::test]
async fn standby_takes_over_within_the_lease_ttl() {
    let etcd = TestEtcd::start().await;
    let c = etcd.client().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), MANIFESTS).unwrap();
    let mut a = Some(spawn_replica(&etcd, dir.path(), "replica-a"));
    let mut b = Some(spawn_replica(&etcd, dir.path(), "replica-b"));
    let profile = format!("{RESOURCE_PREFIX}profiles/kns.prod");

    wait_for("a leader and a first sync", Duration::from_secs(20), || {
        let c = c.clone();
        let profile = profile.clone();
        async move {
            let mut c2 = c.clone();
            policy_controller::election::current_leader(&c)
                .await
                .is_some()
                && c2
                    .get(profile, None)
                    .await
                    .map(|r| r.count() == 1)
                    .unwrap_or(false)
        }
    })
    .await;
    let leader = policy_controller::election::current_leader(&c)
        .await
        .unwrap();
    let standby = if leader == "replica-a" {
        "replica-b"
    } else {
        "replica-a"
    };

    // SIGKILL the leader: no resignation, its lease must expire.
    if leader == "replica-a" {
        drop(a.take());
    } else {
        drop(b.take());
    }
    let took = wait_for("the standby to lead", Duration::from_secs(10), || {
        let c = c.clone();
        async move {
            policy_controller::election::current_leader(&c)
                .await
                .as_deref()
                == Some(standby)
        }
    })
    .await;
    // TTL 2 s; allow for the keep-alive interval and scheduling on a busy machine.
    assert!(took <= Duration::from_secs(4), "takeover took {took:?}");

    // The new leader writes: an owned key deleted behind its back comes back.
    let mut c2 = c.clone();
    c2.delete(profile.as_str(), None).await.unwrap();
    wait_for(
        "the new leader to restore the profile",
        Duration::from_secs(10),
        || {
            let mut c = c.clone();
            let profile = profile.clone();
            async move {
                c.get(profile, None)
                    .await
                    .map(|r| r.count() == 1)
                    .unwrap_or(false)
            }
        },
    )
    .await;
    drop((a, b));
}
