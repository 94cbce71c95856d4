//! Outgoing NAT from IP pools (Felix's `masqManager` and `rules/nat.go`, felix-reference §2.8).
//!
//! Per family, two `hash:net` sets hold the pools' CIDRs: `cali40all-ipam-pools` every pool that
//! holds pod addresses (a LoadBalancer-only pool does not), `cali40masq-ipam-pools` the pools with
//! `natOutgoing`. While a family has a masquerading pool, the nat table's `cali-nat-outgoing`
//! (reached from `cali-POSTROUTING`, appended to `POSTROUTING` after kube-proxy's rules) holds
//! `-m set --match-set cali40masq-ipam-pools src -m set ! --match-set cali40all-ipam-pools dst -j
//! MASQUERADE [--random-fully]`: traffic from a NAT pool to anything outside every pool leaves
//! with the node's address; pod-to-pod traffic, across nodes included, keeps its source, so the
//! destination's policy sees the pod. With no masquerading pool the chain is empty and the sets
//! are not referenced (so, as every set here, not programmed).
//!
//! Disabled pools are ordinary pools here: in Calico `disabled` only stops IPAM from handing out
//! new addresses, and the addresses it gave out keep their NAT.

use std::collections::BTreeSet;

use calc_graph::proto::{IpPool, IpSetMember, IpVersion};

use super::build::{Match, Rule, SetFlags, Target};
use super::names;

/// Felix's set id of every pool (`IPSetIDAllPools`; master renamed it `network-ip-pools`).
pub const ALL_POOLS_SET_ID: &str = "all-ipam-pools";
/// Felix's set id of the natOutgoing pools (`IPSetIDNATOutgoingMasqPools`).
pub const MASQ_POOLS_SET_ID: &str = "masq-ipam-pools";

fn in_family(p: &IpPool, v: IpVersion) -> bool {
    p.cidr.addr().is_ipv6() == (v == IpVersion::V6)
}

/// The members of the all-pools and masquerade-pools sets over both families.
pub fn pool_sets<'a>(
    pools: impl Iterator<Item = &'a IpPool>,
) -> (BTreeSet<IpSetMember>, BTreeSet<IpSetMember>) {
    let (mut all, mut masq) = (BTreeSet::new(), BTreeSet::new());
    for p in pools {
        let net = p.cidr.trunc();
        if !p.load_balancer_only {
            all.insert(IpSetMember::Net(net));
        }
        if p.masquerade {
            masq.insert(IpSetMember::Net(net));
        }
    }
    (all, masq)
}

/// `cali-nat-outgoing` of family `v` (Felix's `NATOutgoingChain`).
pub fn nat_outgoing_rules<'a>(
    v: IpVersion,
    pools: impl Iterator<Item = &'a IpPool>,
    random_fully: bool,
) -> Vec<Rule> {
    let mut pools = pools;
    if !pools.any(|p| p.masquerade && in_family(p, v)) {
        return Vec::new();
    }
    vec![Rule::new(
        vec![
            Match::Set {
                name: names::ipset_name(v, MASQ_POOLS_SET_ID),
                flags: SetFlags::Src,
                negated: false,
            },
            Match::Set {
                name: names::ipset_name(v, ALL_POOLS_SET_ID),
                flags: SetFlags::Dst,
                negated: true,
            },
        ],
        Target::Masquerade { random_fully },
    )]
}
