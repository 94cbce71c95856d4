//! `/liveness` tells the truth about the apply thread, and the agent ends when that thread does.
//!
//! * In process (no root): the runtime with a dataplane that panics (or never returns) from its
//!   first apply, programming from a snapshot with etcd refusing: `/liveness` turns 503 naming
//!   the cause and `runtime::run` returns it as its error.
//! * The binary (root, a network namespace, a real etcd): with the test-only fault hook
//!   (`FELIXRS_TEST_APPLY_FAULT`, debug builds) the process exits non-zero with a log line naming
//!   the cause; a healthy idle agent answers 200 across several stale bounds.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use calc_graph::proto::Output;
use felixrs::agent::apply_loop::{ApplyReport, Dataplane, DataplaneError};
use felixrs::agent::datastore::{EtcdDatastore, EtcdTls};
use felixrs::agent::kernel::GraphPipeline;
use felixrs::agent::liveness::Liveness;
use felixrs::agent::metrics::Metrics;
use felixrs::agent::runtime::{self, RuntimeConfig};
use felixrs::agent::snapshot::{Snapshot, SnapshotStore};
use felixrs::agent::status::{self, StatusHub};
use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;
use felixrs_test_support::{free_port, http};
use support::{Agent, put_default_tier, put_ns1_profile, put_web_endpoint};

/// What the test dataplane's first apply does.
#[derive(Clone, Copy)]
enum Failing {
    Panics,
    NeverReturns,
}

impl Dataplane for Failing {
    fn apply(&mut self, _outputs: Vec<Output>) -> Result<ApplyReport, DataplaneError> {
        match self {
            Failing::Panics => panic!("test dataplane: apply panicked"),
            Failing::NeverReturns => loop {
                std::thread::park();
            },
        }
    }
    fn refresh(&mut self) -> Result<ApplyReport, DataplaneError> {
        Ok(ApplyReport::default())
    }
}

