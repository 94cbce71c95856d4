//! Our IP sets: reading them from `ipset save`, and planning the `ipset restore` payloads of the
//! two ipset phases of an apply.
//!
//! * Phase 1 (before iptables): create missing sets and fill them; member changes as `del`/`add`;
//!   a changed `maxelem` goes through a temporary `cali4t<N>` set and `swap` (the only way to
//!   change an in-use set); a changed type (which the kernel cannot swap) goes through
//!   `destroy` + `create`, allowed only while nothing references the set.
//! * Domain sets (FQDN policy, `hash:ip ... timeout 0`): created (and filled with the learned
//!   members the desired state carries, `add <set> <addr> timeout <secs> -exist`) when missing,
//!   re-created when the kernel's set is not a `hash:ip` with timeout support, and otherwise left
//!   alone: the DNS learner owns their members and the kernel expires them, so the applier never
//!   diffs, deletes or flushes them.
//! * Phase 3 (after iptables): `destroy` every set of ours (`cali4*` / `cali6*`, leftover temp sets
//!   included) that is not desired.
//!
//! Every name and member in a payload comes from a validated [`DesiredState`] or from the kernel's
//! own listing of a set whose name passed [`is_our_set`]; members are typed, so nothing here can
//! smuggle a second command into a payload.
//!
//! [`DesiredState`]: super::DesiredState

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::{
    DesiredError, IpSetKind, IpSetMember, IpSetSpec, IpVersion, is_our_set, member_text,
    temp_set_prefix, validate_set,
};

/// One of our sets as the kernel has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActualSet {
    /// `hash:net`, `hash:ip,port`, … as `ipset save` prints it.
    pub type_name: String,
    pub maxelem: u32,
    /// The header's default `timeout` (`Some(0)` for our domain sets); `None` without timeout
    /// support.
    pub timeout: Option<u32>,
    /// Members in `ipset save` text form (without their `timeout`).
    pub members: BTreeSet<String>,
    /// The seconds left of each member that has a timeout (sets with timeout support).
    pub member_timeouts: BTreeMap<String, u32>,
    /// The spec this content was written from, when we wrote it (not when read from the kernel):
    /// an unchanged spec is recognised without rendering its members again.
    pub written: Option<IpSetSpec>,
}

/// The `ipset` type name of a kind.
pub fn type_name(kind: IpSetKind) -> &'static str {
    match kind {
        IpSetKind::Net => "hash:net",
        IpSetKind::IpPort => "hash:ip,port",
        IpSetKind::Domain => "hash:ip",
    }
}

impl ActualSet {
    /// Whether the kernel's set can stand for a desired set of `kind` without being re-created
    /// (same type; a domain set also needs timeout support).
    pub fn fits(&self, kind: IpSetKind) -> bool {
        self.type_name == type_name(kind) && (kind != IpSetKind::Domain || self.timeout.is_some())
    }

    /// A set with per-member timeouts (a domain set): its members change without us.
    pub fn is_timed(&self) -> bool {
        self.timeout.is_some()
    }
}

/// `<word> <value>` after `word` in a list of words.
fn value_after(words: &[&str], word: &str) -> Option<u32> {
    words
        .windows(2)
        .find(|w| w[0] == word)
        .and_then(|w| w[1].parse().ok())
}

fn family_name(family: IpVersion) -> &'static str {
    match family {
        IpVersion::V4 => "inet",
        IpVersion::V6 => "inet6",
    }
}

/// The kernel text of a member. `hash:net` cannot hold a /0, so a /0 becomes its two /1 halves
/// (as Felix does).
pub fn member_texts(m: &IpSetMember) -> Vec<String> {
    if let IpSetMember::Net(net) = m
        && net.prefix_len() == 0
    {
        return match net {
            ipnet::IpNet::V4(_) => vec!["0.0.0.0/1".into(), "128.0.0.0/1".into()],
            ipnet::IpNet::V6(_) => vec!["::/1".into(), "8000::/1".into()],
        };
    }
    vec![member_text(m)]
}

