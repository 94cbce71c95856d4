//! The calculation graph's IP pool handling: every valid pool reaches the dataplane (disabled ones
//! too), changes are emitted once and only when they change what the dataplane needs, deletions
//! and invalid pools become removals, and pool outputs come after the policy state.

mod support;

use calc_graph::graph::Update;
use calc_graph::model::{IpPool, Kind, Metadata, Resource};
use calc_graph::proto::Output;
use support::*;

fn mk_pool(name: &str, spec: serde_json::Value) -> Update {
    let r = Resource::from_value(serde_json::json!({
        "kind": "IPPool", "metadata": {"name": name}, "spec": spec
    }))
    .unwrap();
    upd(r)
}

fn pools_of(out: &[Output]) -> Vec<String> {
    out.iter()
        .filter_map(|o| match o {
            Output::IpPoolUpdated(p) => Some(format!(
                "+{} {} masq={} lb={}",
                p.name, p.cidr, p.masquerade, p.load_balancer_only
            )),
            Output::IpPoolRemoved(n) => Some(format!("-{n}")),
            _ => None,
        })
        .collect()
}

#[test]
fn pools_are_emitted_after_in_sync_with_everything_else() {
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep("prod", "web", NODE, "10.0.0.1/32", &[("app", "web")]),
        mk_pool(
            "nat",
            serde_json::json!({"cidr": "10.0.0.0/16", "natOutgoing": true}),
        ),
        mk_pool(
            "off",
            serde_json::json!({"cidr": "10.1.0.0/16", "natOutgoing": true, "disabled": true}),
        ),
        mk_pool(
            "v6",
            serde_json::json!({"cidr": "fd00:10::/64", "blockSize": 122}),
        ),
        mk_pool(
            "lb",
            serde_json::json!({"cidr": "203.0.113.0/24", "allowedUses": ["LoadBalancer"]}),
        ),
    ]);
    let got: Vec<String> = dp
        .pools
        .values()
        .map(|p| {
            format!(
                "{} {} {} {}",
                p.name, p.cidr, p.masquerade, p.load_balancer_only
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            "lb 203.0.113.0/24 false true",
            "nat 10.0.0.0/16 true false",
            "off 10.1.0.0/16 true false",
            "v6 fd00:10::/64 false false",
        ],
        "a disabled pool is still a pool (Calico: disabled only stops new allocations)"
    );

    // An unchanged re-write emits nothing; a change emits one update.
    let out = run(
        &mut g,
        vec![mk_pool(
            "nat",
            serde_json::json!({"cidr": "10.0.0.0/16", "natOutgoing": true}),
        )],
    );
    assert!(out.is_empty(), "{out:?}");
    let out = run(
        &mut g,
        vec![
            mk_pool("nat", serde_json::json!({"cidr": "10.0.0.0/16"})),
            mk_pool(
                "nat",
                serde_json::json!({"cidr": "10.0.0.0/16", "natOutgoing": false}),
            ),
        ],
    );
    assert_eq!(pools_of(&out), ["+nat 10.0.0.0/16 masq=false lb=false"]);
    dp.apply(&out).unwrap();

    // A pool that becomes invalid is removed (and reported); deleting an invalid pool emits nothing.
    let out = run(
        &mut g,
        vec![mk_pool("off", serde_json::json!({"cidr": "10.1.0.1/16"}))],
    );
    assert_eq!(pools_of(&out), ["-off"]);
    dp.apply(&out).unwrap();
    let errors = g.take_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].1.to_string().contains("spec.cidr"), "{errors:?}");
    assert!(run(&mut g, vec![del(Kind::IpPool, None, "off")]).is_empty());

    // Created and deleted between two flushes: nothing.
    let out = run(
        &mut g,
        vec![
            mk_pool("tmp", serde_json::json!({"cidr": "10.9.0.0/16"})),
            del(Kind::IpPool, None, "tmp"),
        ],
    );
    assert!(out.is_empty(), "{out:?}");

    // Pool outputs follow the policy state in a mixed batch.
    let out = run(
        &mut g,
        vec![
            del(Kind::IpPool, None, "lb"),
            mk_wep("prod", "api", NODE, "10.0.0.2/32", &[("app", "api")]),
        ],
    );
    assert!(
        matches!(out.last(), Some(Output::IpPoolRemoved(n)) if n == "lb"),
        "{out:?}"
    );
    dp.apply(&out).unwrap();
    assert_eq!(dp.pools.len(), 2);
}

#[test]
fn pools_without_a_cidr_are_not_pools() {
    let (_, dp) = synced(vec![upd(IpPool {
        metadata: Metadata::named("empty"),
        ..IpPool::default()
    })]);
    assert!(dp.pools.is_empty());
}
