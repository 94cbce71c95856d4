//! Planning: the change (compares, operations and what it does to the writer's index) that
//! takes one key from what is stored to what is desired, and the order the changes go out in.

use calc_graph::model::EtcdPrefix;
use etcd_client::{Compare, CompareOp, TxnOp};
use serde_json::Value;

use super::Desired;
use super::index::{Current, Have, value_hash};
use super::ownership::{marker_key, owned_by_label, owned_by_pattern};
use crate::convert::{CREATED_BY_LABEL, RESOURCE_PREFIX};

/// What a change does to the writer's index once its transaction succeeds.
pub(super) enum Effect {
    Put {
        key: String,
        hash: u64,
        label_owned: bool,
    },
    Delete(String),
    Marker(String),
    Unmarker(String),
}

/// One planned change: its compares and operations travel in the same transaction.
pub(super) struct Change {
    pub(super) compares: Vec<Compare>,
    pub(super) ops: Vec<TxnOp>,
    pub(super) kind: ChangeKind,
    /// Dependency rank of the key's resource type ([`rank`]).
    pub(super) rank: u8,
    pub(super) effects: Vec<Effect>,
    /// Roughly what the change adds to the request.
    pub(super) bytes: usize,
}

/// Dependency rank: tiers, then sets, then policies, then profiles, then endpoints. Creates and
/// updates go out in rising rank and deletes in falling rank, so even when a pass spans several
/// transactions a new endpoint never appears before the policies and profiles that apply to it, and
/// an endpoint is removed before its policies are. This is the order Felix's calc graph emits (felix-reference §8.5).
fn rank(key: &str) -> u8 {
    let plural = key
        .strip_prefix(RESOURCE_PREFIX)
        .and_then(|r| r.split('/').next())
        .unwrap_or("");
    match plural {
        "tiers" => 0,
        "globalnetworksets" | "networksets" => 1,
        "profiles" => 3,
        "workloadendpoints" | "hostendpoints" => 4,
        _ => 2,
    }
}

#[derive(Clone, Copy)]
pub(super) enum ChangeKind {
    Create,
    Update,
    /// Only an ownership marker is added to an existing, identical resource.
    Adopt,
    Delete,
    /// A marker whose resource is already gone is removed.
    Cleanup,
}

pub(super) fn json_equal(a: &[u8], b: &str) -> bool {
    match (
        serde_json::from_slice::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b.as_bytes(),
    }
}

