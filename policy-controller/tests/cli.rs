//! The `policy-controller` binary against a real etcd: `sync --once` output and effects, and leader
//! failover between two long-running replicas.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use felixrs_test_support::etcd::Etcd;
use policy_controller::convert::RESOURCE_PREFIX;
use serde_json::Value;
use support::etcd::EtcdClientExt;

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

fn sync_once(etcd: &Etcd, dir: &Path) -> Value {
    let out = Command::new(BIN)
        .args([
            "sync",
            "--once",
            "--etcd-endpoints",
            &etcd.client_url(),
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
    let etcd = Etcd::start();
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

use felixrs_test_support::{free_port, http};

/// GET with retries while the server starts listening.
async fn http_get(port: u16, path: &str) -> Option<String> {
    for _ in 0..100 {
        if let Some(b) = http_get_once(port, path).await {
            return Some(b);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// One GET on 127.0.0.1:`port`; the body whatever the status, `None` if nothing answers.
async fn http_get_once(port: u16, path: &str) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let path = path.to_string();
    tokio::task::spawn_blocking(move || http::get_with_timeout(addr, &path, Duration::from_secs(5)))
        .await
        .expect("http thread")
        .ok()
        .map(|(_, body)| body)
}

fn spawn_replica(etcd: &Etcd, dir: &Path, identity: &str, metrics_port: u16) -> Proc {
    let child = Command::new(BIN)
        .args([
            "sync",
            "--etcd-endpoints",
            &etcd.client_url(),
            "--election-ttl",
            "2",
            "--resync-interval",
            "1",
        ])
        .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
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
    let etcd = Etcd::start();
    let c = etcd.client().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), MANIFESTS).unwrap();
    let (port_a, port_b) = (free_port(), free_port());
    let mut a = Some(spawn_replica(&etcd, dir.path(), "replica-a", port_a));
    let mut b = Some(spawn_replica(&etcd, dir.path(), "replica-b", port_b));
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
    let (leader_port, standby_port) = if leader == "replica-a" {
        (port_a, port_b)
    } else {
        (port_b, port_a)
    };
    // Metrics: the leader says so, the standby does not; the leader reports the skipped policy.
    let m = http_get(leader_port, "/metrics")
        .await
        .expect("leader metrics");
    assert!(m.contains("policy_controller_leader 1"), "{m}");
    assert!(
        m.contains(
            "policy_controller_objects_skipped{kind=\"NetworkPolicy\",field=\"spec.podSelector.matchLabels.app\"} 1"
        ),
        "{m}"
    );
    assert!(
        m.contains("policy_controller_etcd_txn_duration_seconds_count"),
        "{m}"
    );
    let m = http_get(standby_port, "/metrics")
        .await
        .expect("standby metrics");
    assert!(m.contains("policy_controller_leader 0"), "{m}");

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

#[tokio::test]
async fn sync_once_from_a_kubeconfig_and_manifests() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let api = support::fake_apiserver::FakeApiServer::start().await;
    api.apply(
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    );
    api.apply(serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": "shop"}}));
    api.apply(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cart", "namespace": "shop"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "podIP": "10.9.0.1"},
    }));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path());
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(manifests.join("gnp.yaml"), MANIFESTS).unwrap();
    // The fake server runs on this runtime, so the child is awaited, not blocked on.
    let out = tokio::process::Command::new(BIN)
        .args([
            "sync",
            "--once",
            "--etcd-endpoints",
            &etcd.client_url(),
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .arg("--manifests")
        .arg(&manifests)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let r: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(r["revision"].as_i64().unwrap(), revision(&mut c).await);
    let k = keys(&mut c).await;
    let p = RESOURCE_PREFIX;
    for want in [
        format!("{p}profiles/kns.shop"),
        format!("{p}profiles/ksa.shop.default"),
        format!("{p}workloadendpoints/shop/n1-k8s-cart-eth0"),
        format!("{p}profiles/kns.prod"),
        format!("{p}globalnetworkpolicies/deny-metadata"),
    ] {
        assert!(k.contains(&want), "missing {want} in {k:?}");
    }
}

#[tokio::test]
async fn etcd_tls_flags_are_used() {
    let etcd = Etcd::start_tls();
    let tls = etcd.tls_files().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), MANIFESTS).unwrap();
    let run = |with_client_cert: bool| {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args([
            "sync",
            "--once",
            "--etcd-endpoints",
            &etcd.client_url(),
            "--etcd-ca",
        ])
        .arg(&tls.ca)
        .arg("--manifests")
        .arg(dir.path());
        if with_client_cert {
            cmd.arg("--etcd-cert")
                .arg(&tls.cert)
                .arg("--etcd-key")
                .arg(&tls.key);
        }
        cmd.output()
    };
    // etcd demands a client certificate: without one the sync fails, naming etcd.
    let out = run(false).await.unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("etcd"), "{stderr}");
    // With the certificate it works.
    let out = run(true).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(r["created"], 3, "{r}");
    let mut c = etcd.client().await;
    assert_eq!(r["revision"].as_i64().unwrap(), revision(&mut c).await);
}

