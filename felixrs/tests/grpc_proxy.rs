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

/// What one syncer delivered, folded by the test.
#[derive(Default)]
struct Seen {
    /// The syncer's view of the keys, and its newest confirmed revision under [`REVISION`].
    view: View,
    /// The reason of each `Disconnected`, with when it was reported.
    disconnects: Vec<(tokio::time::Instant, String)>,
    /// The mod revision of every change delivered since the last listing, in delivery order.
    delivered: Vec<i64>,
    /// The revision of the last listing.
    listed_at: i64,
    lists: usize,
}

type Shared = Arc<std::sync::Mutex<Seen>>;

/// One syncer through `url`, folding its events into what it has seen, shared with the test.
fn spawn_syncer(url: &str, cancel: &CancellationToken) -> Shared {
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
    let seen: Shared = Default::default();
    let s = seen.clone();
    tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            let mut s = s.lock().unwrap();
            let s = &mut *s;
            let v = &mut s.view;
            match ev {
                SyncEvent::Listed { kvs, revision } => {
                    *v = kvs.into_iter().collect();
                    v.insert(REVISION.into(), revision.to_string().into_bytes());
                    s.delivered.clear();
                    s.listed_at = revision;
                    s.lists += 1;
                }
                SyncEvent::Progress { revision } => {
                    v.insert(REVISION.into(), revision.to_string().into_bytes());
                }
                SyncEvent::Changes { changes, revision } => {
                    v.insert(REVISION.into(), revision.to_string().into_bytes());
                    for c in changes {
                        s.delivered.push(c.mod_revision);
                        match c.value {
                            Some(val) => v.insert(c.key, val),
                            None => v.remove(&c.key),
                        };
                    }
                }
                SyncEvent::Disconnected { reason } => {
                    s.disconnects.push((tokio::time::Instant::now(), reason));
                }
            }
        }
    });
    seen
}

