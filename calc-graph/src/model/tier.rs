//! Tier: an ordered group of policies with a default action for traffic no policy decided.

use serde::{Deserialize, Serialize};

use super::metadata::{Metadata, order_as_go};
use super::primitives::Action;

/// The tier a policy without `tier` belongs to.
pub const DEFAULT_TIER: &str = "default";
/// Built-in tier evaluated before `default` (Kubernetes AdminNetworkPolicy), default action Pass.
pub const KUBE_ADMIN_TIER: &str = "kube-admin";
/// Built-in tier evaluated after `default` (Kubernetes BaselineAdminNetworkPolicy), default Pass.
pub const KUBE_BASELINE_TIER: &str = "kube-baseline";

/// `projectcalico.org/v3` Tier (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tier {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: TierSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TierSpec {
    /// Absent sorts after every present order.
    #[serde(
        serialize_with = "order_as_go",
        skip_serializing_if = "Option::is_none"
    )]
    pub order: Option<f64>,
    /// `Deny` or `Pass`; absent means `Deny`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_action: Option<Action>,
}

impl TierSpec {
    /// The default action, `Deny` when absent.
    pub fn default_action(&self) -> Action {
        self.default_action.unwrap_or(Action::Deny)
    }
}

impl Tier {
    /// The built-in tiers Calico creates, with their orders and default actions (felix-reference §8.4).
    pub fn builtin() -> Vec<Tier> {
        [
            (KUBE_ADMIN_TIER, 1_000.0, Action::Pass),
            (DEFAULT_TIER, 1_000_000.0, Action::Deny),
            (KUBE_BASELINE_TIER, 10_000_000.0, Action::Pass),
        ]
        .into_iter()
        .map(|(name, order, action)| Tier {
            metadata: Metadata::named(name),
            spec: TierSpec {
                order: Some(order),
                default_action: Some(action),
            },
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_tiers_and_defaults() {
        let tiers = Tier::builtin();
        assert_eq!(tiers[1].metadata.name, "default");
        assert_eq!(tiers[1].spec.default_action(), Action::Deny);
        assert_eq!(tiers[0].spec.default_action(), Action::Pass);
        assert_eq!(TierSpec::default().default_action(), Action::Deny);
        assert_eq!(
            serde_json::to_value(&tiers[0]).unwrap(),
            serde_json::json!({"metadata": {"name": "kube-admin"},
                               "spec": {"order": 1000, "defaultAction": "Pass"}})
        );
    }
}
