//! The status/health/metrics server over real HTTP.

use std::time::Duration;

use felixrs::agent::metrics::Metrics;
use felixrs::agent::status::{self, Source, Status, StatusHub};
use felixrs_test_support::http;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_readiness_metrics_and_revision_wait() {
    let hub = StatusHub::new(Metrics::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::spawn(status::serve(
        listener,
        hub.clone(),
        cancel.clone().cancelled_owned(),
    ));
    let get = move |path: &'static str| {
        tokio::task::spawn_blocking(move || http::get(addr, path).expect("http get"))
    };

    let (code, body) = get("/status").await.unwrap();
    assert_eq!(code, 200);
    let s: Status = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (s.in_sync, s.applied_revision, s.source),
        (false, 0, Source::None)
    );
    assert_eq!(get("/readiness").await.unwrap().0, 503);
    assert_eq!(get("/liveness").await.unwrap().0, 200);

    // A waiting client is released when the revision is applied.
    let waiter = get("/status?min_revision=42&timeout_ms=10000");
    tokio::time::sleep(Duration::from_millis(200)).await;
    hub.metrics.rules.set(17);
    hub.update(|s| {
        s.in_sync = true;
        s.programmed = true;
        s.source = Source::Etcd;
        s.applied_revision = 42;
    });
    let (code, body) = waiter.await.unwrap();
    assert_eq!(code, 200);
    let s: Status = serde_json::from_str(&body).unwrap();
    assert_eq!(s.applied_revision, 42);
    assert_eq!(get("/readiness").await.unwrap().0, 200);

    let (code, metrics) = get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(metrics.contains("felixrs_rules 17"), "{metrics}");
    assert!(metrics.contains("felixrs_applied_revision 42"), "{metrics}");
    assert!(
        metrics.contains("felixrs_apply_seconds_bucket"),
        "{metrics}"
    );

    // A wait that is not satisfied times out with the current status.
    let (code, body) = get("/status?min_revision=100&timeout_ms=300")
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_str::<Status>(&body)
            .unwrap()
            .applied_revision,
        42
    );
    cancel.cancel();
}
