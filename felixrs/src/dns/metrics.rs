//! The learner's metrics (`/metrics`, registered with the agent's in `agent::metrics`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Why a held response was dropped (label `reason`).
pub const DROP_WRITE_FAILED: &str = "set_write_failed";
/// The verdict could not be sent (the kernel drops the packet when the queue goes away).
pub const DROP_VERDICT_FAILED: &str = "verdict_failed";

/// Cheap to clone: every metric shares its value with the clones.
#[derive(Debug, Clone)]
pub struct DnsMetrics {
    pub learned_names: Gauge,
    pub learned_addresses: Gauge,
    pub responses_held: Counter,
    pub hold_seconds: Histogram,
    pub responses_dropped: Family<Vec<(String, String)>, Counter>,
    pub evictions: Counter,
    /// 1 while the agent is bound to the hold queue (0: the kernel drops every held response).
    pub queue_bound: Gauge,
}

impl Default for DnsMetrics {
    fn default() -> Self {
        DnsMetrics {
            learned_names: Gauge::default(),
            learned_addresses: Gauge::default(),
            responses_held: Counter::default(),
            // 10 µs .. ~0.33 s.
            hold_seconds: Histogram::new(exponential_buckets(0.000_01, 2.0, 16)),
            responses_dropped: Family::default(),
            evictions: Counter::default(),
            queue_bound: Gauge::default(),
        }
    }
}

impl DnsMetrics {
    /// Counts a dropped response.
    pub fn dropped(&self, reason: &str) {
        self.responses_dropped
            .get_or_create(&vec![("reason".to_string(), reason.to_string())])
            .inc();
    }

    /// Registers every metric under `felixrs_dns_*`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "dns_learned_names",
            "Names in the learned DNS map",
            self.learned_names.clone(),
        );
        r.register(
            "dns_learned_addresses",
            "Distinct addresses in the learned DNS map",
            self.learned_addresses.clone(),
        );
        r.register(
            "dns_responses_held",
            "DNS responses held on the queue until their addresses were in the domain sets",
            self.responses_held.clone(),
        );
        r.register(
            "dns_hold_seconds",
            "Time a DNS response was held by the agent (receipt to verdict)",
            self.hold_seconds.clone(),
        );
        r.register(
            "dns_responses_dropped",
            "Held DNS responses dropped instead of released, by reason",
            self.responses_dropped.clone(),
        );
        r.register(
            "dns_learned_evictions",
            "Learned (name, address) entries evicted by --dns-max-learned",
            self.evictions.clone(),
        );
        r.register(
            "dns_queue_bound",
            "1 while the agent holds DNS responses on its NFQUEUE; 0: no one is bound and the kernel drops them",
            self.queue_bound.clone(),
        );
    }
}
