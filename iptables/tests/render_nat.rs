//! Golden and incremental tests of outgoing NAT from IP pools (`render::nat`): Felix's rule text
//! in `cali-nat-outgoing`, the all-pools / masquerade-pools sets per family, and a pool change
//! touching only set members.

mod render_support;

use calc_graph::proto::{IpPool, IpSetMember, IpVersion, Output};
use iptables::desired::TableName;
use iptables::render::{RenderConfig, Renderer};
use render_support::*;

fn pool(name: &str, cidr: &str, masquerade: bool, load_balancer_only: bool) -> Output {
    Output::IpPoolUpdated(IpPool {
        name: name.into(),
        cidr: net(cidr),
        masquerade,
        load_balancer_only,
    })
}

fn bodies(r: &Renderer, v: IpVersion) -> Vec<String> {
    r.desired(v).tables[&TableName::Nat].chains["cali-nat-outgoing"]
        .iter()
        .map(|d| d.body().to_string())
        .collect()
}

fn members(r: &Renderer, v: IpVersion, set: &str) -> Option<Vec<String>> {
    r.desired(v).ip_sets.get(set).map(|s| {
        s.members
            .iter()
            .map(|m| match m {
                IpSetMember::Net(n) => n.to_string(),
                other => format!("{other:?}"),
            })
            .collect()
    })
}

fn synced(outputs: Vec<Output>) -> Renderer {
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    let mut all = outputs;
    all.push(Output::InSync);
    assert!(r.apply_all(all).is_empty());
    assert!(r.flush().is_empty());
    r
}

const V4_RULE: &str = "-m set --match-set cali40masq-ipam-pools src -m set ! --match-set cali40all-ipam-pools dst -j MASQUERADE --random-fully";

#[test]
fn no_pools_no_nat_and_no_pool_sets() {
    let r = synced(vec![]);
    for v in [IpVersion::V4, IpVersion::V6] {
        assert!(bodies(&r, v).is_empty());
        assert!(r.desired(v).ip_sets.is_empty());
    }
    // cali-POSTROUTING still jumps to the (empty) chain, as Felix's does.
    let post: Vec<String> =
        r.desired(IpVersion::V4).tables[&TableName::Nat].chains["cali-POSTROUTING"]
            .iter()
            .map(|d| d.body().to_string())
            .collect();
    assert_eq!(post, ["-j cali-fip-snat", "-j cali-nat-outgoing"]);
}

#[test]
fn masquerade_from_nat_pools_to_outside_all_pools_per_family() {
    let mut r = synced(vec![
        pool("nat", "10.78.1.0/24", true, false),
        pool("plain", "10.78.2.0/24", false, false),
        pool("lb", "203.0.113.0/24", false, true),
        pool("nat-v6", "fd78:1::/64", true, false),
    ]);
    assert_eq!(bodies(&r, IpVersion::V4), [V4_RULE]);
    assert_eq!(
        bodies(&r, IpVersion::V6),
        [
            "-m set --match-set cali60masq-ipam-pools src -m set ! --match-set cali60all-ipam-pools dst -j MASQUERADE --random-fully"
        ]
    );
    let v4 = IpVersion::V4;
    assert_eq!(
        members(&r, v4, "cali40all-ipam-pools").unwrap(),
        ["10.78.1.0/24", "10.78.2.0/24"],
        "a LoadBalancer-only pool holds no pods: traffic to it is masqueraded"
    );
    assert_eq!(
        members(&r, v4, "cali40masq-ipam-pools").unwrap(),
        ["10.78.1.0/24"]
    );
    assert_eq!(
        members(&r, IpVersion::V6, "cali60all-ipam-pools").unwrap(),
        ["fd78:1::/64"]
    );
    // The rule id is hashed over Felix's own text of the rule (match_builder.go SourceIPSet /
    // NotDestIPSet, actions.go MasqAction with MASQFullyRandom).
    let felix: Vec<&str> = r
        .chain(v4, TableName::Nat, "cali-nat-outgoing")
        .unwrap()
        .iter()
        .map(|rule| rule.felix_text())
        .collect();
    assert_eq!(
        felix,
        [
            "-m set --match-set cali40masq-ipam-pools src -m set ! --match-set cali40all-ipam-pools dst --jump MASQUERADE --random-fully"
        ]
    );
    assert!(assert_parses_back(&r, v4) > 0);
    r.take_delta(v4);
    r.take_delta(IpVersion::V6);

    // Turning natOutgoing on for another pool changes a set member; the chain is not rewritten.
    r.apply(pool("plain", "10.78.2.0/24", true, false)).unwrap();
    r.flush();
    let d = r.take_delta(v4);
    assert!(d.chains.is_empty(), "{:?}", d.chains);
    assert_eq!(d.ip_sets.len(), 1, "{:?}", d.ip_sets);
    assert_eq!(d.ip_sets[0].0, "cali40masq-ipam-pools");
    assert!(r.take_delta(IpVersion::V6).is_empty());

    // Deleting a pool: members only.
    r.apply(Output::IpPoolRemoved("nat".into())).unwrap();
    r.flush();
    let d = r.take_delta(v4);
    assert!(d.chains.is_empty(), "{:?}", d.chains);
    assert_eq!(
        members(&r, v4, "cali40all-ipam-pools").unwrap(),
        ["10.78.2.0/24"]
    );
    assert_eq!(
        members(&r, v4, "cali40masq-ipam-pools").unwrap(),
        ["10.78.2.0/24"]
    );

    // The last masquerading v4 pool goes: the rule goes, then the unreferenced sets.
    r.apply(pool("plain", "10.78.2.0/24", false, false))
        .unwrap();
    r.flush();
    let d = r.take_delta(v4);
    assert_eq!(d.chains.len(), 1);
    assert_eq!(d.chains[0].2.as_deref(), Some(&[][..]));
    let mut gone: Vec<&str> = d
        .ip_sets
        .iter()
        .filter(|(_, spec)| spec.is_none())
        .map(|(n, _)| n.as_str())
        .collect();
    gone.sort();
    assert_eq!(gone, ["cali40all-ipam-pools", "cali40masq-ipam-pools"]);
    assert_eq!(bodies(&r, IpVersion::V6).len(), 1, "v6 unaffected");
}

