//! The selector indices' cost: a change evaluates only the selectors it can affect, covers avoid
//! terms that look cheap only locally, and covers are re-chosen as labels drift. Each test counts
//! selector evaluations (`GraphStats::selector_evaluations`), which are repeatable, unlike time.

mod support;

use calc_graph::graph::CalcGraph;
use support::*;

#[test]
fn label_change_on_a_pod_touches_only_its_selectors() {
    let mut ups = vec![mk_ns_profile("ns0", &[])];
    for i in 0..200 {
        ups.push(mk_wep(
            &format!("ns{}", i % 20),
            &format!("p{i}"),
            if i < 5 { NODE } else { "n2" },
            &format!("10.1.{}.{}/32", i / 250, i % 250),
            &[("app", &format!("a{}", i % 10))],
        ));
    }
    for i in 0..100 {
        ups.push(mk_np(
            &format!("ns{}", i % 20),
            &format!("np{i}"),
            &format!("app == 'a{}'", i % 10),
            vec![allow_from(&format!("app == 'a{}'", (i + 1) % 10))],
        ));
    }
    let (mut g, mut dp) = synced(ups);
    let before = g.stats().selector_evaluations;
    let out = run(
        &mut g,
        vec![mk_wep("ns7", "p7", "n2", "10.1.0.7/32", &[("app", "a3")])],
    );
    dp.apply(&out).unwrap();
    let evaluated = g.stats().selector_evaluations - before;
    assert!(evaluated <= 30, "a relabel evaluated {evaluated} selectors");
}

#[test]
fn label_change_no_selector_tests_evaluates_nothing() {
    let (mut g, mut dp) = synced(vec![
        mk_ns_profile("prod", &[]),
        mk_wep(
            "prod",
            "web",
            NODE,
            "10.0.0.1/32",
            &[("app", "web"), ("pod-template-hash", "h1")],
        ),
        mk_np(
            "prod",
            "p",
            "app == 'web'",
            vec![allow_from("app == 'web' && role != 'x'")],
        ),
        mk_gnp("g", "all()", None, vec![allow_from("!has(team)")], vec![]),
    ]);
    let before = g.stats().selector_evaluations;
    let out = run(
        &mut g,
        vec![mk_wep(
            "prod",
            "web",
            NODE,
            "10.0.0.1/32",
            &[("app", "web"), ("pod-template-hash", "h2")],
        )],
    );
    dp.apply(&out).unwrap();
    assert_eq!(
        g.stats().selector_evaluations - before,
        0,
        "no selector tests pod-template-hash, so none needs evaluating"
    );
    assert!(out.is_empty(), "nothing changed for the dataplane: {out:?}");
    // A key the unindexed selector tests must still be evaluated.
    let out = run(
        &mut g,
        vec![mk_wep(
            "prod",
            "web",
            NODE,
            "10.0.0.1/32",
            &[("app", "web"), ("pod-template-hash", "h2"), ("team", "a")],
        )],
    );
    dp.apply(&out).unwrap();
    assert!(g.stats().selector_evaluations > before);
    assert!(members(&dp, &sel_id("!has(team)")).is_empty());
}

/// The policy index holds only local endpoints. A label value none of them carries yet must not
/// attract every policy that tests it: the namespace term is the better index even though no
/// local endpoint has the value (this made a relabel evaluate hundreds of policies).
#[test]
fn relabel_to_a_value_no_local_pod_had_evaluates_few_policies() {
    let mut ups = Vec::new();
    for n in 0..100 {
        ups.push(mk_ns_profile(&format!("ns{n}"), &[]));
        for i in 0..10 {
            // One local pod in every fourth namespace, all with app a1.
            let local = i == 0 && n % 4 == 0;
            ups.push(mk_wep(
                &format!("ns{n}"),
                &format!("p{i}"),
                if local { NODE } else { "n2" },
                &format!("10.1.{n}.{i}/32"),
                &[("app", if local { "a1" } else { ["a1", "a2"][i % 2] })],
            ));
        }
        ups.push(mk_np(
            &format!("ns{n}"),
            "np-a2",
            "app == 'a2'",
            vec![allow_from("app == 'a1'")],
        ));
    }
    let (mut g, mut dp) = synced(ups);
    assert!(dp.policies.is_empty(), "no local pod has app a2");
    let before = g.stats().selector_evaluations;
    let out = run(
        &mut g,
        vec![mk_wep("ns8", "p0", NODE, "10.1.8.0/32", &[("app", "a2")])],
    );
    dp.apply(&out).unwrap();
    // One policy selector, plus the ten ns8 pods the newly needed rule set is built from.
    let evaluated = g.stats().selector_evaluations - before;
    assert!(evaluated <= 20, "a relabel evaluated {evaluated} selectors");
    let active: Vec<_> = dp.policies.keys().map(|p| p.to_string()).collect();
    assert_eq!(active, ["NetworkPolicy ns8/np-a2"]);
}

