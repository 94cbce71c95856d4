//! Federation in the graph: remote clusters' endpoints, profiles and network sets join IP set
//! membership under their cluster's name, are never local, and never merge with local objects.

mod support;

use calc_graph::graph::{CalcGraph, LABEL_CLUSTER, Update};
use calc_graph::model::Kind;
use proptest::prelude::*;
use support::*;

/// `u` (a local resource update) as an update of remote cluster `cluster`.
fn remote(cluster: &str, u: Update) -> Update {
    match u {
        Update::Resource { key, value } => Update::Remote {
            cluster: cluster.into(),
            key,
            value,
        },
        other => other,
    }
}

/// A server on this node whose policy allows from `selector` (a GlobalNetworkPolicy, so the
/// rule's selector is not namespaced).
fn server_allowing(selector: &str) -> Vec<Update> {
    vec![
        mk_ns_profile("a", &[]),
        mk_wep("a", "server", NODE, "10.0.0.1/32", &[("app", "server")]),
        mk_gnp(
            "allow",
            "app == 'server'",
            Some(1.0),
            vec![allow_from(selector)],
            vec![],
        ),
    ]
}

fn set_members(
    g: &mut CalcGraph,
    dp: &mut Dataplane,
    selector: &str,
    ups: Vec<Update>,
) -> Vec<String> {
    let out = run(g, ups);
    dp.apply(&out).unwrap();
    dp.check_integrity().unwrap();
    members(dp, &sel_id(selector))
}

#[test]
fn remote_endpoints_join_sets_by_cluster_label_and_are_never_local() {
    let sel = format!("{LABEL_CLUSTER} == 'b' && role == 'client'");
    let mut ups = server_allowing(&sel);
    // Same namespace and name as a local endpoint, and the remote names *our* node: still remote.
    ups.push(mk_wep(
        "b",
        "c1",
        "node2",
        "10.0.2.1/32",
        &[("role", "client")],
    ));
    ups.push(remote(
        "b",
        mk_wep("b", "c1", NODE, "10.1.0.1/32", &[("role", "client")]),
    ));
    // A local endpoint claiming to be in cluster b is not.
    ups.push(mk_wep(
        "b",
        "liar",
        "node2",
        "10.0.2.2/32",
        &[("role", "client"), (LABEL_CLUSTER, "b")],
    ));
    // A remote endpoint claiming another cluster is relabelled with its own.
    ups.push(remote(
        "c",
        mk_wep(
            "b",
            "c1",
            "n",
            "10.2.0.1/32",
            &[("role", "client"), (LABEL_CLUSTER, "b")],
        ),
    ));
    let (mut g, mut dp) = synced(ups);
    assert_eq!(members(&dp, &sel_id(&sel)), ["10.1.0.1/32"]);
    assert_eq!(dp.endpoints.len(), 1, "only the local server is local");
    assert_eq!(g.stats().local_endpoints, 1);

    // Relabel in b moves it out; a second b endpoint moves in; deletion removes.
    let got = set_members(
        &mut g,
        &mut dp,
        &sel,
        vec![
            remote(
                "b",
                mk_wep("b", "c1", NODE, "10.1.0.1/32", &[("role", "other")]),
            ),
            remote(
                "b",
                mk_wep("x", "c2", "n2", "10.1.0.2/32", &[("role", "client")]),
            ),
        ],
    );
    assert_eq!(got, ["10.1.0.2/32"]);
    let got = set_members(
        &mut g,
        &mut dp,
        &sel,
        vec![remote("b", del(Kind::WorkloadEndpoint, Some("x"), "c2"))],
    );
    assert!(got.is_empty(), "{got:?}");
    // Deleting the remote c1 leaves the local c1 alone.
    let all = "role in {'client', 'other'}";
    let mut ups = server_allowing(all);
    ups.push(mk_wep(
        "b",
        "c1",
        "node2",
        "10.0.2.1/32",
        &[("role", "client")],
    ));
    ups.push(remote(
        "b",
        mk_wep("b", "c1", "n", "10.1.0.1/32", &[("role", "client")]),
    ));
    let (mut g, mut dp) = synced(ups);
    assert_eq!(members(&dp, &sel_id(all)), ["10.0.2.1/32", "10.1.0.1/32"]);
    let got = set_members(
        &mut g,
        &mut dp,
        all,
        vec![remote("b", del(Kind::WorkloadEndpoint, Some("b"), "c1"))],
    );
    assert_eq!(got, ["10.0.2.1/32"]);
}

