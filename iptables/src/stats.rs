//! Per-policy packet and byte counters (pure): which policy, tier, direction and action the
//! kernel's counters of our rules belong to.
//!
//! The renderer knows what every rule of ours is for; [`Attribution`] keeps, per chain and
//! `cali:` id, the [`CounterKey`] a rule's counters count towards:
//! * a policy's chain (`cali-pi-`/`cali-po-`): its rules that set the accept bit (Allow), set the
//!   pass bit (Pass), DROP (Deny, also a policy rendered fail-closed) or log (Log), or, in the
//!   shared layout, go to the verdict chain that does (`cali-verdict-accept`/`-pass`/`-drop`);
//! * a profile's chain (`cali-pri-`/`cali-pro-`): the same, under the profile;
//! * an endpoint's chain (`cali-tw-`/`cali-fw-`), or the shared chain it goes to (`cali-si-`/
//!   `cali-so-`): the "End of tier T" DROP (a tier-end drop of T, summed over endpoints) and the
//!   final "Drop if no profiles matched" (a profile-end drop).
//!
//! Everything else (bookkeeping marks, RETURNs, jumps) counts towards nothing: a packet is
//! counted once per verdict it got. [`scan_counters`] reads `iptables-save -c` text with a line
//! scan (only `[p:b] -A cali-… -m comment --comment "cali:<id>" …` lines matter; a full parse
//! of a large table costs several times the save itself), and [`Attribution::attribute`] sums
//! the counters per key. Keys are bounded by what the node has: policies and profiles × 2
//! directions × the actions their rules use, plus tiers × 2; [`Tally::capped`] bounds them
//! further for metrics.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use calc_graph::proto::{self, IpVersion, PolicyKind};

use crate::model::Counters;
use crate::model::TableName;
use crate::model::{Rule, Target};
use crate::parse::scan_counters;
use crate::render::host::{HepChain, hep_chain_name};
use crate::render::static_chains::verdict_of_chain;
use crate::render::{Renderer, names};

/// Which way the counted traffic went, seen from the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// What the counted rules did with the packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    Allow,
    Deny,
    Pass,
    Log,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Pass => "pass",
            Action::Log => "log",
        }
    }
}

/// Whose rules the counters are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    NetworkPolicy,
    GlobalNetworkPolicy,
    Profile,
    /// The DROP at the end of a tier (no policy of the tier allowed or passed the packet).
    TierEnd,
    /// The final DROP of an endpoint chain (no profile allowed the packet).
    ProfileEnd,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::NetworkPolicy => "networkpolicy",
            Source::GlobalNetworkPolicy => "globalnetworkpolicy",
            Source::Profile => "profile",
            Source::TierEnd => "tier-end",
            Source::ProfileEnd => "profile-end",
        }
    }
}

/// What one counter counts. `name` is `namespace/name` for a NetworkPolicy, the name for a
/// GlobalNetworkPolicy, the profile id for a profile, empty for tier-end and profile-end drops;
/// `tier` is empty for profiles and profile-end drops.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey {
    pub source: Source,
    pub tier: String,
    pub name: String,
    pub direction: Direction,
    pub action: Action,
}

/// Our rules of one family, each mapped to the key it counts towards.
#[derive(Debug, Clone, Default)]
pub struct Attribution {
    keys: Vec<CounterKey>,
    index: HashMap<CounterKey, usize>,
    /// chain -> `cali:` id -> index into `keys`.
    rules: HashMap<String, HashMap<String, usize>>,
}

/// Counters summed per key, and how well the kernel matched the attribution.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Every key of the attribution (zero when no packet hit it yet).
    pub counters: BTreeMap<CounterKey, Counters>,
    /// Attributed rules found in the save.
    pub rules_found: usize,
    /// Attributed rules the save does not hold (not programmed yet, or tampered with).
    pub rules_missing: usize,
}

const END_OF_TIER: &str = "End of tier ";
const END_OF_TIER_TAIL: &str = ". Drop if no policies passed packet";
const NO_PROFILE: &str = "Drop if no profiles matched";

impl Attribution {
    /// The attribution of `renderer`'s current filter chains of family `v` (after a flush).
    pub fn new(renderer: &Renderer, v: IpVersion) -> Self {
        Self::for_table(renderer, v, TableName::Filter)
    }

