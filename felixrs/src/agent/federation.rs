//! Federation: one read-only syncer per RemoteClusterConfiguration in this cluster's store.
//!
//! * Each remote's keys live in the agent's view (and snapshot) as *remote keys*,
//!   `/felixrs/remote/<cluster>` + the canonical key, so the local view and every remote's are
//!   disjoint ranges of one sorted map: a full list of one never touches another's keys.
//! * Only the kinds federation uses are kept: workload endpoints, profiles, network sets and global
//!   network sets. The graph turns them into cluster-labelled, never-local IP set members
//!   (`calc_graph::graph::Update::Remote`).
//! * A remote that is down or slow never blocks local enforcement: its syncer runs in its own task
//!   and its last known members stay (persisted in the snapshot, and seeded from it at start
//!   whatever the local etcd does). Deleting the configuration stops the syncer and removes the
//!   remote's keys; changing it restarts the syncer, keeping the members until the new list.
//! * Events of a stopped syncer are told apart by a generation number and dropped.

use std::collections::BTreeMap;
use std::time::Duration;

use calc_graph::model::{CALICO_PREFIX, Kind, RemoteCluster, ResourceKey};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::datastore::{EtcdDatastore, EtcdTls};
use super::syncer::{self, SyncEvent, SyncerConfig};

/// How often a remote syncer asks its etcd for a progress notification.
const REMOTE_PROGRESS_INTERVAL: Duration = Duration::from_secs(10);

/// Where remote keys live in the agent's view.
pub const REMOTE_ROOT: &str = "/felixrs/remote/";

/// The remote key of `cluster`'s canonical key.
pub fn remote_key(cluster: &str, canonical: &str) -> String {
    format!("{}{cluster}{canonical}", REMOTE_ROOT)
}

/// The prefix of every remote key of `cluster`.
pub fn remote_scope(cluster: &str) -> String {
    format!("{REMOTE_ROOT}{cluster}/")
}

/// `(cluster, canonical key)` of a remote key.
pub fn split_remote_key(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix(REMOTE_ROOT)?;
    let slash = rest.find('/')?;
    Some((&rest[..slash], &rest[slash..]))
}

/// Whether a remote cluster's canonical key is of a kind federation keeps.
pub fn is_federated(canonical: &str) -> bool {
    let plural = canonical
        .strip_prefix(CALICO_PREFIX)
        .and_then(|r| r.split('/').next())
        .and_then(Kind::from_plural);
    matches!(
        plural,
        Some(Kind::WorkloadEndpoint | Kind::Profile | Kind::NetworkSet | Kind::GlobalNetworkSet)
    )
}

/// Why a key under [`REMOTE_ROOT`] is not a remote cluster's resource key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteKeyError {
    #[error("{key}: not a remote key")]
    NotRemote { key: String },
    #[error("remote cluster {cluster}: {source}")]
    Key {
        cluster: String,
        source: calc_graph::model::ModelError,
    },
}

/// Parses a remote key for the graph: cluster and resource key.
pub fn parse_remote_key(key: &str) -> Result<(&str, ResourceKey), RemoteKeyError> {
    let (cluster, canonical) = split_remote_key(key).ok_or_else(|| RemoteKeyError::NotRemote {
        key: key.to_string(),
    })?;
    let rk = ResourceKey::parse_etcd_key(canonical).map_err(|source| RemoteKeyError::Key {
        cluster: cluster.to_string(),
        source,
    })?;
    Ok((cluster, rk))
}

/// One remote syncer's event.
#[derive(Debug)]
pub struct RemoteEvent {
    pub cluster: String,
    pub generation: u64,
    pub event: SyncEvent,
}

struct Running {
    config: RemoteCluster,
    generation: u64,
    cancel: CancellationToken,
}

/// The remote syncers, kept in line with the configurations.
pub struct Remotes {
    running: BTreeMap<String, Running>,
    next_generation: u64,
    tx: mpsc::Sender<RemoteEvent>,
    timeout: Duration,
    cancel: CancellationToken,
}

