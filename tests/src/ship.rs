//! End-to-end pieces of shipping: upgrading the agent in place (rule counters prove adoption),
//! and hostile manifests (Kubernetes size limits, unicode, quotes, newlines, option-like and
//! selector-injecting strings) through controller → etcd → agent → kernel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use felixrs_test_support::netns::Netns;

use crate::cases::{Expect, Step, T80};

/// The agent binary `current` under a second path, as a new image's binary is, for upgrades (a
/// hard link: the debug binary is hundreds of MB; a copy where linking is not possible).
pub fn next_binary(work: &Path, current: &Path) -> Result<PathBuf> {
    let next = work.join("felixrs-next");
    let _ = std::fs::remove_file(&next);
    if std::fs::hard_link(current, &next).is_err() {
        std::fs::copy(current, &next).context("copying the agent binary")?;
    }
    Ok(next)
}

/// Packet counters of every rule of ours in the node's kernel (both backends, IPv4, every table),
/// by `table/chain/cali:hash`.
pub fn rule_counters(ns: &Netns) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for program in ["iptables-legacy-save", "iptables-nft-save"] {
        let o = ns.exec_unchecked(&[program, "-c"])?;
        let text = String::from_utf8_lossy(&o.stdout);
        let mut table = String::new();
        for line in text.lines() {
            if let Some(t) = line.strip_prefix('*') {
                table = t.to_string();
                continue;
            }
            // `[pkts:bytes] -A chain ... --comment "cali:hash" ...`
            let Some(rest) = line.strip_prefix('[') else {
                continue;
            };
            let Some((counters, rule)) = rest.split_once("] -A ") else {
                continue;
            };
            let Some(hash) = rule
                .split_once("--comment \"cali:")
                .and_then(|(_, h)| h.split('"').next())
            else {
                continue;
            };
            let chain = rule.split_whitespace().next().unwrap_or_default();
            let pkts: u64 = counters
                .split(':')
                .next()
                .and_then(|p| p.parse().ok())
                .with_context(|| format!("counters in {line}"))?;
            out.insert(format!("{program}/{table}/{chain}/cali:{hash}"), pkts);
        }
    }
    Ok(out)
}

/// What an upgrade that adopted the old agent's rules leaves: the same rules, none rewritten (a
/// rewritten rule's counter restarts from zero, so every counter must be at least what it was).
pub fn adopted(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> Vec<String> {
    let mut failures = Vec::new();
    if before.is_empty() {
        failures.push("no rule of ours in the kernel before the upgrade".to_string());
    }
    if before.keys().ne(after.keys()) {
        let gone: Vec<_> = before.keys().filter(|k| !after.contains_key(*k)).collect();
        let new: Vec<_> = after.keys().filter(|k| !before.contains_key(*k)).collect();
        failures.push(format!(
            "the upgrade changed the rules: gone {gone:?}, new {new:?}"
        ));
    }
    let counted = before.values().filter(|&&p| p > 0).count();
    if counted == 0 {
        failures.push("no rule of ours had counted a packet before the upgrade".to_string());
    }
    for (k, was) in before {
        if let Some(now) = after.get(k)
            && now < was
        {
            failures.push(format!(
                "{k} was rewritten by the upgrade (counter {was} -> {now})"
            ));
        }
    }
    failures
}

/// `len` characters of a DNS label (lowercase alphanumerics and `-`, alphanumeric at both ends).
fn label(seed: char, len: usize) -> String {
    let mut s: String = std::iter::repeat_n(seed, len).collect();
    if len > 2 {
        s.replace_range(len / 2..len / 2 + 1, "-");
    }
    s
}

/// A DNS subdomain of exactly `len` characters (labels of at most 63, joined by dots).
fn subdomain(seed: char, len: usize) -> String {
    let mut parts = Vec::new();
    let mut left = len;
    while left > 0 {
        let take = left.min(63);
        // Leave room for the dot before the next label, and never a 0-length last label.
        let take = if left > take && left - take == 1 {
            take - 1
        } else {
            take
        };
        parts.push(label(seed, take));
        // The label, then the dot before the next one.
        left = (left - take).saturating_sub(1);
    }
    parts.join(".")
}

/// The longest label key Kubernetes allows: a 253-character DNS-subdomain prefix, `/`, and a
/// 63-character name.
pub fn max_label_key(seed: char) -> String {
    format!("{}/{}", subdomain(seed, 253), label(seed, 63))
}

/// The longest label value (63 characters).
pub fn max_label_value(seed: char) -> String {
    label(seed, 63).to_uppercase()
}

/// The longest NetworkPolicy name (a 253-character DNS subdomain).
pub fn max_name() -> String {
    subdomain('p', 253)
}

/// Annotation values no payload may ever carry: unicode, both quotes, newlines, iptables-restore
/// and ipset syntax, option-like strings; and one large value so the object approaches the
/// API server's 256 KiB total annotation size.
pub fn hostile_annotations() -> Vec<(String, String)> {
    vec![
        ("example.com/unicode".into(), "政策 ✓ — Ünïcödé 🚫".into()),
        (
            "example.com/quotes".into(),
            "it's \"quoted\" `back` \\".into(),
        ),
        (
            "example.com/restore".into(),
            "x\nCOMMIT\n*filter\n-I INPUT 1 -j ACCEPT\nCOMMIT\n".into(),
        ),
        (
            "example.com/options".into(),
            "--jump ACCEPT -m comment --comment \"cali:AAAAAAAAAAAAAAAA\" ; flush -".into(),
        ),
        (
            "example.com/ipset".into(),
            "create x hash:ip\nflush\ndestroy".into(),
        ),
        ("example.com/large".into(), "A".repeat(250 * 1024)),
    ]
}

/// Strings that must never reach the kernel (checked against every save).
pub const NEVER_IN_KERNEL: &[&str] = &["政策", "Ünïcödé", "quoted", "--jump ACCEPT", "AAAAAAAAAA"];

fn yaml(v: &serde_json::Value) -> &'static str {
    serde_yaml::to_string(v).expect("yaml").leak()
}

