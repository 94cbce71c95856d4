use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::desired::HookRule;
use crate::model::valid_hash;
use crate::parse::scan_save;

fn mk_hash(n: usize) -> String {
    format!("{n:0>16}")
}

fn mk_rule(n: usize, body: &str) -> DesiredRule {
    DesiredRule::new(mk_hash(n), body)
}

fn mk_desired() -> DesiredTable {
    let mut t = DesiredTable::default();
    t.chains.insert(
        "cali-INPUT".into(),
        vec![mk_rule(1, "-j cali-wl"), mk_rule(2, "-j ACCEPT")],
    );
    t.chains
        .insert("cali-wl".into(), vec![mk_rule(3, "-j DROP")]);
    t.hooks.push(HookRule {
        kernel_chain: "INPUT".into(),
        rule: mk_rule(9, "-j cali-INPUT"),
        position: HookPosition::Top,
    });
    t
}

fn apply(table: TableName, d: Option<&DesiredTable>, actual: &mut ActualTable) -> Vec<Op> {
    let ops = plan_table(table, d, actual).unwrap();
    simulate(table, actual, &ops).unwrap();
    ops
}

#[test]
fn fresh_table_gets_chains_then_hooks() {
    let mut actual = scan_save("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j LOG\nCOMMIT\n")
        .remove(&TableName::Filter)
        .unwrap();
    let d = mk_desired();
    let ops = apply(TableName::Filter, Some(&d), &mut actual);
    let text = render(TableName::Filter, &ops);
    assert_eq!(
        text,
        "*filter\n:cali-INPUT - [0:0]\n:cali-wl - [0:0]\n\
         -A cali-INPUT -m comment --comment \"cali:0000000000000001\" -j cali-wl\n\
         -A cali-INPUT -m comment --comment \"cali:0000000000000002\" -j ACCEPT\n\
         -A cali-wl -m comment --comment \"cali:0000000000000003\" -j DROP\n\
         -I INPUT 1 -m comment --comment \"cali:0000000000000009\" -j cali-INPUT\nCOMMIT\n"
    );
    assert_eq!(actual.chains["INPUT"].len(), 2);
    assert!(
        plan_table(TableName::Filter, Some(&d), &actual)
            .unwrap()
            .is_empty()
    );
    assert_eq!(render(TableName::Filter, &[]), "");
}

#[test]
fn changed_rule_is_replaced_in_place_and_tail_trimmed() {
    let mut actual = ActualTable::default();
    let mut d = mk_desired();
    apply(TableName::Filter, Some(&d), &mut actual);
    d.chains
        .insert("cali-INPUT".into(), vec![mk_rule(1, "-j cali-wl")]);
    d.chains.get_mut("cali-wl").unwrap()[0] = mk_rule(4, "-j REJECT");
    let ops = apply(TableName::Filter, Some(&d), &mut actual);
    let text = render(TableName::Filter, &ops);
    assert_eq!(
        text,
        "*filter\n-D cali-INPUT 2\n\
         -R cali-wl 1 -m comment --comment \"cali:0000000000000004\" -j REJECT\nCOMMIT\n"
    );
}

#[test]
fn removed_chain_is_flushed_first_and_deleted_last() {
    let mut actual = ActualTable::default();
    let d = mk_desired();
    apply(TableName::Filter, Some(&d), &mut actual);
    let mut d2 = d.clone();
    d2.chains.remove("cali-wl");
    d2.chains
        .insert("cali-INPUT".into(), vec![mk_rule(5, "-j ACCEPT")]);
    let ops = apply(TableName::Filter, Some(&d2), &mut actual);
    assert_eq!(ops.first(), Some(&Op::Declare("cali-wl".into())));
    assert_eq!(ops.last(), Some(&Op::DeleteChain("cali-wl".into())));
    // Cleanup of the whole table: hooks go by spec, then both chains.
    let ops = apply(TableName::Filter, None, &mut actual);
    let text = render(TableName::Filter, &ops);
    assert!(
        text.contains("-D INPUT -m comment --comment \"cali:0000000000000009\" -j cali-INPUT\n")
    );
    assert!(text.ends_with("-X cali-INPUT\nCOMMIT\n"), "{text}");
    assert!(actual.our_chains().next().is_none());
}

