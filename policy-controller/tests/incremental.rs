//! Steady-state work proportional to what changed: the index hands the writer only the keys that
//! changed, the writer plans them against its index of etcd (no read), a `410 Gone` relist rewrites
//! nothing that did not change, someone else's write sends the writer back to a full pass, and large
//! passes stay inside etcd's request size.

mod support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use felixrs_test_support::etcd::Etcd;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use policy_controller::ConvertOptions;
use policy_controller::convert::RESOURCE_PREFIX;
use policy_controller::index::{Changed, Index};
use policy_controller::manifests::ManifestSet;
use policy_controller::writer::{Changes, Desired, Writer};
use serde_json::{Value, json};
use support::etcd::EtcdClientExt;
use support::fake_apiserver::FakeApiServer;

const BIN: &str = env!("CARGO_BIN_EXE_policy-controller");

fn mk_pod(name: &str, ip: &str, app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "prod", "labels": {"app": app}, "resourceVersion": "1"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    })
}

/// Every key under the resource prefix with its mod revision, and etcd's revision.
async fn snapshot(c: &mut Client) -> (i64, BTreeMap<String, i64>) {
    let r = c
        .get(
            RESOURCE_PREFIX,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    let rev = r.header().unwrap().revision();
    let keys = r
        .kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap().to_string(), kv.mod_revision()))
        .collect();
    (rev, keys)
}

