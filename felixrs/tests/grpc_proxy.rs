//! Fan-out through `etcd grpc-proxy` (issue 14): the agent's real syncers, connected through one
//! proxy in front of a 3-member etcd cluster, keep exactly the cluster's contents while each member
//! in turn is killed (SIGKILL) and restarted with writes going on; and list again when the proxy
//! restarts after etcd compacted past what they hold (etcd-io/etcd#10650: without the syncer's
//! compaction probe, watches reopened through the restarted proxy deliver nothing, ever).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use calc_graph::model::{CALICO_PREFIX, EtcdPrefix};
use felixrs::agent::datastore::{EtcdDatastore, EtcdTls};
use felixrs::agent::syncer::{self, SyncEvent, SyncerConfig};
use felixrs_test_support::etcd::cluster::{EtcdCluster, GrpcProxy};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

const SYNCERS: usize = 5;

type View = BTreeMap<String, Vec<u8>>;

/// Key under which a view records the newest revision its syncer confirmed (not an etcd key).
const REVISION: &str = "#revision";

/// One syncer through `url`, folding its events into a view shared with the test.
fn spawn_syncer(url: &str, cancel: &CancellationToken) -> Arc<std::sync::Mutex<View>> {
    let ds = EtcdDatastore::new(
        vec![url.to_string()],
        EtcdTls::default(),
        Duration::from_secs(2),
    );
    let mut cfg = SyncerConfig::new(EtcdPrefix::default());
    cfg.max_backoff = Duration::from_millis(500);
    let (tx, mut rx) = mpsc::channel(256);
    tokio::spawn(syncer::run(
        ds,
        cfg,
        tx,
        Arc::new(Notify::new()),
        cancel.child_token(),
    ));
    let view = Arc::new(std::sync::Mutex::new(View::new()));
    let v = view.clone();
    tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            let mut v = v.lock().unwrap();
            match ev {
                SyncEvent::Listed { kvs, revision } => {
                    *v = kvs.into_iter().collect();
                    v.insert(REVISION.into(), revision.to_string().into_bytes());
                }
                SyncEvent::Progress { revision } => {
                    v.insert(REVISION.into(), revision.to_string().into_bytes());
                }
                SyncEvent::Changes { changes, revision } => {
                    v.insert(REVISION.into(), revision.to_string().into_bytes());
                    for c in changes {
                        match c.value {
                            Some(val) => v.insert(c.key, val),
                            None => v.remove(&c.key),
                        };
                    }
                }
                SyncEvent::Disconnected { .. } => {}
            }
        }
    });
    view
}

/// What the cluster holds under the prefix (etcdctl prints key and value lines; values here are
/// one-line JSON).
fn contents(cluster: &EtcdCluster) -> View {
    let out = cluster
        .etcdctl(&["get", "--prefix", CALICO_PREFIX])
        .output()
        .expect("etcdctl get");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|kv| {
            (
                kv[0].to_string(),
                kv.get(1).unwrap_or(&"").as_bytes().to_vec(),
            )
        })
        .collect()
}

fn key(i: usize) -> String {
    format!("{CALICO_PREFIX}globalnetworksets/s{i}")
}

async fn wait_in_sync(cluster: &EtcdCluster, views: &[Arc<std::sync::Mutex<View>>], what: &str) {
    let want = contents(cluster);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let lagging = views
            .iter()
            .filter(|v| {
                let mut v = v.lock().unwrap().clone();
                v.remove(REVISION);
                v != want
            })
            .count();
        if lagging == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {lagging} of {} syncers differ from the cluster ({} keys)",
            views.len(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncers_through_a_grpc_proxy_survive_each_member_being_killed() {
    let mut cluster = EtcdCluster::start(3);
    let proxy = GrpcProxy::start(&cluster.endpoints());
    for i in 0..10 {
        cluster.put(&key(i), &format!("{{\"v\":{i}}}"));
    }
    let cancel = CancellationToken::new();
    let views: Vec<_> = (0..SYNCERS)
        .map(|_| spawn_syncer(&proxy.url(), &cancel))
        .collect();
    wait_in_sync(&cluster, &views, "initial list").await;
    assert_eq!(
        views[0].lock().unwrap().len(),
        10 + 1,
        "10 keys and the revision"
    );

    let mut n = 10;
    for member in 0..cluster.len() {
        cluster.kill(member);
        // Writes while the member is down (the other two keep quorum) and a delete.
        for _ in 0..5 {
            cluster.put(&key(n), "{\"v\":\"down\"}");
            n += 1;
        }
        cluster.delete(&key(member));
        wait_in_sync(&cluster, &views, &format!("member {member} down")).await;
        cluster.restart(member);
        cluster.put(&key(n), "{\"v\":\"back\"}");
        n += 1;
        wait_in_sync(&cluster, &views, &format!("member {member} back")).await;
    }
    assert_eq!(views[0].lock().unwrap().len() - 1, n - cluster.len());

    // Every syncer's revision reaches that of the last write under the prefix. (Not of a write
    // outside it: etcd 3.4's grpc-proxy answers progress requests without a revision, so behind a
    // proxy only changes under the prefix advance an agent's revision; see README, "Fan-out".)
    cluster.put(&key(n), "{\"v\":\"last\"}");
    let out = cluster
        .etcdctl(&["get", &key(n), "-w", "json"])
        .output()
        .expect("etcdctl get");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let rev = v["kvs"][0]["mod_revision"].as_i64().expect("mod_revision");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let behind: Vec<i64> = views
            .iter()
            .map(|v| {
                let v = v.lock().unwrap();
                v.get(REVISION)
                    .and_then(|r| std::str::from_utf8(r).ok()?.parse().ok())
                    .unwrap_or(0)
            })
            .filter(|r| *r < rev)
            .collect();
        if behind.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "syncers did not confirm revision {rev} through the proxy: {behind:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cancel.cancel();
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncers_list_again_when_the_proxy_restarts_after_a_compaction() {
    let cluster = EtcdCluster::start(3);
    let mut proxy = GrpcProxy::start(&cluster.endpoints());
    for i in 0..10 {
        cluster.put(&key(i), &format!("{{\"v\":{i}}}"));
    }
    let cancel = CancellationToken::new();
    // More syncers than the other test: the proxy bug needs several watches reopened at the same
    // compacted revision (the first is told; the later ones joined its dead broadcast).
    let views: Vec<_> = (0..SYNCERS * 4)
        .map(|_| spawn_syncer(&proxy.url(), &cancel))
        .collect();
    wait_in_sync(&cluster, &views, "initial list").await;

    for round in 0..2 {
        proxy.kill();
        // While the proxy is down: a change under the prefix, a delete, and a compaction past both,
        // so every syncer's watch would resume in compacted history.
        cluster.put(&key(100 + round), "{\"v\":\"while the proxy was down\"}");
        cluster.delete(&key(round));
        let rev = cluster.put_rev("/felixrs-test/outside-the-prefix", "x");
        cluster.compact(rev);
        proxy.restart();
        wait_in_sync(&cluster, &views, &format!("proxy restart {round}")).await;
    }
    // And the watches reopened through the proxy deliver again.
    cluster.put(&key(200), "{\"v\":\"after\"}");
    wait_in_sync(&cluster, &views, "a change after the restarts").await;
    cancel.cancel();
}