#[test]
fn rule_inserted_above_hook_triggers_reinsert() {
    let mut actual = ActualTable::default();
    let d = mk_desired();
    apply(TableName::Filter, Some(&d), &mut actual);
    actual.chains.get_mut("INPUT").unwrap().insert(
        0,
        ActualRule {
            hash: None,
            spec: "-j LOG".into(),
            target: Some("LOG".into()),
        },
    );
    let ops = apply(TableName::Filter, Some(&d), &mut actual);
    assert!(matches!(&ops[0], Op::DeleteSpec { chain, .. } if chain == "INPUT"));
    assert!(matches!(&ops[1], Op::Insert { chain, .. } if chain == "INPUT"));
    assert_eq!(actual.chains["INPUT"][1].spec, "-j LOG");
}

#[test]
fn written_rules_and_all_chain_names_are_validated() {
    let actual = ActualTable::default();
    let mut d = mk_desired();
    d.chains
        .insert("cali-x".into(), vec![mk_rule(7, "-j ACCEPT\nCOMMIT")]);
    let err = plan_table(TableName::Filter, Some(&d), &actual).unwrap_err();
    assert!(err.to_string().contains("cali-x"), "{err}");
    let mut d = mk_desired();
    d.chains.insert("KUBE-SERVICES".into(), vec![]);
    let err = plan_table(TableName::Filter, Some(&d), &actual).unwrap_err();
    assert!(err.to_string().contains("KUBE-SERVICES"), "{err}");
    let mut d = mk_desired();
    d.hooks[0].kernel_chain = "PREROUTING".into();
    let err = plan_table(TableName::Filter, Some(&d), &actual).unwrap_err();
    assert!(err.to_string().contains("built-in"), "{err}");
}

#[test]
fn chain_referenced_by_foreign_rule_is_flushed_not_deleted() {
    let mut actual = scan_save(
        "*filter\n:INPUT ACCEPT [0:0]\n:cali-old - [0:0]\n-A INPUT -j cali-old\n-A cali-old -j DROP\nCOMMIT\n",
    )
    .remove(&TableName::Filter)
    .unwrap();
    let ops = apply(TableName::Filter, None, &mut actual);
    assert_eq!(ops, vec![Op::Declare("cali-old".into())]);
    assert!(apply(TableName::Filter, None, &mut actual).is_empty());
}

// ---- property: any kernel state + any desired state -> one valid transaction to the goal ----

fn arb_body(names: Vec<String>) -> impl Strategy<Value = String> {
    let n = names.len();
    prop_oneof![
        Just("-j ACCEPT".to_string()),
        Just("-j DROP".to_string()),
        Just("-m mark --mark 0x10000/0x10000 -j RETURN".to_string()),
        (0..n.max(1)).prop_map(move |i| match names.get(i) {
            Some(c) => format!("-j {c}"),
            None => "-j ACCEPT".into(),
        }),
    ]
}

fn body_id(b: &str) -> usize {
    b.bytes().fold(7usize, |h, c| (h * 31 + c as usize) % 9973)
}

