//! Calico's automatic host endpoints from Kubernetes Nodes, end to end: the real kube client and
//! watchers against the fake API server over HTTP (list, watch, resourceVersion, `410 Gone`), the
//! index and the writer into a real etcd; then the binary, which reads the setting from the flag or
//! the `default` KubeControllersConfiguration in etcd, live and with `--once` from manifests.

mod support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

const BIN: &str = env!("CARGO_BIN_EXE_policy-controller");

fn mk_node(name: &str, zone: &str, internal: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "zone": zone},
                     "annotations": {"projectcalico.org/IPv4Address": format!("{internal}/24"),
                                     "projectcalico.org/IPv4VXLANTunnelAddr": "10.244.0.1"}},
        "status": {"addresses": [{"type": "InternalIP", "address": internal},
                                 {"type": "InternalIP", "address": "fd00::7"},
                                 {"type": "ExternalIP", "address": "203.0.113.9"},
                                 {"type": "Hostname", "address": name}]},
    })
}

/// The host endpoint kube-controllers writes for `mk_node(name, zone, internal)`.
fn want_hep(name: &str, zone: &str, internal: &str) -> Value {
    json!({
        "apiVersion": "projectcalico.org/v3", "kind": "HostEndpoint",
        "metadata": {"name": format!("{name}-auto-hep"), "labels": {
            "kubernetes.io/hostname": name, "zone": zone,
            "projectcalico.org/created-by": "calico-kube-controllers"}},
        "spec": {"node": name, "interfaceName": "*",
                 "expectedIPs": [internal, "10.244.0.1", "fd00::7"],
                 "profiles": ["projectcalico-default-allow"]},
    })
}

fn hep_key(name: &str) -> String {
    format!("{RESOURCE_PREFIX}hostendpoints/{name}")
}

