//! The syncer against a real etcd: initial list, watch, progress outside the prefix, reconnect
//! after an etcd restart, and re-list after compaction (deletions included).

mod support;

use std::sync::Arc;
use std::time::Duration;

use felixrs::agent::datastore::{EtcdDatastore, EtcdTls};
use felixrs::agent::syncer::{self, SyncEvent, SyncerConfig};
use felixrs_test_support::etcd::Etcd;
use support::PREFIX;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

fn key(name: &str) -> String {
    format!("{PREFIX}globalnetworksets/{name}")
}

struct Harness {
    rx: mpsc::Receiver<SyncEvent>,
    cancel: CancellationToken,
}

impl Harness {
    fn start(etcd: &Etcd) -> Self {
        let ds = EtcdDatastore::new(
            vec![etcd.client_url()],
            EtcdTls::default(),
            Duration::from_secs(1),
        );
        let mut cfg = SyncerConfig::new(calc_graph::model::EtcdPrefix::default());
        cfg.progress_interval = Duration::from_millis(200);
        cfg.max_backoff = Duration::from_millis(300);
        let (tx, rx) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        tokio::spawn(syncer::run(
            ds,
            cfg,
            tx,
            Arc::new(Notify::new()),
            cancel.clone(),
        ));
        Harness { rx, cancel }
    }

    /// The next event that satisfies `pred`, within 15 s.
    async fn until(&mut self, what: &str, mut pred: impl FnMut(&SyncEvent) -> bool) -> SyncEvent {
        let wait = async {
            loop {
                let ev = self.rx.recv().await.expect("syncer stopped");
                if pred(&ev) {
                    return ev;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(15), wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn listed_keys(ev: &SyncEvent) -> Vec<String> {
    match ev {
        SyncEvent::Listed { kvs, .. } => kvs.iter().map(|(k, _)| k.clone()).collect(),
        other => panic!("expected Listed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_watches_and_reports_progress_outside_the_prefix() {
    let etcd = Etcd::start();
    etcd.put(&key("a"), "{\"a\":1}");
    etcd.put("/other/x", "1");
    let rev_b = etcd.put(&key("b"), "{\"b\":1}");

    let mut h = Harness::start(&etcd);
    let listed = h.until("initial list", |_| true).await;
    assert_eq!(listed_keys(&listed), vec![key("a"), key("b")]);
    let SyncEvent::Listed { revision, .. } = listed else {
        unreachable!()
    };
    assert!(revision >= rev_b);

    let rev_c = etcd.put(&key("c"), "{\"c\":1}");
    let ev = h
        .until("change c", |e| matches!(e, SyncEvent::Changes { .. }))
        .await;
    let SyncEvent::Changes { revision, changes } = ev else {
        unreachable!()
    };
    assert_eq!(revision, rev_c);
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].key, key("c"));
    assert_eq!(changes[0].value.as_deref(), Some(&b"{\"c\":1}"[..]));

    let rev_del = etcd.delete(&key("a"));
    let ev = h
        .until("delete a", |e| matches!(e, SyncEvent::Changes { .. }))
        .await;
    assert!(
        matches!(&ev, SyncEvent::Changes { revision, changes } if *revision == rev_del && changes[0].value.is_none())
    );

    // A write outside the prefix is only visible through progress notifications.
    let rev_out = etcd.put("/other/y", "2");
    h.until(
        "progress past the outside write",
        |e| matches!(e, SyncEvent::Progress { revision } if *revision >= rev_out),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_after_restart_and_relists_after_compaction() {
    let mut etcd = Etcd::start();
    etcd.put(&key("keep"), "{}");
    etcd.put(&key("gone"), "{}");
    let mut h = Harness::start(&etcd);
    let listed = h.until("initial list", |_| true).await;
    assert_eq!(listed_keys(&listed), vec![key("gone"), key("keep")]);

    // Restart with the agent's port closed: the syncer loses the connection.
    etcd.stop();
    h.until("disconnect", |e| {
        matches!(e, SyncEvent::Disconnected { .. })
    })
    .await;
    etcd.restart();
    // A change made after the restart arrives as a change, without a re-list.
    let rev_new = etcd.put(&key("new"), "{}");
    let ev = h
        .until("change after restart", |e| {
            matches!(e, SyncEvent::Changes { .. } | SyncEvent::Listed { .. })
        })
        .await;
    assert!(
        matches!(&ev, SyncEvent::Changes { revision, .. } if *revision == rev_new),
        "expected a resumed watch, got {ev:?}"
    );

    // While the agent cannot reach etcd: delete a key and compact past it.
    etcd.restart_admin_only();
    etcd.delete(&key("gone"));
    let rev = etcd.put("/other/bump", "1");
    etcd.compact(rev);
    etcd.restart();
    let listed = h
        .until("re-list after compaction", |e| {
            matches!(e, SyncEvent::Listed { .. })
        })
        .await;
    assert_eq!(listed_keys(&listed), vec![key("keep"), key("new")]);
}