/// The hostile step: the reliability scenarios' "x/b accepts only from x/c", written as a
/// NetworkPolicy at the Kubernetes size limits (longest name; selecting x/b by the longest label
/// key and value; x/c by a matchExpression; the hostile annotations) — it must be enforced
/// exactly — next to objects that must each be rejected or be harmless without disturbing it:
/// a selector value that would inject `|| all()` into a Calico selector, names with a newline,
/// unicode, an option-like string, one character over the limit, and a namespace with a newline.
/// Each of those would isolate its namespace (deny all ingress) if it were stored with the
/// meaning an injection gives it, which the probe matrix would see.
pub fn hostile_step() -> Step {
    let key_b = max_label_key('b');
    let val_b = max_label_value('b');
    let annotations: BTreeMap<String, String> = hostile_annotations().into_iter().collect();
    let mut labels = BTreeMap::new();
    labels.insert(max_label_key('l'), max_label_value('l'));
    labels.insert("app.kubernetes.io/name".to_string(), "hostile".to_string());
    let protect = serde_json::json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": max_name(), "namespace": "x",
                     "labels": labels, "annotations": annotations},
        "spec": {
            "podSelector": {"matchLabels": {key_b.clone(): val_b.clone()}},
            "ingress": [{"from": [{"podSelector": {"matchExpressions": [
                {"key": "example.com/role", "operator": "In",
                 "values": ["client", max_label_value('v')]}]}}]}]
        }
    });
    let deny_all = |ns: &str, name: &str, select: serde_json::Value| {
        yaml(&serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"podSelector": select, "policyTypes": ["Ingress"]}
        }))
    };
    let inject = serde_json::json!({"matchLabels": {"pod": "a' || all() || 'a"}});
    let inject_key = serde_json::json!({"matchExpressions": [
        {"key": "pod) || all() || has(x", "operator": "Exists"}]});
    // A rule whose peer values no label can have: the rule is dropped (reported), and the policy,
    // which selects no pod, changes nothing.
    let rule_values = serde_json::json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "hostile-rule-values", "namespace": "y"},
        "spec": {
            "podSelector": {"matchLabels": {"pod": "nobody"}},
            "ingress": [{"from": [{"podSelector": {"matchExpressions": [
                {"key": "example.com/role", "operator": "In",
                 "values": ["it's", "a\"b", "-j ACCEPT", "x\nCOMMIT"]}]}}]}]
        }
    });
    let mut policies = vec![
        yaml(&protect),
        yaml(&rule_values),
        deny_all("y", "inject-selector-value", inject),
        deny_all("y", "inject-selector-key", inject_key),
        deny_all("z", "bad\nname", serde_json::json!({})),
        deny_all("z", "politique-réseau", serde_json::json!({})),
        deny_all("z", "--jump=ACCEPT", serde_json::json!({})),
        deny_all(
            "z\n-A INPUT -j ACCEPT",
            "bad-namespace",
            serde_json::json!({}),
        ),
    ];
    let too_long = subdomain('q', 254);
    policies.push(deny_all("z", &too_long, serde_json::json!({})));
    Step {
        policies,
        // A namespace label at the limits too: it reaches the kns. profile and every pod in z.
        ns_labels: vec![("z", max_label_key('n').leak(), max_label_value('n').leak())],
        pod_labels: vec![
            ("x/b", key_b.leak(), Some(val_b.leak())),
            ("x/c", "example.com/role", Some("client")),
        ],
        pod_annotations: vec![("x/a", "example.com/restore", "x\nCOMMIT\n-j ACCEPT")],
        probes: vec![T80],
        expect: |e: &mut Expect| {
            e.deny("*/*", "x/b");
            e.allow("x/c", "x/b");
        },
    }
}

/// The objects of [`hostile_step`] the controller must report (refused, or a rule dropped), as
/// the `(namespace, name)` its skip report names.
pub fn hostile_rejects() -> Vec<(String, String)> {
    vec![
        ("y".into(), "hostile-rule-values".into()),
        ("y".into(), "inject-selector-value".into()),
        ("y".into(), "inject-selector-key".into()),
        ("z".into(), "bad\nname".into()),
        ("z".into(), "politique-réseau".into()),
        ("z".into(), "--jump=ACCEPT".into()),
        ("z\n-A INPUT -j ACCEPT".into(), "bad-namespace".into()),
        ("z".into(), subdomain('q', 254)),
    ]
}
