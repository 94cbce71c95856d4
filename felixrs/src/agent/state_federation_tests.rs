//! The agent state's federation scopes: remote lists, local lists and snapshots each replace only
//! their own keys; a dropped remote takes its keys with it; remote configurations are read from
//! the local view.

use calc_graph::model::{CALICO_PREFIX, remote_cluster_key};

use super::tests::{mk_change, mk_listed, mk_state};
use super::*;
use crate::agent::federation::remote_key;

fn wep(name: &str) -> String {
    format!("{CALICO_PREFIX}workloadendpoints/ns/{name}")
}

fn rcc(name: &str, endpoints: &str) -> String {
    format!(r#"{{"metadata":{{"name":"{name}"}},"spec":{{"etcdEndpoints":"{endpoints}"}}}}"#)
}

fn keys(st: &AgentState<super::tests::RecordingPipeline>) -> Vec<String> {
    st.kvs().keys().map(|k| k.to_string()).collect()
}

#[test]
fn each_full_view_replaces_only_its_own_scope() {
    let (mut st, log, _rx, hub) = mk_state();
    st.on_event(mk_listed(10, &[(&wep("a"), "1")]));
    st.on_remote_event("b", mk_listed(100, &[(&wep("a"), "1"), (&wep("x"), "1")]));
    st.on_remote_event("c", mk_listed(7, &[(&wep("a"), "1")]));
    // A policy of the remote is not federated: not kept.
    st.on_remote_event(
        "b",
        mk_change(
            101,
            &format!("{CALICO_PREFIX}networkpolicies/ns/p"),
            Some("1"),
        ),
    );
    assert_eq!(keys(&st).len(), 4, "{:?}", keys(&st));
    log.lock().unwrap().clear();
    // A new local list leaves both remotes alone.
    st.on_event(mk_listed(11, &[]));
    assert_eq!(*log.lock().unwrap(), vec![format!("del {}", wep("a"))]);
    // b's new list deletes b's x only.
    log.lock().unwrap().clear();
    st.on_remote_event("b", mk_listed(102, &[(&wep("a"), "1")]));
    assert_eq!(
        *log.lock().unwrap(),
        vec![format!("del {}", remote_key("b", &wep("x")))]
    );
    assert_eq!(
        keys(&st),
        vec![remote_key("b", &wep("a")), remote_key("c", &wep("a"))]
    );
    let s = hub.snapshot();
    assert_eq!(
        s.observed_revision, 11,
        "remote revisions are not the local one"
    );
    let b = &s.remote_clusters["b"];
    assert_eq!(
        (b.connected, b.revision, b.keys, b.source),
        (true, 102, 1, Source::Etcd)
    );
    // A remote that goes away keeps its members; dropping it removes them.
    st.on_remote_event(
        "c",
        SyncEvent::Disconnected {
            reason: "down".into(),
        },
    );
    let c = &hub.snapshot().remote_clusters["c"];
    assert_eq!(
        (c.connected, c.keys, c.error.as_deref()),
        (false, 1, Some("down"))
    );
    st.drop_remote("c");
    assert_eq!(keys(&st), vec![remote_key("b", &wep("a"))]);
    assert!(!hub.snapshot().remote_clusters.contains_key("c"));
    assert_eq!(st.remote_clusters_in_view(), vec!["b".to_string()]);
}

#[test]
fn remote_members_persist_and_are_seeded_from_the_snapshot() {
    let (mut st, _log, _rx, _hub) = mk_state();
    st.on_event(mk_listed(10, &[(&wep("l"), "1")]));
    st.on_remote_event("b", mk_listed(5, &[(&wep("r"), "1")]));
    let snap = st.take_snapshot().expect("etcd data");
    assert_eq!(snap.kvs.len(), 2, "remote members are persisted");

    // A restart: remote members come from the snapshot before any etcd answers...
    let (mut st, log, _rx, hub) = mk_state();
    st.seed_remotes(&snap);
    assert_eq!(keys(&st), vec![remote_key("b", &wep("r"))]);
    assert_eq!(hub.snapshot().remote_clusters["b"].source, Source::Snapshot);
    assert!(!hub.snapshot().in_sync, "seeding is not in-sync");
    // ...and the local view (from the snapshot too) does not drop them.
    log.lock().unwrap().clear();
    assert!(st.load_snapshot(snap));
    assert_eq!(keys(&st).len(), 2);
    assert_eq!(
        *log.lock().unwrap(),
        vec![format!("put {}=1", wep("l")), "in-sync".to_string()]
    );
}

#[test]
fn remote_configurations_come_from_the_local_view_and_a_bad_one_keeps_the_last_good() {
    let (mut st, _log, _rx, hub) = mk_state();
    let none = |_: &str| None;
    assert!(
        st.take_remote_configs(&none).is_none(),
        "nothing changed yet"
    );
    st.on_event(mk_listed(
        10,
        &[(&remote_cluster_key("b"), &rcc("b", "http://10.0.0.2:2379"))],
    ));
    let got = st.take_remote_configs(&none).expect("changed");
    assert_eq!(got["b"].endpoints, vec!["http://10.0.0.2:2379".to_string()]);
    assert!(st.take_remote_configs(&none).is_none());
    // A typo: reported, and the running configuration stays.
    st.on_event(mk_change(
        11,
        &remote_cluster_key("b"),
        Some(&rcc("b", "10.0.0.2")),
    ));
    let prev = got["b"].clone();
    let keep = move |n: &str| (n == "b").then(|| prev.clone());
    let again = st.take_remote_configs(&keep).expect("changed");
    assert_eq!(again["b"].endpoints, got["b"].endpoints);
    let e = hub.snapshot().remote_clusters["b"]
        .config_error
        .clone()
        .unwrap();
    assert!(
        e.contains("remoteclusterconfigurations/b: spec.etcdEndpoints"),
        "{e}"
    );
    // Deleted: gone from the desired set.
    st.on_event(mk_change(12, &remote_cluster_key("b"), None));
    assert!(st.take_remote_configs(&keep).expect("changed").is_empty());
}
