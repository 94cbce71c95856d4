//! `felixrs agent`: keeps this node's kernel equal to what the datastore says for it.
//!
//! # Layout
//! * [`datastore`]: the `Datastore` seam and its etcd implementation.
//! * [`syncer`]: list + watch + reconnect/resync, emitting [`syncer::SyncEvent`]s.
//! * [`watch_liveness`]: when a watch's connection is dead (two unanswered checks, not counting
//!   time the process was not running), and request timeouts that forgive a starved process.
//! * [`state`]: the raw key -> value view fed into the calculation graph (`Pipeline` seam).
//! * [`apply_loop`]: the thread that owns the dataplane and coalesces applies.
//! * [`liveness`]: the apply thread's heartbeat, behind `/liveness` and watched by the runtime.
//! * [`counters`]: the counter thread and the per-policy counters of `/metrics`.
//! * [`felix_config`]: the settings from FelixConfiguration, with Felix's precedence; live
//!   changes applied, restart-needing ones re-exec the agent.
//! * [`snapshot`]: the persisted, checksummed snapshot of the last in-sync datastore view.
//! * [`status`], [`metrics`]: HTTP status/health and Prometheus metrics.
//! * [`view`]: the applied view, served to the operator tools on the node (`agent.sock`).
//! * [`runtime`]: wires the tasks together.

pub mod apply_loop;
pub mod counters;
pub mod datastore;
#[cfg(debug_assertions)]
pub mod fault;
pub mod federation;
pub mod felix_config;
pub mod flow_logs;
pub mod host_ifaces;
pub mod kernel;
pub mod liveness;
pub mod metrics;
pub mod pipeline;
pub mod runtime;
pub mod snapshot;
pub mod stale_flows;
pub mod state;
pub mod status;
pub mod syncer;
pub mod view;
pub mod watch_liveness;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use calc_graph::model::EtcdPrefix;
use iptables::apply::{Backend, ExecRunner};
use tokio_util::sync::CancellationToken;

use crate::cmd::shared::dataplane_args::DataplaneArgs;
use datastore::{Datastore, EtcdDatastore, EtcdTls};
use metrics::Metrics;
use runtime::RuntimeConfig;
use status::StatusHub;

/// Which iptables binaries to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IptablesBackend {
    /// Detect from the rules already in the kernel (as Felix does).
    Auto,
    Legacy,
    Nft,
}

impl From<IptablesBackend> for Backend {
    fn from(b: IptablesBackend) -> Self {
        match b {
            IptablesBackend::Auto => Backend::Auto,
            IptablesBackend::Legacy => Backend::Legacy,
            IptablesBackend::Nft => Backend::Nft,
        }
    }
}

/// A flag value of `felixrs agent` that does not parse (clap prints it after the flag's name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    #[error("invalid number of seconds {text:?}: {error}")]
    Seconds {
        text: String,
        error: std::num::ParseFloatError,
    },
    #[error("seconds must be positive, got {0:?}")]
    NotPositive(String),
    #[error("--dns-max-learned must be at least 1")]
    MaxLearnedZero,
    #[error("invalid --dns-max-learned {text:?}: {error}")]
    MaxLearned {
        text: String,
        error: std::num::ParseIntError,
    },
}

fn parse_secs(s: &str) -> Result<Duration, ArgError> {
    let v: f64 = s.parse().map_err(|error| ArgError::Seconds {
        text: s.to_string(),
        error,
    })?;
    if !(v.is_finite() && v > 0.0) {
        return Err(ArgError::NotPositive(s.to_string()));
    }
    Ok(Duration::from_secs_f64(v))
}

fn parse_secs_or_zero(s: &str) -> Result<Duration, ArgError> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_secs(s)
}

fn parse_max_learned(s: &str) -> Result<usize, ArgError> {
    match s.parse::<usize>() {
        Ok(0) => Err(ArgError::MaxLearnedZero),
        Ok(n) => Ok(n),
        Err(error) => Err(ArgError::MaxLearned {
            text: s.to_string(),
            error,
        }),
    }
}

