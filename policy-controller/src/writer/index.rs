//! What etcd holds: a full pass's read ([`Current`]) and the writer's index of it ([`Known`]),
//! which the passes in between plan against (see the module docs of [`super`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

use super::owned_by_label;
use super::plan::Effect;

/// What is in etcd now, for the keys that matter.
pub(super) struct Current {
    /// Every key under the Calico prefix: value and mod revision.
    pub(super) values: BTreeMap<String, (Vec<u8>, i64)>,
    /// Keys that carry an ownership marker, with the marker's mod revision.
    pub(super) markers: BTreeMap<String, i64>,
    pub(super) revision: i64,
}

/// The writer's index of etcd: what [`Current`] holds, with each value reduced to a hash.
#[derive(Debug, Default)]
pub(super) struct Known {
    pub(super) values: HashMap<String, KnownValue>,
    pub(super) markers: HashMap<String, i64>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct KnownValue {
    pub(super) hash: u64,
    rev: i64,
    /// [`owned_by_label`] of the stored value.
    label_owned: bool,
}

pub(super) fn value_hash(v: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(v);
    h.finish()
}

impl Known {
    pub(super) fn from_current(c: &Current) -> Self {
        Known {
            values: (c.values.iter())
                .map(|(k, (v, rev))| {
                    let kv = KnownValue {
                        hash: value_hash(v),
                        rev: *rev,
                        label_owned: owned_by_label(k, v),
                    };
                    (k.clone(), kv)
                })
                .collect(),
            markers: (c.markers.iter()).map(|(k, r)| (k.clone(), *r)).collect(),
        }
    }

    pub(super) fn have(&self, key: &str, want: Option<&str>) -> Option<Have> {
        self.values.get(key).map(|kv| Have {
            rev: kv.rev,
            same: want.is_some_and(|w| kv.hash == value_hash(w.as_bytes())),
            label_owned: kv.label_owned,
        })
    }

    /// Records a transaction that succeeded at `revision`.
    pub(super) fn record(&mut self, effects: Vec<Effect>, revision: i64) {
        for e in effects {
            match e {
                Effect::Put {
                    key,
                    hash,
                    label_owned,
                } => {
                    let kv = KnownValue {
                        hash,
                        rev: revision,
                        label_owned,
                    };
                    self.values.insert(key, kv);
                }
                Effect::Delete(key) => {
                    self.values.remove(&key);
                }
                Effect::Marker(key) => {
                    self.markers.insert(key, revision);
                }
                Effect::Unmarker(key) => {
                    self.markers.remove(&key);
                }
            }
        }
    }
}

/// A stored key as the plan sees it.
pub(super) struct Have {
    pub(super) rev: i64,
    /// Whether the stored value equals the desired one.
    pub(super) same: bool,
    pub(super) label_owned: bool,
}
