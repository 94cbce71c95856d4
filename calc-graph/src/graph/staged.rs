//! Staged policies (Calico's pending policies): `StagedNetworkPolicy`,
//! `StagedGlobalNetworkPolicy` and `StagedKubernetesNetworkPolicy`.
//!
//! A staged `Set` policy is a policy of its own staged kind ([`PolicyKind::is_staged`]): active
//! while its selector matches a local endpoint, its IP sets referenced, emitted as a
//! `PolicyUpdated` like any policy, and never in an endpoint's enforced `tiers`. A staged policy
//! (`Set` or `Delete`) *shadows* the enforced policy of the same name (StagedNetworkPolicy ns/foo
//! ↔ NetworkPolicy ns/foo, StagedGlobalNetworkPolicy foo ↔ GlobalNetworkPolicy foo,
//! StagedKubernetesNetworkPolicy ns/foo ↔ NetworkPolicy ns/knp.default.foo). An endpoint's staged
//! view ([`LocalEndpoint::staged_tiers`](crate::proto::LocalEndpoint::staged_tiers)) is its
//! policy list without the shadowed policies and with the staged `Set` policies that select it,
//! each in its tier and order: what the endpoint would have if every staged policy were
//! promoted. It is `None` when no staged policy selects the endpoint and none of its policies is
//! shadowed, so a cluster without staged policies computes nothing more.
//!
//! `StagedKubernetesNetworkPolicy` keeps a Kubernetes spec; the graph is pure and does not know
//! Kubernetes, so its `Set` form needs a [`StagedK8sConverter`] (the agent and the tools pass
//! `k8s-convert`'s); without one it is refused with an error (its `Delete` form needs none).

use crate::model::{PolicySpec, StagedAction, StagedKubernetesNetworkPolicy};
use crate::proto::PolicyKind;

use super::convert::build_policy_spec;
use super::*;

/// Converts a `StagedKubernetesNetworkPolicy`'s spec (as a Kubernetes NetworkPolicy of the key's
/// namespace) to the Calico policy spec it would be promoted to; `Err` names the field.
pub type StagedK8sConverter =
    fn(&StagedKubernetesNetworkPolicy) -> Result<PolicySpec, StagedK8sError>;

/// Why a `StagedKubernetesNetworkPolicy` `Set` has no Calico policy spec; each names the field.
/// The texts are those of the converter (`k8s-convert`), which knows Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StagedK8sError {
    /// The spec is not a Kubernetes NetworkPolicy spec (a wrong type, a missing field).
    #[error("spec: {0}")]
    Spec(String),
    /// A field or rule does not convert (a staged policy is all or nothing): the converter's
    /// report, which names the object and the field.
    #[error("{0}")]
    Unconvertible(String),
    /// The conversion gave something other than a NetworkPolicy.
    #[error("spec: does not convert to a NetworkPolicy")]
    NotANetworkPolicy,
    /// The graph has no converter ([`CalcGraph::set_staged_k8s_converter`]).
    #[error("no Kubernetes converter is set")]
    NoConverter,
}

/// The Calico name Kubernetes NetworkPolicy `name` is converted to (`k8s-convert`'s
/// `KNP_PREFIX`).
const KNP_PREFIX: &str = "knp.default.";

/// The enforced policy a staged policy's key shadows.
pub(crate) fn shadowed_key(key: &ResourceKey) -> Option<ResourceKey> {
    let ns = || key.namespace.clone().unwrap_or_default();
    Some(match key.kind {
        Kind::StagedNetworkPolicy => {
            ResourceKey::namespaced(Kind::NetworkPolicy, ns(), key.name.clone())
        }
        Kind::StagedGlobalNetworkPolicy => {
            ResourceKey::global(Kind::GlobalNetworkPolicy, key.name.clone())
        }
        Kind::StagedKubernetesNetworkPolicy => ResourceKey::namespaced(
            Kind::NetworkPolicy,
            ns(),
            format!("{KNP_PREFIX}{}", key.name),
        ),
        _ => return None,
    })
}

