//! The agent's datastore state: the raw key -> value map, fed into the calculation graph.
//!
//! Invariants:
//! * `kvs` mirrors exactly what the graph has been told (a malformed value is logged, counted and
//!   skipped: the key keeps its previous value, so a typo never silently drops a policy).
//! * A full view (etcd list or snapshot) replaces the previous one wholesale: changed keys are
//!   updated and keys that disappeared are deleted.
//! * No batch reaches the apply loop before the first full view (no kernel write before in-sync).
//! * Only data that came from etcd is persisted into the snapshot.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::Sender;

use calc_graph::proto::Output;

use super::apply_loop::Batch;
use super::snapshot::{KvMap, Snapshot};
use super::status::{FailedSafeRuleStatus, Source, Status, StatusHub};
use super::syncer::SyncEvent;

/// Datastore keys in, graph outputs out (the calculation graph behind a small seam).
pub trait Pipeline: 'static {
    /// One key changed (`None`: deleted). `Err` names what is malformed in the value; the caller
    /// logs it and keeps the key's previous value.
    fn update(&mut self, key: &str, value: Option<&[u8]>) -> Result<(), String>;
    /// The first full view has been given.
    fn in_sync(&mut self);
    /// Everything the graph has to say since the last flush, in dependency order.
    fn flush(&mut self) -> Vec<Output>;
    /// The rules (cluster-wide) that currently fail safe because of a field the agent does not
    /// enforce or know.
    fn failed_safe_rules(&self) -> Vec<FailedSafeRuleStatus> {
        Vec::new()
    }
}

/// Owned by the agent's main task.
pub struct AgentState<P> {
    pipeline: P,
    kvs: KvMap,
    source: Source,
    in_sync: bool,
    revision: i64,
    /// Changes since the last `emit`.
    dirty: bool,
    /// etcd data changed since the last snapshot was taken.
    snapshot_dirty: bool,
    batches: Sender<Batch>,
    hub: Arc<StatusHub>,
}

impl<P: Pipeline> AgentState<P> {
    pub fn new(pipeline: P, batches: Sender<Batch>, hub: Arc<StatusHub>) -> Self {
        Self {
            pipeline,
            kvs: KvMap::new(),
            source: Source::None,
            in_sync: false,
            revision: 0,
            dirty: false,
            snapshot_dirty: false,
            batches,
            hub,
        }
    }

    pub fn source(&self) -> Source {
        self.source
    }

    /// Absorbs one syncer event (call [`Self::emit`] after a burst).
    pub fn on_event(&mut self, ev: SyncEvent) {
        match ev {
            SyncEvent::Listed { revision, kvs } => {
                self.hub.metrics.resyncs.inc();
                let kvs = kvs
                    .into_iter()
                    .map(|(k, v)| (Arc::from(k.as_str()), Arc::from(v.as_slice())))
                    .collect();
                self.replace(revision, kvs, Source::Etcd);
                self.hub.update(connected);
            }
            SyncEvent::Changes { revision, changes } => {
                for c in changes {
                    self.hub.metrics.datastore_updates.inc();
                    self.change(Arc::from(c.key.as_str()), c.value.map(Arc::from));
                }
                self.advance(revision);
                if self.source == Source::Etcd {
                    self.snapshot_dirty = true;
                }
                self.hub.update(connected);
            }
            SyncEvent::Progress { revision } => {
                self.advance(revision);
                self.hub.update(connected);
            }
            SyncEvent::Disconnected { reason } => {
                self.hub.metrics.datastore_disconnects.inc();
                self.hub.update(|s| {
                    s.datastore_connected = false;
                    s.datastore_error = Some(reason);
                });
            }
        }
    }

    /// Uses a persisted snapshot as the full view (only while nothing came from etcd).
    pub fn load_snapshot(&mut self, snap: Snapshot) -> bool {
        if self.source != Source::None {
            return false;
        }
        self.replace(snap.revision, snap.kvs, Source::Snapshot);
        self.snapshot_dirty = false;
        true
    }

    fn replace(&mut self, revision: i64, new: KvMap, source: Source) {
        let old = std::mem::take(&mut self.kvs);
        let mut merged = KvMap::new();
        let mut old_iter = old.into_iter().peekable();
        // Both maps are sorted: walk them together.
        let mut removed = Vec::new();
        for (k, v) in new {
            while let Some((ok, _)) = old_iter.peek() {
                if ok < &k {
                    removed.push(old_iter.next().expect("peeked").0);
                } else {
                    break;
                }
            }
            let prev = match old_iter.peek() {
                Some((ok, _)) if ok == &k => old_iter.next().map(|(_, v)| v),
                _ => None,
            };
            match prev {
                Some(pv) if pv == v => {
                    merged.insert(k, pv);
                }
                prev => match self.pipeline.update(&k, Some(&v)) {
                    Ok(()) => {
                        merged.insert(k, v);
                        self.dirty = true;
                    }
                    Err(error) => {
                        self.malformed(&k, &error);
                        if let Some(pv) = prev {
                            merged.insert(k, pv);
                        }
                    }
                },
            }
        }
        removed.extend(old_iter.map(|(k, _)| k));
        tracing::info!(
            revision,
            ?source,
            keys = merged.len(),
            removed = removed.len(),
            "replacing the datastore view"
        );
        for k in removed {
            self.delete(&k);
        }
        self.kvs = merged;
        self.source = source;
        self.revision = revision;
        if source == Source::Etcd {
            self.snapshot_dirty = true;
        }
        if !self.in_sync {
            self.pipeline.in_sync();
            self.in_sync = true;
        }
        self.dirty = true;
        self.hub.update(|s| {
            s.in_sync = true;
            s.source = source;
            s.observed_revision = revision;
        });
    }