#[test]
fn remote_namespace_labels_come_from_the_remote_clusters_profiles() {
    let sel = "pcns.team == 'blue'";
    let mut ups = server_allowing(sel);
    // Locally namespace "shared" is blue; in b it is red, and b's "other" is blue.
    ups.push(mk_ns_profile("shared", &[("team", "blue")]));
    ups.push(remote("b", mk_ns_profile("shared", &[("team", "red")])));
    ups.push(remote("b", mk_ns_profile("other", &[("team", "blue")])));
    ups.push(remote("b", mk_wep("shared", "p1", "n", "10.1.0.1/32", &[])));
    ups.push(remote("b", mk_wep("other", "p2", "n", "10.1.0.2/32", &[])));
    ups.push(remote(
        "b",
        mk_netset("other", "ns1", &["192.168.0.0/24"], &[]),
    ));
    let (mut g, mut dp) = synced(ups);
    assert_eq!(
        members(&dp, &sel_id(sel)),
        ["10.1.0.2/32", "192.168.0.0/24"]
    );
    // b relabels its namespace: membership follows; local profiles are untouched.
    let got = set_members(
        &mut g,
        &mut dp,
        sel,
        vec![remote("b", mk_ns_profile("shared", &[("team", "blue")]))],
    );
    assert_eq!(got, ["10.1.0.1/32", "10.1.0.2/32", "192.168.0.0/24"]);
    // Deleting b's profile drops its labels.
    let got = set_members(
        &mut g,
        &mut dp,
        sel,
        vec![remote("b", del(Kind::Profile, None, "kns.other"))],
    );
    assert_eq!(got, ["10.1.0.1/32"]);
}

#[test]
fn remote_policies_are_ignored_and_bad_remote_objects_are_reported() {
    let mut ups = server_allowing("all()");
    // A remote policy selecting our server would deny it if it were applied.
    ups.push(remote(
        "b",
        mk_gnp("deny", "app == 'server'", Some(0.0), vec![], vec![]),
    ));
    let (mut g, mut dp) = synced(ups);
    assert_eq!(dp.policies.len(), 1);
    g.apply(Update::Remote {
        cluster: "Not/A/Name".into(),
        key: calc_graph::model::ResourceKey::namespaced(Kind::WorkloadEndpoint, "b", "w"),
        value: None,
    });
    let errs = g.take_errors();
    assert!(
        errs[0].1.to_string().contains("remote cluster name"),
        "{errs:?}"
    );
    // A body that does not match its key is reported with the cluster's name and treated as absent.
    let Update::Resource { value, .. } = mk_wep("b", "w", "n", "10.1.0.9/32", &[]) else {
        unreachable!()
    };
    g.apply(Update::Remote {
        cluster: "b".into(),
        key: calc_graph::model::ResourceKey::namespaced(Kind::WorkloadEndpoint, "b", "other"),
        value,
    });
    let errs = g.take_errors();
    assert!(
        errs[0].1.to_string().contains("remote cluster b"),
        "{errs:?}"
    );
    dp.apply(&g.flush()).unwrap();
    assert_eq!(
        members(&dp, &sel_id("all()")),
        ["10.0.0.1/32"],
        "only the local server"
    );
}

proptest! {
    /// Whatever objects with the same namespace/name exist in several clusters, the set of
    /// `all()` holds every cluster's address, and `cluster == X` exactly X's.
    #[test]
    fn clusters_never_merge(placements in proptest::collection::vec((0usize..3, 0u8..4), 1..12)) {
        let clusters = ["", "b", "c"];
        let mut ups = server_allowing("role == 'p'");
        let mut want_all = std::collections::BTreeSet::new();
        let mut want_b = std::collections::BTreeSet::new();
        let mut seen = std::collections::BTreeSet::new();
        for (i, (c, name)) in placements.iter().enumerate() {
            if !seen.insert((*c, *name)) {
                continue;
            }
            let ip = format!("10.{}.{}.{}/32", c + 1, name, i);
            let u = mk_wep("ns", &format!("p{name}"), "node2", &ip, &[("role", "p")]);
            ups.push(if *c == 0 { u } else { remote(clusters[*c], u) });
            want_all.insert(ip.clone());
            if *c == 1 {
                want_b.insert(ip);
            }
        }
        let b_sel = format!("role == 'p' && {LABEL_CLUSTER} == 'b'");
        ups.push(mk_gnp("b", "app == 'server'", Some(2.0), vec![allow_from(&b_sel)], vec![]));
        let (_, dp) = synced(ups);
        let all: std::collections::BTreeSet<String> = members(&dp, &sel_id("role == 'p'")).into_iter().collect();
        prop_assert_eq!(all, want_all);
        let b: std::collections::BTreeSet<String> = members(&dp, &sel_id(&b_sel)).into_iter().collect();
        prop_assert_eq!(b, want_b);
    }
}