fn arb_desired() -> impl Strategy<Value = DesiredTable> {
    let names = ["cali-a", "cali-b", "cali-c", "cali-d"].map(String::from);
    (
        proptest::sample::subsequence(names.to_vec(), 0..=4),
        any::<u64>(),
        0usize..3,
        0usize..2,
    )
        .prop_flat_map(|(chains, seed, ntop, napp)| {
            let bodies = proptest::collection::vec(
                proptest::collection::vec((arb_body(chains.clone()), 0usize..6), 0..5),
                chains.len(),
            );
            (Just(chains), bodies, Just(seed), Just(ntop), Just(napp))
        })
        .prop_map(|(chains, bodies, _seed, ntop, napp)| {
            let mut t = DesiredTable::default();
            for (i, (name, rules)) in chains.iter().zip(bodies).enumerate() {
                let rules = rules
                    .into_iter()
                    // Only jumps "forward" to avoid loops, like the renderer's tree of chains.
                    .map(|(b, h)| {
                        let b = match b.strip_prefix("-j ") {
                            Some(tgt) if chains.iter().position(|c| c == tgt) <= Some(i) => {
                                "-j RETURN".to_string()
                            }
                            _ => b,
                        };
                        // Like the renderer's hashes, a hash identifies the rule text.
                        mk_rule(100_000 * i + 10 * body_id(&b) + h, &b)
                    })
                    .collect();
                t.chains.insert(name.clone(), rules);
            }
            let target = chains
                .first()
                .map(|c| format!("-j {c}"))
                .unwrap_or("-j ACCEPT".into());
            for k in 0..ntop {
                t.hooks.push(HookRule {
                    kernel_chain: "FORWARD".into(),
                    rule: mk_rule(900_000 + 1000 * k + body_id(&target), &target),
                    position: HookPosition::Top,
                });
            }
            for k in 0..napp {
                t.hooks.push(HookRule {
                    kernel_chain: "FORWARD".into(),
                    rule: mk_rule(950 + k, "-j ACCEPT"),
                    position: HookPosition::Append,
                });
            }
            t
        })
}

/// A kernel state reached by applying some other desired state, then drift: foreign rules in the
/// kernel chain, rogue rules and removed rules in our chains.
fn arb_actual() -> impl Strategy<Value = (ActualTable, Vec<(usize, String)>)> {
    (
        arb_desired(),
        proptest::collection::vec((0usize..8, 0usize..4), 0..6),
    )
        .prop_map(|(d, drift)| {
            let mut actual = scan_save(
                "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                 :KUBE-FWD - [0:0]\n-A FORWARD -j KUBE-FWD\n-A KUBE-FWD -j ACCEPT\nCOMMIT\n",
            )
            .remove(&TableName::Filter)
            .unwrap();
            apply(TableName::Filter, Some(&d), &mut actual);
            let mut foreign = Vec::new();
            for (n, (pos, kind)) in drift.into_iter().enumerate() {
                let fwd = actual.chains.get_mut("FORWARD").unwrap();
                match kind {
                    0 | 1 => {
                        let spec = format!("-s 10.0.0.{n}/32 -j DROP");
                        let at = pos.min(fwd.len());
                        fwd.insert(
                            at,
                            ActualRule {
                                hash: None,
                                spec: spec.clone(),
                                target: None,
                            },
                        );
                        foreign.push((at, spec));
                    }
                    2 => {
                        if let Some((_, rules)) = actual
                            .chains
                            .iter_mut()
                            .find(|(c, _)| c.starts_with("cali-"))
                        {
                            let at = pos.min(rules.len());
                            rules.insert(
                                at,
                                ActualRule {
                                    hash: None,
                                    spec: String::new(),
                                    target: None,
                                },
                            );
                        }
                    }
                    _ => {
                        if let Some((_, rules)) = actual
                            .chains
                            .iter_mut()
                            .find(|(c, _)| c.starts_with("cali-"))
                            && !rules.is_empty()
                        {
                            let at = pos % rules.len();
                            rules.remove(at);
                        }
                    }
                }
            }
            (actual, foreign)
        })
}