/// Covers chosen at in-sync go stale when the cluster's labels drift: here `env == 'prod'` was
/// the rarest term of every policy at sync and later every pod carries it. Once items have
/// changed as often as there are items (at least 1024 times), the graph re-chooses covers, and
/// a local relabel evaluates a handful of policies again instead of all of them.
#[test]
fn covers_are_rechosen_when_labels_drift() {
    let mut ups = vec![mk_ns_profile("prod", &[])];
    for i in 0..50 {
        ups.push(mk_gnp(
            &format!("g{i}"),
            &format!("app == 'a{i}' && env == 'prod'"),
            None,
            vec![],
            vec![],
        ));
    }
    let remote = |j: usize, env: &str, extra: &str| {
        mk_wep(
            "prod",
            &format!("r{j}"),
            "n2",
            &format!("10.2.{}.{}/32", j / 200, j % 200),
            &[("app", &format!("a{}", j % 50)), ("env", env), ("x", extra)],
        )
    };
    ups.extend((0..400).map(|j| remote(j, "dev", "0")));
    ups.push(mk_wep(
        "prod",
        "l0",
        NODE,
        "10.1.0.1/32",
        &[("app", "none"), ("env", "dev")],
    ));
    let (mut g, mut dp) = synced(ups);
    let after_sync = g.stats().index_reoptimizations;
    assert_eq!(after_sync, 1, "covers are chosen once at in-sync");

    // Every pod becomes env=prod: 400 changes, below the 1024 that trigger a re-choice.
    let out = run(&mut g, (0..400).map(|j| remote(j, "prod", "0")).collect());
    dp.apply(&out).unwrap();
    let flip = |g: &mut CalcGraph, dp: &mut Dataplane, app: &str| {
        let before = g.stats().selector_evaluations;
        let out = run(
            g,
            vec![mk_wep(
                "prod",
                "l0",
                NODE,
                "10.1.0.1/32",
                &[("app", app), ("env", "prod")],
            )],
        );
        dp.apply(&out).unwrap();
        g.stats().selector_evaluations - before
    };
    flip(&mut g, &mut dp, "a1");
    let stale = flip(&mut g, &mut dp, "a2");
    assert_eq!(g.stats().index_reoptimizations, after_sync);
    assert!(
        stale >= 40,
        "stale covers: a relabel evaluated only {stale} policies"
    );

    // Drift on: 700 more changes (an unrelated label) cross the threshold at the next flush.
    for round in 0..2 {
        let out = run(
            &mut g,
            (0..350)
                .map(|j| remote(j, "prod", &format!("{}", round + 1)))
                .collect(),
        );
        dp.apply(&out).unwrap();
    }
    assert_eq!(g.stats().index_reoptimizations, after_sync + 1);
    let fresh = flip(&mut g, &mut dp, "a3");
    eprintln!("evaluations per relabel: stale covers {stale}, re-chosen {fresh}");
    assert!(
        fresh <= 4,
        "re-chosen covers: a relabel evaluated {fresh} policies"
    );
    // Matches never depended on covers.
    let active: Vec<String> = dp.policies.keys().map(|p| p.to_string()).collect();
    assert_eq!(active, ["GlobalNetworkPolicy g3"]);
}
