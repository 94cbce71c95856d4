//! The kube-rs source path end to end: the real kube client and watcher against a fake API server over
//! HTTP, feeding the index, reconciled into a real etcd. Covers the initial list, live events,
//! bookmarks, and a `410 Gone` after a disconnect forcing a relist that applies a missed deletion.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use felixrs_test_support::etcd::Etcd;
use policy_controller::convert::RESOURCE_PREFIX;
use policy_controller::index::Index;
use policy_controller::k8s_source::{self, KINDS};
use policy_controller::manifests::ManifestSet;
use policy_controller::writer::Writer;
use policy_controller::{ConvertOptions, ObjectRef};
use serde_json::{Value, json};
use support::etcd::EtcdClientExt;
use support::fake_apiserver::FakeApiServer;

fn mk_pod(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "prod", "labels": {"app": "web"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    })
}

fn mk_namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"team": "ops"}}})
}

fn mk_sa(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}})
}

fn mk_np(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"ports": [{"port": 80}]}]},
    })
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn etcd_keys(c: &mut etcd_client::Client) -> Vec<String> {
    let r = c
        .get(
            RESOURCE_PREFIX,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    r.kvs()
        .iter()
        .map(|kv| {
            kv.key_str()
                .unwrap()
                .trim_start_matches(RESOURCE_PREFIX)
                .to_string()
        })
        .collect()
}

/// An index of every watched kind, without manifests.
fn empty_index() -> Arc<Mutex<Index>> {
    Arc::new(Mutex::new(Index::new(
        ConvertOptions::default(),
        &KINDS,
        ManifestSet::default(),
    )))
}

async fn sync(index: &Arc<Mutex<Index>>, writer: &mut Writer) {
    let state = index.lock().unwrap().desired().expect("index ready");
    writer.sync(&state.desired).await.unwrap();
}

/// The watchers of [`start`]; stopped on drop (also when a test fails).
struct Watchers(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watchers {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// What every test here starts from: etcd, the fake API server, the watchers over an empty
/// index, and a writer that has written one pass after the initial lists.
struct Started {
    _etcd: Etcd,
    c: etcd_client::Client,
    api: FakeApiServer,
    index: Arc<Mutex<Index>>,
    writer: Writer,
    _watchers: Watchers,
}

/// Starts etcd and the API server, lets `setup` fill the API server, starts the watchers and
/// writes the first pass once every kind is listed.
async fn start(setup: impl FnOnce(&FakeApiServer)) -> Started {
    let etcd = Etcd::start();
    let c = etcd.client().await;
    let api = FakeApiServer::start().await;
    setup(&api);
    let index = empty_index();
    assert!(
        index.lock().unwrap().desired().is_none(),
        "not ready before the first list"
    );
    let changed = Arc::new(tokio::sync::Notify::new());
    let watchers = Watchers(k8s_source::spawn_all(api.client(), index.clone(), changed));
    let mut writer = Writer::new(c.clone());
    wait_until("the initial lists", || index.lock().unwrap().is_ready()).await;
    sync(&index, &mut writer).await;
    Started {
        _etcd: etcd,
        c,
        api,
        index,
        writer,
        _watchers: watchers,
    }
}

impl Started {
    /// One full pass of the index's desired state.
    async fn sync(&mut self) {
        sync(&self.index, &mut self.writer).await;
    }
}

#[tokio::test]
async fn watch_relist_after_gone_applies_missed_deletion() {
    let mut w = start(|api| {
        api.apply(mk_namespace("prod"));
        api.apply(mk_sa("prod", "default"));
        api.apply(mk_pod("web-1", "10.0.0.1"));
        api.apply(mk_pod("web-2", "10.0.0.2"));
        api.apply(mk_np("prod", "allow-web"));
    })
    .await;
    assert_eq!(
        etcd_keys(&mut w.c).await,
        vec![
            "networkpolicies/prod/knp.default.allow-web",
            "profiles/kns.prod",
            "profiles/ksa.prod.default",
            "workloadendpoints/prod/node--1-k8s-web--1-eth0",
            "workloadendpoints/prod/node--1-k8s-web--2-eth0",
        ]
    );

    // Live events over the watch.
    let pod3 = ObjectRef::new("Pod", Some("prod"), "web-3");
    w.api.apply(mk_pod("web-3", "10.0.0.3"));
    wait_until("web-3 from the watch", || {
        w.index.lock().unwrap().contains(&pod3)
    })
    .await;
    w.api.delete(mk_np("prod", "allow-web"));
    let np = ObjectRef::new("NetworkPolicy", Some("prod"), "allow-web");
    wait_until("the policy deletion from the watch", || {
        !w.index.lock().unwrap().contains(&np)
    })
    .await;
    w.sync().await;
    let keys = etcd_keys(&mut w.c).await;
    assert!(keys.contains(&"workloadendpoints/prod/node--1-k8s-web--3-eth0".to_string()));
    assert!(!keys.iter().any(|k| k.contains("knp.default.allow-web")));
    let (lists_before, gone_before, bookmarks) = w.api.stats();
    assert_eq!(gone_before, 0);
    assert!(
        bookmarks >= 4,
        "watches asked for and got bookmarks ({bookmarks})"
    );

    // Disconnect; web-2 is deleted while nobody watches and the history is compacted.
    let pod2 = ObjectRef::new("Pod", Some("prod"), "web-2");
    w.api.disconnect_and_delete(mk_pod("web-2", "10.0.0.2"));
    wait_until("the relist to drop web-2", || {
        !w.index.lock().unwrap().contains(&pod2)
    })
    .await;
    let (lists_after, gone, _) = w.api.stats();
    assert!(gone >= 1, "the reconnecting watch got 410 Gone");
    assert!(
        lists_after["pods"] > lists_before["pods"],
        "pods were relisted"
    );
    w.sync().await;
    let keys = etcd_keys(&mut w.c).await;
    assert!(
        !keys.iter().any(|k| k.contains("web--2")),
        "missed deletion applied: {keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.contains("web--1")),
        "other pods kept: {keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.contains("web--3")),
        "other pods kept: {keys:?}"
    );

    // Watching resumes after the relist.
    let pod4 = ObjectRef::new("Pod", Some("prod"), "web-4");
    w.api.apply(mk_pod("web-4", "10.0.0.4"));
    wait_until("web-4 after the relist", || {
        w.index.lock().unwrap().contains(&pod4)
    })
    .await;
}

/// A NetworkPolicy from the API with an unknown field (k8s-openapi would drop it silently) is
/// reported with its path and its last good version stays in etcd.
#[tokio::test]
async fn unknown_field_from_the_api_keeps_the_last_good_version() {
    let mut w = start(|api| {
        api.apply(mk_namespace("prod"));
        api.apply(mk_sa("prod", "default"));
        api.apply(mk_np("prod", "allow-web"));
    })
    .await;
    let key = format!("{RESOURCE_PREFIX}networkpolicies/prod/knp.default.allow-web");
    let good = w.c.get(key.as_str(), None).await.unwrap().kvs()[0]
        .value()
        .to_vec();
    assert!(String::from_utf8_lossy(&good).contains("80"));

    // The update moves the port and misspells `from`'s podSelector: as written, the rule would
    // allow every source on port 81.
    let mut typo = mk_np("prod", "allow-web");
    typo["spec"]["ingress"][0] = json!({"ports": [{"port": 81}], "from": [{"podSelectr": {}}]});
    w.api.apply(typo);
    let field = "spec.ingress[0].from[0].podSelectr";
    wait_until("the typo reported", || {
        w.index
            .lock()
            .unwrap()
            .desired()
            .is_some_and(|s| s.skips.iter().any(|r| r.field == field))
    })
    .await;
    w.sync().await;
    let now = w.c.get(key.as_str(), None).await.unwrap().kvs()[0]
        .value()
        .to_vec();
    assert_eq!(
        String::from_utf8_lossy(&now),
        String::from_utf8_lossy(&good),
        "the last good version is kept"
    );
}

fn mk_anp(name: &str, priority: i64, action: &str) -> Value {
    json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "AdminNetworkPolicy",
        "metadata": {"name": name},
        "spec": {"priority": priority, "subject": {"namespaces": {"matchLabels": {"team": "ops"}}},
                 "ingress": [{"action": action, "from": [{"namespaces": {}}]}]},
    })
}

fn mk_banp() -> Value {
    json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "BaselineAdminNetworkPolicy",
        "metadata": {"name": "default"},
        "spec": {"subject": {"namespaces": {}},
                 "egress": [{"action": "Deny", "to": [{"networks": ["10.0.0.0/8"]}]}]},
    })
}

