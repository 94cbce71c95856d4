//! Issue 18 on the kernel datapath: a typo'd Allow rule never opens a pod.
//!
//! A GlobalNetworkPolicy isolates x/b with one Allow rule whose `source.selector` is misspelt
//! `selectr`. Decoding used to drop the unknown field, leaving "allow from anywhere". Now the rule
//! fails safe: x/b stays isolated (probed through the kernel), and the agent on x/b's node reports
//! the rule and field in its log, `/status` (`failed_safe_rules`) and `/metrics`
//! (`felixrs_failed_safe_rules`). With the field spelt right, x/a (and only x/a) gets in and the
//! report goes away.

use serde_json::Value;

use crate::cases::{Step, T80};

const TYPO: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: strict-typo}
spec:
  selector: pod == 'b' && projectcalico.org/namespace == 'x'
  types: [Ingress]
  ingress:
  - action: Allow
    source: {selectr: "pod == 'a'"}
"#;

const FIXED: &str = r#"
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: strict-typo}
spec:
  selector: pod == 'b' && projectcalico.org/namespace == 'x'
  types: [Ingress]
  ingress:
  - action: Allow
    source: {selector: "pod == 'a' && projectcalico.org/namespace == 'x'"}
"#;

/// The typo'd policy: x/b accepts nothing.
pub fn typo_step() -> Step {
    Step::new(vec![TYPO], vec![T80], |e| e.deny("*/*", "x/b"))
}

/// The same policy spelt right: x/b accepts x/a only.
pub fn fixed_step() -> Step {
    Step::new(vec![FIXED], vec![T80], |e| {
        e.deny("*/*", "x/b");
        e.allow("x/a", "x/b");
    })
}

/// What is wrong with the agent's report of the typo (empty: it names policy, rule and field).
pub fn typo_reported(status: &Value, metrics: &str, log: &str) -> Vec<String> {
    let mut failures = Vec::new();
    let logged = log.lines().any(|l| {
        l.contains("rule fails safe")
            && l.contains("globalnetworkpolicies/strict-typo")
            && l.contains("spec.ingress[0].source.selectr")
    });
    if !logged {
        failures.push("the agent's log has no \"rule fails safe\" line naming strict-typo spec.ingress[0].source.selectr".to_string());
    }
    let rules = status["failed_safe_rules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let named = rules.iter().any(|r| {
        r["resource"] == "globalnetworkpolicies/strict-typo"
            && r["rule"] == "spec.ingress[0]"
            && r["action"] == "Allow"
            && r["rendered"] == false
            && r["unknown_fields"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f == "spec.ingress[0].source.selectr"))
    });
    if !named {
        failures.push(format!(
            "/status failed_safe_rules does not name strict-typo spec.ingress[0].source.selectr: {rules:?}"
        ));
    }
    if !metrics.lines().any(|l| l == "felixrs_failed_safe_rules 1") {
        failures.push("/metrics does not say felixrs_failed_safe_rules 1".to_string());
    }
    failures
}

/// What is wrong once the policy is fixed (empty: nothing is reported any more).
pub fn fixed_reported(status: &Value, metrics: &str, _log: &str) -> Vec<String> {
    let mut failures = Vec::new();
    if status["failed_safe_rules"]
        .as_array()
        .is_none_or(|r| !r.is_empty())
    {
        failures.push(format!(
            "/status still lists failed_safe_rules after the fix: {}",
            status["failed_safe_rules"]
        ));
    }
    if !metrics.lines().any(|l| l == "felixrs_failed_safe_rules 0") {
        failures.push("/metrics does not say felixrs_failed_safe_rules 0".to_string());
    }
    failures
}
