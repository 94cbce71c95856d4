//! The controller at cluster scale (issue 26): the release `policy-controller` binary against the
//! fake Kubernetes API server (real HTTP list + watch, `tests/support/fake_apiserver.rs`) serving
//! 100,000 pods, 10,000 NetworkPolicies and 2,000 namespaces (each with its `default` service
//! account), and a real etcd the bench starts.
//!
//! Measures: the time from the controller's start to every resource in etcd (first full sync), the
//! controller's RSS (current and peak), and the latency from a watch event to its etcd write, seen
//! by an etcd watch on the prefix, under 100 pod events/s (80% label changes, 20% deletions) plus
//! 10 policy changes/s for 30 s. Floor, in the same run and during the churn (10/s): a bare etcd put
//! of an endpoint's value, seen by the same watch.
//!
//! Run: `cargo bench -p policy-controller --bench scale` (needs /usr/bin/etcd). Knobs (env):
//! `SCALE_PODS` (100000), `SCALE_POLICIES` (10000), `SCALE_NAMESPACES` (2000), `SCALE_SECONDS` (30),
//! `SCALE_BIN` (another controller binary, e.g. an older build, for a before/after).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use felixrs_test_support::etcd::Etcd;
use policy_controller::convert::RESOURCE_PREFIX;
use serde_json::{Value, json};
use support::etcd::EtcdClientExt;
use support::fake_apiserver::FakeApiServer;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pod(i: usize, namespaces: usize, rev: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("web-{i}"), "namespace": format!("ns-{}", i % namespaces),
                     "labels": {"app": format!("app-{}", i % 50), "tier": "web", "rev": rev.to_string()}},
        "spec": {"nodeName": format!("node-{}", i % 500), "serviceAccountName": "default",
                 "containers": [{"name": "c", "image": "x", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)}})
}

fn pod_key(i: usize, namespaces: usize) -> String {
    format!(
        "{RESOURCE_PREFIX}workloadendpoints/ns-{}/node--{}-k8s-web--{i}-eth0",
        i % namespaces,
        i % 500
    )
}

fn policy(i: usize, namespaces: usize, port: usize) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": format!("np-{i}"), "namespace": format!("ns-{}", i % namespaces)},
        "spec": {"podSelector": {"matchLabels": {"app": format!("app-{}", i % 50)}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "web"}}},
                                  {"namespaceSelector": {"matchLabels": {"team": "a"}}},
                                  {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                         "ports": [{"port": port}, {"port": "http"}, {"port": 53, "protocol": "UDP"}]}],
            "egress": [{"to": [{"podSelector": {}}]}]}})
}

fn policy_key(i: usize, namespaces: usize) -> String {
    format!(
        "{RESOURCE_PREFIX}networkpolicies/ns-{}/knp.default.np-{i}",
        i % namespaces
    )
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn count(c: &mut Client) -> i64 {
    c.get(
        RESOURCE_PREFIX,
        Some(GetOptions::new().with_prefix().with_count_only()),
    )
    .await
    .map(|r| r.count())
    .unwrap_or(0)
}

/// Keys waiting for their write: key → when the change was made.
type Pending = Arc<Mutex<HashMap<String, Instant>>>;

/// Watches the etcd prefix and turns every awaited key's event into a latency sample.
fn spawn_watch(
    mut c: Client,
    prefix: &'static str,
    pending: Pending,
    samples: Arc<Mutex<Vec<(&'static str, Duration)>>>,
    kind_of: fn(&str, EventType) -> &'static str,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = c
            .watch(prefix, Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        while let Ok(Some(resp)) = stream.message().await {
            let now = Instant::now();
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let key = kv.key_str().unwrap_or("");
                if let Some(t) = pending.lock().unwrap().remove(key) {
                    samples
                        .lock()
                        .unwrap()
                        .push((kind_of(key, ev.event_type()), now - t));
                }
            }
        }
    })
}

fn kind_of(key: &str, ev: EventType) -> &'static str {
    match ev {
        EventType::Delete => "pod delete",
        EventType::Put if key.contains("/networkpolicies/") => "policy change",
        EventType::Put if key.starts_with("/bench/") => "floor",
        EventType::Put => "pod label change",
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}