/// `felixrs agent`: the node agent.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// etcd client URLs, comma separated.
    #[arg(
        long,
        env = "FELIXRS_ETCD_ENDPOINTS",
        value_delimiter = ',',
        required = true
    )]
    pub etcd_endpoints: Vec<String>,
    /// Where this cluster's Calico data lives in etcd (`<prefix>/resources/v3/projectcalico.org/`):
    /// clusters sharing one etcd each take their own.
    #[arg(long, env = "FELIXRS_ETCD_PREFIX", default_value = "/calico")]
    pub etcd_prefix: EtcdPrefix,
    /// This node's name (as in WorkloadEndpoint `spec.node`).
    #[arg(long, env = "FELIXRS_NODE_NAME")]
    pub node_name: String,
    /// Directory for the persisted datastore snapshot.
    #[arg(long, env = "FELIXRS_STATE_DIR", default_value = "/var/lib/felixrs")]
    pub state_dir: PathBuf,
    /// Address of the status/health/metrics HTTP server.
    #[arg(long, env = "FELIXRS_HEALTH_LISTEN", default_value = "127.0.0.1:9099")]
    pub health_listen: SocketAddr,
    #[arg(
        long,
        env = "FELIXRS_IPTABLES_BACKEND",
        value_enum,
        default_value = "auto"
    )]
    pub iptables_backend: IptablesBackend,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
    #[command(flatten)]
    pub flow_logs: Box<flow_logs::FlowLogArgs>,
    /// Seconds between full re-reads of the kernel (drift repair).
    #[arg(long, env = "FELIXRS_REFRESH_INTERVAL", default_value = "90", value_parser = parse_secs)]
    pub refresh_interval: Duration,
    /// Seconds between fast drift checks (the kernel asked whether anything changed; if so,
    /// every chain and IP set of ours compared and what drifted repaired); 0 turns them off (the
    /// full refresh still repairs).
    #[arg(long, env = "FELIXRS_DRIFT_INTERVAL", default_value = "2", value_parser = parse_secs_or_zero)]
    pub drift_interval: Duration,
    /// Seconds between reads of the kernel's rule counters for the per-policy counters of
    /// `/metrics` (a scrape never reads the kernel).
    #[arg(long, env = "FELIXRS_COUNTERS_INTERVAL", default_value = "10", value_parser = parse_secs)]
    pub counters_interval: Duration,
    /// Seconds to wait for etcd at start before programming from the snapshot.
    #[arg(long, env = "FELIXRS_ETCD_TIMEOUT", default_value = "2", value_parser = parse_secs)]
    pub etcd_timeout: Duration,
    /// CA bundle (PEM) for etcd TLS.
    #[arg(long, env = "FELIXRS_ETCD_CA")]
    pub etcd_ca: Option<String>,
    /// Client certificate (PEM) for etcd TLS.
    #[arg(long, env = "FELIXRS_ETCD_CERT", requires = "etcd_key")]
    pub etcd_cert: Option<String>,
    /// Client key (PEM) for etcd TLS.
    #[arg(long, env = "FELIXRS_ETCD_KEY", requires = "etcd_cert")]
    pub etcd_key: Option<String>,
    /// The least seconds a learned DNS address stays allowed (Felix's `DNSMinTTL`); 0: the
    /// record's own TTL.
    #[arg(long, env = "FELIXRS_DNS_MIN_TTL", default_value_t = 0)]
    pub dns_min_ttl: u32,
    /// The most (name, address) pairs the DNS learner keeps; beyond it the least recently learned
    /// are forgotten (`felixrs_dns_learned_evictions_total`).
    #[arg(
        long,
        env = "FELIXRS_DNS_MAX_LEARNED",
        default_value_t = crate::dns::config::DEFAULT_MAX_LEARNED,
        value_parser = parse_max_learned
    )]
    pub dns_max_learned: usize,
    /// Serve the web view on the status port (`/ui/`: live flows, per-policy hits and staged
    /// differences, the policies of each pod; with `/flows`, `/api/pods`, `/api/policies`).
    #[arg(long, env = "FELIXRS_WEB_VIEW")]
    pub web_view: bool,
    /// tracing filter.
    #[arg(long, env = "FELIXRS_LOG", default_value = "info")]
    pub log: String,
}

