//! `Applier::apply_changes` (plan only what the renderer's change log names) writes exactly
//! what `Applier::apply` (plan every table and set) writes, after any sequence of renderer
//! changes: endpoints added, moved between policy combinations and removed, policies changed,
//! IP sets created, filled, emptied and removed, in batches of any size. Both appliers run
//! against a kernel that takes every write (no root needed: the applier keeps its own view of
//! what it wrote), so any chain or set the change log failed to name, or the scoped planning
//! missed, shows up as a payload difference.

mod render_support;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Output as ProcessOutput};

use calc_graph::proto::*;
use iptables::apply::{Applier, ApplierConfig, ApplyReport, Backend, RunError, Runner};
use iptables::render::{RenderConfig, Renderer};
use proptest::prelude::*;
use render_support::*;

const POLICIES: usize = 6;
const SETS: usize = 3;

/// A kernel with nothing in it that takes every write.
struct TakesEverything;

impl Runner for TakesEverything {
    fn run(&self, _: &str, _: &[&str], _: Option<&[u8]>) -> Result<ProcessOutput, RunError> {
        Ok(ProcessOutput {
            status: ExitStatus::from_raw(0),
            stdout: Vec::new(),
            stderr: Vec::new(),
        })
    }
}

fn applier(family: IpVersion) -> Applier<TakesEverything> {
    Applier::new(
        TakesEverything,
        ApplierConfig {
            family,
            backend: Backend::Nft,
            ..ApplierConfig::default()
        },
    )
}

fn set_id(s: usize) -> String {
    format!("s:set{s}")
}

/// Policy `i` (variant `v`): allows TCP from set `i % SETS` and from a CIDR, denies a CIDR with
/// an exception.
fn policy(i: usize, v: u16) -> ActivePolicy {
    let allow = ParsedRule {
        action: Some(Action::Allow),
        protocol: Some(Protocol::Tcp),
        src_ip_set_ids: vec![set_id(i % SETS)],
        dst_ports: ports(&[(80 + v, 80 + v)]),
        ..Default::default()
    };
    let deny = ParsedRule {
        action: Some(Action::Deny),
        src_nets: vec![net("10.0.0.0/8"), net("fd00::/8")],
        not_src_nets: vec![net(&format!("10.{i}.0.0/16"))],
        ..Default::default()
    };
    mk_policy(
        mk_np("ns", &format!("p{i}")),
        vec![allow.clone(), deny.clone()],
        vec![allow, deny],
    )
}

/// Combination `c`: two policies of the pool in a Pass tier, one in a Deny tier.
fn endpoint(e: usize, c: usize) -> LocalEndpoint {
    let p = |k: usize| mk_np("ns", &format!("p{}", k % POLICIES));
    let tiers = vec![
        TierInfo {
            name: "security".into(),
            default_action: Action::Pass,
            ingress_policies: vec![p(c), p(c + 1)],
            egress_policies: vec![p(c + 2)],
        },
        mk_tier("default", vec![p(c + 3)], vec![p(c * 2)]),
    ];
    let mut ep = mk_endpoint(
        "ns",
        &format!("pod{e}"),
        &format!("cali{e:04}"),
        &[&format!("10.65.0.{e}/32")],
        tiers,
        &[&format!("kns.ns{}", c % 2)],
    );
    ep.ipv6_nets = vec![net(&format!("fd00::{e:x}/128"))];
    ep
}

fn member(s: usize, m: u8) -> IpSetMember {
    if m.is_multiple_of(3) {
        IpSetMember::Net(net(&format!("fd00::{s}:{m}/128")))
    } else {
        IpSetMember::Net(net(&format!("10.{s}.0.{m}/32")))
    }
}

#[derive(Debug, Clone)]
enum Change {
    Upsert { ep: usize, combo: usize },
    Remove { ep: usize },
    Policy { p: usize, variant: u16 },
    Add { set: usize, m: u8 },
    Del { set: usize, m: u8 },
    Apply,
}

fn arb_change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => (0..10usize, 0..5usize).prop_map(|(ep, combo)| Change::Upsert { ep, combo }),
        1 => (0..10usize).prop_map(|ep| Change::Remove { ep }),
        2 => (0..POLICIES, 0..3u16).prop_map(|(p, variant)| Change::Policy { p, variant }),
        2 => (0..SETS, 0..8u8).prop_map(|(set, m)| Change::Add { set, m }),
        1 => (0..SETS, 0..8u8).prop_map(|(set, m)| Change::Del { set, m }),
        3 => Just(Change::Apply),
    ]
}