async fn wait_until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The running controller against the fake API server: a `410 Gone` relist of every kind with
/// nothing changed writes nothing (etcd's revision does not move), and one with a deletion missed
/// while disconnected writes exactly that deletion; every other key keeps its mod revision.
#[tokio::test]
async fn gone_relist_rewrites_no_unchanged_key() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let api = FakeApiServer::start().await;
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod"}}));
    api.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": {"name": "default", "namespace": "prod"}}));
    for i in 0..40 {
        api.apply(mk_pod(&format!("web-{i}"), &format!("10.0.0.{i}"), "web"));
    }
    api.apply(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "allow-web", "namespace": "prod"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"ports": [{"port": 80}]}]},
    }));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path());
    // No resync during the test: every write must come from the watches.
    let _child = tokio::process::Command::new(BIN)
        .args(["sync", "--etcd-endpoints", &etcd.client_url()])
        .args(["--election-ttl", "2", "--resync-interval", "3600"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // 40 endpoints, two profiles, one policy.
    wait_until("the first sync", || {
        let mut c = c.clone();
        async move { snapshot(&mut c).await.1.len() == 43 }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rev0, keys0) = snapshot(&mut c).await;

    // A 410 with nothing changed: every kind relists, nothing is written.
    api.disconnect_and_delete(mk_pod("not-there", "10.9.9.9", "x"));
    let relisted = |n: usize| {
        let stats = api.stats().0;
        ["namespaces", "serviceaccounts", "pods", "networkpolicies"]
            .iter()
            .all(|r| stats.get(*r).copied().unwrap_or(0) >= n)
    };
    wait_until("every kind relisted", || std::future::ready(relisted(2))).await;
    assert!(api.stats().1 >= 4, "the watches got 410 Gone");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (rev1, keys1) = snapshot(&mut c).await;
    assert_eq!(rev1, rev0, "a relist of unchanged objects wrote nothing");
    assert_eq!(keys1, keys0);

    // A 410 hiding one deletion: exactly that key goes, in one transaction.
    api.disconnect_and_delete(mk_pod("web-7", "10.0.0.7", "web"));
    let gone = format!("{RESOURCE_PREFIX}workloadendpoints/prod/node--1-k8s-web--7-eth0");
    assert!(keys0.contains_key(&gone));
    wait_until("the missed deletion", || {
        let mut c = c.clone();
        let gone = gone.clone();
        async move { !snapshot(&mut c).await.1.contains_key(&gone) }
    })
    .await;
    wait_until("every kind relisted again", || {
        std::future::ready(relisted(3))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (rev2, keys2) = snapshot(&mut c).await;
    assert_eq!(rev2, rev0 + 1, "one transaction: the deletion");
    let mut expected = keys0.clone();
    expected.remove(&gone);
    assert_eq!(keys2, expected, "every other key kept its mod revision");

    // Live events still flow, and write only their own key.
    api.apply(mk_pod("web-3", "10.0.0.3", "db"));
    let key3 = format!("{RESOURCE_PREFIX}workloadendpoints/prod/node--1-k8s-web--3-eth0");
    wait_until("the label change", || {
        let mut c = c.clone();
        let key3 = key3.clone();
        async move {
            let r = c.get(key3, None).await.unwrap();
            String::from_utf8_lossy(r.kvs()[0].value()).contains("\"db\"")
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rev3, keys3) = snapshot(&mut c).await;
    assert_eq!(rev3, rev2 + 1);
    let changed: Vec<&String> = keys3
        .iter()
        .filter(|(k, r)| keys2.get(*k) != Some(r))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(changed, vec![&key3]);
}

fn wep(name: &str) -> String {
    format!("{RESOURCE_PREFIX}workloadendpoints/prod/{name}")
}

/// The writer's index: changes are planned against it (a changed key is written, an unchanged one
/// is not, a foreign key is never deleted), someone else's write makes the next indexed pass ask
/// for a full one, and the full pass repairs it.
#[tokio::test]
async fn writer_index_writes_differences_and_falls_back_on_conflict() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let mut w = Writer::new(c.clone());
    assert!(!w.is_indexed());
    let assert_no_index = |w: &Writer| assert!(!w.is_indexed());
    let foreign = format!("{RESOURCE_PREFIX}networkpolicies/prod/mine");
    c.put(foreign.as_str(), "{}", None).await.unwrap();
    let desired = Desired {
        resources: (0..5)
            .map(|i| (wep(&format!("w{i}")), format!("{{\"v\":{i}}}")))
            .collect(),
        ..Desired::default()
    };
    w.sync(&desired).await.unwrap();
    assert!(w.is_indexed());
    let (rev0, keys0) = snapshot(&mut c).await;

    // One value changed, one unchanged, one deleted, the foreign key "deleted" (not ours: kept).
    let mut ch = Changes::default();
    ch.resources
        .insert(wep("w0"), Some(r#"{"v":"new"}"#.into()));
    ch.resources.insert(wep("w1"), Some(r#"{"v":1}"#.into()));
    ch.resources.insert(wep("w2"), None);
    ch.resources.insert(foreign.clone(), None);
    let s = w.sync_changes(&ch).await.unwrap().expect("indexed");
    assert_eq!((s.created, s.updated, s.deleted), (0, 1, 1));
    let (rev1, keys1) = snapshot(&mut c).await;
    assert_eq!(rev1, rev0 + 1, "one transaction");
    assert!(!keys1.contains_key(&wep("w2")));
    assert_eq!(keys1[&wep("w1")], keys0[&wep("w1")]);
    assert_eq!(keys1[&foreign], keys0[&foreign]);
    assert_eq!(keys1[&wep("w0")], rev1);
    // The same changes again: nothing to write.
    let s = w.sync_changes(&ch).await.unwrap().expect("indexed");
    assert_eq!((s.created, s.updated, s.deleted), (0, 0, 0));
    assert_eq!(snapshot(&mut c).await.0, rev1);

    // Someone else rewrites w3: the next pass touching it fails its compare and asks for a full one.
    c.put(wep("w3"), r#"{"v":"theirs"}"#, None).await.unwrap();
    let mut ch = Changes::default();
    ch.resources.insert(wep("w3"), Some(r#"{"v":33}"#.into()));
    assert!(w.sync_changes(&ch).await.unwrap().is_none());
    assert_no_index(&w);
    assert!(
        w.sync_changes(&ch).await.unwrap().is_none(),
        "no index: full pass needed"
    );
    let mut desired = desired.clone();
    desired.resources.insert(wep("w0"), r#"{"v":"new"}"#.into());
    desired.resources.remove(&wep("w2"));
    desired.resources.insert(wep("w3"), r#"{"v":33}"#.into());
    let s = w.sync(&desired).await.unwrap();
    assert_eq!((s.created, s.updated, s.deleted), (0, 1, 0));
    assert!(w.is_indexed());
    let v = c.get(wep("w3"), None).await.unwrap();
    assert_eq!(v.kvs()[0].value(), br#"{"v":33}"#);
    // A whole desired state against the index: equal, so nothing written.
    let rev = snapshot(&mut c).await.0;
    let s = w.sync_indexed(&desired).await.unwrap().expect("indexed");
    assert_eq!((s.created, s.updated, s.deleted), (0, 0, 0));
    assert_eq!(snapshot(&mut c).await.0, rev);
}

/// A pass larger than etcd's request limit (1.5 MiB by default) goes out in several transactions.
#[tokio::test]
async fn large_pass_stays_inside_the_request_limit() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let mut w = Writer::new(c.clone());
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(300 * 1024));
    let desired = Desired {
        resources: (0..12)
            .map(|i| (wep(&format!("big{i}")), big.clone()))
            .collect(),
        ..Desired::default()
    };
    let s = w.sync(&desired).await.unwrap();
    assert_eq!(s.created, 12);
    let (_, keys) = snapshot(&mut c).await;
    assert_eq!(keys.len(), 12);
    let revs: std::collections::BTreeSet<i64> = keys.values().copied().collect();
    assert!(
        revs.len() >= 4,
        "split into transactions under 1 MiB: {revs:?}"
    );
}

fn pod(name: &str, app: &str, rv: &str) -> Pod {
    let mut v = mk_pod(name, "10.1.0.1", app);
    v["metadata"]["resourceVersion"] = json!(rv);
    serde_json::from_value(v).unwrap()
}

/// The index hands over only the keys whose stored value changed.
#[test]
fn index_tracks_changed_keys() {
    let mut idx = Index::new(
        ConvertOptions::default(),
        &["Namespace", "Pod"],
        ManifestSet::default(),
    );
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "prod"}})).unwrap();
    idx.reset(&[ns]);
    assert!(
        idx.take_changes().is_none(),
        "not ready before every kind is listed"
    );
    idx.reset(&[pod("a", "web", "1"), pod("b", "web", "1")]);
    let Some(Changed::Everything(state)) = idx.take_changes() else {
        panic!("the first complete listing is everything");
    };
    assert_eq!(state.desired.resources.len(), 3);
    assert_eq!(idx.desired_len(), 3);
    let keys = |c: Option<Changed>| match c {
        Some(Changed::Keys(ch)) => ch
            .resources
            .into_iter()
            .map(|(k, v)| (k, v.is_some()))
            .collect::<Vec<_>>(),
        other => panic!("expected keys, got {other:?}"),
    };
    // A relist with the same objects (same resourceVersion, or a new one with the same content).
    idx.reset(&[pod("a", "web", "1"), pod("b", "web", "2")]);
    assert_eq!(keys(idx.take_changes()), vec![]);
    // One label change, one deletion by relist.
    idx.reset(&[pod("a", "db", "3")]);
    let a = wep("node--1-k8s-a-eth0");
    let b = wep("node--1-k8s-b-eth0");
    assert_eq!(keys(idx.take_changes()), vec![(a, true), (b, false)]);
    assert_eq!(idx.desired_len(), 2);
    assert_eq!(keys(idx.take_changes()), vec![]);
}

/// A listing larger than a page (500) arrives in pages, and the relist is applied whole.
#[tokio::test]
async fn paged_listing_is_applied_whole() {
    let api = FakeApiServer::start().await;
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod"}}));
    for i in 0..1_201 {
        api.apply(mk_pod(&format!("p-{i}"), "10.2.0.1", "web"));
    }
    let kinds = policy_controller::k8s_source::KINDS;
    let index = std::sync::Arc::new(std::sync::Mutex::new(Index::new(
        ConvertOptions::default(),
        &kinds,
        ManifestSet::default(),
    )));
    policy_controller::k8s_source::list_once(api.client(), &index)
        .await
        .unwrap();
    assert_eq!(index.lock().unwrap().count("Pod"), 1_201);
    assert_eq!(api.stats().0["pods"], 3, "three pages of at most 500");
}
