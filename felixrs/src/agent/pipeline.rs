//! The real part behind the agent's pipeline seam: the calculation graph fed with raw etcd keys
//! and values as the [`Pipeline`] (decoded, validated, kinds the graph does not consume skipped).

use calc_graph::graph::{CalcGraph, Update};
use calc_graph::model::{CALICO_PREFIX, Kind, ResourceKey, Validated};
use calc_graph::proto::Output;

use super::federation;
use super::state::{Pipeline, PipelineError};
use super::status::FailedSafeRuleStatus;

/// The calculation graph fed with raw etcd keys and values.
pub struct GraphPipeline {
    graph: CalcGraph,
}

impl GraphPipeline {
    pub fn new(node_name: &str) -> Self {
        let mut graph = CalcGraph::new(node_name);
        // StagedKubernetesNetworkPolicy: converted as its promotion would be.
        graph.set_staged_k8s_converter(k8s_convert::staged::staged_kubernetes_policy_spec);
        Self { graph }
    }

    /// A local resource validated upstream ([`Validated`]): given to the graph as it is.
    pub fn update_valid(&mut self, valid: Validated) -> Result<(), PipelineError> {
        let rk = valid.key().clone();
        self.graph.apply(Update::Valid(valid));
        self.warn_failed_safe(&rk);
        self.take_errors()
    }

    /// Logs each rule of `rk` that fails safe (its unenforceable fields named).
    fn warn_failed_safe(&self, rk: &ResourceKey) {
        for r in self.graph.failed_safe_rules_of(rk) {
            tracing::warn!(
                resource = %rk,
                rule = %r.rule,
                action = ?r.action,
                fields = %r.fields().collect::<Vec<_>>().join(", "),
                "rule fails safe: {r}"
            );
        }
    }

    /// A remote cluster's key (see [`federation`]): decoded and validated under its canonical
    /// key, then given to the graph as that cluster's.
    fn update_remote(&mut self, key: &str, value: Option<&[u8]>) -> Result<(), PipelineError> {
        let (cluster, rk) = federation::parse_remote_key(key)?;
        let cluster = cluster.to_string();
        match value {
            Some(v) => match Validated::from_etcd(&rk.etcd_key(), v) {
                Ok(value) => self.graph.apply(Update::RemoteValid { cluster, value }),
                Err(source) => return Err(PipelineError::Remote { cluster, source }),
            },
            None => self.graph.apply(Update::Remote {
                cluster,
                key: rk,
                value: None,
            }),
        }
        self.take_errors()
    }

    fn take_errors(&mut self) -> Result<(), PipelineError> {
        let errors = self.graph.take_errors();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(PipelineError::Graph(errors))
        }
    }
}

/// Keys under the Calico prefix whose kind the graph does not consume (nodes, ipamblocks,
/// felixconfigurations, ...): kept in the snapshot, never reported as malformed.
fn is_unconsumed_kind(key: &str) -> bool {
    key.strip_prefix(CALICO_PREFIX)
        .and_then(|rest| rest.split('/').next())
        .is_some_and(|plural| !plural.is_empty() && Kind::from_plural(plural).is_none())
}

impl Pipeline for GraphPipeline {
    fn update(&mut self, key: &str, value: Option<&[u8]>) -> Result<(), PipelineError> {
        if key.starts_with(federation::REMOTE_ROOT) {
            return self.update_remote(key, value);
        }
        if is_unconsumed_kind(key) {
            return Ok(());
        }
        // Validated here, once: the graph takes it as it is.
        match value {
            Some(v) => self.update_valid(Validated::from_etcd(key, v)?),
            None => {
                let key = ResourceKey::parse_etcd_key(key)?;
                self.graph.apply(Update::Resource { key, value: None });
                self.take_errors()
            }
        }
    }

    fn in_sync(&mut self) {
        self.graph.apply(Update::InSync);
    }

    fn flush(&mut self) -> Vec<Output> {
        self.graph.flush()
    }

