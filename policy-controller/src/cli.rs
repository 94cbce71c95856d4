//! The `policy-controller` command line and the `sync` loop.
//!
//! `sync --once` converts everything once, reconciles etcd once, and prints one JSON line (the last
//! line of stdout) with the revision at which the writes are visible and the counts. Without `--once`
//! the sources keep watching and the elected replica reconciles: on election a full pass (one ranged
//! read of etcd, building the writer's index), after every change only the keys that changed
//! (against the writer's index, nothing read from etcd), and every `--resync-interval` (and after
//! someone else's write made a compare fail, at most once a second) a full pass again, which repairs
//! any divergence. Logs go to stderr.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use etcd_client::{Client, ConnectOptions};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::convert::ConvertOptions;
use crate::index::{Changed, Index};
use crate::metrics::Metrics;
use crate::writer::{SyncStats, Writer, WriterError};
use crate::{election, k8s_source, manifests};

/// Kubernetes objects and manifests → Calico v3 resources in etcd.
#[derive(Debug, Parser)]
#[command(name = "policy-controller", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Keep etcd in line with the Kubernetes API and/or manifest files.
    Sync(SyncArgs),
}

#[derive(Debug, Clone, Args)]
pub struct SyncArgs {
    /// etcd endpoints, comma separated.
    #[arg(
        long,
        env = "POLICY_CONTROLLER_ETCD_ENDPOINTS",
        value_delimiter = ',',
        required = true
    )]
    pub etcd_endpoints: Vec<String>,
    /// Where this cluster's Calico data lives in etcd (`<prefix>/resources/v3/projectcalico.org/`):
    /// clusters sharing one etcd each take their own. The controller's election and ownership
    /// markers move under it too (unless it is the default).
    #[arg(long, env = "POLICY_CONTROLLER_ETCD_PREFIX", default_value = "/calico")]
    pub etcd_prefix: calc_graph::model::EtcdPrefix,
    /// Manifest files or directories (repeatable).
    #[arg(
        long = "manifests",
        env = "POLICY_CONTROLLER_MANIFESTS",
        value_delimiter = ','
    )]
    pub manifests: Vec<PathBuf>,
    /// Kubeconfig file. Without it the in-cluster config is used when running in a pod, and otherwise
    /// only manifests are synced.
    #[arg(long, env = "POLICY_CONTROLLER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Reconcile once, print the result as JSON and exit.
    #[arg(long, env = "POLICY_CONTROLLER_ONCE")]
    pub once: bool,
    /// CA bundle for etcd TLS.
    #[arg(long, env = "POLICY_CONTROLLER_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd TLS.
    #[arg(long, env = "POLICY_CONTROLLER_ETCD_CERT", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// Client key for etcd TLS.
    #[arg(long, env = "POLICY_CONTROLLER_ETCD_KEY", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// Host-side interface prefix of workload endpoints.
    #[arg(
        long,
        env = "POLICY_CONTROLLER_INTERFACE_PREFIX",
        default_value = "cali"
    )]
    pub interface_prefix: String,
    /// Election lease TTL in seconds; a standby takes over within this time.
    #[arg(long, env = "POLICY_CONTROLLER_ELECTION_TTL", default_value_t = 15,
          value_parser = clap::value_parser!(i64).range(1..=3600))]
    pub election_ttl: i64,
    /// Full reconcile period in seconds while leading: every period the leader re-reads its etcd
    /// prefix (one ranged read) and repairs whatever differs from the desired state. Between them,
    /// changes are written against the writer's index of etcd without reading it.
    #[arg(long, env = "POLICY_CONTROLLER_RESYNC_INTERVAL", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub resync_interval: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, env = "POLICY_CONTROLLER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// This replica's name in the election (default: hostname-pid).
    #[arg(long, env = "POLICY_CONTROLLER_IDENTITY")]
    pub identity: Option<String>,
    /// Create the IPv4 IP pool `default-ipv4-ippool` with this CIDR (calico-node's
    /// `CALICO_IPV4POOL_CIDR`); a manifest IPPool of that name wins.
    #[arg(long, env = "CALICO_IPV4POOL_CIDR")]
    pub default_ipv4_pool_cidr: Option<String>,
    /// natOutgoing of `default-ipv4-ippool` (`CALICO_IPV4POOL_NAT_OUTGOING`).
    #[arg(long, env = "CALICO_IPV4POOL_NAT_OUTGOING", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub default_ipv4_pool_nat_outgoing: bool,
    /// Create the IPv6 IP pool `default-ipv6-ippool` with this CIDR (`CALICO_IPV6POOL_CIDR`).
    #[arg(long, env = "CALICO_IPV6POOL_CIDR")]
    pub default_ipv6_pool_cidr: Option<String>,
    /// natOutgoing of `default-ipv6-ippool` (`CALICO_IPV6POOL_NAT_OUTGOING`).
    #[arg(long, env = "CALICO_IPV6POOL_NAT_OUTGOING", default_value_t = false,
          action = clap::ArgAction::Set)]
    pub default_ipv6_pool_nat_outgoing: bool,
    /// Create Calico's automatic host endpoint `<node>-auto-hep` for every Node (kube-controllers'
    /// `AUTO_HOST_ENDPOINTS`). Given, it overrides the `default` KubeControllersConfiguration's
    /// `spec.controllers.node.hostEndpoint.autoCreate` in etcd; without either, off.
    #[arg(long, env = "AUTO_HOST_ENDPOINTS", value_enum, ignore_case = true)]
    pub auto_host_endpoints: Option<crate::auto_hep::Toggle>,
}