#[tokio::test]
async fn running_controller_follows_live_kubernetes_events() {
    let etcd = Etcd::start();
    let c = etcd.client().await;
    let api = support::fake_apiserver::FakeApiServer::start().await;
    api.apply(
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "live"}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path());
    // A resync period far beyond the test: every write below must come from a watch event.
    let _child = tokio::process::Command::new(BIN)
        .args([
            "sync",
            "--etcd-endpoints",
            &etcd.client_url(),
            "--election-ttl",
            "2",
        ])
        .args(["--resync-interval", "3600", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let has = |key: String| {
        let mut c = c.clone();
        async move {
            c.get(key, None)
                .await
                .map(|r| r.count() == 1)
                .unwrap_or(false)
        }
    };
    let p = RESOURCE_PREFIX;
    wait_for("the namespace profile", Duration::from_secs(20), || {
        has(format!("{p}profiles/kns.live"))
    })
    .await;
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "api-0", "namespace": "live"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "podIP": "10.7.0.1"},
    });
    api.apply(pod.clone());
    let wep = format!("{p}workloadendpoints/live/n1-k8s-api--0-eth0");
    wait_for("the pod's endpoint", Duration::from_secs(10), || {
        has(wep.clone())
    })
    .await;
    api.delete(pod);
    wait_for("the endpoint's removal", Duration::from_secs(10), || {
        let h = has(wep.clone());
        async move { !h.await }
    })
    .await;
}

#[tokio::test]
async fn sigterm_hands_leadership_over_without_waiting_for_the_lease() {
    let etcd = Etcd::start();
    let c = etcd.client().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), MANIFESTS).unwrap();
    // A 30 s lease: a handover within a few seconds can only come from the leader resigning.
    let spawn = |identity: &str| {
        Proc(
            Command::new(BIN)
                .args([
                    "sync",
                    "--etcd-endpoints",
                    &etcd.client_url(),
                    "--election-ttl",
                    "30",
                ])
                .args(["--identity", identity, "--manifests"])
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let a = spawn("replica-a");
    let leader_is = |who: &'static str| {
        let c = c.clone();
        move || {
            let c = c.clone();
            async move {
                policy_controller::election::current_leader(&c)
                    .await
                    .as_deref()
                    == Some(who)
            }
        }
    };
    wait_for(
        "replica-a to lead",
        Duration::from_secs(20),
        leader_is("replica-a"),
    )
    .await;
    let _b = spawn("replica-b");
    // Give b time to start campaigning behind a.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = Command::new("kill")
        .args(["-TERM", &a.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let took = wait_for(
        "replica-b to lead",
        Duration::from_secs(20),
        leader_is("replica-b"),
    )
    .await;
    assert!(took < Duration::from_secs(5), "handover took {took:?}");
    drop(a);
}

/// `sync --once` lists the admin-policy kinds; a cluster without their CRDs (404) still syncs.
#[tokio::test]
async fn sync_once_lists_admin_policies_and_survives_missing_crds() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let api = support::fake_apiserver::FakeApiServer::start().await;
    api.apply(
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    );
    api.apply(serde_json::json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "AdminNetworkPolicy",
        "metadata": {"name": "deny-sandbox"},
        "spec": {"priority": 1, "subject": {"namespaces": {}},
                 "ingress": [{"action": "Deny", "from": [{"namespaces": {"matchLabels": {"team": "dev"}}}]}]},
    }));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path());
    let sync = || {
        tokio::process::Command::new(BIN)
            .args([
                "sync",
                "--once",
                "--etcd-endpoints",
                &etcd.client_url(),
                "--kubeconfig",
            ])
            .arg(&kubeconfig)
            .output()
    };
    let out = sync().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = RESOURCE_PREFIX;
    let k = keys(&mut c).await;
    for want in [
        format!("{p}globalnetworkpolicies/kanp.adminnetworkpolicy.deny-sandbox"),
        format!("{p}tiers/kube-admin"),
        format!("{p}profiles/kns.shop"),
    ] {
        assert!(k.contains(&want), "missing {want} in {k:?}");
    }

    // The CRDs go away (and with them every object of their kinds).
    api.set_crds_installed(false);
    let out = sync().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(api.not_found() >= 3);
    let k = keys(&mut c).await;
    assert!(
        !k.iter()
            .any(|k| k.contains("globalnetworkpolicies/") || k.contains("tiers/")),
        "{k:?}"
    );
    assert!(k.contains(&format!("{p}profiles/kns.shop")));
}
