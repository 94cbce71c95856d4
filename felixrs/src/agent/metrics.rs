//! Prometheus metrics of the agent (prometheus-client registry, text exposition).
//!
//! Counters are bumped where the event happens (apply loop, syncer consumer, snapshot writer);
//! gauges are set from each apply's report. Names follow Felix's where one exists.

use calc_graph::proto::IpVersion;
use iptables::stats::Tally;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};

use crate::dns::metrics::DnsMetrics;

/// Every metric the agent exports, with the registry that serves them.
pub struct Metrics {
    registry: Registry,
    pub apply_seconds: Histogram,
    pub apply_errors: Counter,
    pub restore_calls: Counter,
    pub restore_errors: Counter,
    pub conntrack_flows_deleted: Counter,
    pub conntrack_errors: Counter,
    pub rules: Gauge,
    pub chains: Gauge,
    pub ip_sets: Gauge,
    pub local_endpoints: Gauge,
    pub active_policies: Gauge,
    pub applied_revision: Gauge,
    pub resyncs: Counter,
    pub datastore_updates: Counter,
    pub datastore_disconnects: Counter,
    pub malformed_values: Counter,
    pub failed_safe_rules: Gauge,
    pub snapshot_writes: Counter,
    pub snapshot_write_errors: Counter,
    pub snapshot_write_seconds: Histogram,
    /// Per-policy kernel counters, as last read by the counter thread.
    pub policy_counters: Arc<PolicyCounters>,
    pub policy_counter_rules_missing: Gauge,
    pub counter_reads: Counter,
    pub counter_read_errors: Counter,
    pub counter_read_seconds: Histogram,
    pub drift_checks: Counter,
    pub drift_check_errors: Counter,
    pub drift_repairs: Counter,
    pub drift_check_seconds: Histogram,
    /// Per federated cluster (label `cluster`): 1 while its etcd answers.
    pub remote_connected: Family<RemoteLabels, Gauge>,
    /// Per federated cluster: its keys (endpoints, profiles, network sets) in the agent's view.
    pub remote_keys: Family<RemoteLabels, Gauge>,
    /// The DNS learner's (`felixrs_dns_*`, FQDN policy).
    pub dns: DnsMetrics,
}

/// The label set of the per-remote-cluster metrics.
pub type RemoteLabels = Vec<(String, String)>;

