//! Prometheus metrics of the agent (prometheus-client registry, text exposition).
//!
//! Counters are bumped where the event happens (apply loop, syncer consumer, snapshot writer);
//! gauges are set from each apply's report. Names follow Felix's where one exists; Felix's own
//! names (`felix_*`) are served beside them from the same quantities ([`felix`]).

pub mod felix;

use calc_graph::proto::IpVersion;
use iptables::stats::Tally;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};

use crate::dns::metrics::DnsMetrics;

/// Declares a struct of metrics from one list: each field with its initial value and, for a
/// metric it exports itself, the name and help it is registered under. Generates
/// `Self::unregistered()` (every field at its initial value) and `Self::register_fields()` (the
/// exported fields, in list order), so a metric cannot be declared and never registered.
macro_rules! metric_fields {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                $fvis:vis $field:ident: $ty:ty = $init:expr $(=> $metric:literal, $help:literal)?;
            )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$fmeta])* $fvis $field: $ty,)*
        }

        impl $name {
            fn unregistered() -> Self {
                Self { $($field: $init,)* }
            }

            pub(crate) fn register_fields(&self, r: &mut prometheus_client::registry::Registry) {
                $($(r.register($metric, $help, self.$field.clone());)?)*
            }
        }
    };
}
pub(crate) use metric_fields;

/// The buckets of the agent's durations: 0.5 ms .. ~16 s.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