impl Remotes {
    pub fn new(
        tx: mpsc::Sender<RemoteEvent>,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Self {
        Remotes {
            running: BTreeMap::new(),
            next_generation: 1,
            tx,
            timeout,
            cancel,
        }
    }

    /// Starts, restarts and stops syncers so that one runs per configuration in `desired`.
    /// Returns the clusters whose syncer was stopped for good (their keys must go).
    pub fn reconcile(&mut self, desired: &BTreeMap<String, RemoteCluster>) -> Vec<String> {
        let mut gone = Vec::new();
        self.running.retain(|c, r| {
            let keep = desired.contains_key(c);
            if !keep {
                tracing::info!(cluster = %c, "remote cluster configuration deleted; stopping its syncer");
                r.cancel.cancel();
                gone.push(c.clone());
            }
            keep
        });
        for (name, config) in desired {
            if self.running.get(name).is_some_and(|r| &r.config == config) {
                continue;
            }
            if let Some(old) = self.running.remove(name) {
                tracing::info!(cluster = %name, "remote cluster configuration changed; restarting its syncer");
                old.cancel.cancel();
            }
            let generation = self.next_generation;
            self.next_generation += 1;
            let cancel = self.cancel.child_token();
            self.spawn(config.clone(), generation, cancel.clone());
            self.running.insert(
                name.clone(),
                Running {
                    config: config.clone(),
                    generation,
                    cancel,
                },
            );
        }
        gone
    }

    /// The configuration `cluster`'s syncer runs with.
    pub fn config(&self, cluster: &str) -> Option<RemoteCluster> {
        self.running.get(cluster).map(|r| r.config.clone())
    }

    /// Whether `ev` comes from a syncer that is still wanted.
    pub fn is_current(&self, ev: &RemoteEvent) -> bool {
        self.running
            .get(&ev.cluster)
            .is_some_and(|r| r.generation == ev.generation)
    }

    fn spawn(&self, config: RemoteCluster, generation: u64, cancel: CancellationToken) {
        tracing::info!(
            cluster = %config.name,
            endpoints = %config.endpoints.join(","),
            prefix = %config.prefix,
            "starting remote cluster syncer"
        );
        let tls = EtcdTls {
            ca: config.ca_file.clone(),
            cert: config.cert_file.clone(),
            key: config.key_file.clone(),
        };
        let ds = EtcdDatastore::new(config.endpoints.clone(), tls, self.timeout);
        let (tx, mut rx) = mpsc::channel(256);
        let mut cfg = SyncerConfig::new(config.prefix.clone());
        // A remote's revision only feeds `/status`: every agent of this cluster watches the remote
        // etcd, so ask it for progress ten times less often than the local store.
        cfg.progress_interval = REMOTE_PROGRESS_INTERVAL;
        tokio::spawn(syncer::run(
            ds,
            cfg,
            tx,
            std::sync::Arc::new(tokio::sync::Notify::new()),
            cancel.clone(),
        ));
        let out = self.tx.clone();
        let cluster = config.name;
        tokio::spawn(async move {
            while let Some(event) = rx.recv().await {
                let ev = RemoteEvent {
                    cluster: cluster.clone(),
                    generation,
                    event,
                };
                if out.send(ev).await.is_err() {
                    return;
                }
            }
        });
    }
}

impl Drop for Remotes {
    fn drop(&mut self) {
        for r in self.running.values() {
            r.cancel.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_keys_round_trip_and_stay_out_of_the_local_range() {
        let canon = format!("{CALICO_PREFIX}workloadendpoints/ns/w");
        let k = remote_key("b", &canon);
        assert_eq!(split_remote_key(&k), Some(("b", canon.as_str())));
        assert!(k.starts_with(&remote_scope("b")));
        assert!(!k.starts_with(&remote_scope("b2")));
        assert!(!k.starts_with(CALICO_PREFIX));
        let (c, rk) = parse_remote_key(&k).unwrap();
        assert_eq!((c, rk.name.as_str()), ("b", "w"));
        assert!(parse_remote_key(&canon).is_err());
    }

    #[test]
    fn only_federated_kinds_are_kept() {
        let k = |p: &str| format!("{CALICO_PREFIX}{p}");
        assert!(is_federated(&k("workloadendpoints/a/b")));
        assert!(is_federated(&k("profiles/kns.a")));
        assert!(is_federated(&k("networksets/a/b")));
        assert!(is_federated(&k("globalnetworksets/b")));
        assert!(!is_federated(&k("networkpolicies/a/b")));
        assert!(!is_federated(&k("remoteclusterconfigurations/b")));
        assert!(!is_federated(&k("ippools/x")));
    }
}
