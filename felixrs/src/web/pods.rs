//! `GET /api/pods`: the node's pods and, per direction and tier, the policies that apply to
//! each, computed from the agent's applied view (what the kernel holds) with the same graph the
//! agent programs from.
//!
//! The document (every field always present; lists in evaluation order):
//! ```json
//! {"node": "node-1", "revision": 42,
//!  "pods": [{"namespace": "prod", "pod": "web-0", "endpoint": "node--1-k8s-web--0-eth0",
//!            "interface": "cali1234", "addresses": ["10.65.0.3"], "labels": {"app": "web"},
//!            "ingress": [{"tier": "default", "default_action": "deny",
//!                         "policies": [{"kind": "NetworkPolicy", "namespace": "prod", "name": "allow-web"}]}],
//!            "egress": [],
//!            "profiles": ["kns.prod", "ksa.prod.default"]}]}
//! ```
//! `revision` is `null` (and `pods` empty) until the agent has applied something. `namespace`
//! of a policy is `null` for global ones. A tier is listed for a direction only when one of its
//! policies applies in that direction.

use std::collections::BTreeMap;

use calc_graph::model::{Action, Resource, Validated};
use calc_graph::proto::{LocalEndpoint, Output, PolicyId, TierInfo};
use serde::Serialize;

use crate::agent::kernel::GraphPipeline;
use crate::agent::state::Pipeline;
use crate::agent::view::AppliedView;

/// The `/api/pods` document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodsDoc {
    pub node: String,
    /// The applied view's datastore revision; `None` before the first apply.
    pub revision: Option<i64>,
    pub pods: Vec<PodDoc>,
}

/// One local workload endpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodDoc {
    pub namespace: String,
    /// The pod's name (the endpoint's `spec.pod`, else its name).
    pub pod: String,
    /// The WorkloadEndpoint's name.
    pub endpoint: String,
    pub interface: String,
    pub addresses: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub ingress: Vec<TierDoc>,
    pub egress: Vec<TierDoc>,
    pub profiles: Vec<String>,
}

/// One tier's policies for one direction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierDoc {
    pub tier: String,
    /// `deny` or `pass`: what happens when no policy of the tier decided.
    pub default_action: &'static str,
    pub policies: Vec<PolicyRef>,
}

/// A policy by identity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyRef {
    pub kind: &'static str,
    pub namespace: Option<String>,
    pub name: String,
}

fn action_name(a: Action) -> &'static str {
    match a {
        Action::Allow => "allow",
        Action::Deny => "deny",
        Action::Pass => "pass",
        Action::Log => "log",
    }
}

fn policy_ref(id: &PolicyId) -> PolicyRef {
    PolicyRef {
        kind: id.kind.as_str(),
        namespace: id.namespace.clone(),
        name: id.name.clone(),
    }
}

fn tiers(tiers: &[TierInfo], ingress: bool) -> Vec<TierDoc> {
    tiers
        .iter()
        .filter_map(|t| {
            let ids = if ingress {
                &t.ingress_policies
            } else {
                &t.egress_policies
            };
            (!ids.is_empty()).then(|| TierDoc {
                tier: t.name.clone(),
                default_action: action_name(t.default_action),
                policies: ids.iter().map(policy_ref).collect(),
            })
        })
        .collect()
}

/// The pods of `node` in `view`: the view run through the calculation graph as the agent runs
/// it (bad values are skipped, as the agent skips them).
pub fn pods_of(node: &str, view: Option<&AppliedView>) -> PodsDoc {
    let Some(view) = view else {
        return PodsDoc {
            node: node.to_string(),
            revision: None,
            pods: Vec::new(),
        };
    };
    let mut pipeline = GraphPipeline::new(node);
    // The endpoints' resources, by (namespace, name), for the pod name and labels.
    let mut weps = BTreeMap::new();
    for (key, value) in &view.kvs {
        // A remote cluster's key, a kind the graph does not consume or an invalid value: the
        // pipeline decides, as in the agent; its errors are the agent's to report.
        let _ = match Validated::from_etcd(key, value) {
            Ok(valid) => {
                if let Resource::WorkloadEndpoint(w) = valid.resource() {
                    let ns = w.metadata.namespace.clone().unwrap_or_default();
                    weps.insert((ns, w.metadata.name.clone()), w.clone());
                }
                pipeline.update_valid(valid)
            }
            Err(_) => pipeline.update(key, Some(value.as_ref())),
        };
    }
    pipeline.in_sync();
    let mut endpoints: BTreeMap<_, LocalEndpoint> = BTreeMap::new();
    for out in pipeline.flush() {
        match out {
            Output::EndpointUpdated(e) => {
                endpoints.insert(e.id.clone(), e);
            }
            Output::EndpointRemoved(id) => {
                endpoints.remove(&id);
            }
            _ => {}
        }
    }
    let pods = endpoints
        .into_values()
        .map(|e| {
            let wep = weps.get(&(e.id.namespace.clone(), e.id.name.clone()));
            PodDoc {
                pod: (wep.and_then(|w| w.spec.pod.clone())).unwrap_or_else(|| e.id.name.clone()),
                labels: wep.map(|w| w.metadata.labels.clone()).unwrap_or_default(),
                addresses: (e.ipv4_nets.iter().chain(&e.ipv6_nets))
                    .map(|n| n.addr().to_string())
                    .collect(),
                interface: e.interface_name.clone(),
                ingress: tiers(&e.tiers, true),
                egress: tiers(&e.tiers, false),
                profiles: e.profile_ids.clone(),
                namespace: e.id.namespace,
                endpoint: e.id.name,
            }
        })
        .collect();
    PodsDoc {
        node: node.to_string(),
        revision: Some(view.revision),
        pods,
    }
}