fn mk_cnp(name: &str) -> Value {
    json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
        "metadata": {"name": name},
        "spec": {"tier": "Baseline", "priority": 3, "subject": {"namespaces": {}},
                 "ingress": [{"action": "Accept", "from": [{"namespaces": {}}],
                              "protocols": [{"tcp": {"destinationPort": {"number": 80}}}]}]},
    })
}

async fn etcd_value(c: &mut etcd_client::Client, key: &str) -> Option<Value> {
    let r = c
        .get(format!("{RESOURCE_PREFIX}{key}"), None)
        .await
        .unwrap();
    r.kvs()
        .first()
        .map(|kv| serde_json::from_slice(kv.value()).unwrap())
}

/// The admin-policy kinds through the CRD group/version paths: list, live events, an invalid object
/// skipped while the others apply, and a relist after `410 Gone` that applies a missed deletion.
#[tokio::test]
async fn admin_policies_watch_and_relist_after_gone() {
    let mut w = start(|api| {
        api.apply(mk_namespace("prod"));
        api.apply(mk_anp("first", 10, "Deny"));
        api.apply(mk_anp("second", 20, "Pass"));
        api.apply(mk_banp());
        api.apply(mk_cnp("web"));
    })
    .await;
    let keys = etcd_keys(&mut w.c).await;
    for k in [
        "globalnetworkpolicies/kanp.adminnetworkpolicy.first",
        "globalnetworkpolicies/kanp.adminnetworkpolicy.second",
        "globalnetworkpolicies/kbanp.baselineadminnetworkpolicy.default",
        "globalnetworkpolicies/kcnp.web",
        "tiers/kube-admin",
        "tiers/kube-baseline",
    ] {
        assert!(keys.contains(&k.to_string()), "{k} missing from {keys:?}");
    }
    let first = etcd_value(
        &mut w.c,
        "globalnetworkpolicies/kanp.adminnetworkpolicy.first",
    )
    .await
    .unwrap();
    assert_eq!(first["spec"]["tier"], "kube-admin");
    assert_eq!(first["spec"]["order"], 10);
    assert_eq!(first["spec"]["ingress"][0]["action"], "Deny");
    let tier = etcd_value(&mut w.c, "tiers/kube-admin").await.unwrap();
    assert_eq!(tier["spec"]["defaultAction"], "Pass");

    // Nodes: watched, but their network sets are stored only once a policy has a nodes peer.
    w.api.apply(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "a"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}]},
    }));
    let n1 = ObjectRef::new("Node", None, "n1");
    wait_until("the node from the watch", || {
        w.index.lock().unwrap().contains(&n1)
    })
    .await;
    w.sync().await;
    assert!(
        etcd_value(&mut w.c, "globalnetworksets/knode.n1")
            .await
            .is_none()
    );
    w.api.apply(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "AdminNetworkPolicy",
        "metadata": {"name": "to-zone-a"},
        "spec": {"priority": 50, "subject": {"namespaces": {}},
                 "egress": [{"action": "Deny", "to": [{"nodes": {"matchLabels": {"zone": "a"}}}]}]},
    }));
    let to_zone_a = ObjectRef::new("AdminNetworkPolicy", None, "to-zone-a");
    wait_until("the nodes policy from the watch", || {
        w.index.lock().unwrap().contains(&to_zone_a)
    })
    .await;
    w.sync().await;
    let set = etcd_value(&mut w.c, "globalnetworksets/knode.n1")
        .await
        .expect("the node's set once a nodes peer uses it");
    assert_eq!(set["spec"]["nets"], json!(["192.0.2.1/32"]));
    w.api.delete(
        json!({"apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "AdminNetworkPolicy",
                      "metadata": {"name": "to-zone-a"}}),
    );
    w.api
        .delete(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));

    // Live: an update, and an invalid object (unknown field) that is skipped, not fatal.
    w.api.apply(mk_anp("first", 5, "Allow"));
    let mut bad = mk_anp("bad", 1, "Deny");
    bad["spec"]["ingress"][0]["prots"] = json!([]);
    w.api.apply(bad);
    let bad_ref = ObjectRef::new("AdminNetworkPolicy", None, "bad");
    wait_until("the invalid policy from the watch", || {
        w.index.lock().unwrap().contains(&bad_ref)
    })
    .await;
    wait_until("the update from the watch", || {
        let s = w.index.lock().unwrap().desired().unwrap();
        s.desired
            .resources
            .iter()
            .any(|(k, v)| k.ends_with("kanp.adminnetworkpolicy.first") && v.contains("Allow"))
    })
    .await;
    let state = w.index.lock().unwrap().desired().unwrap();
    let skip = state
        .skips
        .iter()
        .find(|s| s.name == "bad")
        .expect("the invalid policy is reported");
    assert_eq!(skip.kind, "AdminNetworkPolicy");
    assert_eq!(skip.field, "spec.ingress[0].prots");
    w.sync().await;
    let first = etcd_value(
        &mut w.c,
        "globalnetworkpolicies/kanp.adminnetworkpolicy.first",
    )
    .await
    .unwrap();
    assert_eq!(first["spec"]["order"], 5);
    assert!(
        !etcd_keys(&mut w.c).await.iter().any(|k| k.contains(".bad")),
        "the invalid policy is not written"
    );

    // Missed deletion across a 410 Gone.
    let second = ObjectRef::new("AdminNetworkPolicy", None, "second");
    w.api.disconnect_and_delete(mk_anp("second", 20, "Pass"));
    wait_until("the relist to drop the second policy", || {
        !w.index.lock().unwrap().contains(&second)
    })
    .await;
    let (lists, gone, _) = w.api.stats();
    assert!(gone >= 1, "the reconnecting watch got 410 Gone");
    assert!(lists["adminnetworkpolicies"] >= 2, "relisted: {lists:?}");
    w.sync().await;
    let keys = etcd_keys(&mut w.c).await;
    assert!(!keys.iter().any(|k| k.contains("adminnetworkpolicy.second")));
    assert!(keys.iter().any(|k| k.contains("adminnetworkpolicy.first")));

    // All admin policies deleted: their tiers go too.
    w.api.delete(mk_anp("first", 5, "Allow"));
    w.api.delete(mk_banp());
    w.api.delete(mk_cnp("web"));
    w.api.delete(mk_anp("bad", 1, "Deny"));
    wait_until("the deletions", || {
        w.index.lock().unwrap().count("AdminNetworkPolicy") == 0
            && w.index.lock().unwrap().count("ClusterNetworkPolicy") == 0
            && w.index.lock().unwrap().count("BaselineAdminNetworkPolicy") == 0
    })
    .await;
    w.sync().await;
    let keys = etcd_keys(&mut w.c).await;
    assert!(
        !keys
            .iter()
            .any(|k| k.starts_with("tiers/") || k.starts_with("globalnetworkpolicies/")),
        "{keys:?}"
    );
}