    fn change(&mut self, key: Arc<str>, value: Option<Arc<[u8]>>) {
        match value {
            None => {
                if self.kvs.remove(&key).is_some() {
                    self.delete(&key);
                }
            }
            Some(v) => {
                if self.kvs.get(&key) == Some(&v) {
                    return;
                }
                match self.pipeline.update(&key, Some(&v)) {
                    Ok(()) => {
                        self.kvs.insert(key, v);
                        self.dirty = true;
                    }
                    Err(error) => self.malformed(&key, &error),
                }
            }
        }
    }

    fn delete(&mut self, key: &str) {
        if let Err(error) = self.pipeline.update(key, None) {
            self.malformed(key, &error);
        }
        self.dirty = true;
    }

    fn malformed(&self, key: &str, error: &str) {
        tracing::warn!(key, %error, "skipping malformed datastore value");
        self.hub.metrics.malformed_values.inc();
        self.hub.update(|s| s.malformed_values += 1);
    }

    fn advance(&mut self, revision: i64) {
        if revision > self.revision {
            self.revision = revision;
            self.hub.update(|s| s.observed_revision = revision);
        }
    }

    /// Flushes the graph and hands the batch to the apply loop (nothing before in-sync).
    pub fn emit(&mut self) {
        if !self.in_sync {
            return;
        }
        let outputs = if self.dirty {
            let failed_safe = self.pipeline.failed_safe_rules();
            self.hub
                .metrics
                .failed_safe_rules
                .set(failed_safe.len() as i64);
            self.hub.update(|s| s.failed_safe_rules = failed_safe);
            self.pipeline.flush()
        } else {
            Vec::new()
        };
        self.dirty = false;
        // The apply loop only stops when the agent shuts down; a send error then is harmless.
        let _ = self.batches.send(Batch {
            outputs,
            revision: self.revision,
        });
    }

    /// The etcd data to persist, if it changed since the last call.
    pub fn take_snapshot(&mut self) -> Option<Snapshot> {
        if !self.snapshot_dirty || self.source != Source::Etcd {
            return None;
        }
        self.snapshot_dirty = false;
        Some(Snapshot {
            revision: self.revision,
            kvs: self.kvs.clone(),
        })
    }

    /// Current raw contents (tests and diagnostics).
    pub fn kvs(&self) -> &BTreeMap<Arc<str>, Arc<[u8]>> {
        &self.kvs
    }
}

/// The datastore answered: connected, and the last connection error is history.
fn connected(s: &mut Status) {
    s.datastore_connected = true;
    s.datastore_error = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::datastore::Change;
    use crate::agent::metrics::Metrics;
    use std::sync::mpsc::Receiver;

    /// Records what the graph is told; values starting with `!` are malformed.
    #[derive(Default)]
    struct RecordingPipeline {
        log: Log,
    }

    impl Pipeline for RecordingPipeline {
        fn update(&mut self, key: &str, value: Option<&[u8]>) -> Result<(), String> {
            let v = value.map(|v| String::from_utf8_lossy(v).into_owned());
            if v.as_deref().is_some_and(|v| v.starts_with('!')) {
                return Err(format!("{key}: spec: malformed"));
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

    type Log = Arc<std::sync::Mutex<Vec<String>>>;

    fn mk_state() -> (
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

    fn mk_listed(revision: i64, kvs: &[(&str, &str)]) -> SyncEvent {
        SyncEvent::Listed {
            revision,
            kvs: kvs
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    fn mk_change(revision: i64, key: &str, value: Option<&str>) -> SyncEvent {
        SyncEvent::Changes {
            revision,
            changes: vec![Change {
                key: key.into(),
                value: value.map(|v| v.as_bytes().to_vec()),
                mod_revision: revision,
            }],
        }
    }

    #[test]
    fn a_connection_error_is_reported_until_etcd_answers_again() {
        let (mut st, _, _, hub) = mk_state();
        let reason =
            "etcd at https://10.0.0.1:2379: TLS handshake failed: invalid peer certificate";
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
    fn nothing_is_emitted_before_in_sync() {
        let (mut st, log, rx, _) = mk_state();
        st.on_event(mk_change(5, "/k/a", Some("1")));
        st.on_event(SyncEvent::Progress { revision: 6 });
        st.emit();
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
        st.emit();
        assert_eq!(rx.try_recv().unwrap().revision, 10);
        log.lock().unwrap().clear();
        st.on_event(mk_listed(
            20,
            &[("/k/b", "1"), ("/k/c", "2"), ("/k/d", "1")],
        ));
        st.emit();
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
        st.emit();
        rx.try_recv().unwrap();
        log.lock().unwrap().clear();
        st.on_event(SyncEvent::Progress { revision: 15 });
        st.emit();
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
}
