//! Golden and incremental tests of outgoing NAT from IP pools (`render::nat`): Felix's rule text
//! in `cali-nat-outgoing`, the all-pools / masquerade-pools sets per family, and a pool change
//! touching only set members.

mod render_support;

use calc_graph::proto::{IpPool, IpSetMember, IpVersion, Output};
use iptables::apply::TableName;
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
        .map(|d| d.body.clone())
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
            .map(|d| d.body.clone())
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