impl SyncArgs {
    /// The default pools the flags ask for.
    pub fn default_pools(&self) -> crate::default_pools::DefaultPools {
        crate::default_pools::DefaultPools {
            ipv4_cidr: self.default_ipv4_pool_cidr.clone(),
            ipv4_nat_outgoing: self.default_ipv4_pool_nat_outgoing,
            ipv6_cidr: self.default_ipv6_pool_cidr.clone(),
            ipv6_nat_outgoing: self.default_ipv6_pool_nat_outgoing,
        }
    }
}

/// The `--once` result line.
#[derive(Debug, serde::Serialize)]
pub struct OnceReport {
    pub revision: i64,
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
    pub skipped: usize,
    pub resources: usize,
    pub skips: Vec<crate::convert::SkipReport>,
}

/// Connects to etcd, with TLS when any TLS flag is given.
pub async fn connect_etcd(a: &SyncArgs) -> anyhow::Result<Client> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
    let cert_and_key = a.etcd_cert.as_deref().zip(a.etcd_key.as_deref());
    if let Some(tls) = etcd_tls::tls_options(a.etcd_ca.as_deref(), cert_and_key)? {
        opts = opts.with_tls(tls);
    }
    Client::connect(&a.etcd_endpoints, Some(opts))
        .await
        .with_context(|| format!("cannot connect to etcd at {}", a.etcd_endpoints.join(",")))
}

async fn kube_client(a: &SyncArgs) -> anyhow::Result<Option<kube::Client>> {
    let config = if let Some(path) = &a.kubeconfig {
        let kc = kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .with_context(|| format!("invalid kubeconfig {}", path.display()))?
    } else if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        kube::Config::incluster().context("cannot load in-cluster Kubernetes config")?
    } else {
        return Ok(None);
    };
    Ok(Some(
        kube::Client::try_from(config).context("cannot build Kubernetes client")?,
    ))
}

