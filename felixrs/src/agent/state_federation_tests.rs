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
    let text = hub.metrics.render();
    assert!(
        text.contains("felixrs_remote_cluster_connected{cluster=\"c\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("felixrs_remote_cluster_connected{cluster=\"b\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("felixrs_remote_cluster_keys{cluster=\"b\"} 1"),
        "{text}"
    );
    st.drop_remote("c");
    assert!(!hub.metrics.render().contains("cluster=\"c\""));
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
    // Deleted: gone from the desired set and from the status.
    st.on_event(mk_change(12, &remote_cluster_key("b"), None));
    assert!(st.take_remote_configs(&keep).expect("changed").is_empty());
    assert!(hub.snapshot().remote_clusters.is_empty());
}

mod props {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::super::tests::mk_state;
    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        List(usize, Vec<(u8, u8)>),
        Put(usize, u8, u8),
        Del(usize, u8),
        Disconnect(usize),
        Drop(usize),
    }

    const SCOPES: [&str; 3] = ["", "b", "c"];

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..3usize, proptest::collection::vec((0..6u8, 0..3u8), 0..6))
                .prop_map(|(s, kvs)| Op::List(s, kvs)),
            (0..3usize, 0..6u8, 0..3u8).prop_map(|(s, k, v)| Op::Put(s, k, v)),
            (0..3usize, 0..6u8).prop_map(|(s, k)| Op::Del(s, k)),
            (1..3usize).prop_map(Op::Disconnect),
            (1..3usize).prop_map(Op::Drop),
        ]
    }

    fn view_key(scope: usize, k: u8) -> String {
        let canon = wep(&format!("w{k}"));
        if scope == 0 {
            canon
        } else {
            remote_key(SCOPES[scope], &canon)
        }
    }

    proptest! {
        /// Whatever the interleaving of local and remote lists, changes, outages and removals:
        /// the view is exactly the union of what each scope's source last said, and replaying
        /// what the graph was told gives the same map.
        #[test]
        fn the_view_is_the_union_of_each_scopes_last_word(ops in proptest::collection::vec(op(), 1..40)) {
            let (mut st, log, _rx, _hub) = mk_state();
            let mut model: [BTreeMap<u8, u8>; 3] = Default::default();
            for op in ops {
                let canon = |k: u8| wep(&format!("w{k}"));
                let send = |st: &mut AgentState<_>, scope: usize, ev: SyncEvent| {
                    if scope == 0 { st.on_event(ev) } else { st.on_remote_event(SCOPES[scope], ev) }
                };
                match op {
                    Op::List(s, kvs) => {
                        model[s] = kvs.iter().copied().collect();
                        let kvs: Vec<(String, String)> = model[s].iter().map(|(k, v)| (canon(*k), v.to_string())).collect();
                        let refs: Vec<(&str, &str)> = kvs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                        send(&mut st, s, mk_listed(1, &refs));
                    }
                    Op::Put(s, k, v) => {
                        model[s].insert(k, v);
                        send(&mut st, s, mk_change(2, &canon(k), Some(&v.to_string())));
                    }
                    Op::Del(s, k) => {
                        model[s].remove(&k);
                        send(&mut st, s, mk_change(3, &canon(k), None));
                    }
                    Op::Disconnect(s) => {
                        st.on_remote_event(SCOPES[s], SyncEvent::Disconnected { reason: "x".into() });
                    }
                    Op::Drop(s) => {
                        model[s].clear();
                        st.drop_remote(SCOPES[s]);
                    }
                }
                let want: BTreeMap<String, String> = (0..3)
                    .flat_map(|s| model[s].iter().map(move |(k, v)| (view_key(s, *k), v.to_string())))
                    .collect();
                let got: BTreeMap<String, String> = st
                    .kvs()
                    .iter()
                    .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v).into_owned()))
                    .collect();
                prop_assert_eq!(&got, &want);
                let mut told = BTreeMap::new();
                for line in log.lock().unwrap().iter() {
                    if let Some(kv) = line.strip_prefix("put ") {
                        let (k, v) = kv.rsplit_once('=').unwrap();
                        told.insert(k.to_string(), v.to_string());
                    } else if let Some(k) = line.strip_prefix("del ") {
                        told.remove(k);
                    }
                }
                prop_assert_eq!(&told, &want);
            }
        }
    }
}
