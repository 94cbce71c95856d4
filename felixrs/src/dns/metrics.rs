//! The learner's metrics (`/metrics`, registered with the agent's in `agent::metrics`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::agent::metrics::metric_fields;

/// Why a held response was dropped (label `reason`).
pub const DROP_WRITE_FAILED: &str = "set_write_failed";
/// The verdict could not be sent (the kernel drops the packet when the queue goes away).
pub const DROP_VERDICT_FAILED: &str = "verdict_failed";

metric_fields! {
    /// Cheap to clone: every metric shares its value with the clones.
    #[derive(Debug, Clone)]
    pub struct DnsMetrics {
        pub learned_names: Gauge = Gauge::default()
            => "dns_learned_names", "Names in the learned DNS map";
        pub learned_addresses: Gauge = Gauge::default()
            => "dns_learned_addresses", "Distinct addresses in the learned DNS map";
        pub responses_held: Counter = Counter::default()
            => "dns_responses_held",
            "DNS responses held on the queue until their addresses were in the domain sets";
        // 10 µs .. ~0.33 s.
        pub hold_seconds: Histogram = Histogram::new(exponential_buckets(0.000_01, 2.0, 16))
            => "dns_hold_seconds", "Time a DNS response was held by the agent (receipt to verdict)";
        pub responses_dropped: Family<Vec<(String, String)>, Counter> = Family::default()
            => "dns_responses_dropped", "Held DNS responses dropped instead of released, by reason";
        pub evictions: Counter = Counter::default()
            => "dns_learned_evictions",
            "Learned (name, address) entries evicted by --dns-max-learned";
        /// 1 while the agent is bound to the hold queue (0: the kernel drops every held response).
        pub queue_bound: Gauge = Gauge::default()
            => "dns_queue_bound",
            "1 while the agent holds DNS responses on its NFQUEUE; 0: no one is bound and the kernel drops them";
    }
}

impl Default for DnsMetrics {
    fn default() -> Self {
        Self::unregistered()
    }
}

impl DnsMetrics {
    /// Counts a dropped response.
    pub fn dropped(&self, reason: &str) {
        self.responses_dropped
            .get_or_create(&vec![("reason".to_string(), reason.to_string())])
            .inc();
    }
}
