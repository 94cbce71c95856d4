//! Status, health and metrics over HTTP (axum).
//!
//! * `GET /status[?min_revision=R&timeout_ms=T]`: JSON [`Status`]; with `min_revision` the request
//!   waits (up to `timeout_ms`, default 10 s, max 60 s) until `applied_revision >= R`. Every status
//!   request asks the syncer for an etcd progress notification, so `applied_revision` reaches a
//!   revision written outside this node's concern promptly.
//! * `GET /readiness`: 200 once the kernel has been programmed from in-sync data, else 503.
//! * `GET /liveness`: 200 while the apply thread is alive ([`Liveness`]: it runs and its heartbeat
//!   is fresh), else 503 naming why (`apply thread panicked: …`, `apply thread stuck: …`).
//! * `GET /metrics`: Prometheus text.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};

use super::liveness::Liveness;
use super::metrics::Metrics;
use super::view::{AppliedView, ViewDelta};

/// Where the agent's current data came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    #[default]
    None,
    Snapshot,
    Etcd,
}

/// The `/status` document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The agent holds a complete, consistent view of the datastore (from etcd or the snapshot).
    pub in_sync: bool,
    /// The kernel has been programmed from in-sync data at least once.
    pub programmed: bool,
    /// The datastore revision whose effects are all in the kernel.
    pub applied_revision: i64,
    /// The newest datastore revision the agent has fully received.
    pub observed_revision: i64,
    pub source: Source,
    pub datastore_connected: bool,
    /// Why the datastore connection failed last (e.g. etcd's TLS handshake), until it works again.
    pub datastore_error: Option<String>,
    pub local_endpoints: usize,
    /// Host endpoints of this node (HostEndpoints with this node and an interface).
    #[serde(default)]
    pub local_host_endpoints: usize,
    pub active_policies: usize,
    pub ip_sets: usize,
    pub rules: usize,
    pub chains: usize,
    pub last_apply_duration_ms: Option<f64>,
    pub last_apply_error: Option<String>,
    pub malformed_values: u64,
    /// Rules not rendered as written because they have a field the agent does not enforce or
    /// know (cluster-wide, current): an Allow/Pass rule is left out, a Deny/Log rule keeps only
    /// its enforced matches. Never widens what a rule allows.
    #[serde(default)]
    pub failed_safe_rules: Vec<FailedSafeRuleStatus>,
    pub snapshot_revision: Option<i64>,
    pub snapshot_error: Option<String>,
    /// The last snapshot write failed (full or read-only state directory): the file on disk is
    /// older than the view the kernel is programmed from (a restart would start from
    /// `snapshot_revision`). Enforcement goes on; the writer retries, and the next good write
    /// clears it.
    #[serde(default)]
    pub snapshot_stale: bool,
    /// Each federated cluster (RemoteClusterConfiguration) by name.
    #[serde(default)]
    pub remote_clusters: BTreeMap<String, RemoteStatus>,
    /// When this agent process (this exec) started, Unix milliseconds: a re-exec for a
    /// FelixConfiguration change shows a newer one.
    #[serde(default)]
    pub started_at_unix_ms: u64,
    /// The settings read from FelixConfiguration (`default`, `node.<nodename>`): each field's
    /// source and value, the fields not implemented, invalid values.
    #[serde(default)]
    pub felix_configuration: Option<super::felix_config::FelixConfigStatus>,
}

/// One federated cluster in `/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RemoteStatus {
    /// Its etcd answered the last request.
    pub connected: bool,
    /// Why its etcd could not be reached, until it answers again.
    pub error: Option<String>,
    /// Its store's revision fully received (0: nothing from its etcd since the agent started).
    pub revision: i64,
    /// Where its members come from: `etcd`, or `snapshot` until its etcd answers after a restart.
    pub source: Source,
    /// Its keys (workload endpoints, profiles, network sets) in the agent's view.
    pub keys: usize,
    /// Its revision in the last snapshot written (what a restart with it down would start from).
    pub snapshot_revision: Option<i64>,
    /// Why its configuration is unusable (the last valid one, if any, stays in use).
    pub config_error: Option<String>,
}

/// One entry of `/status`'s `failed_safe_rules`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedSafeRuleStatus {
    /// The policy or profile, as `globalnetworkpolicies/<name>` or `networkpolicies/<ns>/<name>`.
    pub resource: String,
    /// `spec.ingress[0]`.
    pub rule: String,
    pub action: String,
    /// `unknown` or `unenforced` field paths, with the rule's: `spec.ingress[0].source.selectr`.
    pub unknown_fields: Vec<String>,
    pub unenforced_fields: Vec<String>,
    /// Fields enforced only in some uses, used otherwise, with the reason and the rule's path:
    /// `spec.egress[0].destination.domains[1]: invalid domain name "a..b": empty label`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected_fields: Vec<String>,
    /// Whether the rule is rendered at all (Deny/Log, with only its enforced matches).
    pub rendered: bool,
}