    fn failed_safe_rules(&self) -> Vec<FailedSafeRuleStatus> {
        self.graph
            .failed_safe_rules()
            .map(|(key, r)| FailedSafeRuleStatus {
                resource: key.to_string(),
                rule: r.rule.clone(),
                action: format!("{:?}", r.action),
                unknown_fields: r
                    .unknown
                    .iter()
                    .map(|f| format!("{}.{f}", r.rule))
                    .collect(),
                unenforced_fields: r
                    .unenforced
                    .iter()
                    .map(|f| format!("{}.{f}", r.rule))
                    .collect(),
                rejected_fields: r
                    .rejected
                    .iter()
                    .map(|(f, reason)| format!("{}.{f}: {reason}", r.rule))
                    .collect(),
                rendered: r.rendered(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unconsumed_kinds_are_recognised() {
        assert!(is_unconsumed_kind(&format!("{CALICO_PREFIX}nodes/node-1")));
        assert!(!is_unconsumed_kind(&format!(
            "{CALICO_PREFIX}ippools/default-ipv4-ippool"
        )));
        assert!(!is_unconsumed_kind(&format!(
            "{CALICO_PREFIX}networkpolicies/a/b"
        )));
        assert!(!is_unconsumed_kind("/elsewhere/x"));
    }

    #[test]
    fn malformed_values_and_keys_are_errors_naming_the_key() {
        let mut p = GraphPipeline::new("node-1");
        let key = format!("{CALICO_PREFIX}globalnetworkpolicies/gnp1");
        let err = p.update(&key, Some(b"{not json")).unwrap_err().to_string();
        assert!(err.contains("gnp1"), "{err}");
        let err = p
            .update(
                &format!("{CALICO_PREFIX}networkpolicies/only-ns"),
                Some(b"{}"),
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("only-ns"), "{err}");
        // IP pools are consumed now: a malformed one is reported, naming the pool and the field.
        let err = p
            .update(
                &format!("{CALICO_PREFIX}ippools/p1"),
                Some(
                    br#"{"kind":"IPPool","metadata":{"name":"p1"},"spec":{"cidr":"10.0.0.1/16"}}"#,
                ),
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ippools/p1") && err.contains("spec.cidr"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod pipeline_tests {
    use super::*;
    use crate::agent::metrics::Metrics;
    use crate::agent::state::AgentState;
    use crate::agent::status::StatusHub;
    use crate::agent::syncer::SyncEvent;
    use calc_graph::proto::IpVersion;
    use iptables::render::{RenderConfig, Renderer};

    #[test]
    fn relist_without_a_policy_removes_it_from_the_rendered_state() {
        let k = |s: &str| format!("{CALICO_PREFIX}{s}");
        let prof = (k("profiles/kns.ns1"), br#"{"apiVersion":"projectcalico.org/v3","kind":"Profile","metadata":{"name":"kns.ns1"},"spec":{"ingress":[{"action":"Allow"}],"egress":[{"action":"Allow"}]}}"#.to_vec());
        let wep = (k("workloadendpoints/ns1/node--1-k8s-web-eth0"), br#"{"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint","metadata":{"name":"node--1-k8s-web-eth0","namespace":"ns1","labels":{"app":"web","projectcalico.org/namespace":"ns1","projectcalico.org/orchestrator":"k8s"}},"spec":{"orchestrator":"k8s","node":"node-1","pod":"web","endpoint":"eth0","interfaceName":"cali0000000001","ipNetworks":["10.70.0.1/32"],"profiles":["kns.ns1"]}}"#.to_vec());
        let np = |n: &str| {
            (k(&format!("networkpolicies/ns1/{n}")), format!(r#"{{"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy","metadata":{{"name":"{n}","namespace":"ns1"}},"spec":{{"tier":"default","order":1000,"selector":"app == 'web'","types":["Ingress"],"ingress":[{{"action":"Allow","protocol":"TCP","destination":{{"ports":[7001]}}}}]}}}}"#).into_bytes())
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let mut st = AgentState::new(
            GraphPipeline::new("node-1"),
            tx,
            StatusHub::new(Metrics::new()),
        );
        let tier = (k("tiers/default"), br#"{"apiVersion":"projectcalico.org/v3","kind":"Tier","metadata":{"name":"default"},"spec":{"order":1000000}}"#.to_vec());
        let mut l = vec![np("p1"), tier.clone(), prof.clone(), wep.clone()];
        l.sort();
        st.on_event(SyncEvent::Listed {
            revision: 5,
            kvs: l,
        });
        st.emit().unwrap();
        let mut r = Renderer::new(RenderConfig::default()).unwrap();
        let e = r.apply_all(rx.try_recv().unwrap().outputs);
        assert!(e.is_empty(), "{e:?}");
        assert!(r.flush().is_empty());
        for (i, (kk, v)) in [
            np("p2"),
            (k("networkpolicies/ns1/bad"), b"{not json".to_vec()),
            np("p3"),
        ]
        .into_iter()
        .enumerate()
        {
            st.on_event(SyncEvent::Changes {
                revision: 6 + i as i64,
                changes: vec![crate::agent::datastore::Change {
                    key: kk,
                    value: Some(v),
                    mod_revision: 6,
                }],
            });
            st.emit().unwrap();
            r.apply_all(rx.try_recv().unwrap().outputs);
            r.flush();
        }
        let mut l = vec![
            np("p2"),
            np("p3"),
            tier,
            prof,
            wep,
            (k("networkpolicies/ns1/bad"), b"{not json".to_vec()),
        ];
        l.sort();
        st.on_event(SyncEvent::Listed {
            revision: 9,
            kvs: l,
        });
        st.emit().unwrap();
        let out = rx.try_recv().unwrap().outputs;
        assert!(out.iter().any(|o| matches!(o, Output::PolicyRemoved(_))));
        let e = r.apply_all(out);
        assert!(e.is_empty(), "{e:?}");
        assert!(r.flush().is_empty());
        let d = r.desired(IpVersion::V4);
        let names: Vec<_> = d
            .tables
            .values()
            .flat_map(|t| t.chains.keys())
            .cloned()
            .collect();
        eprintln!("CHAINS {names:?}");
        assert!(!names.iter().any(|n| n.contains("p1")));
    }
}