/// The stored value and mod revision of a key.
async fn stored(c: &mut etcd_client::Client, key: &str) -> Option<(Value, i64)> {
    let r = c.get(key, None).await.unwrap();
    r.kvs().first().map(|kv| {
        (
            serde_json::from_slice(kv.value()).unwrap(),
            kv.mod_revision(),
        )
    })
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn sync(index: &Arc<Mutex<Index>>, writer: &mut Writer) {
    let state = index.lock().unwrap().desired().expect("index ready");
    writer.sync(&state.desired).await.unwrap();
}

/// The host endpoint the index desires under `name`.
fn desired_hep(index: &Arc<Mutex<Index>>, name: &str) -> Option<Value> {
    let state = index.lock().unwrap().desired()?;
    let json = state.desired.resources.get(&hep_key(name))?;
    Some(serde_json::from_str(json).unwrap())
}

#[tokio::test]
async fn auto_host_endpoints_follow_nodes() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let api = FakeApiServer::start().await;
    api.apply(mk_node("n1", "a", "192.0.2.1"));
    api.apply(mk_node("n2", "b", "192.0.2.2"));
    api.apply(mk_node("n3", "c", "192.0.2.3"));
    // A user's host endpoints: one of their own, one holding n3's automatic name (no label), and
    // a stale automatic one whose node went away while no controller ran.
    let users = json!({"apiVersion": "projectcalico.org/v3", "kind": "HostEndpoint",
        "metadata": {"name": "n1-eth0", "labels": {"role": "edge"}},
        "spec": {"node": "n1", "interfaceName": "eth0", "expectedIPs": ["192.0.2.1"]}});
    let squatter = json!({"apiVersion": "projectcalico.org/v3", "kind": "HostEndpoint",
        "metadata": {"name": "n3-auto-hep", "labels": {"mine": "yes"}},
        "spec": {"node": "n3", "interfaceName": "eth1"}});
    let stale = want_hep("gone", "z", "192.0.2.99");
    for (name, v) in [
        ("n1-eth0", &users),
        ("n3-auto-hep", &squatter),
        ("gone-auto-hep", &stale),
    ] {
        c.put(hep_key(name), v.to_string(), None).await.unwrap();
    }
    let (_, users_rev) = stored(&mut c, &hep_key("n1-eth0")).await.unwrap();
    let (_, squatter_rev) = stored(&mut c, &hep_key("n3-auto-hep")).await.unwrap();

    let index = Arc::new(Mutex::new(Index::new(
        ConvertOptions::default(),
        &KINDS,
        ManifestSet::default(),
    )));
    let changed = Arc::new(tokio::sync::Notify::new());
    let tasks = k8s_source::spawn_all(api.client(), index.clone(), changed.clone());
    let mut writer = Writer::new(c.clone());
    wait_until("the initial lists", || index.lock().unwrap().is_ready()).await;

    // Off when not asked: no automatic host endpoint is written; like kube-controllers with
    // autoCreate disabled, the stale automatic one is removed; the user's are untouched.
    sync(&index, &mut writer).await;
    assert!(stored(&mut c, &hep_key("n1-auto-hep")).await.is_none());
    assert!(stored(&mut c, &hep_key("gone-auto-hep")).await.is_none());
    c.put(hep_key("gone-auto-hep"), stale.to_string(), None)
        .await
        .unwrap();

    // Asked: one per node, as kube-controllers writes it; the stale one goes on this resync.
    assert!(index.lock().unwrap().set_auto_host_endpoints(true));
    sync(&index, &mut writer).await;
    let (n1, n1_rev) = stored(&mut c, &hep_key("n1-auto-hep")).await.unwrap();
    assert_eq!(n1, want_hep("n1", "a", "192.0.2.1"));
    assert_eq!(
        stored(&mut c, &hep_key("n2-auto-hep")).await.unwrap().0,
        want_hep("n2", "b", "192.0.2.2")
    );
    assert!(stored(&mut c, &hep_key("gone-auto-hep")).await.is_none());
    assert_eq!(
        stored(&mut c, &hep_key("n3-auto-hep")).await.unwrap(),
        (squatter.clone(), squatter_rev),
        "a host endpoint without the created-by label is never taken over"
    );

    // A label change on the node: the endpoint's labels follow.
    api.apply(mk_node("n1", "east", "192.0.2.1"));
    wait_until("the label change from the watch", || {
        desired_hep(&index, "n1-auto-hep")
            .is_some_and(|h| h["metadata"]["labels"]["zone"] == "east")
    })
    .await;
    sync(&index, &mut writer).await;
    assert_eq!(
        stored(&mut c, &hep_key("n1-auto-hep")).await.unwrap().0,
        want_hep("n1", "east", "192.0.2.1")
    );

    // An address change: expectedIPs follow.
    api.apply(mk_node("n1", "east", "192.0.2.41"));
    wait_until("the address change from the watch", || {
        desired_hep(&index, "n1-auto-hep")
            .is_some_and(|h| h["spec"]["expectedIPs"][0] == "192.0.2.41")
    })
    .await;
    sync(&index, &mut writer).await;
    let (n1, n1_rev_2) = stored(&mut c, &hep_key("n1-auto-hep")).await.unwrap();
    assert_eq!(n1, want_hep("n1", "east", "192.0.2.41"));
    assert!(n1_rev_2 > n1_rev);

    // A relist after 410 Gone: n2 deleted while disconnected goes; n1, unchanged, is not rewritten.
    let (n2_rev_lists, gone_before, _) = api.stats();
    api.disconnect_and_delete(mk_node("n2", "b", "192.0.2.2"));
    let n2 = ObjectRef::new("Node", None, "n2");
    wait_until("the relist to drop n2", || {
        !index.lock().unwrap().contains(&n2)
    })
    .await;
    let (lists, gone, _) = api.stats();
    assert!(gone > gone_before, "the reconnecting watch got 410 Gone");
    assert!(
        lists["nodes"] > n2_rev_lists["nodes"],
        "nodes were relisted"
    );
    sync(&index, &mut writer).await;
    assert!(stored(&mut c, &hep_key("n2-auto-hep")).await.is_none());
    assert_eq!(
        stored(&mut c, &hep_key("n1-auto-hep")).await.unwrap().1,
        n1_rev_2,
        "an unchanged host endpoint is not rewritten by a relist"
    );

    // Node deleted: its host endpoint goes.
    api.delete(mk_node("n1", "east", "192.0.2.41"));
    let n1_ref = ObjectRef::new("Node", None, "n1");
    wait_until("n1's deletion from the watch", || {
        !index.lock().unwrap().contains(&n1_ref)
    })
    .await;
    sync(&index, &mut writer).await;
    assert!(stored(&mut c, &hep_key("n1-auto-hep")).await.is_none());

    // Through all of it the user's host endpoints were never written.
    assert_eq!(
        stored(&mut c, &hep_key("n1-eth0")).await.unwrap(),
        (users, users_rev)
    );
    assert_eq!(
        stored(&mut c, &hep_key("n3-auto-hep")).await.unwrap(),
        (squatter, squatter_rev)
    );
    for t in tasks {
        t.abort();
    }
}