/// Runs `sync`.
pub async fn run_sync(a: SyncArgs) -> anyhow::Result<()> {
    let opts = ConvertOptions {
        interface_prefix: a.interface_prefix.clone(),
    };
    opts.validate()?;
    let default_pools = a.default_pools().resources()?;
    let mut set = manifests::load_manifests(&a.manifests, &opts)?;
    for (key, pool) in default_pools {
        set.resources.entry(key).or_insert(pool);
    }
    for s in &set.skipped {
        tracing::warn!("skipping manifest object: {s}");
    }
    let kube = kube_client(&a).await?;
    let etcd = connect_etcd(&a).await?;
    let waiting: &[&'static str] = if kube.is_some() {
        &k8s_source::KINDS
    } else {
        &[]
    };
    let index = Arc::new(Mutex::new(Index::new(opts, waiting, set)));
    let auto_hep = AutoHep {
        flag: a.auto_host_endpoints,
        prefix: a.etcd_prefix.clone(),
        etcd: etcd.clone(),
    };
    let metrics = Metrics::new();
    let mut writer = Writer::new(etcd.clone());
    writer.set_prefix(a.etcd_prefix.clone());
    writer.set_metrics(metrics.clone());

    if a.once {
        if let Some(k) = kube {
            k8s_source::list_once(k, &index)
                .await
                .context("cannot list Kubernetes objects")?;
        }
        auto_hep.refresh(&index).await;
        let state = index
            .lock()
            .expect("index lock poisoned")
            .desired()
            .context("index not ready")?;
        let stats = writer.sync(&state.desired).await?;
        let report = OnceReport {
            revision: stats.revision,
            created: stats.created,
            updated: stats.updated,
            deleted: stats.deleted,
            skipped: state.skips.len(),
            resources: state.desired.resources.len(),
            skips: state.skips,
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }

    let changed = Arc::new(Notify::new());
    let _watchers = kube.map(|k| k8s_source::spawn_all(k, index.clone(), changed.clone()));
    let _kcc_watch = a.auto_host_endpoints.is_none().then(|| {
        crate::auto_hep::spawn_watch(etcd.clone(), a.etcd_prefix.clone(), changed.clone())
    });
    if let Some(addr) = a.metrics_listen {
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = m.serve(addr).await {
                tracing::error!(%addr, "metrics endpoint failed: {e}");
            }
        });
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone()));
    let identity = a.identity.clone().unwrap_or_else(default_identity);
    let election_name = a.etcd_prefix.private_key(election::ELECTION_NAME);
    let resync = Duration::from_secs(a.resync_interval);
    loop {
        let leadership = tokio::select! {
            l = election::campaign_named(&etcd, &election_name, &identity, a.election_ttl) => l,
            _ = shutdown.cancelled() => return Ok(()),
        };
        let leadership = match leadership {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("election failed, retrying: {:#}", anyhow::Error::new(e));
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        tracing::info!(%identity, "elected leader");
        metrics.set_leader(true);
        writer.set_fence(Some(leadership.fence.clone()));
        let resign = lead(
            &index,
            &auto_hep,
            &mut writer,
            &metrics,
            &leadership,
            &changed,
            resync,
            &shutdown,
        )
        .await;
        metrics.set_leader(false);
        writer.set_fence(None);
        if resign {
            leadership.resign().await;
            return Ok(());
        }
        tracing::warn!("lost leadership, campaigning again");
    }
}

/// How soon a full pass is retried after one failed or someone else's write made a compare fail.
const RESYNC_RETRY: Duration = Duration::from_secs(1);
/// How long a burst of watch events may settle into one pass.
const SETTLE: Duration = Duration::from_millis(2);

/// What one pass of [`lead`] does.
enum Pass {
    /// Read etcd and reconcile everything (election, the periodic resync, after a failed compare).
    Full(crate::index::DesiredState),
    /// Reconcile against the writer's index, nothing read from etcd.
    Indexed(Changed),
}