/// A cluster without the network-policy-api CRDs: the controller does not wait for them forever, and
/// picks the objects up once the CRDs are installed.
#[tokio::test]
async fn missing_admin_crds_count_as_empty_until_installed() {
    let mut w = start(|api| {
        api.set_crds_installed(false);
        api.apply(mk_namespace("prod"));
    })
    .await;
    // Ready (the first pass is written) without the CRDs.
    assert!(w.api.not_found() >= 3, "the CRD paths answered 404");
    assert_eq!(etcd_keys(&mut w.c).await, vec!["profiles/kns.prod"]);

    w.api.set_crds_installed(true);
    w.api.apply(mk_anp("late", 1, "Deny"));
    let late = ObjectRef::new("AdminNetworkPolicy", None, "late");
    wait_until("the policy once the CRD is served", || {
        w.index.lock().unwrap().contains(&late)
    })
    .await;
    w.sync().await;
    assert!(
        etcd_keys(&mut w.c)
            .await
            .contains(&"globalnetworkpolicies/kanp.adminnetworkpolicy.late".to_string())
    );
}

fn mk_staged(kind: &str, ns: Option<&str>, name: &str, spec: Value) -> Value {
    let mut meta = json!({"name": name});
    if let Some(ns) = ns {
        meta["namespace"] = json!(ns);
    }
    json!({"apiVersion": "projectcalico.org/v3", "kind": kind, "metadata": meta, "spec": spec})
}