/// State shared by the agent's tasks and the HTTP handlers.
pub struct StatusHub {
    status: Mutex<Status>,
    applied_tx: watch::Sender<i64>,
    /// Wakes the syncer to request an etcd progress notification.
    pub nudge: Arc<Notify>,
    pub metrics: Metrics,
    /// The apply thread's heartbeat (`/liveness`).
    pub liveness: Arc<Liveness>,
    /// What the kernel holds, for the operator tools ([`super::view`]).
    applied_view: Mutex<Option<AppliedView>>,
    /// The flow hub, with `--flow-logs` (`GET /flows`).
    flows: std::sync::OnceLock<Arc<crate::flowlog::FlowHub>>,
}

impl StatusHub {
    pub fn new(metrics: Metrics) -> Arc<Self> {
        Self::with_liveness(metrics, Liveness::default())
    }

    /// With the apply thread's heartbeat `liveness` (e.g. another stale bound).
    pub fn with_liveness(metrics: Metrics, liveness: Liveness) -> Arc<Self> {
        Arc::new(Self {
            status: Mutex::new(Status::default()),
            applied_tx: watch::channel(0).0,
            nudge: Arc::new(Notify::new()),
            metrics,
            liveness: Arc::new(liveness),
            applied_view: Mutex::new(None),
            flows: std::sync::OnceLock::new(),
        })
    }

    /// Serves `hub` at `/flows` (flow logs on; set once, before serving).
    pub fn set_flows(&self, hub: Arc<crate::flowlog::FlowHub>) {
        let _ = self.flows.set(hub);
    }

    /// Applies the changes an apply put in the kernel to the applied view, now at `revision`;
    /// called before `applied_revision` reaches it, so the view served is never older than what
    /// `/status` reports. Costs the changes, not the view.
    pub fn apply_view(&self, revision: i64, changes: ViewDelta) {
        let mut v = self.applied_view.lock().expect("view lock");
        let view = v.get_or_insert_with(|| AppliedView {
            revision,
            kvs: Default::default(),
        });
        view.revision = revision;
        for (k, value) in changes {
            match value {
                Some(value) => view.kvs.insert(k, value),
                None => view.kvs.remove(&k),
            };
        }
    }

    /// The applied view's revision (none before the first apply).
    pub fn applied_view_revision(&self) -> Option<i64> {
        (self.applied_view.lock().expect("view lock").as_ref()).map(|v| v.revision)
    }

    /// A copy of the view the kernel holds (none before the first apply).
    pub fn applied_view(&self) -> Option<AppliedView> {
        self.applied_view.lock().expect("view lock").clone()
    }

    pub fn snapshot(&self) -> Status {
        self.status.lock().expect("status lock").clone()
    }

    /// Changes the status under its lock.
    pub fn update(&self, f: impl FnOnce(&mut Status)) {
        let mut s = self.status.lock().expect("status lock");
        f(&mut s);
        let applied = s.applied_revision;
        drop(s);
        self.metrics.applied_revision.set(applied);
        self.applied_tx
            .send_if_modified(|r| std::mem::replace(r, applied) != applied);
    }

    /// Waits until `applied_revision >= revision` or `timeout` passes; true if reached.
    pub async fn wait_applied(&self, revision: i64, timeout: Duration) -> bool {
        let mut rx = self.applied_tx.subscribe();
        let nudge = self.nudge.clone();
        let wait = async {
            loop {
                nudge.notify_one();
                if *rx.borrow_and_update() >= revision {
                    return;
                }
                tokio::select! {
                    r = rx.changed() => if r.is_err() { std::future::pending::<()>().await },
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

#[derive(Debug, Deserialize)]
struct StatusQuery {
    min_revision: Option<i64>,
    timeout_ms: Option<u64>,
}

/// The HTTP routes.
pub fn router(hub: Arc<StatusHub>) -> Router {
    let flows = hub.flows.get().cloned();
    let r = Router::new()
        .route("/status", get(status))
        .route("/readiness", get(readiness))
        .route("/liveness", get(liveness))
        .route("/metrics", get(metrics))
        .with_state(hub);
    match flows {
        Some(f) => r.merge(crate::flowlog::http::routes(f)),
        None => r,
    }
}

async fn status(State(hub): State<Arc<StatusHub>>, Query(q): Query<StatusQuery>) -> Json<Status> {
    hub.nudge.notify_one();
    if let Some(rev) = q.min_revision {
        let timeout = Duration::from_millis(q.timeout_ms.unwrap_or(10_000).min(60_000));
        hub.wait_applied(rev, timeout).await;
    }
    Json(hub.snapshot())
}

async fn readiness(State(hub): State<Arc<StatusHub>>) -> Response {
    let s = hub.snapshot();
    if s.in_sync && s.programmed && s.last_apply_error.is_none() {
        (StatusCode::OK, "ready").into_response()
    } else {
        let why = if !s.in_sync {
            match &s.datastore_error {
                Some(e) => format!("not in sync with the datastore: {e}"),
                None => "not in sync with the datastore".to_string(),
            }
        } else if !s.programmed {
            "kernel not programmed yet".to_string()
        } else {
            "last apply failed".to_string()
        };
        (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
    }
}

async fn liveness(State(hub): State<Arc<StatusHub>>) -> Response {
    match hub.liveness.check() {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.to_string()).into_response(),
    }
}

async fn metrics(State(hub): State<Arc<StatusHub>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        hub.metrics.render(),
    )
        .into_response()
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    hub: Arc<StatusHub>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(hub))
        .with_graceful_shutdown(shutdown)
        .await
}
