//! The agent state's own tests: batches, the applied view's changes, connection status, full
//! views replacing old ones, malformed values, progress, and what a snapshot holds.

use super::*;
use crate::agent::datastore::Change;
use crate::agent::metrics::Metrics;
use std::sync::mpsc::Receiver;

/// Records what the graph is told; values starting with `!` are malformed.
#[derive(Default)]
pub(super) struct RecordingPipeline {
    pub(super) log: Log,
}

impl Pipeline for RecordingPipeline {
    fn update(&mut self, key: &str, value: Option<&[u8]>) -> Result<(), PipelineError> {
        let v = value.map(|v| String::from_utf8_lossy(v).into_owned());
        if v.as_deref().is_some_and(|v| v.starts_with('!')) {
            return Err(ModelError::Decode {
                resource: key.to_string(),
                path: "spec".into(),
                message: "malformed".into(),
            }
            .into());
        }
        self.log.lock().unwrap().push(match v {
            Some(v) => format!("put {key}={v}"),
            None => format!("del {key}"),
        });
        Ok(())
    }
    fn in_sync(&mut self) {
        self.log.lock().unwrap().push("in-sync".into());
    }
    fn flush(&mut self) -> Vec<Output> {
        self.log.lock().unwrap().push("flush".into());
        vec![Output::InSync]
    }
}

pub(super) type Log = Arc<std::sync::Mutex<Vec<String>>>;

pub(super) fn mk_state() -> (
    AgentState<RecordingPipeline>,
    Log,
    Receiver<Batch>,
    Arc<StatusHub>,
) {
    let p = RecordingPipeline::default();
    let log = p.log.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let hub = StatusHub::new(Metrics::new());
    (AgentState::new(p, tx, hub.clone()), log, rx, hub)
}

pub(super) fn mk_listed(revision: i64, kvs: &[(&str, &str)]) -> SyncEvent {
    SyncEvent::Listed {
        revision,
        kvs: kvs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect(),
    }
}

pub(super) fn mk_change(revision: i64, key: &str, value: Option<&str>) -> SyncEvent {
    SyncEvent::Changes {
        revision,
        changes: vec![Change {
            key: key.into(),
            value: value.map(|v| v.as_bytes().to_vec()),
            mod_revision: revision,
        }],
    }
}

/// The batches' view changes, applied in order, rebuild exactly the state's view: after
/// changes before in-sync, the list, puts, deletes and a re-list that drops keys.
#[test]
fn batch_view_changes_rebuild_the_view() {
    let (mut st, _, rx, _) = mk_state();
    let mut view = KvMap::new();
    let mut check = |st: &mut AgentState<RecordingPipeline>| {
        st.emit().unwrap();
        for b in rx.try_iter() {
            for (k, v) in b.view {
                match v {
                    Some(v) => view.insert(k, v),
                    None => view.remove(&k),
                };
            }
        }
        assert_eq!(&view, st.kvs());
    };
    st.on_event(mk_listed(5, &[("/k/a", "1"), ("/k/b", "2"), ("/k/c", "3")]));
    check(&mut st);
    st.on_event(mk_change(6, "/k/a", Some("10")));
    st.on_event(mk_change(7, "/k/b", None));
    st.on_event(mk_change(8, "/k/d", Some("4")));
    check(&mut st);
    st.on_event(mk_listed(9, &[("/k/a", "10"), ("/k/e", "5")]));
    check(&mut st);
    assert_eq!(view.len(), 2);
}

#[test]
fn a_connection_error_is_reported_until_etcd_answers_again() {
    let (mut st, _, _, hub) = mk_state();
    let reason = "etcd at https://10.0.0.1:2379: TLS handshake failed: invalid peer certificate";
    st.on_event(SyncEvent::Disconnected {
        reason: reason.into(),
    });
    let s = hub.snapshot();
    assert_eq!(
        (s.datastore_connected, s.datastore_error.as_deref()),
        (false, Some(reason))
    );
    st.on_event(mk_listed(3, &[]));
    let s = hub.snapshot();
    assert_eq!((s.datastore_connected, s.datastore_error), (true, None));
}

