//! Prometheus metrics, and the optional `--metrics-listen` HTTP endpoint serving them at `/metrics`.
//!
//! Metric names use the `policy_controller_` prefix. Skips are a gauge family labelled by source kind
//! and field, reset on every pass, so the endpoint shows the current problems, not a history.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::convert::SkipReport;
use crate::writer::SyncStats;

type Labels = Vec<(String, String)>;

/// The controller's metrics; clones share the same series.
#[derive(Clone)]
pub struct Metrics {
    synced: Gauge,
    skipped: Family<Labels, Gauge>,
    writes: Family<Labels, Counter>,
    write_latency: Histogram,
    leader: Gauge,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut reg = Registry::with_prefix("policy_controller");
        let synced = Gauge::default();
        let skipped = Family::<Labels, Gauge>::default();
        let writes = Family::<Labels, Counter>::default();
        let write_latency = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let leader = Gauge::default();
        reg.register(
            "objects_synced",
            "Calico resources in the desired state",
            synced.clone(),
        );
        reg.register(
            "objects_skipped",
            "Objects (or rules) skipped in the last pass, by kind and field",
            skipped.clone(),
        );
        reg.register(
            "etcd_writes",
            "Keys written to etcd, by operation",
            writes.clone(),
        );
        reg.register(
            "etcd_txn_duration_seconds",
            "Latency of etcd write transactions",
            write_latency.clone(),
        );
        reg.register(
            "leader",
            "1 while this replica is the elected leader",
            leader.clone(),
        );
        Metrics {
            synced,
            skipped,
            writes,
            write_latency,
            leader,
            registry: Arc::new(reg),
        }
    }

    pub fn observe_write(&self, d: Duration) {
        self.write_latency.observe(d.as_secs_f64());
    }

    pub fn record_sync(&self, s: &SyncStats) {
        for (op, n) in [
            ("create", s.created),
            ("update", s.updated),
            ("delete", s.deleted),
        ] {
            self.writes
                .get_or_create(&vec![("op".to_string(), op.to_string())])
                .inc_by(n as u64);
        }
    }

    /// Sets the desired-state size and the current skip reports.
    pub fn record_desired(&self, resources: usize, skips: &[SkipReport]) {
        self.synced.set(resources as i64);
        self.skipped.clear();
        for s in skips {
            self.skipped
                .get_or_create(&vec![
                    ("kind".to_string(), s.kind.clone()),
                    ("field".to_string(), s.field.clone()),
                ])
                .inc();
        }
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    /// Serves `/metrics` on `addr` until the task is dropped.
    pub async fn serve(self, addr: SocketAddr) -> std::io::Result<()> {
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let m = self.clone();
                async move { m.render() }
            }),
        );
        let listener = tokio::net::TcpListener::bind(addr).await?;
        axum::serve(listener, app).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_skips() {
        let m = Metrics::new();
        m.record_sync(&SyncStats {
            created: 3,
            updated: 1,
            deleted: 0,
            revision: 9,
        });
        let obj = crate::convert::ObjectRef::new("Pod", Some("a"), "b");
        m.record_desired(7, &[SkipReport::new(&obj, "metadata.labels.x", "bad")]);
        m.set_leader(true);
        let text = m.render();
        assert!(
            text.contains("policy_controller_etcd_writes_total{op=\"create\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("policy_controller_objects_synced 7"),
            "{text}"
        );
        assert!(
            text.contains(
                "policy_controller_objects_skipped{kind=\"Pod\",field=\"metadata.labels.x\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("policy_controller_leader 1"), "{text}");
    }
}