    /// The attribution of `renderer`'s chains of family `v` in `table`: the policy and profile
    /// chains there (the raw table holds host endpoints' doNotTrack policy, mangle their preDNAT
    /// policy, under the same chain names), and in the filter table the tier-end and profile-end
    /// drops of workload and host endpoint chains. Attribute each table's save with its own
    /// attribution (the same rule text has the same `cali:` id in every table).
    pub fn for_table(renderer: &Renderer, v: IpVersion, table: TableName) -> Self {
        let mut a = Attribution::default();
        let accept = renderer.marks().accept;
        let pass = renderer.marks().pass;
        let classify = |t: &Option<Target>| match t {
            Some(Target::Drop) => Some(Action::Deny),
            Some(Target::Goto(c)) => verdict_of_chain(c.as_str()).map(|a| match a {
                proto::Action::Allow => Action::Allow,
                proto::Action::Pass => Action::Pass,
                proto::Action::Deny => Action::Deny,
                proto::Action::Log => Action::Log,
            }),
            Some(Target::Mark { value, .. }) if value & accept != 0 => Some(Action::Allow),
            Some(Target::Mark { value, .. }) if value & pass != 0 => Some(Action::Pass),
            // A deny-log rule (`D…` prefix) logs what the DROP after it counts.
            Some(Target::Nflog {
                prefix: Some(p), ..
            }) if p.as_str().starts_with('D') => None,
            Some(Target::Log { .. } | Target::Nflog { .. }) => Some(Action::Log),
            _ => None,
        };
        for id in renderer.policy_ids() {
            // Staged kinds never reach an enforced renderer; they count as their enforced kind.
            let (source, name) = match (&id.kind, &id.namespace) {
                (PolicyKind::GlobalNetworkPolicy | PolicyKind::StagedGlobalNetworkPolicy, _) => {
                    (Source::GlobalNetworkPolicy, id.name.clone())
                }
                (_, Some(ns)) => (Source::NetworkPolicy, format!("{ns}/{}", id.name)),
                (_, None) => (Source::NetworkPolicy, id.name.clone()),
            };
            for ingress in [true, false] {
                let chain = names::policy_chain_name(id, ingress);
                a.add_chain(renderer, v, table, &chain, |rule| {
                    classify(&rule.target).map(|action| CounterKey {
                        source,
                        tier: id.tier.clone(),
                        name: name.clone(),
                        direction: dir(ingress),
                        action,
                    })
                });
            }
        }
        for id in renderer.profile_ids() {
            for ingress in [true, false] {
                let chain = names::profile_chain_name(id, ingress);
                a.add_chain(renderer, v, table, &chain, |rule| {
                    classify(&rule.target).map(|action| CounterKey {
                        source: Source::Profile,
                        tier: String::new(),
                        name: id.to_string(),
                        direction: dir(ingress),
                        action,
                    })
                });
            }
        }
        if table != TableName::Filter {
            return a;
        }
        // With shared chains the endpoint's chain only goes to its shared chain (`cali-si-`/
        // `cali-so-`), which holds the drops; each shared chain is attributed once. A host
        // endpoint's four chains hold their drops themselves.
        let mut seen = BTreeSet::new();
        let workloads = (renderer.local_endpoints()).flat_map(|ep| {
            [true, false].map(|i| (names::endpoint_chain_name(&ep.interface_name, i), i))
        });
        let hosts = renderer.host_endpoints().flat_map(|h| {
            HepChain::ALL.map(|k| (hep_chain_name(k, &h.interface_name), k.ingress()))
        });
        let endpoint_chains: Vec<(String, bool)> = workloads.chain(hosts).collect();
        for (own, ingress) in endpoint_chains {
            let shared = renderer
                .chain(v, TableName::Filter, &own)
                .into_iter()
                .flatten()
                .filter_map(|r| match &r.target {
                    Some(Target::Goto(c)) => Some(c.as_str().to_string()),
                    _ => None,
                });
            let chains: Vec<String> = std::iter::once(own.clone()).chain(shared).collect();
            for chain in chains {
                if !seen.insert(chain.clone()) {
                    continue;
                }
                a.add_chain(renderer, v, table, &chain, |rule| {
                    if rule.target != Some(Target::Drop) {
                        return None;
                    }
                    let comment = rule.first_comment()?;
                    let (source, tier) = if comment == NO_PROFILE {
                        (Source::ProfileEnd, String::new())
                    } else {
                        let tier = comment
                            .strip_prefix(END_OF_TIER)?
                            .strip_suffix(END_OF_TIER_TAIL)?;
                        (Source::TierEnd, tier.to_string())
                    };
                    Some(CounterKey {
                        source,
                        tier,
                        name: String::new(),
                        direction: dir(ingress),
                        action: Action::Deny,
                    })
                });
            }
        }
        a
    }

    fn add_chain(
        &mut self,
        renderer: &Renderer,
        v: IpVersion,
        table: TableName,
        chain: &str,
        mut key_of: impl FnMut(&Rule) -> Option<CounterKey>,
    ) {
        let Some(rules) = renderer.chain(v, table, chain) else {
            return;
        };
        let Some(desired) = renderer
            .desired_ref(v)
            .tables
            .get(&table)
            .and_then(|t| t.chains.get(chain))
        else {
            return;
        };
        for (rule, d) in rules.iter().zip(desired) {
            let Some(key) = key_of(rule.model()) else {
                continue;
            };
            let index = match self.index.get(&key) {
                Some(&i) => i,
                None => {
                    self.keys.push(key.clone());
                    self.index.insert(key, self.keys.len() - 1);
                    self.keys.len() - 1
                }
            };
            self.rules
                .entry(chain.to_string())
                .or_default()
                .insert(d.hash.clone(), index);
        }
    }