/// The staged policy kinds (`projectcalico.org/v3`, optional like the admin CRDs): listed and
/// watched, each written under its own key as written; a StagedKubernetesNetworkPolicy that is
/// no valid Kubernetes NetworkPolicy is skipped with the field named.
#[tokio::test]
async fn staged_policies_are_watched_and_written_to_their_keys() {
    let mut w = start(|api| {
        api.apply(mk_namespace("prod"));
        api.apply(mk_staged(
            "StagedNetworkPolicy",
            Some("prod"),
            "web",
            json!({"stagedAction": "Set", "selector": "app == 'web'", "types": ["Ingress"],
                   "ingress": [{"action": "Deny"}]}),
        ));
        api.apply(mk_staged(
            "StagedGlobalNetworkPolicy",
            None,
            "guard",
            json!({"stagedAction": "Delete"}),
        ));
        api.apply(mk_staged(
            "StagedKubernetesNetworkPolicy",
            Some("prod"),
            "k8s-web",
            json!({"stagedAction": "Set", "podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]}),
        ));
        api.apply(mk_staged(
            "StagedKubernetesNetworkPolicy",
            Some("prod"),
            "typo",
            json!({"podSelector": {}, "ingres": []}),
        ));
    })
    .await;
    let keys = etcd_keys(&mut w.c).await;
    for k in [
        "stagednetworkpolicies/prod/web",
        "stagedglobalnetworkpolicies/guard",
        "stagedkubernetesnetworkpolicies/prod/k8s-web",
    ] {
        assert!(keys.contains(&k.to_string()), "{k} missing from {keys:?}");
    }
    assert!(!keys.iter().any(|k| k.contains("typo")), "{keys:?}");
    let web = etcd_value(&mut w.c, "stagednetworkpolicies/prod/web")
        .await
        .unwrap();
    assert_eq!(web["spec"]["stagedAction"], "Set");
    assert_eq!(web["spec"]["ingress"][0]["action"], "Deny");
    let skips = w.index.lock().unwrap().desired().unwrap().skips;
    assert!(
        skips.iter().any(|s| s.to_string().contains("ingres")),
        "{skips:?}"
    );

    // Live: a new staged policy arrives through the watch.
    w.api.apply(mk_staged(
        "StagedGlobalNetworkPolicy",
        None,
        "late",
        json!({"selector": "all()", "ingress": [{"action": "Deny"}]}),
    ));
    let late = ObjectRef::new("StagedGlobalNetworkPolicy", None, "late");
    wait_until("the live staged policy", || {
        w.index.lock().unwrap().contains(&late)
    })
    .await;
    w.sync().await;
    assert!(
        etcd_keys(&mut w.c)
            .await
            .contains(&"stagedglobalnetworkpolicies/late".to_string())
    );
}