metric_fields! {
    /// Every metric the agent exports, with the registry that serves them.
    pub struct Metrics {
        registry: Registry = Registry::default();
        pub apply_seconds: Histogram = seconds()
            => "apply_seconds", "Time to program one coalesced batch into the kernel";
        pub endpoint_programming_seconds: Histogram = seconds()
            => "endpoint_programming_seconds",
            "Time from a local workload endpoint's datastore change reaching the agent to the apply that programmed its chains";
        pub apply_errors: Counter = Counter::default() => "apply_errors", "Failed applies";
        pub restore_calls: Counter = Counter::default()
            => "iptables_restore_calls", "iptables-restore and ipset restore invocations";
        pub restore_errors: Counter = Counter::default()
            => "iptables_restore_errors", "Failed iptables-restore and ipset restore invocations";
        pub conntrack_flows_deleted: Counter = Counter::default()
            => "conntrack_flows_deleted",
            "Conntrack flows deleted because their address left a local endpoint";
        pub conntrack_errors: Counter = Counter::default()
            => "conntrack_errors", "Failed deletions of conntrack flows of removed endpoint addresses";
        pub rules: Gauge = Gauge::default() => "rules", "Rules programmed (all tables, v4 and v6)";
        pub chains: Gauge = Gauge::default() => "chains", "cali- chains programmed";
        pub ip_sets: Gauge = Gauge::default() => "ip_sets", "IP sets programmed";
        pub local_endpoints: Gauge = Gauge::default()
            => "local_endpoints", "Local workload endpoints";
        pub local_host_endpoints: Gauge = Gauge::default()
            => "local_host_endpoints", "Local host endpoints (HostEndpoints of this node)";
        pub active_policies: Gauge = Gauge::default()
            => "active_policies", "Policies active on this node";
        pub applied_revision: Gauge = Gauge::default()
            => "applied_revision", "Datastore revision whose effects are all in the kernel";
        pub resyncs: Counter = Counter::default()
            => "resyncs", "Full datastore lists (start, compaction)";
        pub datastore_updates: Counter = Counter::default()
            => "datastore_updates", "Datastore key changes received";
        pub datastore_disconnects: Counter = Counter::default()
            => "datastore_disconnects", "Lost datastore connections";
        pub malformed_values: Counter = Counter::default()
            => "malformed_values", "Datastore values that failed to parse and were skipped";
        pub failed_safe_rules: Gauge = Gauge::default()
            => "failed_safe_rules",
            "Rules not rendered as written because of a field the agent does not enforce or know";
        pub snapshot_writes: Counter = Counter::default()
            => "snapshot_writes", "Snapshot files written";
        pub snapshot_write_errors: Counter = Counter::default()
            => "snapshot_write_errors", "Snapshot writes that failed";
        pub snapshot_write_seconds: Histogram = seconds()
            => "snapshot_write_seconds", "Time to encode and durably write the snapshot";
        pub snapshot_stale: Gauge = Gauge::default()
            => "snapshot_stale", "1 while the last snapshot write failed (the file is older than the view)";
        pub counter_reads: Counter = Counter::default()
            => "counter_reads",
            "Reads of the kernel's rule counters (iptables-save -c, both families)";
        pub counter_read_errors: Counter = Counter::default()
            => "counter_read_errors", "Failed reads of the kernel's rule counters";
        pub counter_read_seconds: Histogram = seconds()
            => "counter_read_seconds", "Time to read and attribute the kernel's rule counters";
        pub policy_counter_rules_missing: Gauge = Gauge::default()
            => "policy_counter_rules_missing",
            "Rendered rules of ours the last counter read did not find in the kernel";
        pub drift_checks: Counter = Counter::default()
            => "drift_checks", "Fast drift checks (change signal asked; our tables and sets compared)";
        pub drift_check_errors: Counter = Counter::default()
            => "drift_check_errors", "Fast drift checks that failed";
        pub drift_repairs: Counter = Counter::default()
            => "drift_repairs", "Chains found changed by someone else and repaired (one per chain)";
        /// The same repairs by `family` and `object` (`filter/cali-tw-…`, `ipset/cali40s:…`).
        pub drift_repaired: Family<RemoteLabels, Counter> = Family::default()
            => "drift_repaired_objects", "Objects of ours (chains, IP sets) found changed by someone else and repaired";
        pub drift_check_seconds: Histogram = seconds()
            => "drift_check_seconds", "Time of one fast drift check, repairs included";
        /// Per federated cluster (label `cluster`): 1 while its etcd answers.
        pub remote_connected: Family<RemoteLabels, Gauge> = Family::default()
            => "remote_cluster_connected", "Federated cluster's etcd answers (1) or not (0)";
        /// Per federated cluster: its keys (endpoints, profiles, network sets) in the agent's view.
        pub remote_keys: Family<RemoteLabels, Gauge> = Family::default()
            => "remote_cluster_keys", "Federated cluster's endpoints, profiles and network sets held";
        /// Per-policy kernel counters, as last read by the counter thread (a collector).
        pub policy_counters: Arc<PolicyCounters> = Arc::default();
        /// The DNS learner's (`felixrs_dns_*`, FQDN policy).
        pub dns: DnsMetrics = DnsMetrics::default();
        /// The flow-log collector's (`felixrs_flow_logs_*`; none while flow logs are off).
        pub flow_logs: super::flow_logs::FlowLogMetrics = Default::default();
        /// Felix's names (`felix_*`, `process_*`), encoded after the registry's.
        pub felix: Arc<felix::FelixMetrics> = Arc::default();
    }
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
        let m = Self::unregistered();
        m.register_fields(&mut registry);
        registry.register_collector(Box::new(m.policy_counters.clone()));
        registry.register_collector(Box::new(m.flow_logs.clone()));
        // The DNS learner's, `felixrs_dns_*`.
        m.dns.register_fields(&mut registry);
        Self { registry, ..m }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode_registry(&mut out, &self.registry).expect("writing to a String cannot fail");
        self.felix.encode(&self.felix_aliases(), &mut out);
        encode_eof(&mut out).expect("writing to a String cannot fail");
        out
    }

    /// The metrics Felix's names read at scrape time.
    fn felix_aliases(&self) -> felix::Aliases {
        felix::Aliases {
            local_endpoints: self.local_endpoints.clone(),
            local_host_endpoints: self.local_host_endpoints.clone(),
            active_policies: self.active_policies.clone(),
            ip_sets: self.ip_sets.clone(),
            apply_errors: self.apply_errors.clone(),
            resyncs: self.resyncs.clone(),
        }
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

    /// A copy of the last tallies (the web view's per-policy hits).
    pub fn tallies(&self) -> Vec<(IpVersion, Tally)> {
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