#[test]
fn random_fully_follows_the_config_and_updates_are_idempotent() {
    let mut r = Renderer::new(RenderConfig {
        masquerade_random_fully: false,
        ..RenderConfig::default()
    })
    .unwrap();
    r.apply_all([pool("nat", "10.78.1.0/24", true, false), Output::InSync]);
    r.flush();
    assert_eq!(
        bodies(&r, IpVersion::V4),
        [
            "-m set --match-set cali40masq-ipam-pools src -m set ! --match-set cali40all-ipam-pools dst -j MASQUERADE"
        ]
    );
    r.take_delta(IpVersion::V4);
    r.apply(pool("nat", "10.78.1.0/24", true, false)).unwrap();
    r.flush();
    assert!(r.take_delta(IpVersion::V4).is_empty());
    // Removing a pool the renderer never saw is a no-op.
    r.apply(Output::IpPoolRemoved("ghost".into())).unwrap();
    r.flush();
    assert!(r.take_delta(IpVersion::V4).is_empty());
}

mod props {
    use super::*;
    use std::collections::BTreeMap;
    use std::net::IpAddr;

    use proptest::prelude::*;

    const CIDRS: [&str; 6] = [
        "10.0.0.0/16",
        "10.0.0.0/24",
        "10.1.0.0/16",
        "10.1.128.0/17",
        "fd00::/64",
        "fd00:1::/64",
    ];
    const ADDRS: [&str; 7] = [
        "10.0.0.5",
        "10.0.1.5",
        "10.1.0.5",
        "10.1.200.5",
        "10.2.0.5",
        "fd00::5",
        "fd00:2::5",
    ];

    #[derive(Debug, Clone)]
    enum Op {
        Update(usize, usize, bool, bool),
        Remove(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..4usize, 0..CIDRS.len(), any::<bool>(), prop::bool::weighted(0.2))
                .prop_map(|(n, c, m, lb)| Op::Update(n, c, m, lb)),
            1 => (0..4usize).prop_map(Op::Remove),
        ]
    }

    fn mk(name: usize, cidr: usize, masq: bool, lb: bool) -> IpPool {
        IpPool {
            name: format!("p{name}"),
            cidr: net(CIDRS[cidr]),
            masquerade: masq,
            load_balancer_only: lb,
        }
    }

    /// Whether the rendered state of `r` masquerades a new connection `src -> dst`.
    fn masquerades(r: &Renderer, src: IpAddr, dst: IpAddr) -> bool {
        let v = if src.is_ipv6() {
            IpVersion::V6
        } else {
            IpVersion::V4
        };
        let d = r.desired(v);
        let n = if v == IpVersion::V6 { "6" } else { "4" };
        let has_rule = !d.tables[&TableName::Nat].chains["cali-nat-outgoing"].is_empty();
        let in_set = |set: &str, a: IpAddr| {
            d.ip_sets.get(&format!("cali{n}0{set}")).is_some_and(|s| {
                s.members
                    .iter()
                    .any(|m| matches!(m, IpSetMember::Net(net) if net.contains(&a)))
            })
        };
        has_rule && in_set("masq-ipam-pools", src) && !in_set("all-ipam-pools", dst)
    }

    proptest! {
        /// Incremental rendering of any pool history equals rendering the final pools from
        /// scratch, and masquerades exactly traffic from a natOutgoing pool to outside every
        /// (non-LoadBalancer) pool of the same family.
        #[test]
        fn pools_incremental_equals_scratch_and_masquerade_semantics(
            ops in prop::collection::vec(op(), 1..25),
        ) {
            let mut r = Renderer::new(RenderConfig::default()).unwrap();
            r.apply(Output::InSync).unwrap();
            let mut model: BTreeMap<String, IpPool> = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Update(n, c, m, lb) => {
                        let p = mk(n, c, m, lb);
                        model.insert(p.name.clone(), p.clone());
                        r.apply(Output::IpPoolUpdated(p)).unwrap();
                    }
                    Op::Remove(n) => {
                        model.remove(&format!("p{n}"));
                        r.apply(Output::IpPoolRemoved(format!("p{n}"))).unwrap();
                    }
                }
                r.flush();
            }
            let mut scratch = Renderer::new(RenderConfig::default()).unwrap();
            let mut outs: Vec<Output> = model.values().cloned().map(Output::IpPoolUpdated).collect();
            outs.push(Output::InSync);
            prop_assert!(scratch.apply_all(outs).is_empty());
            scratch.flush();
            for v in [IpVersion::V4, IpVersion::V6] {
                prop_assert_eq!(r.desired(v), scratch.desired(v));
            }
            for s in ADDRS {
                for d in ADDRS {
                    let (src, dst): (IpAddr, IpAddr) = (s.parse().unwrap(), d.parse().unwrap());
                    if src.is_ipv6() != dst.is_ipv6() {
                        continue;
                    }
                    let want = model.values().any(|p| p.masquerade && p.cidr.contains(&src))
                        && !model.values().any(|p| !p.load_balancer_only && p.cidr.contains(&dst));
                    prop_assert_eq!(masquerades(&r, src, dst), want, "{} -> {}", src, dst);
                }
            }
        }
    }
}