async fn run() {
    let pods = knob("SCALE_PODS", 100_000);
    let policies = knob("SCALE_POLICIES", 10_000);
    let namespaces = knob("SCALE_NAMESPACES", 2_000);
    let seconds = knob("SCALE_SECONDS", 30);
    let bin = std::env::var("SCALE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_policy-controller").to_string());

    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let api = FakeApiServer::start().await;
    let started = Instant::now();
    for n in 0..namespaces {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": format!("ns-{n}"), "labels": {"team": "a"}}}));
        api.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": format!("ns-{n}")}}));
    }
    for i in 0..pods {
        api.apply(pod(i, namespaces, 0));
    }
    for i in 0..policies {
        api.apply(policy(i, namespaces, 80));
    }
    let expected = (pods + policies + 2 * namespaces) as i64;
    eprintln!(
        "fake API server loaded: {pods} pods, {policies} policies, {namespaces} namespaces in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path());
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&bin)
        .args([
            "sync",
            "--etcd-endpoints",
            &etcd.client_url(),
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut peak_during_sync = 0;
    loop {
        let n = count(&mut c).await;
        peak_during_sync = peak_during_sync.max(rss_kib(pid).1);
        if n >= expected {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "first sync stuck at {n} of {expected} keys"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first_sync = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_after_sync, _) = rss_kib(pid);

    let pending: Pending = Arc::default();
    let samples = Arc::new(Mutex::new(Vec::new()));
    let w1 = spawn_watch(
        c.clone(),
        RESOURCE_PREFIX,
        pending.clone(),
        samples.clone(),
        kind_of,
    );
    let w2 = spawn_watch(
        c.clone(),
        "/bench/",
        pending.clone(),
        samples.clone(),
        kind_of,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Floor: a bare put of an endpoint's value, seen by the same kind of watch, made during the churn
    // (10 a second) so it sees the same machine and the same etcd.
    let value = c.get(pod_key(0, namespaces), None).await.unwrap().kvs()[0]
        .value()
        .to_vec();

    // Churn: 100 pod events/s (4 label changes to 1 deletion, each on its own pod) and 10 policy
    // changes/s, for `seconds`.
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let (mut next_label, mut next_delete, mut next_policy) = (0usize, pods - 1, 0usize);
    let churn_started = Instant::now();
    let ticks = seconds * 100;
    for t in 0..ticks {
        tick.tick().await;
        if t % 5 == 4 {
            let key = pod_key(next_delete, namespaces);
            pending.lock().unwrap().insert(key, Instant::now());
            api.delete(pod(next_delete, namespaces, 0));
            next_delete -= 1;
        } else {
            let key = pod_key(next_label, namespaces);
            pending.lock().unwrap().insert(key, Instant::now());
            api.apply(pod(next_label, namespaces, 1));
            next_label += 1;
        }
        if t % 10 == 4 {
            let key = format!("/bench/floor-{t}");
            pending.lock().unwrap().insert(key.clone(), Instant::now());
            let (mut c, value) = (c.clone(), value.clone());
            tokio::spawn(async move { c.put(key, value, None).await.unwrap() });
        }
        if t % 10 == 9 {
            let key = policy_key(next_policy, namespaces);
            pending.lock().unwrap().insert(key, Instant::now());
            api.apply(policy(next_policy, namespaces, 81));
            next_policy += 1;
        }
    }
    let churn = churn_started.elapsed();
    let drain = Instant::now();
    while !pending.lock().unwrap().is_empty() && drain.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let missed = pending.lock().unwrap().len();
    let (rss_end, peak) = rss_kib(pid);
    w1.abort();
    w2.abort();
    let _ = child.kill().await;

    let samples = samples.lock().unwrap().clone();
    let by = |k: &str| -> Vec<Duration> {
        samples
            .iter()
            .filter(|(kind, _)| *kind == k)
            .map(|(_, d)| *d)
            .collect()
    };
    let mut floor = by("floor");
    let (f50, f99) = (pct(&mut floor, 0.5), pct(&mut floor, 0.99));
    let mut all: Vec<Duration> = samples
        .iter()
        .filter(|(k, _)| *k != "floor")
        .map(|(_, d)| *d)
        .collect();
    println!("controller: {bin}");
    println!(
        "first full sync: {:.1} s ({expected} keys); RSS after sync {} MiB, peak {} MiB (peak during sync {} MiB), after churn {} MiB",
        first_sync.as_secs_f64(),
        rss_after_sync / 1024,
        peak / 1024,
        peak_during_sync / 1024,
        rss_end / 1024
    );
    println!(
        "churn: {} events in {:.1} s, {} not written within 30 s",
        all.len() + missed,
        churn.as_secs_f64(),
        missed
    );
    println!("| event | n | p50 | p99 | ratio to floor p50 / p99 |");
    println!("|---|---|---|---|---|");
    println!(
        "| floor: bare etcd put | {} | {} | {} | |",
        floor.len(),
        ms(f50),
        ms(f99)
    );
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    for k in ["pod label change", "pod delete", "policy change"] {
        let mut v = by(k);
        let (p50, p99) = (pct(&mut v, 0.5), pct(&mut v, 0.99));
        println!(
            "| {k} | {} | {} | {} | {:.1}x / {:.1}x |",
            v.len(),
            ms(p50),
            ms(p99),
            ratio(p50, f50),
            ratio(p99, f99)
        );
    }
    let (p50, p99) = (pct(&mut all, 0.5), pct(&mut all, 0.99));
    println!(
        "| all events | {} | {} | {} | {:.1}x / {:.1}x |",
        all.len(),
        ms(p50),
        ms(p99),
        ratio(p50, f50),
        ratio(p99, f99)
    );
}