fn foreign_view(t: &ActualTable) -> BTreeMap<String, Vec<String>> {
    t.chains
        .iter()
        .filter(|(c, _)| !is_our_chain(c))
        .map(|(c, rules)| {
            (
                c.clone(),
                rules
                    .iter()
                    .filter(|r| r.hash.is_none())
                    .map(|r| r.spec.clone())
                    .collect(),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn plan_reaches_desired_keeps_foreign_and_is_idempotent(
        (mut actual, _) in arb_actual(),
        desired in proptest::option::of(arb_desired()),
    ) {
        let foreign_before = foreign_view(&actual);
        let before = actual.clone();
        let ops = plan_table(TableName::Filter, desired.as_ref(), &actual).unwrap();
        simulate(TableName::Filter, &mut actual, &ops).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let empty = DesiredTable::default();
        let d = desired.as_ref().unwrap_or(&empty);
        for (name, rules) in &d.chains {
            let got: Vec<Option<&str>> = actual.chains[name].iter().map(|r| r.hash.as_deref()).collect();
            let want: Vec<Option<&str>> = rules.iter().map(|r| Some(r.hash.as_str())).collect();
            prop_assert_eq!(got, want, "chain {}", name);
        }
        let ours: Vec<&String> = actual.our_chains().map(|(c, _)| c).collect();
        let want: Vec<&String> = d.chains.keys().collect();
        prop_assert_eq!(ours, want);
        prop_assert_eq!(foreign_view(&actual), foreign_before);
        let fwd: Vec<Option<&str>> = actual.chains["FORWARD"].iter().map(|r| r.hash.as_deref()).collect();
        let top: Vec<&str> = d.hooks.iter().filter(|h| h.position == HookPosition::Top).map(|h| h.rule.hash.as_str()).collect();
        let app: Vec<&str> = d.hooks.iter().filter(|h| h.position == HookPosition::Append).map(|h| h.rule.hash.as_str()).collect();
        prop_assert_eq!(fwd[..top.len()].to_vec(), top.iter().map(|h| Some(*h)).collect::<Vec<_>>());
        prop_assert_eq!(fwd[fwd.len() - app.len()..].to_vec(), app.iter().map(|h| Some(*h)).collect::<Vec<_>>());
        prop_assert!(fwd.iter().filter(|h| h.is_some()).count() == top.len() + app.len());
        // Unchanged rules in unchanged positions are not rewritten.
        for op in &ops {
            if let Op::Replace { chain, index, rule } = op {
                let old = before.chains[chain].get(index - 1).and_then(|r| r.hash.as_deref());
                prop_assert_ne!(old, Some(rule.hash.as_str()));
            }
        }
        prop_assert!(plan_table(TableName::Filter, desired.as_ref(), &actual).unwrap().is_empty());
        let hashes_ok = ops.iter().all(|op| match op {
            Op::Replace { rule, .. } | Op::Append { rule, .. } | Op::Insert { rule, .. } => {
                valid_hash(&rule.hash)
            }
            _ => true,
        });
        prop_assert!(hashes_ok);
    }
}

/// The chains whose desired content differs between two states (present in one only, or with
/// other rules): what the renderer's change log names.
fn differing_chains(a: &DesiredTable, b: &DesiredTable) -> std::collections::BTreeSet<String> {
    a.chains
        .keys()
        .chain(b.chains.keys())
        .filter(|n| a.chains.get(*n) != b.chains.get(*n))
        .cloned()
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// After an apply of `first` (the view then matches it), planning `second` over only the
    /// chains that changed (and any extra names: a change log may name a chain that changed
    /// back) gives exactly the ops of the whole-table plan, and reaches the same table.
    #[test]
    fn planning_the_changed_chains_equals_planning_the_table(
        (mut actual, _) in arb_actual(),
        first in arb_desired(),
        second in arb_desired(),
        extra in proptest::sample::subsequence(
            ["cali-a", "cali-b", "cali-c", "cali-d", "cali-zz", "FORWARD"].map(String::from).to_vec(),
            0..=3,
        ),
    ) {
        apply(TableName::Filter, Some(&first), &mut actual);
        let mut changed = differing_chains(&first, &second);
        changed.extend(extra);
        let whole = plan_table(TableName::Filter, Some(&second), &actual).unwrap();
        let scoped = plan_chains(TableName::Filter, Some(&second), &actual, &changed).unwrap();
        prop_assert_eq!(&scoped, &whole);
        // And nothing at all when nothing changed.
        let none = plan_chains(TableName::Filter, Some(&first), &actual, &Default::default()).unwrap();
        prop_assert!(none.is_empty(), "{:?}", none);
        let mut after = actual.clone();
        simulate(TableName::Filter, &mut after, &scoped).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(plan_table(TableName::Filter, Some(&second), &after).unwrap().is_empty());
    }
}