/// The change (if any) that takes one key from what is stored (`have`, and its marker's mod
/// revision) to what is desired (`want`; `retained`: leave it even though nothing desires it).
pub(super) fn plan_key(
    key: &str,
    want: Option<&str>,
    retained: bool,
    have: Option<Have>,
    marker: Option<i64>,
    p: &EtcdPrefix,
) -> Option<Change> {
    // Keys are canonical until they reach etcd.
    let k = p.from_canonical(key);
    let m = marker_key(p, key);
    let has_marker = marker.is_some();
    let overhead = 16;
    match (want, have) {
        (Some(value), have) => {
            let auto_hep = owned_by_label(key, value.as_bytes());
            let needs_marker = !owned_by_pattern(key) && !auto_hep;
            if let Some(h) = &have
                && auto_hep
                && !has_marker
                && !h.label_owned
            {
                // Someone else's host endpoint with the automatic one's name: never taken over.
                tracing::warn!(%key, "not writing the automatic host endpoint: a host endpoint without the {CREATED_BY_LABEL} label has its name");
                return None;
            }
            let put = Effect::Put {
                key: key.to_string(),
                hash: value_hash(value.as_bytes()),
                label_owned: auto_hep,
            };
            let mut ops = Vec::new();
            let mut effects = Vec::new();
            let mut bytes = 2 * (k.len() + overhead);
            let same = have.as_ref().is_some_and(|h| h.same);
            if !same {
                ops.push(TxnOp::put(k.as_str(), value, None));
                effects.push(put);
                bytes += value.len();
            }
            if needs_marker && (have.is_none() || !has_marker) {
                ops.push(TxnOp::put(m.as_str(), "", None));
                effects.push(Effect::Marker(key.to_string()));
                bytes += m.len() + overhead;
            }
            if ops.is_empty() {
                return None;
            }
            let (compare, kind) = match &have {
                None => (
                    Compare::create_revision(k.as_str(), CompareOp::Equal, 0),
                    ChangeKind::Create,
                ),
                Some(h) => (
                    Compare::mod_revision(k.as_str(), CompareOp::Equal, h.rev),
                    if h.same {
                        ChangeKind::Adopt
                    } else {
                        ChangeKind::Update
                    },
                ),
            };
            Some(Change {
                compares: vec![compare],
                ops,
                kind,
                rank: rank(key),
                effects,
                bytes,
            })
        }
        (None, Some(h)) => {
            if retained || (!owned_by_pattern(key) && !has_marker && !h.label_owned) {
                return None;
            }
            let mut ops = vec![TxnOp::delete(k.as_str(), None)];
            let mut effects = vec![Effect::Delete(key.to_string())];
            let mut bytes = 2 * (k.len() + overhead);
            if has_marker {
                ops.push(TxnOp::delete(m.as_str(), None));
                effects.push(Effect::Unmarker(key.to_string()));
                bytes += m.len() + overhead;
            }
            Some(Change {
                compares: vec![Compare::mod_revision(k.as_str(), CompareOp::Equal, h.rev)],
                ops,
                kind: ChangeKind::Delete,
                rank: rank(key),
                effects,
                bytes,
            })
        }
        // A marker whose resource is gone (deleted by someone else) and not desired.
        (None, None) => {
            let mrev = marker?;
            Some(Change {
                compares: vec![Compare::mod_revision(m.as_str(), CompareOp::Equal, mrev)],
                ops: vec![TxnOp::delete(m.as_str(), None)],
                kind: ChangeKind::Cleanup,
                rank: 0,
                effects: vec![Effect::Unmarker(key.to_string())],
                bytes: 2 * (m.len() + overhead),
            })
        }
    }
}

/// Stable sort: upserts by rising rank, then deletes by falling rank, then marker cleanup.
pub(super) fn sort_changes(changes: &mut [Change]) {
    changes.sort_by_key(|c| match c.kind {
        ChangeKind::Create | ChangeKind::Update | ChangeKind::Adopt => (0, c.rank),
        ChangeKind::Delete => (1, u8::MAX - c.rank),
        ChangeKind::Cleanup => (2, 0),
    });
}