/// Runs the agent's runtime with `dataplane`, from an (empty) snapshot while etcd refuses, and a
/// status server of the test's own on the same hub (it outlives the runtime's): returns the
/// runtime's result and `/liveness` after it, with how long the runtime ran.
async fn run_until_it_stops(
    dataplane: Failing,
    stale_after: Duration,
) -> (anyhow::Result<()>, (u16, String), Duration) {
    let hub = StatusHub::with_liveness(Metrics::new(), Liveness::new(stale_after));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(status::serve(
        listener,
        hub.clone(),
        stop.clone().cancelled_owned(),
    ));
    let get = move |path: &'static str| {
        tokio::task::spawn_blocking(move || http::get(addr, path).expect("http get"))
    };
    assert_eq!(get("/liveness").await.unwrap(), (200, "ok".to_string()));

    let dir = tempfile::tempdir().unwrap();
    SnapshotStore::new(dir.path())
        .save(&Snapshot {
            revision: 3,
            kvs: Default::default(),
        })
        .unwrap();
    let cfg = RuntimeConfig {
        prefix: "/calico".parse().unwrap(),
        state_dir: dir.path().to_path_buf(),
        health_listen: "127.0.0.1:0".parse().unwrap(),
        etcd_timeout: Duration::from_millis(500),
        refresh_interval: (Duration::from_secs(90)).into(),
        drift_interval: None,
        snapshot_interval: Duration::from_secs(1),
        felix_config: None,
        http_routes: axum::Router::new(),
    };
    // Nothing listens there: etcd refuses, the snapshot is the view.
    let etcd: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let datastore = EtcdDatastore::new(
        vec![format!("http://{etcd}")],
        EtcdTls::default(),
        Duration::from_millis(500),
    );
    let started = Instant::now();
    let res = tokio::time::timeout(
        Duration::from_secs(30),
        runtime::run(
            cfg,
            datastore,
            GraphPipeline::new("node-1"),
            dataplane,
            hub.clone(),
            tokio_util::sync::CancellationToken::new(),
        ),
    )
    .await
    .expect("the runtime stops by itself");
    let ran = started.elapsed();
    let liveness = get("/liveness").await.unwrap();
    stop.cancel();
    (res, liveness, ran)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_apply_thread_turns_liveness_503_and_stops_the_runtime() {
    let (res, (code, body), _) = run_until_it_stops(Failing::Panics, Duration::from_secs(60)).await;
    let err = format!("{:#}", res.expect_err("the runtime fails"));
    assert_eq!(err, "apply thread panicked: test dataplane: apply panicked");
    assert_eq!((code, body.as_str()), (503, err.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_apply_thread_turns_liveness_503_and_stops_the_runtime() {
    let bound = Duration::from_millis(1500);
    let (res, (code, body), ran) = run_until_it_stops(Failing::NeverReturns, bound).await;
    let err = format!("{:#}", res.expect_err("the runtime fails"));
    assert!(
        err.starts_with("apply thread stuck: no heartbeat for "),
        "{err}"
    );
    assert!(err.ends_with("(bound 1500 ms)"), "{err}");
    assert!(ran >= bound, "stopped after {ran:?}, before the bound");
    assert_eq!(code, 503);
    assert!(body.starts_with("apply thread stuck: "), "{body}");
}

/// The agent binary with a test fault, in a namespace of its own with a real etcd holding one
/// local endpoint.
fn agent_with(env: &[(&str, &str)]) -> (Netns, Etcd, tempfile::TempDir, Agent) {
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    put_default_tier(&etcd);
    put_ns1_profile(&etcd);
    put_web_endpoint(&etcd, "cali0000000001", &["kns.ns1"]);
    let (dir, state_dir) = support::state_dir();
    let agent = Agent::spawn(
        ns.name(),
        &etcd.client_url(),
        &state_dir,
        &["--drift-interval", "1"],
        env,
    );
    (ns, etcd, dir, agent)
}

#[test]
fn the_agent_exits_non_zero_naming_a_panicked_apply_thread() {
    let (_ns, _etcd, _dir, mut agent) = agent_with(&[("FELIXRS_TEST_APPLY_FAULT", "panic")]);
    let status = agent
        .wait_exit(Duration::from_secs(30))
        .expect("the agent exits by itself");
    assert_eq!(status.code(), Some(1), "{}", agent.log());
    let log = agent.log();
    assert!(
        log.contains("the apply thread is not alive; stopping the agent")
            && log
                .contains("apply thread panicked: injected fault: FELIXRS_TEST_APPLY_FAULT=panic"),
        "{log}"
    );
    assert!(
        log.contains("felixrs agent: apply thread panicked: injected fault"),
        "{log}"
    );
}

#[test]
fn the_agent_exits_non_zero_naming_a_stuck_apply_thread() {
    let (_ns, _etcd, _dir, mut agent) = agent_with(&[
        ("FELIXRS_TEST_APPLY_FAULT", "hang"),
        ("FELIXRS_TEST_LIVENESS_STALE_MS", "2000"),
    ]);
    let status = agent
        .wait_exit(Duration::from_secs(30))
        .expect("the agent exits by itself");
    assert_eq!(status.code(), Some(1), "{}", agent.log());
    let log = agent.log();
    assert!(
        log.contains("felixrs agent: apply thread stuck: no heartbeat for "),
        "{log}"
    );
}

#[test]
fn a_healthy_idle_agent_stays_live_across_several_stale_bounds() {
    let bound = Duration::from_secs(2);
    let (_ns, _etcd, _dir, mut agent) = agent_with(&[("FELIXRS_TEST_LIVENESS_STALE_MS", "2000")]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent.get("/liveness").is_err() {
        assert!(Instant::now() < deadline, "agent did not start serving");
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = agent.poll_status(Duration::from_secs(20), |s| s["programmed"] == true);
    assert_eq!(s["programmed"], true, "{s}");
    // Idle: nothing changes in etcd; the drift check and the waits for work keep it beating.
    let until = Instant::now() + bound * 5;
    let mut probes = 0;
    while Instant::now() < until {
        let (code, body) = agent.get("/liveness").expect("GET /liveness");
        assert_eq!((code, body.as_str()), (200, "ok"), "{}", agent.log());
        probes += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(probes > 50, "{probes}");
    assert!(agent.wait_exit(Duration::ZERO).is_none(), "{}", agent.log());
}
