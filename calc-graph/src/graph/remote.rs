//! Federation: resources of remote clusters join this cluster's IP set membership.
//!
//! A remote cluster `c`'s workload endpoints, network sets and profiles are kept under internal
//! keys and names `c/<name>` (profiles `c/<profile>`): a `/` never occurs in a valid local name, so
//! two clusters' objects with the same namespace and name stay two items, and a remote endpoint
//! can only inherit labels from its own cluster's profiles (its namespace's `kns.` profile
//! included). Every remote item carries the label `projectcalico.org/cluster: c` (whatever label
//! of that name it had is replaced; local endpoints never carry it), so a selector restricts to a
//! cluster with `projectcalico.org/cluster == 'c'` and to the local one with
//! `!has(projectcalico.org/cluster)`. Selectors without it match endpoints of every cluster, as
//! Calico's federation does (a namespaced policy's selectors still add the namespace, so they
//! match same-named namespaces of remote clusters).
//!
//! Remote endpoints are never local: whatever their `spec.node`, they get no chains. Remote
//! policies, tiers, host endpoints and IP pools are ignored (a remote cluster's policy is its own agents'
//! business).

use std::collections::BTreeMap;

use crate::model::{Kind, Resource, ResourceKey, validate_name};

use super::CalcGraph;
use super::convert::{check, net_set_item, wep_item, wep_labels};
use super::error::GraphError;

/// The label every remote item carries: its cluster's name.
pub const LABEL_CLUSTER: &str = "projectcalico.org/cluster";

/// The internal name of a remote object.
fn remote_name(cluster: &str, name: &str) -> String {
    format!("{cluster}/{name}")
}

fn remote_key(cluster: &str, key: &ResourceKey) -> ResourceKey {
    ResourceKey {
        kind: key.kind,
        namespace: key.namespace.clone(),
        name: remote_name(cluster, &key.name),
    }
}

/// `labels` without any `projectcalico.org/cluster`, plus the cluster's.
fn with_cluster<'a>(labels: Vec<(&'a str, &'a str)>, cluster: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut out: Vec<(&str, &str)> = labels
        .into_iter()
        .filter(|(k, _)| *k != LABEL_CLUSTER)
        .collect();
    out.push((LABEL_CLUSTER, cluster));
    out
}

impl CalcGraph {
    pub(super) fn apply_remote(
        &mut self,
        cluster: &str,
        key: ResourceKey,
        value: Option<Resource>,
        validated: bool,
    ) {
        if let Err(e) = validate_name(cluster) {
            self.errors.push((
                key,
                GraphError::RemoteClusterName {
                    cluster: cluster.to_string(),
                    reason: e,
                },
            ));
            return;
        }
        let rkey = remote_key(cluster, &key);
        let value = value.and_then(|r| match if validated { Ok(()) } else { check(&key, &r) } {
            Ok(()) => Some(r),
            Err(error) => {
                self.errors.push((
                    rkey.clone(),
                    GraphError::Remote {
                        cluster: cluster.to_string(),
                        error: Box::new(error),
                    },
                ));
                None
            }
        });
        match key.kind {
            Kind::WorkloadEndpoint => match value {
                Some(Resource::WorkloadEndpoint(mut w)) if !w.spec.ip_networks.is_empty() => {
                    // The local-endpoint part is dropped: a remote endpoint is never local.
                    let (parents, data, _) = wep_item(&key, &mut w, &self.node);
                    let parents = parents.iter().map(|p| remote_name(cluster, p)).collect();
                    let labels = with_cluster(wep_labels(&key, &w), cluster);
                    self.upsert_item(&rkey, &labels, parents, data, None);
                }
                _ => self.remove_item(&rkey),
            },
            Kind::NetworkSet | Kind::GlobalNetworkSet => {
                match value.as_ref().and_then(|r| net_set_item(&key, r)) {
                    Some((labels, parents, data)) => {
                        let labels = with_cluster(labels, cluster);
                        let parents = parents.iter().map(|p| remote_name(cluster, p)).collect();
                        self.upsert_item(&rkey, &labels, parents, data, None);
                    }
                    None => self.remove_item(&rkey),
                }
            }
            Kind::Profile => {
                // Only the labels a remote profile applies matter: no local endpoint can name it.
                let labels = match value {
                    Some(Resource::Profile(p)) => p.spec.labels_to_apply,
                    _ => BTreeMap::new(),
                };
                self.set_profile_labels(&rkey.name, &labels);
            }
            Kind::NetworkPolicy
            | Kind::GlobalNetworkPolicy
            | Kind::Tier
            | Kind::HostEndpoint
            | Kind::IpPool
            | Kind::StagedNetworkPolicy
            | Kind::StagedGlobalNetworkPolicy
            | Kind::StagedKubernetesNetworkPolicy => {}
        }
    }
}