/// Works out the changes that take `current` to `desired`.
pub(super) fn plan(desired: &Desired, current: &Current, p: &EtcdPrefix) -> Vec<Change> {
    let have = |key: &str, want: Option<&str>| {
        current.values.get(key).map(|(old, rev)| Have {
            rev: *rev,
            same: want.is_some_and(|w| old.as_slice() == w.as_bytes() || json_equal(old, w)),
            label_owned: owned_by_label(key, old),
        })
    };
    let mut changes = Vec::new();
    for (key, value) in &desired.resources {
        let marker = current.markers.get(key).copied();
        changes.extend(plan_key(
            key,
            Some(value),
            false,
            have(key, Some(value)),
            marker,
            p,
        ));
    }
    for key in current.values.keys() {
        if desired.resources.contains_key(key) {
            continue;
        }
        let retained = desired.retain.contains(key);
        let marker = current.markers.get(key).copied();
        changes.extend(plan_key(key, None, retained, have(key, None), marker, p));
    }
    for (key, mrev) in &current.markers {
        if !current.values.contains_key(key) && !desired.resources.contains_key(key) {
            changes.extend(plan_key(key, None, false, None, Some(*mrev), p));
        }
    }
    sort_changes(&mut changes);
    changes
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn endpoints_are_written_after_and_deleted_before_policies() {
        let p = RESOURCE_PREFIX;
        let desired = Desired {
            resources: [
                (format!("{p}workloadendpoints/ns/w"), "{}".to_string()),
                (format!("{p}profiles/kns.ns"), "{}".to_string()),
                (format!("{p}tiers/t"), "{}".to_string()),
                (
                    format!("{p}networkpolicies/ns/knp.default.a"),
                    "{}".to_string(),
                ),
            ]
            .into(),
            ..Desired::default()
        };
        let current = Current {
            values: [
                (
                    format!("{p}networkpolicies/ns/knp.default.old"),
                    (b"{}".to_vec(), 3),
                ),
                (format!("{p}workloadendpoints/ns/old"), (b"{}".to_vec(), 4)),
            ]
            .into(),
            markers: BTreeMap::new(),
            revision: 4,
        };
        let order: Vec<(u8, bool)> = plan(&desired, &current, &EtcdPrefix::default())
            .iter()
            .map(|c| (c.rank, matches!(c.kind, ChangeKind::Delete)))
            .collect();
        assert_eq!(
            order,
            vec![
                (0, false),
                (2, false),
                (3, false),
                (4, false),
                (4, true),
                (2, true)
            ]
        );
    }

    #[test]
    fn automatic_host_endpoints_are_owned_by_their_label_only() {
        let p = RESOURCE_PREFIX;
        let auto = br#"{"metadata":{"name":"n1-auto-hep","labels":{"projectcalico.org/created-by":"calico-kube-controllers"}}}"#;
        let user = br#"{"metadata":{"name":"n2-auto-hep","labels":{"a":"b"}}}"#;
        let zoned = r#"{"metadata":{"name":"n1-auto-hep","labels":{"projectcalico.org/created-by":"calico-kube-controllers","zone":"a"}}}"#;
        assert!(owned_by_label(
            &format!("{p}hostendpoints/n1-auto-hep"),
            auto
        ));
        assert!(!owned_by_label(
            &format!("{p}hostendpoints/n2-auto-hep"),
            user
        ));
        assert!(!owned_by_label(&format!("{p}globalnetworksets/x"), auto));
        assert!(!owned_by_label(&format!("{p}hostendpoints/x"), b"not json"));
        let key = |n: &str| format!("{p}hostendpoints/{n}");
        // Desired: n1 (changed) and n2 (whose name a user's endpoint holds); stored: a stale
        // automatic one and a user's one, neither desired.
        let desired = Desired {
            resources: [
                (key("n1-auto-hep"), zoned.to_string()),
                (
                    key("n2-auto-hep"),
                    String::from_utf8(auto.to_vec()).unwrap(),
                ),
            ]
            .into(),
            ..Desired::default()
        };
        let current = Current {
            values: [
                (key("n1-auto-hep"), (auto.to_vec(), 2)),
                (key("n2-auto-hep"), (user.to_vec(), 3)),
                (key("gone-auto-hep"), (auto.to_vec(), 4)),
                (key("users-eth0"), (user.to_vec(), 5)),
            ]
            .into(),
            markers: BTreeMap::new(),
            revision: 5,
        };
        // One update (n1), one delete (the stale one); the user's two are left alone, and no
        // ownership marker is written (the label is the marker).
        let kinds: Vec<(&str, usize)> = plan(&desired, &current, &EtcdPrefix::default())
            .iter()
            .map(|c| match c.kind {
                ChangeKind::Update => ("update", c.ops.len()),
                ChangeKind::Delete => ("delete", c.ops.len()),
                _ => ("other", c.ops.len()),
            })
            .collect();
        assert_eq!(kinds, vec![("update", 1), ("delete", 1)]);
    }

    #[test]
    fn json_comparison_ignores_formatting() {
        assert!(json_equal(br#"{"b":1, "a":2}"#, r#"{"a":2,"b":1}"#));
        assert!(!json_equal(br#"{"a":1}"#, r#"{"a":2}"#));
    }
}