    /// Rules that count towards some key.
    pub fn rule_count(&self) -> usize {
        self.rules.values().map(HashMap::len).sum()
    }

    /// Sums the counters of an `iptables-save -c` (filter table) per key.
    pub fn attribute(&self, save: &str) -> Tally {
        let mut sums = vec![Counters::default(); self.keys.len()];
        let mut found = 0;
        for (chain, hash, c) in scan_counters(save) {
            let Some(&i) = self.rules.get(chain).and_then(|r| r.get(hash)) else {
                continue;
            };
            found += 1;
            sums[i].packets += c.packets;
            sums[i].bytes += c.bytes;
        }
        let mut counters = BTreeMap::new();
        for (k, c) in self.keys.iter().zip(sums) {
            let e: &mut Counters = counters.entry(k.clone()).or_default();
            e.packets += c.packets;
            e.bytes += c.bytes;
        }
        Tally {
            counters,
            rules_found: found,
            rules_missing: self.rule_count().saturating_sub(found),
        }
    }
}

fn dir(ingress: bool) -> Direction {
    if ingress {
        Direction::Ingress
    } else {
        Direction::Egress
    }
}

impl Tally {
    /// Adds another tally (the other family's) into this one.
    pub fn merge(&mut self, other: Tally) {
        for (k, c) in other.counters {
            let e = self.counters.entry(k).or_default();
            e.packets += c.packets;
            e.bytes += c.bytes;
        }
        self.rules_found += other.rules_found;
        self.rules_missing += other.rules_missing;
    }

    /// At most `max` keys: the ones with the most packets (ties by key) stay, the others are
    /// summed per source, direction and action under the name `(other)` and an empty tier.
    pub fn capped(self, max: usize) -> Tally {
        if self.counters.len() <= max {
            return self;
        }
        let mut all: Vec<(CounterKey, Counters)> = self.counters.into_iter().collect();
        all.sort_by(|a, b| b.1.packets.cmp(&a.1.packets).then_with(|| a.0.cmp(&b.0)));
        let fold = |k: &CounterKey| CounterKey {
            source: k.source,
            tier: String::new(),
            name: OTHER.to_string(),
            direction: k.direction,
            action: k.action,
        };
        // Keep as many as leave room for the folded keys (at most one per source, direction and
        // action); a `max` below that many keeps none.
        let mut keep = max.min(all.len());
        while keep > 0 {
            let folded: std::collections::BTreeSet<CounterKey> =
                all[keep..].iter().map(|(k, _)| fold(k)).collect();
            if keep + folded.len() <= max {
                break;
            }
            keep -= 1;
        }
        let rest = all.split_off(keep);
        let mut counters: BTreeMap<CounterKey, Counters> = all.into_iter().collect();
        for (k, c) in rest {
            let e = counters.entry(fold(&k)).or_default();
            e.packets += c.packets;
            e.bytes += c.bytes;
        }
        Tally { counters, ..self }
    }

    /// The keys sorted by packets, then bytes, most first (ties by key).
    pub fn by_hits(&self) -> Vec<(&CounterKey, Counters)> {
        let mut v: Vec<(&CounterKey, Counters)> =
            self.counters.iter().map(|(k, c)| (k, *c)).collect();
        v.sort_by(|a, b| {
            (b.1.packets, b.1.bytes)
                .cmp(&(a.1.packets, a.1.bytes))
                .then_with(|| a.0.cmp(b.0))
        });
        v
    }
}

/// The name that stands for the keys [`Tally::capped`] folded together.
pub const OTHER: &str = "(other)";

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, packets: u64) -> (CounterKey, Counters) {
        (
            CounterKey {
                source: Source::NetworkPolicy,
                tier: "default".into(),
                name: name.into(),
                direction: Direction::Ingress,
                action: Action::Allow,
            },
            Counters { packets, bytes: 0 },
        )
    }

    #[test]
    fn capping_keeps_the_busiest_and_folds_the_rest() {
        let t = Tally {
            counters: (0..10).map(|i| key(&format!("p{i}"), i)).collect(),
            ..Tally::default()
        };
        let total: u64 = t.counters.values().map(|c| c.packets).sum();
        let c = t.capped(4);
        assert!(c.counters.len() <= 4, "{:?}", c.counters);
        assert!(c.counters.keys().any(|k| k.name == "p9"));
        assert!(c.counters.keys().any(|k| k.name == OTHER));
        assert_eq!(c.counters.values().map(|c| c.packets).sum::<u64>(), total);
    }
}
