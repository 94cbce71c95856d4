//! The agent's flow logs (issue 27): the `--flow-logs-*` flags, the collector started in the
//! node's namespace when `--flow-logs` is on, the names it resolves with (refreshed from the
//! agent's own applied view, as `felixrs flows --state-dir` does), and its metrics. Off: nothing
//! here runs and no metric, route or rendered byte changes.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::collector::Collector as PromCollector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::cmd::shared::dataplane_args::DataplaneArgs;
use crate::cmd::shared::node_view::{SourceArgs, render_node, state_dir_changed};
use crate::flowlog::collector::{Collector, CollectorConfig, CollectorStats};
use crate::flowlog::hub::DEFAULT_RECENT;
use crate::flowlog::names::Names;
use crate::flowlog::{FlowHub, PendingPolicies};

/// The flow log flags (with `--flow-logs`, which is a dataplane flag: it changes the rules).
#[derive(Debug, Clone, clap::Args)]
pub struct FlowLogArgs {
    /// The flow log file (JSON lines, one record per 5-tuple and interval); default
    /// `<state-dir>/flows.jsonl`.
    #[arg(long, env = "FELIXRS_FLOW_LOGS_FILE")]
    pub flow_logs_file: Option<PathBuf>,
    /// Size in MiB at which the flow log file is rotated.
    #[arg(
        long,
        env = "FELIXRS_FLOW_LOGS_FILE_MAX_SIZE_MB",
        default_value_t = 100
    )]
    pub flow_logs_file_max_size_mb: u64,
    /// Flow log files kept, the current one included (`flows.jsonl`, `flows.jsonl.1`, …).
    #[arg(long, env = "FELIXRS_FLOW_LOGS_FILE_KEEP", default_value_t = 5)]
    pub flow_logs_file_keep: usize,
    /// Seconds per aggregation interval (Felix's `FlowLogsFlushInterval`).
    #[arg(long, env = "FELIXRS_FLOW_LOGS_INTERVAL", default_value = "15", value_parser = super::parse_secs)]
    pub flow_logs_interval: Duration,
    /// The most 5-tuples held at once; new ones beyond are dropped and counted
    /// (`felixrs_flow_logs_dropped_total`).
    #[arg(long, env = "FELIXRS_FLOW_LOGS_MAX_ENTRIES", default_value_t = 100_000)]
    pub flow_logs_max_entries: usize,
}

impl Default for FlowLogArgs {
    fn default() -> Self {
        FlowLogArgs {
            flow_logs_file: None,
            flow_logs_file_max_size_mb: 100,
            flow_logs_file_keep: 5,
            flow_logs_interval: Duration::from_secs(15),
            flow_logs_max_entries: 100_000,
        }
    }
}

/// The running flow logs: the hub (`/flows`), the collector and the names refresher.
pub struct FlowLogs {
    pub hub: Arc<FlowHub>,
    /// What the collector names flows with: endpoints refreshed here, policies set by the
    /// dataplane.
    pub names: Arc<RwLock<Names>>,
    collector: Collector,
    stop: Arc<AtomicBool>,
    refresher: Option<std::thread::JoinHandle<()>>,
}

/// How often the endpoint names are checked against the agent's applied view (an unchanged view
/// costs one `agent.sock` round trip). Policy names need no polling: the dataplane sets them
/// before the kernel has the rules that log them.
const NAMES_REFRESH: Duration = Duration::from_millis(100);