const KCC_KEY: &str =
    "/calico/resources/v3/projectcalico.org/kubecontrollersconfigurations/default";

fn kcc(auto_create: &str) -> String {
    json!({"apiVersion": "projectcalico.org/v3", "kind": "KubeControllersConfiguration",
           "metadata": {"name": "default"},
           "spec": {"controllers": {"node": {"reconcilerPeriod": "5m",
                    "hostEndpoint": {"autoCreate": auto_create}}}}})
    .to_string()
}

async fn wait_for_key(c: &etcd_client::Client, key: &str, present: bool) {
    let start = Instant::now();
    loop {
        let n = c.clone().get(key, None).await.unwrap().count();
        if (n == 1) == present {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {key} to be {}",
            if present { "written" } else { "deleted" }
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The running controller follows the `default` KubeControllersConfiguration live (its watch, not
/// the resync: the resync interval is an hour), and the flag overrides it.
#[tokio::test]
async fn the_controller_follows_the_kube_controllers_configuration() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let api = FakeApiServer::start().await;
    api.apply(mk_node("n1", "a", "192.0.2.1"));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path());
    let spawn = |flag: Option<&str>| {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(["sync", "--etcd-endpoints", &etcd.client_url()])
            .args(["--election-ttl", "2", "--resync-interval", "3600"])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env_remove("AUTO_HOST_ENDPOINTS")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(f) = flag {
            cmd.args(["--auto-host-endpoints", f]);
        }
        cmd.spawn().unwrap()
    };
    let key = hep_key("n1-auto-hep");
    let child = spawn(None);
    c.put(KCC_KEY, kcc("Enabled"), None).await.unwrap();
    wait_for_key(&c, &key, true).await;
    assert_eq!(
        stored(&mut c, &key).await.unwrap().0,
        want_hep("n1", "a", "192.0.2.1")
    );
    c.put(KCC_KEY, kcc("Disabled"), None).await.unwrap();
    wait_for_key(&c, &key, false).await;
    drop(child);

    // The flag wins over the resource, both ways.
    let child = spawn(Some("enabled"));
    wait_for_key(&c, &key, true).await;
    drop(child);
    c.put(KCC_KEY, kcc("Enabled"), None).await.unwrap();
    let _child = spawn(Some("Disabled"));
    wait_for_key(&c, &key, false).await;
}

/// `--once` from manifests: the manifests' Nodes produce the same host endpoints, when asked.
#[tokio::test]
async fn manifest_nodes_produce_auto_host_endpoints() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let dir = tempfile::tempdir().unwrap();
    let manifest = serde_yaml::to_string(&mk_node("m1", "a", "192.0.2.5")).unwrap();
    std::fs::write(dir.path().join("nodes.yaml"), manifest).unwrap();
    let once = |flag: Option<&str>| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["sync", "--once", "--etcd-endpoints", &etcd.client_url()])
            .arg("--manifests")
            .arg(dir.path())
            .env_remove("AUTO_HOST_ENDPOINTS");
        if let Some(f) = flag {
            cmd.args(["--auto-host-endpoints", f]);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let last = String::from_utf8(out.stdout).unwrap();
        serde_json::from_str::<Value>(last.lines().last().unwrap()).unwrap()
    };
    let key = hep_key("m1-auto-hep");
    let r = once(None);
    assert_eq!(r["created"], 0, "off when not asked: {r}");
    c.put(KCC_KEY, kcc("Enabled"), None).await.unwrap();
    let r = once(None);
    assert_eq!(r["created"], 1, "{r}");
    assert_eq!(
        stored(&mut c, &key).await.unwrap().0,
        want_hep("m1", "a", "192.0.2.5")
    );
    let r = once(None);
    assert_eq!(
        (r["created"].as_u64(), r["updated"].as_u64()),
        (Some(0), Some(0))
    );
    let r = once(Some("disabled"));
    assert_eq!(r["deleted"], 1, "{r}");
    assert!(stored(&mut c, &key).await.is_none());
}