/// What a staged resource asks for: `None` for `Learn`/`Ignore` (nothing staged), else the
/// action and, for `Set`, the policy spec and kind.
type StagedIntent = Option<(StagedAction, Option<(PolicyKind, PolicySpec)>)>;

impl CalcGraph {
    /// Sets the converter for `StagedKubernetesNetworkPolicy` `Set` policies (see the module
    /// docs). Set it before feeding resources.
    pub fn set_staged_k8s_converter(&mut self, f: StagedK8sConverter) {
        self.staged_k8s = Some(f);
    }

    fn staged_intent(&mut self, key: &ResourceKey, value: Option<Resource>) -> StagedIntent {
        let (action, spec) = match value? {
            Resource::StagedNetworkPolicy(p) => (
                p.spec.staged_action,
                Some((PolicyKind::StagedNetworkPolicy, p.spec.policy)),
            ),
            Resource::StagedGlobalNetworkPolicy(p) => (
                p.spec.staged_action,
                Some((PolicyKind::StagedGlobalNetworkPolicy, p.spec.policy)),
            ),
            Resource::StagedKubernetesNetworkPolicy(p) => {
                let action = p.spec.staged_action;
                if matches!(action, Some(StagedAction::Delete)) {
                    (action, None)
                } else {
                    let converted = match self.staged_k8s {
                        Some(f) => f(&p),
                        None => Err(StagedK8sError::NoConverter),
                    };
                    match converted {
                        Ok(spec) => (
                            action,
                            Some((PolicyKind::StagedKubernetesNetworkPolicy, spec)),
                        ),
                        Err(e) => {
                            self.errors.push((key.clone(), GraphError::Staged(e)));
                            return None;
                        }
                    }
                }
            }
            other => {
                self.errors
                    .push((key.clone(), GraphError::NotAPolicy(other.kind())));
                return None;
            }
        };
        match action.unwrap_or(StagedAction::Set) {
            StagedAction::Set => Some((StagedAction::Set, spec)),
            StagedAction::Delete => Some((StagedAction::Delete, None)),
            StagedAction::Learn | StagedAction::Ignore => None,
        }
    }

    /// A staged policy was created, changed or deleted.
    pub(super) fn apply_staged(&mut self, key: &ResourceKey, value: Option<Resource>) {
        let Some(target) = shadowed_key(key) else {
            return;
        };
        let intent = self.staged_intent(key, value);
        let action = intent.as_ref().map(|(a, _)| *a);
        let mut draft = None;
        let mut failed_safe = Vec::new();
        if let Some((_, Some((kind, spec)))) = intent {
            match build_policy_spec(key, kind, spec) {
                Ok((d, f)) => {
                    draft = Some(d);
                    failed_safe = f;
                }
                Err(e) => self.errors.push((key.clone(), e)),
            }
        }
        let staged_now = match action {
            Some(StagedAction::Set) => draft.is_some(),
            Some(_) => true,
            None => false,
        };
        self.set_failed_safe(key, failed_safe);
        let was = self.staged.remove(key).is_some();
        if was {
            self.shadow(&target, false);
        }
        if staged_now {
            self.staged.insert(key.clone(), target.clone());
            self.shadow(&target, true);
        }
        self.apply_policy(key, draft);
    }

    /// Counts one more (or one less) staged policy shadowing `target`, and marks the endpoints
    /// it selects dirty (their staged view changes).
    fn shadow(&mut self, target: &ResourceKey, add: bool) {
        if add {
            *self.shadows.entry(target.clone()).or_insert(0) += 1;
        } else if let Some(n) = self.shadows.get_mut(target) {
            *n -= 1;
            if *n == 0 {
                self.shadows.remove(target);
            }
        }
        if let Some(p) = self.policies.get(target) {
            for item in self.local.matches(p.sel).iter() {
                if let Some(ep) = self.local_eps.get(item) {
                    self.seq.endpoint_dirty(&ep.id);
                }
            }
        }
    }

    /// Whether the enforced policy `id` is shadowed by a staged one.
    pub(super) fn is_shadowed(&self, id: &PolicyId) -> bool {
        !self.shadows.is_empty()
            && self
                .policy_keys
                .get(id)
                .is_some_and(|k| self.shadows.contains_key(k))
    }
}