/// `etcdctl ARGS` against the cluster; its stdout (it must succeed).
fn etcdctl_ok(cluster: &EtcdCluster, args: &[&str]) -> Vec<u8> {
    let out = cluster.etcdctl(args).output().expect("etcdctl");
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The cluster's current revision (the header of a read).
fn head_revision(cluster: &EtcdCluster) -> i64 {
    let out = etcdctl_ok(cluster, &["get", CALICO_PREFIX, "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out).expect("etcdctl json");
    v["header"]["revision"].as_i64().expect("header.revision")
}

/// What the cluster holds under the prefix (etcdctl prints key and value lines; values here are
/// one-line JSON).
fn contents(cluster: &EtcdCluster) -> View {
    let out = etcdctl_ok(cluster, &["get", "--prefix", CALICO_PREFIX]);
    let text = String::from_utf8(out).expect("utf-8");
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

async fn wait_in_sync(cluster: &EtcdCluster, views: &[Shared], what: &str) {
    let want = contents(cluster);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let lagging = views
            .iter()
            .filter(|v| {
                let mut v = v.lock().unwrap().view.clone();
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
        views[0].lock().unwrap().view.len(),
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
    assert_eq!(views[0].lock().unwrap().view.len() - 1, n - cluster.len());

    // Every syncer's revision reaches that of the last write under the prefix. (Not of a write
    // outside it: etcd 3.4's grpc-proxy answers progress requests without a revision, so behind a
    // proxy only changes under the prefix advance an agent's revision; see README, "Fan-out".)
    cluster.put(&key(n), "{\"v\":\"last\"}");
    let out = etcdctl_ok(&cluster, &["get", &key(n), "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
    let rev = v["kvs"][0]["mod_revision"].as_i64().expect("mod_revision");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let behind: Vec<i64> = views
            .iter()
            .map(|v| {
                let v = v.lock().unwrap();
                v.view
                    .get(REVISION)
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

/// The disconnects the syncers reported, as "syncer i: reason" lines.
fn disconnects(views: &[Shared]) -> Vec<String> {
    (views.iter().enumerate())
        .flat_map(|(i, v)| {
            let v = v.lock().unwrap();
            (v.disconnects.iter())
                .map(|(_, r)| format!("syncer {i}: {r}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every syncer delivered each change once, in revision order, since its last listing.
fn assert_no_duplicates(views: &[Shared]) {
    for (i, v) in views.iter().enumerate() {
        let v = v.lock().unwrap();
        assert!(
            v.delivered.windows(2).all(|w| w[0] < w[1]),
            "syncer {i} delivered revisions out of order or twice: {:?}",
            v.delivered
        );
    }
}

/// etcd 3.4's grpc-proxy enforces grpc-go's default keepalive policy (a client ping at most every
/// 5 minutes, none without a stream) and closes a connection that pings more often with GOAWAY
/// "too many pings"; the agent's old 5 s keepalive got that about every 20 s (this test saw two
/// disconnects per syncer). The agent sends no pings now, so over 50 s behind the proxy (idle and
/// with a change) no syncer is disconnected; and a stopped proxy is still noticed (see below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncers_behind_a_grpc_proxy_are_not_closed_for_too_many_pings() {
    let cluster = EtcdCluster::start(1);
    let proxy = GrpcProxy::start(&cluster.endpoints());
    cluster.put(&key(0), "{\"v\":0}");
    let cancel = CancellationToken::new();
    let views: Vec<_> = (0..SYNCERS)
        .map(|_| spawn_syncer(&proxy.url(), &cancel))
        .collect();
    wait_in_sync(&cluster, &views, "initial list").await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    cluster.put(&key(1), "{\"v\":1}");
    wait_in_sync(&cluster, &views, "a change through the proxy").await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    let lost = disconnects(&views);
    assert!(
        lost.is_empty(),
        "syncers behind the proxy were disconnected:\n{}",
        lost.join("\n")
    );

    // The proxy never answers progress requests, so behind it the liveness check reads through
    // the connection instead: a proxy that stops answering (SIGSTOP, connections up) is noticed
    // within the same bound, and when it answers again the syncers resume.
    let stopped = Stopped(proxy.pid());
    signal(stopped.0, "STOP");
    let stopped_at = tokio::time::Instant::now();
    cluster.put(&key(2), "{\"v\":\"while the proxy was stopped\"}");
    wait_noticed(&views, stopped_at).await;
    drop(stopped);
    cluster.put(&key(3), "{\"v\":\"after the proxy answered again\"}");
    wait_in_sync(&cluster, &views, "the proxy answers again").await;
    assert_no_duplicates(&views);
    for (i, v) in views.iter().enumerate() {
        let v = v.lock().unwrap();
        assert_eq!(v.lists, 1, "syncer {i} listed again instead of resuming");
        assert_eq!(v.delivered.len(), 3, "syncer {i}: {:?}", v.delivered);
    }
    cancel.cancel();
}

/// Waits until every syncer reported a disconnect after `since`, within the liveness bound (and
/// slack for a loaded machine).
async fn wait_noticed(views: &[Shared], since: tokio::time::Instant) {
    let bound = SyncerConfig::new(EtcdPrefix::default()).dead_connection_bound();
    let deadline = since + bound + Duration::from_secs(20);
    loop {
        let noticed: Vec<_> = (views.iter())
            .filter_map(|v| {
                let v = v.lock().unwrap();
                v.disconnects.iter().map(|d| d.0).find(|t| *t >= since)
            })
            .collect();
        if noticed.len() == views.len() {
            let latest = noticed.iter().max().unwrap().duration_since(since);
            eprintln!(
                "all {} syncers noticed the silence, the last after {latest:?}",
                views.len()
            );
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} syncers did not notice their silent watch within {:?}",
            views.len() - noticed.len(),
            views.len(),
            deadline - since
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `signal` to `pid` (`kill -SIG pid`).
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Continues a stopped process when dropped (a failed assertion must not leave it stopped).
struct Stopped(u32);

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

/// A member that stops answering with its TCP connections up (SIGSTOP: the kernel keeps them, so
/// no reset and no close reaches the syncers) leaves their watches silent. Each syncer notices
/// within its liveness bound (no event and no progress answer), reports `Disconnected`, and when
/// the member answers again resumes where it was: the changes written meanwhile through the other
/// members arrive, none twice, without listing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_watch_is_noticed_and_resumed_without_loss_or_duplicates() {
    let cluster = EtcdCluster::start(3);
    for i in 0..5 {
        cluster.put(&key(i), &format!("{{\"v\":{i}}}"));
    }
    let cancel = CancellationToken::new();
    let views: Vec<_> = (0..SYNCERS)
        .map(|_| spawn_syncer(&cluster.client_url(0), &cancel))
        .collect();
    wait_in_sync(&cluster, &views, "initial list").await;

    let stopped = Stopped(cluster.pid(0).expect("member 0 runs"));
    signal(stopped.0, "STOP");
    let stopped_at = tokio::time::Instant::now();
    // Writes through the two members that answer (they keep quorum and elect a leader if member
    // 0 led): etcdctl against them only, since the stopped member would hold every request.
    let others = format!("{},{}", cluster.client_url(1), cluster.client_url(2));
    let put = |k: &str, v: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let out = std::process::Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &others, "--command-timeout", "5s"])
                .args(["put", k, v])
                .output()
                .expect("etcdctl put");
            if out.status.success() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "etcdctl put {k}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    for i in 5..10 {
        put(&key(i), "{\"v\":\"while member 0 was stopped\"}");
    }
    // Every syncer reports the silence within its bound.
    wait_noticed(&views, stopped_at).await;
    drop(stopped);
    for i in 10..12 {
        put(&key(i), "{\"v\":\"after member 0 answered again\"}");
    }
    wait_in_sync(&cluster, &views, "member 0 answers again").await;
    assert_no_duplicates(&views);
    for (i, v) in views.iter().enumerate() {
        let v = v.lock().unwrap();
        assert_eq!(v.lists, 1, "syncer {i} listed again instead of resuming");
        // Every write since its listing, each once: the 7 puts, and a put etcdctl retried after
        // a timeout during the leader election that had committed all the same (a second
        // revision of the same key).
        let written = head_revision(&cluster) - v.listed_at;
        assert!(written >= 7, "{written} writes since the listing");
        assert_eq!(
            v.delivered.len() as i64,
            written,
            "syncer {i}: {:?}",
            v.delivered
        );
    }
    cancel.cancel();
}