/// Reconciles while leading. Returns true on shutdown, false when leadership was lost.
#[allow(clippy::too_many_arguments)]
async fn lead(
    index: &Arc<Mutex<Index>>,
    auto_hep: &AutoHep,
    writer: &mut Writer,
    metrics: &Metrics,
    leadership: &election::Leadership,
    changed: &Notify,
    resync: Duration,
    shutdown: &CancellationToken,
) -> bool {
    // When the last full pass succeeded; `None`: one is due.
    let mut last_full: Option<Instant> = None;
    // When the last full pass was tried (the retry of a failed one waits RESYNC_RETRY).
    let mut last_try: Option<Instant> = None;
    loop {
        auto_hep.refresh(index).await;
        let full_due = !writer.is_indexed() || last_full.is_none_or(|t| t.elapsed() >= resync);
        let may_resync = last_try.is_none_or(|t| t.elapsed() >= RESYNC_RETRY);
        let pass = {
            let mut idx = index.lock().expect("index lock poisoned");
            if full_due && may_resync {
                idx.take_desired().map(Pass::Full)
            } else if writer.is_indexed() {
                idx.take_changes().map(Pass::Indexed)
            } else {
                None
            }
        };
        let (desired_len, skips) = {
            let idx = index.lock().expect("index lock poisoned");
            (idx.desired_len(), idx.skips())
        };
        let result = match pass {
            None => None,
            Some(Pass::Full(state)) => {
                last_try = Some(Instant::now());
                let r = writer.sync(&state.desired).await.map(Some);
                if r.is_ok() {
                    last_full = last_try;
                }
                Some(r)
            }
            Some(Pass::Indexed(Changed::Everything(state))) => {
                Some(writer.sync_indexed(&state.desired).await)
            }
            Some(Pass::Indexed(Changed::Keys(changes))) if changes.resources.is_empty() => None,
            Some(Pass::Indexed(Changed::Keys(changes))) => {
                Some(writer.sync_changes(&changes).await)
            }
        };
        if result.is_some() {
            metrics.record_desired(desired_len, &skips);
        }
        match result {
            None | Some(Ok(None)) => {}
            Some(Ok(Some(s))) => log_stats(&s, skips.len()),
            Some(Err(WriterError::Fenced(k))) => {
                tracing::warn!(key = %k, "fenced out of the store");
                return false;
            }
            Some(Err(e)) => {
                tracing::warn!("reconcile failed, will retry: {:#}", anyhow::Error::new(e))
            }
        }
        // Changes taken for a pass that did not complete are repaired by the full pass that is
        // then due (the writer dropped its index, or the full pass never succeeded).
        let next_full = match (writer.is_indexed(), last_full) {
            (true, Some(t)) => resync.saturating_sub(t.elapsed()),
            _ => Duration::ZERO,
        };
        let wait = match last_try {
            _ if !next_full.is_zero() => next_full,
            Some(t) => RESYNC_RETRY
                .saturating_sub(t.elapsed())
                .max(Duration::from_millis(10)),
            // Never tried: the index is not ready yet, and its first complete listing wakes us.
            None => resync,
        };
        tokio::select! {
            _ = leadership.lost.cancelled() => return false,
            _ = shutdown.cancelled() => return true,
            _ = changed.notified() => {
                // Let a burst of watch events settle into one pass.
                tokio::time::sleep(SETTLE).await;
            }
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Where the automatic host endpoint setting comes from (see [`crate::auto_hep`]).
struct AutoHep {
    flag: Option<crate::auto_hep::Toggle>,
    prefix: calc_graph::model::EtcdPrefix,
    etcd: Client,
}

impl AutoHep {
    /// Resolves the setting and applies it to the index.
    async fn refresh(&self, index: &Mutex<Index>) {
        let last = index
            .lock()
            .expect("index lock poisoned")
            .auto_host_endpoints();
        let on =
            crate::auto_hep::resolve(self.flag, &mut self.etcd.clone(), &self.prefix, last).await;
        if index
            .lock()
            .expect("index lock poisoned")
            .set_auto_host_endpoints(on)
        {
            tracing::info!(enabled = on, "automatic host endpoints");
        }
    }
}

fn log_stats(s: &SyncStats, skipped: usize) {
    if s.created + s.updated + s.deleted > 0 {
        tracing::info!(
            created = s.created,
            updated = s.updated,
            deleted = s.deleted,
            skipped,
            revision = s.revision,
            "reconciled"
        );
    }
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{host}-{}", std::process::id())
}

async fn signal_shutdown(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down");
    token.cancel();
}
