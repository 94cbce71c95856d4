//! Remote cluster syncers against real etcds: a remote under its own prefix over TLS delivers only
//! the federated kinds of its own prefix; a configuration change (here: the wrong CA) restarts the
//! syncer, which then reports etcd's TLS failure; events of a replaced syncer are told apart.

use std::collections::BTreeMap;
use std::time::Duration;

use calc_graph::model::{CALICO_PREFIX, RemoteCluster, remote_cluster_key};
use felixrs::agent::federation::{RemoteEvent, Remotes};
use felixrs::agent::syncer::SyncEvent;
use felixrs_test_support::etcd::Etcd;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn config(etcd: &Etcd, prefix: &str, ca: &str) -> RemoteCluster {
    let tls = etcd.tls_files().expect("tls etcd");
    let json = serde_json::json!({
        "apiVersion": "projectcalico.org/v3", "kind": "RemoteClusterConfiguration",
        "metadata": {"name": "west"},
        "spec": {"datastoreType": "etcdv3", "etcdEndpoints": etcd.client_url(), "etcdPrefix": prefix,
                 "etcdCACertFile": ca, "etcdCertFile": tls.cert.to_str().unwrap(),
                 "etcdKeyFile": tls.key.to_str().unwrap()}
    });
    RemoteCluster::from_etcd(&remote_cluster_key("west"), json.to_string().as_bytes())
        .expect("valid configuration")
}

async fn next(rx: &mut mpsc::Receiver<RemoteEvent>, remotes: &Remotes, what: &str) -> SyncEvent {
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("channel open");
        assert_eq!(ev.cluster, "west");
        if remotes.is_current(&ev) {
            return ev.event;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_remote_under_its_prefix_syncs_and_a_wrong_ca_is_reported() {
    let etcd = Etcd::start_tls();
    let west = "/clusters/west/calico/resources/v3/projectcalico.org/";
    etcd.put(&format!("{west}workloadendpoints/ns/w1"), "{}");
    etcd.put(&format!("{west}networkpolicies/ns/p1"), "{}");
    // The default cluster's keys in the same etcd are not west's.
    etcd.put(&format!("{CALICO_PREFIX}workloadendpoints/ns/local"), "{}");

    let (tx, mut rx) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let mut remotes = Remotes::new(tx, Duration::from_secs(2), cancel.clone());
    let ca = etcd.tls_files().unwrap().ca;
    let good = config(&etcd, "/clusters/west/calico", ca.to_str().unwrap());
    let gone = remotes.reconcile(&BTreeMap::from([("west".to_string(), good.clone())]));
    assert!(gone.is_empty());
    match next(&mut rx, &remotes, "west's list").await {
        SyncEvent::Listed { kvs, .. } => {
            let keys: Vec<&str> = kvs.iter().map(|(k, _)| k.as_str()).collect();
            // Canonical keys of west's prefix only (the state keeps only the federated kinds).
            assert_eq!(
                keys,
                [
                    format!("{CALICO_PREFIX}networkpolicies/ns/p1"),
                    format!("{CALICO_PREFIX}workloadendpoints/ns/w1")
                ]
            );
        }
        other => panic!("expected west's list, got {other:?}"),
    }
    etcd.put(&format!("{west}workloadendpoints/ns/w2"), "{}");
    match next(&mut rx, &remotes, "west's change").await {
        SyncEvent::Changes { changes, .. } => {
            assert_eq!(
                changes[0].key,
                format!("{CALICO_PREFIX}workloadendpoints/ns/w2")
            );
        }
        other => panic!("expected a change, got {other:?}"),
    }
    assert_eq!(remotes.config("west"), Some(good));

    // The wrong CA (the client certificate's file is not a CA of etcd's): the syncer restarts and
    // says the TLS handshake failed.
    let bad = config(
        &etcd,
        "/clusters/west/calico",
        etcd.tls_files().unwrap().cert.to_str().unwrap(),
    );
    remotes.reconcile(&BTreeMap::from([("west".to_string(), bad)]));
    match next(&mut rx, &remotes, "the TLS failure").await {
        SyncEvent::Disconnected { reason } => {
            assert!(reason.contains("TLS"), "{reason}");
            assert!(reason.contains(&etcd.client_url()), "{reason}");
        }
        other => panic!("expected a TLS failure, got {other:?}"),
    }
    // Removed: the syncer stops and the cluster is reported gone.
    assert_eq!(
        remotes.reconcile(&BTreeMap::new()),
        vec!["west".to_string()]
    );
    assert!(remotes.config("west").is_none());
    cancel.cancel();
}