/// The clap ids of the flags given on the command line or by their `FELIXRS_*` variables (not left
/// at their defaults): these override FelixConfiguration.
pub fn explicit_flags(m: &clap::ArgMatches) -> BTreeSet<String> {
    use clap::parser::ValueSource;
    m.ids()
        .filter(|id| {
            matches!(
                m.value_source(id.as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .map(|id| id.as_str().to_string())
        .collect()
}

impl Args {
    /// Runs the agent until SIGTERM/SIGINT. The kernel rules are left in place on exit.
    /// `explicit`: [`explicit_flags`] of the command line. A FelixConfiguration change that needs
    /// a restart ends the run with the agent re-exec'ing itself (same argv and environment).
    pub fn run(self, explicit: BTreeSet<String>) -> anyhow::Result<()> {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        let (filter, reload) = tracing_subscriber::reload::Layer::new(
            tracing_subscriber::EnvFilter::try_new(&self.log).context("--log")?,
        );
        tracing_subscriber::registry()
            .with(filter)
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .init();
        let started_at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        #[cfg(debug_assertions)]
        let stale_after = fault::stale_after_from_env().unwrap_or(liveness::STALE_AFTER);
        #[cfg(not(debug_assertions))]
        let stale_after = liveness::STALE_AFTER;
        let hub = StatusHub::with_liveness(Metrics::new(), liveness::Liveness::new(stale_after));
        hub.update(|s| s.started_at_unix_ms = started_at_unix_ms);
        // The settings, before anything is built from them: flags, Felix's variables, this node's
        // FelixConfiguration resources (from etcd, else the snapshot).
        let layers = felix_config::Layers::from_process(self.clone(), explicit);
        let mut watch = felix_config::ConfigWatch::new(
            layers,
            Box::new(move |filter: &str| {
                let f = tracing_subscriber::EnvFilter::try_new(filter)?;
                Ok(reload.reload(f)?)
            }),
        );
        let initial = self.initial_felix_configuration();
        let this = watch.start(|k| initial.get(k).cloned(), &hub);
        let watch = Arc::new(std::sync::Mutex::new(watch));
        // The DNS learner's NFQUEUE socket (the nfq crate opens it without close-on-exec) would
        // outlive an exec and keep the queue bound: with it, the restart is an exit instead.
        let dns_queue_open = !this.dataplane.dns_trusted_servers.is_empty();
        let result = this.run_with(hub, watch.clone());
        let restart = watch.lock().expect("felix config lock").restart.take();
        match (result, restart) {
            (Ok(()), Some(fields)) if dns_queue_open => Err(anyhow::anyhow!(
                "FelixConfiguration fields {} need a restart: exiting for the supervisor to \
                 restart the agent (the DNS queue cannot be handed over an exec)",
                fields.join(", ")
            )),
            (Ok(()), Some(fields)) => Err(reexec(&fields)),
            (result, _) => result,
        }
    }

    /// This node's FelixConfiguration values by canonical key: etcd's (within `--etcd-timeout`),
    /// else the snapshot's, else none.
    fn initial_felix_configuration(&self) -> BTreeMap<String, Vec<u8>> {
        let (global, node) = felix_config::keys(&self.node_name);
        let wanted = |k: &str| k == global || k == node;
        let read = async {
            let tls = EtcdTls {
                ca: self.etcd_ca.clone(),
                cert: self.etcd_cert.clone(),
                key: self.etcd_key.clone(),
            };
            let mut ds = EtcdDatastore::new(self.etcd_endpoints.clone(), tls, self.etcd_timeout);
            let prefix = format!(
                "{}{}/",
                self.etcd_prefix.resources(),
                calc_graph::model::FELIX_CONFIGURATION_PLURAL
            );
            tokio::time::timeout(self.etcd_timeout, ds.list(&prefix)).await
        };
        let listed = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(read)?.map_err(anyhow::Error::from));
        match listed {
            Ok(l) => l
                .kvs
                .into_iter()
                .filter_map(|(k, v)| Some((self.etcd_prefix.to_canonical(&k)?, v)))
                .filter(|(k, _)| wanted(k))
                .collect(),
            Err(error) => {
                let snap = snapshot::SnapshotStore::new(&self.state_dir).load();
                tracing::warn!(%error, from_snapshot = matches!(snap, Ok(Some(_))), "FelixConfiguration not read from etcd at start");
                match snap {
                    Ok(Some(s)) => s
                        .kvs
                        .into_iter()
                        .filter(|(k, _)| wanted(k))
                        .map(|(k, v)| (k.to_string(), v.to_vec()))
                        .collect(),
                    _ => BTreeMap::new(),
                }
            }
        }
    }

    /// Runs with these (resolved) settings.
    fn run_with(
        mut self,
        hub: Arc<StatusHub>,
        watch: Arc<std::sync::Mutex<felix_config::ConfigWatch>>,
    ) -> anyhow::Result<()> {
        // The web view shows live flows: one flag turns on the flow logs it reads.
        if self.web_view {
            self.dataplane.flow_logs = true;
        }
        let mut render = self.dataplane.render_config();
        // As Felix's feature detection: MASQUERADE --random-fully where iptables and the kernel
        // support it (`felixrs render` assumes they do).
        render.masquerade_random_fully =
            iptables::apply::detect_masquerade_fully_random(&ExecRunner::new());
        let counter_hub = counters::CounterHub::new();
        let refresh = apply_loop::RefreshPeriod::from(self.refresh_interval);
        watch
            .lock()
            .expect("felix config lock")
            .live_refresh(refresh.clone());
        // The dataplane's commands beat the apply thread's heartbeat (a long apply is not a stuck one).
        // Each iptables-restore/-save and ipset call is counted for Felix's names.
        let exec_counts = hub.metrics.felix.exec.clone();
        let runner = liveness::BeatingRunner::new(
            metrics::felix::CountingRunner::new(ExecRunner::new(), exec_counts.clone()),
            hub.liveness.clone(),
        );
        let mut dataplane =
            kernel::KernelDataplane::new(runner, self.iptables_backend.into(), render.clone())?
                .with_counters(counter_hub.clone())
                .with_conntrack_metrics(
                    hub.metrics.conntrack_flows_deleted.clone(),
                    hub.metrics.conntrack_errors.clone(),
                );
        let dns = crate::dns::agent::start(
            &self.dataplane,
            self.dns_min_ttl,
            self.dns_max_learned,
            &self.state_dir,
            hub.metrics.dns.clone(),
        );
        if let Some(d) = &dns {
            dataplane = dataplane.with_learner(d.learner.clone());
        }
        // The staged view (issue 27): with flow logs on, fed every batch the enforced renderer
        // gets and read by the collector as its pending policies.
        let staged = self
            .dataplane
            .flow_logs
            .then(|| crate::staged::StagedView::new(render.clone()))
            .and_then(|r| {
                r.inspect_err(|e| tracing::error!("staged view not built: {e}"))
                    .ok()
            })
            .map(|v| Arc::new(crate::staged::SharedStagedView::new(v)));
        let pending: Arc<dyn crate::flowlog::PendingPolicies> = match &staged {
            Some(s) => s.clone(),
            None => Arc::new(crate::flowlog::NoPending),
        };
        if let Some(s) = &staged {
            dataplane = dataplane.with_staged_view(s.clone());
        }
        // Flow logs: a failure to start them is logged, never a reason to stop enforcing.
        let flow_logs = self
            .dataplane
            .flow_logs
            .then(|| {
                flow_logs::FlowLogs::start(
                    &self.flow_logs,
                    &self.node_name,
                    &self.state_dir,
                    &self.dataplane,
                    &hub.metrics.flow_logs,
                    pending,
                )
            })
            .and_then(|r| {
                r.inspect_err(|e| tracing::error!("flow logs not started: {e:#}"))
                    .ok()
            });
        if let Some(f) = &flow_logs {
            dataplane = dataplane.with_flow_names(f.names.clone());
        }
        let pipeline = kernel::GraphPipeline::new(&self.node_name);
        let tls = EtcdTls {
            ca: self.etcd_ca,
            cert: self.etcd_cert,
            key: self.etcd_key,
        };
        let datastore = EtcdDatastore::new(self.etcd_endpoints, tls, self.etcd_timeout);
        // The agent's one flow hub (issue 27): the collector's, or (its start failed) an empty one
        // the web view can still serve.
        let flow_hub: Option<Arc<crate::flowlog::FlowHub>> = match &flow_logs {
            Some(f) => Some(f.hub.clone()),
            None => self
                .web_view
                .then(|| crate::flowlog::FlowHub::new(crate::flowlog::hub::DEFAULT_RECENT)),
        };
        let http_routes = http_routes(&hub, flow_hub.as_ref(), self.web_view, &self.node_name);
        let cfg = RuntimeConfig {
            prefix: self.etcd_prefix,
            state_dir: self.state_dir,
            health_listen: self.health_listen,
            etcd_timeout: self.etcd_timeout,
            refresh_interval: refresh.clone(),
            drift_interval: (!self.drift_interval.is_zero()).then_some(self.drift_interval),
            snapshot_interval: Duration::from_secs(1),
            felix_config: Some(watch),
            http_routes,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("tokio runtime")?;
        let counter_thread = counters::spawn(
            metrics::felix::CountingRunner::new(ExecRunner::new(), exec_counts),
            counter_hub,
            hub.clone(),
            self.counters_interval,
        );
        tracing::info!(node = %self.node_name, "felixrs agent starting");
        let result = rt.block_on(async move {
            let cancel = CancellationToken::new();
            tokio::spawn(shutdown_on_signal(cancel.clone()));
            #[cfg(debug_assertions)]
            if let Some(fault) = fault::from_env() {
                tracing::warn!(?fault, "test fault injected into the apply thread");
                let dataplane = fault::Faulty {
                    inner: dataplane,
                    fault,
                };
                return runtime::run(cfg, datastore, pipeline, dataplane, hub, cancel).await;
            }
            runtime::run(cfg, datastore, pipeline, dataplane, hub, cancel).await
        });
        counter_thread.stop();
        if let Some(d) = dns {
            d.stop();
        }
        if let Some(f) = flow_logs {
            f.stop();
        }
        result
    }
}

/// The routes the status port serves beside `/status` & co.: `/flows` when the agent has a flow
/// hub, and the web view's (`/ui/`, `/api/*`) with `--web-view`; none otherwise.
pub fn http_routes(
    hub: &Arc<StatusHub>,
    flow_hub: Option<&Arc<crate::flowlog::FlowHub>>,
    web_view: bool,
    node_name: &str,
) -> axum::Router {
    let mut routes = axum::Router::new();
    if let Some(flows) = flow_hub {
        routes = routes.merge(crate::flowlog::http::routes(flows.clone()));
        if web_view {
            let view = crate::web::WebView::new(hub.clone(), flows.clone(), node_name);
            routes = routes.merge(crate::web::routes(view));
        }
    }
    routes
}

/// Replaces this process with a fresh start of the same binary, argv and environment (Felix
/// restarts itself on such changes; a re-exec keeps the pid and the kernel untouched, and the new
/// process programs from etcd or the snapshot just written). Returns only if the exec failed.
fn reexec(fields: &[String]) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    tracing::warn!(fields = %fields.join(", "), "re-exec'ing for the new FelixConfiguration");
    let mut argv = std::env::args_os();
    let mut cmd = std::process::Command::new("/proc/self/exe");
    if let Some(arg0) = argv.next() {
        cmd.arg0(arg0);
    }
    let error = cmd.args(argv).exec();
    anyhow::anyhow!(
        "re-exec for FelixConfiguration fields {}: {error}",
        fields.join(", ")
    )
}

async fn shutdown_on_signal(cancel: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    cancel.cancel();
}