fn base() -> Vec<Output> {
    let mut out: Vec<Output> = (0..SETS)
        .map(|s| Output::IpSetCreated {
            id: set_id(s),
            kind: IpSetKind::Net,
            members: vec![member(s, 1), member(s, 3)].into(),
        })
        .collect();
    out.extend((0..POLICIES).map(|i| Output::PolicyUpdated(policy(i, 0))));
    for ns in 0..2 {
        out.push(Output::ProfileUpdated(mk_profile(
            &format!("kns.ns{ns}"),
            vec![mk_allow()],
            vec![mk_allow()],
        )));
    }
    out
}

/// What an apply wrote, without the bookkeeping that legitimately differs.
fn written(r: &ApplyReport) -> (String, BTreeMap<String, String>, String) {
    (
        r.ipset_updates.clone(),
        r.iptables
            .iter()
            .map(|(t, p)| (t.to_string(), p.clone()))
            .collect(),
        r.ipset_deletions.clone(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn planning_the_change_log_writes_what_planning_everything_writes(
        changes in prop::collection::vec(arb_change(), 1..40),
    ) {
        let mut r = Renderer::new(RenderConfig::default()).unwrap();
        prop_assert!(r.apply_all(base()).is_empty());
        let families = [IpVersion::V4, IpVersion::V6];
        let mut whole = families.map(applier);
        let mut scoped = families.map(applier);
        let mut writes = 0;
        for change in changes.iter().chain([&Change::Apply]) {
            match *change {
                Change::Upsert { ep, combo } => {
                    r.apply(Output::EndpointUpdated(endpoint(ep, combo))).unwrap()
                }
                Change::Remove { ep } => r
                    .apply(Output::EndpointRemoved(EndpointId {
                        namespace: "ns".into(),
                        name: format!("pod{ep}"),
                    }))
                    .unwrap(),
                Change::Policy { p, variant } => {
                    r.apply(Output::PolicyUpdated(policy(p, variant))).unwrap()
                }
                Change::Add { set, m } => r
                    .apply(Output::IpSetMembersAdded { id: set_id(set), members: vec![member(set, m)] })
                    .unwrap(),
                Change::Del { set, m } => r
                    .apply(Output::IpSetMembersRemoved { id: set_id(set), members: vec![member(set, m)] })
                    .unwrap(),
                Change::Apply => {
                    prop_assert!(r.flush().is_empty());
                    for (i, v) in families.into_iter().enumerate() {
                        let log = r.take_changes(v);
                        let desired = r.desired_ref(v);
                        let a = whole[i].apply(desired).unwrap();
                        let b = scoped[i].apply_changes(desired, &log).unwrap();
                        prop_assert_eq!(written(&a), written(&b), "IPv{}", v.number());
                        writes += usize::from(!a.is_empty());
                    }
                }
            }
        }
        // Both views hold the final state: a whole plan of either writes nothing more.
        for (i, v) in families.into_iter().enumerate() {
            prop_assert!(scoped[i].apply(r.desired_ref(v)).unwrap().is_empty());
            prop_assert!(whole[i].apply(r.desired_ref(v)).unwrap().is_empty());
        }
        prop_assert!(writes > 0);
    }
}

/// The scoped plan of a one-policy change looks at the policy's chains, and a change log that
/// names nothing writes nothing even when the desired state moved on (the caller's promise is
/// broken): so the log is what decides, and the test above is not vacuous.
#[test]
fn an_empty_change_log_plans_nothing() {
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    let mut outputs = base();
    outputs.push(Output::EndpointUpdated(endpoint(1, 0)));
    assert!(r.apply_all(outputs).is_empty());
    assert!(r.flush().is_empty());
    let mut a = applier(IpVersion::V4);
    let first = r.take_changes(IpVersion::V4);
    assert!(
        !a.apply_changes(r.desired_ref(IpVersion::V4), &first)
            .unwrap()
            .is_empty()
    );
    r.apply(Output::PolicyUpdated(policy(0, 7))).unwrap();
    assert!(r.flush().is_empty());
    let log = r.take_changes(IpVersion::V4);
    assert!(!log.is_empty());
    let d = r.desired_ref(IpVersion::V4);
    let skipped = a.apply_changes(d, &Default::default()).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let written = a.apply_changes(d, &log).unwrap();
    let filter = &written.iptables[&iptables::desired::TableName::Filter];
    assert!(filter.contains("--dports 87"), "{filter}");
    // And the whole plan finds nothing left.
    assert!(a.apply(d).unwrap().is_empty());
}