fn desired_texts(spec: &IpSetSpec) -> BTreeSet<String> {
    spec.members.iter().flat_map(member_texts).collect()
}

/// Our sets (for `family`) in `ipset save` output.
pub fn parse_save(family: IpVersion, text: &str) -> BTreeMap<String, ActualSet> {
    let mut out: BTreeMap<String, ActualSet> = BTreeMap::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("create"), Some(name)) if is_our_set(family, name) => {
                let type_name = words.next().unwrap_or_default().to_string();
                let rest: Vec<&str> = words.collect();
                let maxelem = value_after(&rest, "maxelem").unwrap_or(0);
                out.insert(
                    name.to_string(),
                    ActualSet {
                        type_name,
                        maxelem,
                        timeout: value_after(&rest, "timeout"),
                        members: BTreeSet::new(),
                        member_timeouts: BTreeMap::new(),
                        written: None,
                    },
                );
            }
            (Some("add"), Some(name)) => {
                if let (Some(set), Some(member)) = (out.get_mut(name), words.next()) {
                    set.members.insert(member.to_string());
                    let rest: Vec<&str> = words.collect();
                    if let Some(t) = value_after(&rest, "timeout") {
                        set.member_timeouts.insert(member.to_string(), t);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// What phase 1 will do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetUpdatePlan {
    /// The `ipset restore` payload ("" = nothing to do).
    pub payload: String,
    /// Sets whose type changes: they are destroyed and re-created, which the kernel refuses while
    /// a rule references them (the caller checks first).
    pub retyped: Vec<String>,
    /// Temporary sets the payload creates and destroys again.
    pub temps: Vec<String>,
}

/// Plans phase 1 for the `desired` sets (all of them, or the ones that changed: a set left out
/// is left as it is). Every set that goes into the payload is validated first.
pub fn plan_updates<'a>(
    family: IpVersion,
    desired: impl IntoIterator<Item = (&'a String, &'a IpSetSpec)>,
    actual: &BTreeMap<String, ActualSet>,
) -> Result<SetUpdatePlan, DesiredError> {
    let mut plan = SetUpdatePlan::default();
    let mut p = String::new();
    let fam = family_name(family);
    let mut temp_n = 0usize;
    for (name, spec) in desired {
        let actual_set = actual.get(name);
        if actual_set.is_some_and(|a| a.written.as_ref() == Some(spec)) {
            continue;
        }
        validate_set(family, name, spec)?;
        let want = desired_texts(spec);
        let ty = type_name(spec.kind);
        let domain = spec.kind == IpSetKind::Domain;
        let create = |p: &mut String, n: &str| {
            let timeout = if domain { " timeout 0" } else { "" };
            let _ = writeln!(
                p,
                "create {n} {ty} family {fam}{timeout} maxelem {}",
                spec.maxelem
            );
        };
        let fill = |p: &mut String, n: &str, members: &mut dyn Iterator<Item = &String>| {
            for m in members {
                let _ = writeln!(p, "add {n} {m}");
            }
            // `-exist`: the learner may have written the same address first; its entry is
            // refreshed, never an error that fails the whole restore.
            for (addr, secs) in &spec.learned {
                let _ = writeln!(p, "add {n} {addr} timeout {secs} -exist");
            }
        };
        if domain {
            match actual_set {
                Some(a) if a.fits(spec.kind) => {}
                Some(_) => {
                    plan.retyped.push(name.clone());
                    let _ = writeln!(p, "destroy {name}");
                    create(&mut p, name);
                    fill(&mut p, name, &mut want.iter());
                }
                None => {
                    create(&mut p, name);
                    fill(&mut p, name, &mut want.iter());
                }
            }
            continue;
        }
        match actual_set {
            None => {
                create(&mut p, name);
                fill(&mut p, name, &mut want.iter());
            }
            Some(a) if !a.fits(spec.kind) => {
                plan.retyped.push(name.clone());
                let _ = writeln!(p, "destroy {name}");
                create(&mut p, name);
                fill(&mut p, name, &mut want.iter());
            }
            Some(a) if a.maxelem != spec.maxelem => {
                let temp = loop {
                    let t = format!("{}{temp_n}", temp_set_prefix(family));
                    temp_n += 1;
                    if !actual.contains_key(&t) {
                        break t;
                    }
                };
                create(&mut p, &temp);
                fill(&mut p, &temp, &mut want.iter());
                let _ = writeln!(p, "swap {name} {temp}");
                // After the swap the temp name holds the old content and no references.
                let _ = writeln!(p, "destroy {temp}");
                plan.temps.push(temp);
            }
            Some(a) => {
                for m in a.members.difference(&want) {
                    let _ = writeln!(p, "del {name} {m}");
                }
                fill(&mut p, name, &mut want.difference(&a.members));
            }
        }
    }
    plan.payload = p;
    Ok(plan)
}

/// Our sets that are not desired (phase 3), in name order.
pub fn plan_deletions(
    desired: &BTreeMap<String, IpSetSpec>,
    actual: &BTreeMap<String, ActualSet>,
) -> Vec<String> {
    actual
        .keys()
        .filter(|n| !desired.contains_key(*n))
        .cloned()
        .collect()
}

/// The payload destroying `names`.
pub fn render_deletions(names: &[String]) -> String {
    names.iter().map(|n| format!("destroy {n}\n")).collect()
}

/// The kernel's sets after a successful phase 1 planned for the same `desired` sets.
pub fn after_updates<'a>(
    desired: impl IntoIterator<Item = (&'a String, &'a IpSetSpec)>,
    actual: &mut BTreeMap<String, ActualSet>,
) {
    for (name, spec) in desired {
        if actual
            .get(name)
            .is_some_and(|a| a.written.as_ref() == Some(spec))
        {
            continue;
        }
        let domain = spec.kind == IpSetKind::Domain;
        if domain && actual.get(name).is_some_and(|a| a.fits(spec.kind)) {
            // Left alone by phase 1: the kernel's members are the learner's.
            continue;
        }
        let learned = spec.learned.iter().map(|(a, t)| (a.to_string(), *t));
        actual.insert(
            name.clone(),
            ActualSet {
                type_name: type_name(spec.kind).to_string(),
                maxelem: spec.maxelem,
                timeout: domain.then_some(0),
                members: desired_texts(spec)
                    .into_iter()
                    .chain(learned.clone().map(|(a, _)| a))
                    .collect(),
                member_timeouts: learned.collect(),
                written: Some(spec.clone()),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use calc_graph::proto::Protocol;

    fn net(s: &str) -> IpSetMember {
        IpSetMember::Net(s.parse().unwrap())
    }

    const SAVE: &str = "create cali40a hash:net family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x308942f4
add cali40a 10.1.0.0/16
add cali40a 10.0.0.1
create KUBE-X hash:ip family inet hashsize 1024 maxelem 65536
add KUBE-X 10.9.9.9
create cali40p hash:ip,port family inet hashsize 1024 maxelem 1024 bucketsize 12 initval 0xf772bf74
add cali40p 10.0.0.5,tcp:8080
create cali60v6 hash:net family inet6 hashsize 1024 maxelem 1048576
";

    #[test]
    fn parse_keeps_only_our_family_sets() {
        let sets = parse_save(IpVersion::V4, SAVE);
        assert_eq!(sets.keys().collect::<Vec<_>>(), ["cali40a", "cali40p"]);
        assert_eq!(sets["cali40a"].type_name, "hash:net");
        assert_eq!(sets["cali40a"].maxelem, 1_048_576);
        assert!(sets["cali40a"].members.contains("10.0.0.1"));
        assert_eq!(sets["cali40p"].members.len(), 1);
        assert_eq!(parse_save(IpVersion::V6, SAVE).len(), 1);
    }

    #[test]
    fn plan_creates_adds_dels_swaps_and_retypes() {
        let actual = parse_save(IpVersion::V4, SAVE);
        let mut desired = BTreeMap::new();
        desired.insert(
            "cali40a".to_string(),
            IpSetSpec::new(IpSetKind::Net, [net("10.0.0.1/32"), net("10.2.0.0/16")]),
        );
        let mut p = IpSetSpec::new(IpSetKind::Net, [net("0.0.0.0/0")]);
        p.maxelem = 1024;
        desired.insert("cali40p".to_string(), p);
        let mut b = IpSetSpec::new(
            IpSetKind::IpPort,
            [IpSetMember::IpPort {
                addr: "10.0.0.5".parse().unwrap(),
                protocol: Protocol::Tcp,
                port: 80,
            }],
        );
        b.maxelem = 4096;
        desired.insert("cali40b".to_string(), b);
        let plan = plan_updates(IpVersion::V4, &desired, &actual).unwrap();
        assert_eq!(
            plan.payload,
            "del cali40a 10.1.0.0/16\nadd cali40a 10.2.0.0/16\n\
             create cali40b hash:ip,port family inet maxelem 4096\nadd cali40b 10.0.0.5,tcp:80\n\
             destroy cali40p\ncreate cali40p hash:net family inet maxelem 1024\n\
             add cali40p 0.0.0.0/1\nadd cali40p 128.0.0.0/1\n"
        );
        assert_eq!(plan.retyped, ["cali40p"]);
        let mut after = actual.clone();
        after_updates(&desired, &mut after);
        assert!(
            plan_updates(IpVersion::V4, &desired, &after)
                .unwrap()
                .payload
                .is_empty()
        );

        // maxelem change: temp set + swap.
        let mut d2 = desired.clone();
        d2.get_mut("cali40a").unwrap().maxelem = 2048;
        let plan = plan_updates(IpVersion::V4, &d2, &after).unwrap();
        assert_eq!(
            plan.payload,
            "create cali4t0 hash:net family inet maxelem 2048\nadd cali4t0 10.0.0.1\n\
             add cali4t0 10.2.0.0/16\nswap cali40a cali4t0\ndestroy cali4t0\n"
        );
        assert_eq!(plan.temps, ["cali4t0"]);
    }

    #[test]
    fn sets_are_validated_before_they_reach_a_payload() {
        let mut desired = BTreeMap::new();
        desired.insert(
            "cali40s:x\ncreate evil".to_string(),
            IpSetSpec::new(IpSetKind::Net, []),
        );
        let err = plan_updates(IpVersion::V4, &desired, &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("invalid ip set"), "{err}");
    }

    #[test]
    fn deletions_are_undesired_sets_of_ours() {
        let actual = parse_save(IpVersion::V4, SAVE);
        let mut desired = BTreeMap::new();
        desired.insert("cali40a".to_string(), IpSetSpec::new(IpSetKind::Net, []));
        let del = plan_deletions(&desired, &actual);
        assert_eq!(del, ["cali40p"]);
        assert_eq!(render_deletions(&del), "destroy cali40p\n");
    }

    /// `ipset save` of sets with timeout support, as this kernel prints it (kernel-extensions.md).
    const SAVE_TIMEOUTS: &str = "create cali40d:abc hash:ip family inet hashsize 1024 maxelem 1048576 timeout 0 bucketsize 12 initval 0x0a4e5f8a
add cali40d:abc 10.0.0.2 timeout 9
add cali40d:abc 10.0.0.1 timeout 70
add cali40d:abc 10.0.0.3 timeout 0
create cali40d:old hash:ip family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x1
add cali40d:old 10.0.0.1
create to-ip hash:ip family inet hashsize 1024 maxelem 65536 timeout 300 bucketsize 12 initval 0x70fd210e
add to-ip 10.0.0.1 timeout 59
";

    #[test]
    fn parse_reads_timeouts_of_headers_and_members() {
        let sets = parse_save(IpVersion::V4, SAVE_TIMEOUTS);
        assert_eq!(
            sets.keys().collect::<Vec<_>>(),
            ["cali40d:abc", "cali40d:old"]
        );
        let d = &sets["cali40d:abc"];
        assert_eq!(
            (d.type_name.as_str(), d.maxelem, d.timeout),
            ("hash:ip", 1_048_576, Some(0))
        );
        assert!(d.fits(IpSetKind::Domain) && d.is_timed());
        assert_eq!(
            d.members.iter().map(String::as_str).collect::<Vec<_>>(),
            ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        );
        assert_eq!(d.member_timeouts["10.0.0.1"], 70);
        assert_eq!(d.member_timeouts["10.0.0.2"], 9);
        assert_eq!(d.member_timeouts["10.0.0.3"], 0);
        // Without timeout support the set cannot stand for a domain set.
        let old = &sets["cali40d:old"];
        assert_eq!(old.timeout, None);
        assert!(old.member_timeouts.is_empty());
        assert!(!old.fits(IpSetKind::Domain) && !old.fits(IpSetKind::Net));
        // The plain sets of the other fixture have no timeouts.
        assert!(
            parse_save(IpVersion::V4, SAVE)
                .values()
                .all(|s| !s.is_timed())
        );
    }

    fn domain(learned: &[(&str, u32)]) -> IpSetSpec {
        IpSetSpec::domain(learned.iter().map(|(a, t)| (a.parse().unwrap(), *t)))
    }

    #[test]
    fn domain_sets_are_created_full_and_never_diffed() {
        let mut desired = BTreeMap::new();
        desired.insert(
            "cali40d:new".to_string(),
            domain(&[
                ("10.0.0.9", 60),
                ("10.0.0.8", 5),
                ("10.0.0.7", 0),
                ("10.0.0.6", u32::MAX),
            ]),
        );
        let plan = plan_updates(IpVersion::V4, &desired, &BTreeMap::new()).unwrap();
        assert_eq!(
            plan.payload,
            "create cali40d:new hash:ip family inet timeout 0 maxelem 1048576\n\
             add cali40d:new 10.0.0.6 timeout 2147483 -exist\n\
             add cali40d:new 10.0.0.8 timeout 5 -exist\n\
             add cali40d:new 10.0.0.9 timeout 60 -exist\n",
            "an expired (0 s) entry would be permanent: left out; a huge TTL is cut to the kernel's limit"
        );
        // The kernel's set (learner's members, other timeouts) is left alone, whatever the
        // desired state's learned members now are; the one without timeouts is re-created.
        let mut actual = parse_save(IpVersion::V4, SAVE_TIMEOUTS);
        let mut desired = BTreeMap::new();
        desired.insert("cali40d:abc".to_string(), domain(&[("10.0.0.5", 30)]));
        desired.insert("cali40d:old".to_string(), domain(&[]));
        let plan = plan_updates(IpVersion::V4, &desired, &actual).unwrap();
        assert_eq!(
            plan.payload,
            "destroy cali40d:old\ncreate cali40d:old hash:ip family inet timeout 0 maxelem 1048576\n"
        );
        assert_eq!(plan.retyped, ["cali40d:old"]);
        after_updates(&desired, &mut actual);
        assert_eq!(
            actual["cali40d:abc"].members.len(),
            3,
            "the kernel's members kept"
        );
        assert!(actual["cali40d:old"].fits(IpSetKind::Domain));
        assert!(
            plan_updates(IpVersion::V4, &desired, &actual)
                .unwrap()
                .payload
                .is_empty()
        );
        // Gone from the desired state: destroyed in phase 3 like any set of ours.
        assert_eq!(
            plan_deletions(&BTreeMap::new(), &actual),
            ["cali40d:abc", "cali40d:old"]
        );
    }

    #[test]
    fn learned_members_are_validated_like_members() {
        let mut desired = BTreeMap::new();
        desired.insert("cali40d:x".to_string(), domain(&[("fd00::1", 60)]));
        let err = plan_updates(IpVersion::V4, &desired, &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("fd00::1"), "{err}");
        let mut net = IpSetSpec::new(IpSetKind::Net, []);
        net.learned.insert("10.0.0.1".parse().unwrap(), 5);
        desired.clear();
        desired.insert("cali40s:x".to_string(), net);
        assert!(plan_updates(IpVersion::V4, &desired, &BTreeMap::new()).is_err());
    }
}