#[test]
fn felix_resync_state_and_cluster_counts_follow_the_view() {
    let (mut st, _, _, hub) = mk_state();
    let value = |name: &str| {
        let text = hub.metrics.render();
        let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
        line.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    assert_eq!(value("felix_resync_state"), Some(1.0), "waiting for etcd");
    let wep = "/calico/resources/v3/projectcalico.org/workloadendpoints/ns/node--2-k8s-a-eth0";
    st.on_event(mk_listed(3, &[(wep, "{}")]));
    assert_eq!(value("felix_resync_state"), Some(3.0));
    assert_eq!(value("felix_cluster_num_workload_endpoints"), Some(1.0));
    assert_eq!(value("felix_cluster_num_hosts"), Some(1.0));
    st.on_event(SyncEvent::Disconnected {
        reason: "gone".into(),
    });
    assert_eq!(value("felix_resync_state"), Some(1.0));
    // The watch resumes: the listed view stands, in sync again.
    st.on_event(SyncEvent::Progress { revision: 4 });
    assert_eq!(value("felix_resync_state"), Some(3.0));
    st.on_event(mk_change(5, wep, None));
    let bad = "/calico/resources/v3/projectcalico.org/workloadendpoints/ns/node--3-k8s-b-eth0";
    st.on_event(mk_change(6, bad, Some("!bad")));
    assert_eq!(value("felix_cluster_num_workload_endpoints"), Some(0.0));
    assert_eq!(value("felix_cluster_num_hosts"), Some(0.0));
    assert_eq!(
        value("felix_calc_graph_update_time_seconds_count"),
        Some(3.0),
        "put, delete and the refused value each went to the graph"
    );
}

#[test]
fn nothing_is_emitted_before_in_sync() {
    let (mut st, log, rx, _) = mk_state();
    st.on_event(mk_change(5, "/k/a", Some("1")));
    st.on_event(SyncEvent::Progress { revision: 6 });
    st.emit().unwrap();
    assert!(rx.try_recv().is_err());
    assert!(!log.lock().unwrap().contains(&"flush".to_string()));
}

#[test]
fn a_new_full_view_replaces_the_old_one_with_deletions() {
    let (mut st, log, rx, hub) = mk_state();
    st.on_event(mk_listed(
        10,
        &[("/k/a", "1"), ("/k/b", "1"), ("/k/c", "1")],
    ));
    st.emit().unwrap();
    assert_eq!(rx.try_recv().unwrap().revision, 10);
    log.lock().unwrap().clear();
    st.on_event(mk_listed(
        20,
        &[("/k/b", "1"), ("/k/c", "2"), ("/k/d", "1")],
    ));
    st.emit().unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        vec!["put /k/c=2", "put /k/d=1", "del /k/a", "flush"]
    );
    assert_eq!(rx.try_recv().unwrap().revision, 20);
    let keys: Vec<_> = st.kvs().keys().map(|k| k.to_string()).collect();
    assert_eq!(keys, vec!["/k/b", "/k/c", "/k/d"]);
    assert_eq!(hub.snapshot().source, Source::Etcd);
}

#[test]
fn malformed_value_keeps_the_previous_one_and_is_counted() {
    let (mut st, log, _rx, hub) = mk_state();
    st.on_event(mk_listed(10, &[("/k/a", "1")]));
    st.on_event(mk_change(11, "/k/a", Some("!bad")));
    st.on_event(mk_change(12, "/k/b", Some("!bad")));
    assert_eq!(&*st.kvs()[&Arc::from("/k/a")], b"1");
    assert!(!st.kvs().contains_key(&Arc::from("/k/b")));
    assert_eq!(hub.snapshot().malformed_values, 2);
    assert!(!log.lock().unwrap().iter().any(|l| l.contains("!bad")));
}

#[test]
fn progress_only_batches_carry_the_revision_without_flushing() {
    let (mut st, log, rx, _) = mk_state();
    st.on_event(mk_listed(10, &[]));
    st.emit().unwrap();
    rx.try_recv().unwrap();
    log.lock().unwrap().clear();
    st.on_event(SyncEvent::Progress { revision: 15 });
    st.emit().unwrap();
    let b = rx.try_recv().unwrap();
    assert_eq!((b.revision, b.outputs.len()), (15, 0));
    assert!(log.lock().unwrap().is_empty());
}

#[test]
fn snapshot_data_is_replaced_by_etcd_and_only_etcd_data_is_persisted() {
    let (mut st, log, _rx, hub) = mk_state();
    let kvs = [("/k/old", "1"), ("/k/same", "1")]
        .iter()
        .map(|(k, v)| (Arc::from(*k), Arc::from(v.as_bytes())))
        .collect();
    assert!(st.load_snapshot(Snapshot { revision: 7, kvs }));
    assert_eq!(hub.snapshot().source, Source::Snapshot);
    assert!(st.take_snapshot().is_none());
    log.lock().unwrap().clear();
    st.on_event(mk_listed(30, &[("/k/same", "1"), ("/k/new", "1")]));
    assert_eq!(*log.lock().unwrap(), vec!["put /k/new=1", "del /k/old"]);
    let snap = st.take_snapshot().expect("etcd view is persisted");
    assert_eq!(snap.revision, 30);
    assert_eq!(snap.kvs.len(), 2);
    assert!(!st.load_snapshot(Snapshot::default()), "etcd data wins");
}