/// `cluster="<name>"`.
pub fn remote_labels(cluster: &str) -> RemoteLabels {
    vec![("cluster".to_string(), cluster.to_string())]
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("felixrs");
        let secs = || Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let m = Self {
            apply_seconds: secs(),
            apply_errors: Counter::default(),
            restore_calls: Counter::default(),
            restore_errors: Counter::default(),
            conntrack_flows_deleted: Counter::default(),
            conntrack_errors: Counter::default(),
            rules: Gauge::default(),
            chains: Gauge::default(),
            ip_sets: Gauge::default(),
            local_endpoints: Gauge::default(),
            active_policies: Gauge::default(),
            applied_revision: Gauge::default(),
            resyncs: Counter::default(),
            datastore_updates: Counter::default(),
            datastore_disconnects: Counter::default(),
            malformed_values: Counter::default(),
            failed_safe_rules: Gauge::default(),
            snapshot_writes: Counter::default(),
            snapshot_write_errors: Counter::default(),
            snapshot_write_seconds: secs(),
            policy_counters: Arc::default(),
            policy_counter_rules_missing: Gauge::default(),
            counter_reads: Counter::default(),
            counter_read_errors: Counter::default(),
            counter_read_seconds: secs(),
            drift_checks: Counter::default(),
            drift_check_errors: Counter::default(),
            drift_repairs: Counter::default(),
            drift_check_seconds: secs(),
            remote_connected: Family::default(),
            remote_keys: Family::default(),
            dns: DnsMetrics::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "apply_seconds",
            "Time to program one coalesced batch into the kernel",
            m.apply_seconds.clone(),
        );
        r.register("apply_errors", "Failed applies", m.apply_errors.clone());
        r.register(
            "iptables_restore_calls",
            "iptables-restore and ipset restore invocations",
            m.restore_calls.clone(),
        );
        r.register(
            "iptables_restore_errors",
            "Failed iptables-restore and ipset restore invocations",
            m.restore_errors.clone(),
        );
        r.register(
            "conntrack_flows_deleted",
            "Conntrack flows deleted because their address left a local endpoint",
            m.conntrack_flows_deleted.clone(),
        );
        r.register(
            "conntrack_errors",
            "Addresses whose conntrack flows could not be deleted",
            m.conntrack_errors.clone(),
        );
        r.register(
            "rules",
            "Rules programmed (all tables, v4 and v6)",
            m.rules.clone(),
        );
        r.register("chains", "cali- chains programmed", m.chains.clone());
        r.register("ip_sets", "IP sets programmed", m.ip_sets.clone());
        r.register(
            "local_endpoints",
            "Local workload endpoints",
            m.local_endpoints.clone(),
        );
        r.register(
            "active_policies",
            "Policies active on this node",
            m.active_policies.clone(),
        );
        r.register(
            "applied_revision",
            "Datastore revision whose effects are all in the kernel",
            m.applied_revision.clone(),
        );
        r.register(
            "resyncs",
            "Full datastore lists (start, compaction)",
            m.resyncs.clone(),
        );
        r.register(
            "datastore_updates",
            "Datastore key changes received",
            m.datastore_updates.clone(),
        );
        r.register(
            "datastore_disconnects",
            "Lost datastore connections",
            m.datastore_disconnects.clone(),
        );
        r.register(
            "malformed_values",
            "Datastore values that failed to parse and were skipped",
            m.malformed_values.clone(),
        );
        r.register(
            "failed_safe_rules",
            "Rules not rendered as written because of a field the agent does not enforce or know",
            m.failed_safe_rules.clone(),
        );
        r.register(
            "snapshot_writes",
            "Snapshot files written",
            m.snapshot_writes.clone(),
        );
        r.register(
            "snapshot_write_errors",
            "Snapshot writes that failed",
            m.snapshot_write_errors.clone(),
        );
        r.register(
            "snapshot_write_seconds",
            "Time to encode and durably write the snapshot",
            m.snapshot_write_seconds.clone(),
        );
        r.register(
            "counter_reads",
            "Reads of the kernel's rule counters (iptables-save -c, both families)",
            m.counter_reads.clone(),
        );
        r.register(
            "counter_read_errors",
            "Failed reads of the kernel's rule counters",
            m.counter_read_errors.clone(),
        );
        r.register(
            "counter_read_seconds",
            "Time to read and attribute the kernel's rule counters",
            m.counter_read_seconds.clone(),
        );
        r.register(
            "policy_counter_rules_missing",
            "Rendered rules of ours the last counter read did not find in the kernel",
            m.policy_counter_rules_missing.clone(),
        );
        r.register(
            "drift_checks",
            "Fast drift checks (our entry chains and hooks listed)",
            m.drift_checks.clone(),
        );
        r.register(
            "drift_check_errors",
            "Fast drift checks that failed",
            m.drift_check_errors.clone(),
        );
        r.register(
            "drift_repairs",
            "Chains found changed by someone else and repaired (one per chain)",
            m.drift_repairs.clone(),
        );
        r.register(
            "drift_check_seconds",
            "Time of one fast drift check, repairs included",
            m.drift_check_seconds.clone(),
        );
        r.register_collector(Box::new(m.policy_counters.clone()));
        r.register(
            "remote_cluster_connected",
            "Federated cluster's etcd answers (1) or not (0)",
            m.remote_connected.clone(),
        );
        r.register(
            "remote_cluster_keys",
            "Federated cluster's endpoints, profiles and network sets held",
            m.remote_keys.clone(),
        );
        m.dns.register(r);
        Self { registry, ..m }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// The last tallies, encoded on each scrape.
#[derive(Debug, Default)]
pub struct PolicyCounters {
    tallies: Mutex<Vec<(IpVersion, Tally)>>,
}

impl PolicyCounters {
    pub fn set(&self, tallies: Vec<(IpVersion, Tally)>) {
        *self.tallies.lock().expect("policy counters lock") = tallies;
    }

    pub fn get(&self) -> Vec<(IpVersion, Tally)> {
        self.tallies.lock().expect("policy counters lock").clone()
    }
}

impl Collector for PolicyCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let tallies = self.tallies.lock().expect("policy counters lock");
        for (metric, help, bytes) in [
            (
                "policy_packets",
                "Packets counted by the kernel per policy (or tier end, or profile), direction and action",
                false,
            ),
            (
                "policy_bytes",
                "Bytes counted by the kernel per policy (or tier end, or profile), direction and action",
                true,
            ),
        ] {
            let mut family = encoder.encode_descriptor(
                metric,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (v, tally) in tallies.iter() {
                for (k, c) in &tally.counters {
                    let labels = [
                        ("family", if *v == IpVersion::V4 { "ipv4" } else { "ipv6" }),
                        ("kind", k.source.as_str()),
                        ("tier", k.tier.as_str()),
                        ("policy", k.name.as_str()),
                        ("direction", k.direction.as_str()),
                        ("action", k.action.as_str()),
                    ];
                    let value = if bytes { c.bytes } else { c.packets };
                    let m = family.encode_family(&labels)?;
                    ConstCounter::new(value).encode(m)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod policy_counter_tests {
    use super::*;
    use iptables::model::Counters;
    use iptables::stats::{Action, CounterKey, Direction, Source};

    #[test]
    fn hostile_names_stay_inside_their_label() {
        let m = Metrics::new();
        let mut tally = Tally::default();
        tally.counters.insert(
            CounterKey {
                source: Source::NetworkPolicy,
                tier: "default".into(),
                name: "ns/evil\"} 1\nfelixrs_forged_total 9 --policy=x\\".into(),
                direction: Direction::Ingress,
                action: Action::Deny,
            },
            Counters {
                packets: 7,
                bytes: 420,
            },
        );
        m.policy_counters.set(vec![(IpVersion::V4, tally)]);
        let text = m.render();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("felixrs_policy_packets_total{"))
            .collect();
        assert_eq!(lines.len(), 1, "{text}");
        assert!(lines[0].ends_with(" 7"), "{text}");
        assert!(
            !text.lines().any(|l| l.starts_with("felixrs_forged")),
            "{text}"
        );
    }
}