impl FlowLogs {
    /// Starts the collector and its names refresher (the caller's network namespace).
    pub fn start(
        args: &FlowLogArgs,
        node: &str,
        state_dir: &std::path::Path,
        dataplane: &DataplaneArgs,
        stats_sink: &FlowLogMetrics,
        pending: Arc<dyn PendingPolicies>,
    ) -> anyhow::Result<FlowLogs> {
        let hub = FlowHub::new(DEFAULT_RECENT);
        let names = Arc::new(RwLock::new(Names::default()));
        let cfg = CollectorConfig {
            host: node.to_string(),
            file: Some(
                args.flow_logs_file
                    .clone()
                    .unwrap_or_else(|| state_dir.join("flows.jsonl")),
            ),
            file_max_bytes: args.flow_logs_file_max_size_mb.saturating_mul(1 << 20),
            file_keep: args.flow_logs_file_keep,
            interval: args.flow_logs_interval,
            max_entries: args.flow_logs_max_entries,
        };
        let collector = Collector::start(cfg, hub.clone(), names.clone(), pending)?;
        let names_out = names.clone();
        stats_sink.attach(collector.stats.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let (s, dir, node, dp) = (
            stop.clone(),
            state_dir.to_path_buf(),
            node.to_string(),
            dataplane.clone(),
        );
        let refresher = std::thread::Builder::new()
            .name("flow-log-names".into())
            .spawn(move || {
                let source = SourceArgs {
                    manifests: Vec::new(),
                    state_dir: Some(dir.clone()),
                };
                let mut stamp = None;
                while !s.load(Ordering::Relaxed) {
                    let changed = stamp.as_ref().is_none_or(|st| state_dir_changed(&dir, st));
                    if changed {
                        match render_node(&source, &node, &dp) {
                            Ok(view) => {
                                // Endpoints only: the policy names come from the dataplane,
                                // ahead of the kernel (`KernelDataplane::with_flow_names`).
                                names
                                    .write()
                                    .expect("flow names lock")
                                    .set_endpoints(&view.resources);
                                stamp = view.stamp;
                            }
                            Err(e) => tracing::debug!("flow logs: names not refreshed: {e:#}"),
                        }
                    }
                    std::thread::sleep(NAMES_REFRESH);
                }
            })?;
        Ok(FlowLogs {
            hub,
            names: names_out,
            collector,
            stop,
            refresher: Some(refresher),
        })
    }

    /// Stops the collector (after a last flush) and the refresher.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.collector.stop();
        if let Some(t) = self.refresher.take() {
            let _ = t.join();
        }
    }
}

/// The collector's metrics: `felixrs_flow_logs_*`, and Felix's `felix_nflog_logs_received`-style
/// meaning under our prefix; nothing while flow logs are off.
#[derive(Debug, Default, Clone)]
pub struct FlowLogMetrics {
    stats: Arc<std::sync::OnceLock<Arc<CollectorStats>>>,
}

impl FlowLogMetrics {
    pub fn attach(&self, stats: Arc<CollectorStats>) {
        let _ = self.stats.set(stats);
    }

    /// The staged counts; `None` while no collector runs (flow logs off).
    pub fn staged_rows(&self) -> Option<Vec<crate::flowlog::collector::StagedRow>> {
        self.stats.get().map(|s| s.staged_rows())
    }
}

impl PromCollector for FlowLogMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = self.stats.get() else {
            return Ok(());
        };
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        for (name, help, v) in [
            (
                "flow_logs_records",
                "Flow records published (hub and file)",
                get(&s.records),
            ),
            (
                "flow_logs_connections",
                "New connections (5-tuple and reporter) seen",
                get(&s.connections),
            ),
            (
                "flow_logs_dropped",
                "New 5-tuples dropped at --flow-logs-max-entries",
                get(&s.dropped),
            ),
            (
                "flow_logs_nflog_packets",
                "NFLOG packets received (Felix felix_nflog_logs_received)",
                get(&s.nflog_packets),
            ),
            (
                "flow_logs_conntrack_ended",
                "Conntrack end events received",
                get(&s.conntrack_ended),
            ),
            (
                "flow_logs_receive_errors",
                "Netlink receive errors (buffer overruns: messages lost)",
                get(&s.receive_errors),
            ),
            (
                "flow_logs_nflog_socket_drops",
                "NFLOG messages the kernel dropped at the collector's full socket buffer",
                get(&s.nflog_socket_drops),
            ),
            (
                "flow_logs_conntrack_socket_drops",
                "Conntrack events the kernel dropped at the collector's full socket buffer",
                get(&s.conntrack_socket_drops),
            ),
        ] {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let g = ConstGauge::new(get(&s.live_entries) as i64);
        g.encode(encoder.encode_descriptor(
            "flow_logs_live_entries",
            "5-tuples held by the collector",
            None,
            g.metric_type(),
        )?)?;
        let staged = s
            .staged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if !staged.is_empty() {
            let mut family = encoder.encode_descriptor(
                "staged_policy_connections",
                "Connections each staged policy decided in the staged view, by its action",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (k, v) in staged {
                let action = match k.action {
                    crate::flowlog::FlowAction::Allow => "allow",
                    crate::flowlog::FlowAction::Deny => "deny",
                    crate::flowlog::FlowAction::Pass => "pass",
                };
                let labels = [
                    ("kind", k.kind.as_str()),
                    ("namespace", k.namespace.as_str()),
                    ("name", k.name.as_str()),
                    ("tier", k.tier.as_str()),
                    ("action", action),
                ];
                ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
