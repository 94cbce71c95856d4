//! `felixrs preview` on testdata/preview: recorded flows replayed against proposed policies
//! (deny-all, allow-all, a no-op, a replaced policy, admin tiers with Deny, Allow and Pass, a
//! staged policy), the static matrix checked cell by cell against `trace`'s evaluator, and the
//! agent's state directory as the node's source.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/preview")
}

/// Runs `felixrs preview --node-name node-1 ARGS`; the exit status, stdout and stderr.
fn preview(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["preview", "--node-name", "node-1"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().expect("exited"),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `preview --json` of `proposal` over the base manifests, replaying testdata's flows.
fn replay(proposal: &str) -> (i32, Value) {
    let (base, prop, flows) = (
        data().join("base"),
        data().join("proposals").join(proposal),
        data().join("flows.jsonl"),
    );
    let (code, out, err) = preview(&[
        "--base-manifests".as_ref(),
        base.as_os_str(),
        "--manifests".as_ref(),
        prop.as_os_str(),
        "--flows".as_ref(),
        flows.as_os_str(),
        "--json".as_ref(),
    ]);
    assert!(code == 0 || code == 1, "exit {code}: {err}");
    (
        code,
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}")),
    )
}

/// The changed flows as `before->after source=>dest:port`, sorted, and what decided each after.
fn changed(report: &Value) -> (Vec<String>, Vec<String>) {
    let mut flows = Vec::new();
    let mut deciders = Vec::new();
    for g in report["replay"]["groups"].as_array().unwrap() {
        let (b, a) = (&g["before"]["verdict"], &g["after"]["verdict"]);
        for f in g["flows"].as_array().unwrap() {
            let name = |s: &Value| s.as_str().unwrap().split(' ').next().unwrap().to_string();
            flows.push(format!(
                "{}->{} {}=>{}:{}",
                b.as_str().unwrap(),
                a.as_str().unwrap(),
                name(&f["source"]),
                name(&f["dest"]),
                f["port"]
            ));
        }
        for d in g["after"]["decided_by"].as_array().unwrap() {
            deciders.push(d.as_str().unwrap().to_string());
        }
    }
    flows.sort();
    (flows, deciders)
}

/// The allowed flows of flows.jsonl (each counted once: two are reported by both ends).
const ALLOWED: [&str; 3] = [
    "allow->deny app/web-0=>app/db-0:5432",
    "allow->deny client/c-0=>app/web-0:80",
    "allow->deny client/c-1=>app/web-0:80",
];

#[test]
fn a_deny_all_lists_exactly_the_allowed_flows_it_would_block() {
    let (code, r) = replay("deny-all.yaml");
    assert_eq!(code, 1, "{r:#}");
    let (flows, deciders) = changed(&r);
    assert_eq!(flows, ALLOWED, "{r:#}");
    assert!(
        deciders
            .iter()
            .any(|d| d == "dropped by ingress of GlobalNetworkPolicy deny-all (tier default)"),
        "{deciders:?}"
    );
    let rep = &r["replay"];
    // 11 lines: 9 records of 7 flows (3 reported by both ends), 2 that cannot be evaluated.
    assert_eq!(
        (
            rep["records"].as_u64(),
            rep["evaluated"].as_u64(),
            rep["reported_twice"].as_u64()
        ),
        (Some(11), Some(6), Some(3))
    );
    let unresolvable: Vec<(u64, String)> = (rep["unresolvable"].as_array().unwrap().iter())
        .map(|u| {
            (
                u["line"].as_u64().unwrap(),
                u["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(unresolvable.len(), 2, "{unresolvable:?}");
    assert_eq!(
        unresolvable[0],
        (10, "the record has no destination address".to_string())
    );
    assert!(
        unresolvable[1].0 == 11 && unresolvable[1].1.starts_with("not a flow record"),
        "{unresolvable:?}"
    );
    // Counts: c-0 -> web-0 is two records of 2 and 1 connections (600 bytes).
    let g = (r["replay"]["groups"].as_array().unwrap().iter())
        .find(|g| {
            g["flows"][0]["source"]
                .as_str()
                .unwrap()
                .starts_with("client/c-0")
        })
        .unwrap();
    assert_eq!(
        (
            g["connections"].as_u64(),
            g["bytes"].as_u64(),
            g["records"].as_u64()
        ),
        (Some(3), Some(600), Some(2))
    );
}

#[test]
fn a_staged_deny_all_previews_as_the_enforced_one() {
    let (code, r) = replay("staged-deny-all.yaml");
    assert_eq!(code, 1);
    assert_eq!(changed(&r).0, ALLOWED, "{r:#}");
    let proposed = r["proposed"][0].as_str().unwrap();
    assert!(
        proposed.contains("staged StagedGlobalNetworkPolicy deny-all, previewed as enforced"),
        "{proposed}"
    );
}

#[test]
fn an_allow_all_unblocks_exactly_the_denied_flows() {
    let (code, r) = replay("allow-all.yaml");
    assert_eq!(code, 1);
    let (flows, deciders) = changed(&r);
    assert_eq!(
        flows,
        [
            "deny->allow client/c-0=>app/db-0:5432",
            "deny->allow client/c-1=>app/db-0:5432"
        ],
        "{r:#}"
    );
    assert!(
        deciders
            .iter()
            .any(|d| d == "allowed by ingress of GlobalNetworkPolicy allow-all (tier default)"),
        "{deciders:?}"
    );
    let before: Vec<&Value> = (r["replay"]["groups"].as_array().unwrap().iter())
        .flat_map(|g| g["before"]["decided_by"].as_array().unwrap())
        .collect();
    assert!(
        before
            .iter()
            .any(|d| d.as_str().unwrap() == "dropped at the end of tier default (ingress)"),
        "{before:?}"
    );
}

#[test]
fn a_policy_that_changes_nothing_exits_0() {
    let (code, r) = replay("noop.yaml");
    assert_eq!(code, 0, "{r:#}");
    assert!(r["replay"]["groups"].as_array().unwrap().is_empty());
    assert_eq!(r["changes"], false);
    // The text says so too.
    let (base, prop) = (data().join("base"), data().join("proposals/noop.yaml"));
    let (code, text, _) = preview(&[
        "--base-manifests".as_ref(),
        base.as_os_str(),
        "--manifests".as_ref(),
        prop.as_os_str(),
        "--flows".as_ref(),
        data().join("flows.jsonl").as_os_str(),
    ]);
    assert_eq!(code, 0);
    assert!(
        text.contains("no recorded flow would change verdict")
            && text.contains("line 10: the record has no destination address"),
        "{text}"
    );
}

#[test]
fn a_replaced_policy_is_previewed_in_place_of_the_old_one() {
    let (code, r) = replay("replace.yaml");
    assert_eq!(code, 1);
    assert_eq!(
        r["proposed"][0],
        "NetworkPolicy app/knp.default.db-allow-web: replaces the node's"
    );
    assert_eq!(
        changed(&r).0,
        [
            "allow->deny app/web-0=>app/db-0:5432",
            "deny->allow client/c-0=>app/db-0:5432",
            "deny->allow client/c-1=>app/db-0:5432",
        ],
        "{r:#}"
    );
}

#[test]
fn a_higher_tier_deny_allow_and_pass_decide_in_tier_order() {
    let (code, r) = replay("admin.yaml");
    assert_eq!(code, 1);
    let (flows, deciders) = changed(&r);
    assert_eq!(
        flows,
        [
            "allow->deny client/c-0=>app/web-0:80",
            "allow->deny client/c-1=>app/web-0:80",
            "deny->allow client/c-0=>app/db-0:5432",
            "deny->allow client/c-1=>app/db-0:5432",
        ],
        "{r:#}"
    );
    assert!(deciders.iter().any(|d| d == "dropped by ingress of GlobalNetworkPolicy kanp.adminnetworkpolicy.deny-client-web (tier kube-admin)"), "{deciders:?}");
    assert!(deciders.iter().any(|d| d == "allowed by ingress of GlobalNetworkPolicy kanp.adminnetworkpolicy.allow-client-db (tier kube-admin)"), "{deciders:?}");
    // The same Allow behind a higher-priority Pass: the namespace's policy decides, as before.
    let (code, r) = replay("admin-pass.yaml");
    assert_eq!(code, 0, "{r:#}");
}

/// Every cell of the static matrix, before and after, is what `trace`'s evaluator says for that
/// packet in the node view without and with the proposal (the proposals add objects, so "with"
/// is the base and the proposal read together as manifests).
#[test]
fn the_static_matrix_agrees_with_trace_on_every_cell() {
    use clap::Parser;
    use felixrs::cmd::shared::dataplane_args::DataplaneArgs;
    use felixrs::cmd::shared::node_view::{SourceArgs, render_node};
    use felixrs::cmd::trace::{PacketArgs, Verdict, trace_packet};
    #[derive(clap::Parser)]
    struct D {
        #[command(flatten)]
        d: DataplaneArgs,
    }
    let dataplane = D::parse_from(["d"]).d;
    let mut cells = 0;
    let mut changed = 0;
    for proposal in [
        "deny-all.yaml",
        "allow-all.yaml",
        "admin.yaml",
        "admin-pass.yaml",
        "noop.yaml",
    ] {
        let (base, prop) = (data().join("base"), data().join("proposals").join(proposal));
        let (code, out, err) = preview(&[
            "--base-manifests".as_ref(),
            base.as_os_str(),
            "--manifests".as_ref(),
            prop.as_os_str(),
            "--json".as_ref(),
        ]);
        assert!(code == 0 || code == 1, "{err}");
        let r: Value = serde_json::from_str(&out).unwrap();
        let m = &r["matrix"];
        assert_eq!(m["local_pods"], 3, "{m:#}");
        let before = render_node(
            &SourceArgs::manifests(vec![base.clone()]),
            "node-1",
            &dataplane,
        )
        .unwrap();
        let after = render_node(
            &SourceArgs::manifests(vec![base.clone(), prop.clone()]),
            "node-1",
            &dataplane,
        )
        .unwrap();
        let columns = m["columns"].as_array().unwrap();
        let mut row_changes = 0;
        for row in m["rows"].as_array().unwrap() {
            for (i, c) in columns.iter().enumerate() {
                let p = PacketArgs {
                    from: row["from"].as_str().unwrap().into(),
                    to: row["to"].as_str().unwrap().into(),
                    protocol: c["protocol"].to_string(),
                    port: c["port"].as_u64().unwrap() as u16,
                    source_port: m["source_port"].as_u64().unwrap() as u16,
                    icmp_type: None,
                    icmp_code: 0,
                    ipv6: false,
                };
                let word = |v: Verdict| match v {
                    Verdict::Accept => "allow",
                    Verdict::Drop => "deny",
                    Verdict::NotOurs => "not-ours",
                };
                let b = word(trace_packet(&before, "node-1", &p).unwrap().verdict);
                let a = word(trace_packet(&after, "node-1", &p).unwrap().verdict);
                assert_eq!(
                    (
                        row["before"][i].as_str().unwrap(),
                        row["after"][i].as_str().unwrap()
                    ),
                    (b, a),
                    "{proposal}: {row} {c}"
                );
                cells += 1;
                row_changes += usize::from(a != b);
            }
        }
        assert_eq!(
            row_changes,
            m["changes"].as_array().unwrap().len(),
            "{proposal}"
        );
        assert_eq!(code, i32::from(row_changes > 0), "{proposal}");
        changed += row_changes;
    }
    // 3 local pods x 4 other peers (3 pods and "elsewhere") x 2 directions, per column.
    assert!(cells >= 5 * 24 * 2, "{cells}");
    assert!(changed > 0);
}

/// The static matrix in text: aligned, verdict words, the deciding policy, bounded without --all.
#[test]
fn the_static_text_names_the_changes_and_their_policy() {
    let (base, prop) = (data().join("base"), data().join("proposals/admin.yaml"));
    let (code, text, err) = preview(&[
        "--base-manifests".as_ref(),
        base.as_os_str(),
        "--manifests".as_ref(),
        prop.as_os_str(),
    ]);
    assert_eq!(code, 1, "{err}");
    for want in [
        "reachability of 3 local pods against 5 peers",
        "ingress    client/c-0 -> app/web-0  tcp/5432",
        "ALLOW -> DENY",
        "after: dropped by ingress of GlobalNetworkPolicy kanp.adminnetworkpolicy.deny-client-web (tier kube-admin)",
        "allow>deny",
        "verdicts would change (exit status 1)",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

#[test]
fn errors_exit_2() {
    let base = data().join("base");
    let (code, _, err) = preview(&[
        "--base-manifests".as_ref(),
        base.as_os_str(),
        "--manifests".as_ref(),
        "/nonexistent/p.yaml".as_ref(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("felixrs preview: loading the proposed --manifests"),
        "{err}"
    );
    let (code, _, err) = preview(&[
        "--base-manifests".as_ref(),
        base.as_os_str(),
        "--manifests".as_ref(),
        data().join("proposals/deny-all.yaml").as_os_str(),
        "--flows".as_ref(),
        "/nonexistent/flows.jsonl".as_ref(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("reading --flows /nonexistent/flows.jsonl"),
        "{err}"
    );
}

/// With `--state-dir` the node's objects are the agent's (here its snapshot file: no agent runs
/// on the directory) and, without --flows, the flows are its `flows.jsonl`.
#[test]
fn the_agents_state_dir_is_the_source_of_objects_and_flows() {
    use felixrs::agent::snapshot::{Snapshot, SnapshotStore};
    let set = k8s_convert::load_manifests(
        &[data().join("base")],
        &k8s_convert::ConvertOptions::default(),
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let kvs = (set.resources.into_iter())
        .map(|(k, r)| (k.as_str().into(), r.to_json().as_bytes().into()))
        .collect();
    SnapshotStore::new(state.path())
        .save(&Snapshot { revision: 42, kvs })
        .unwrap();
    let prop = data().join("proposals/deny-all.yaml");
    let run = |extra: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "--state-dir".as_ref(),
            state.path().as_os_str(),
            "--manifests".as_ref(),
            prop.as_os_str(),
            "--json".as_ref(),
        ];
        args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
        let (code, out, err) = preview(&args);
        (
            code,
            serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}")),
        )
    };
    // No flow log in the directory: the static matrix.
    let (code, r) = run(&[]);
    assert_eq!((code, r["mode"].as_str()), (1, Some("static")));
    assert!(
        r["source"]
            .as_str()
            .unwrap()
            .contains("at datastore revision 42"),
        "{r:#}"
    );
    std::fs::copy(data().join("flows.jsonl"), state.path().join("flows.jsonl")).unwrap();
    let (code, r) = run(&[]);
    assert_eq!((code, r["mode"].as_str()), (1, Some("replay")));
    assert_eq!(changed(&r).0, ALLOWED, "{r:#}");
    // --static still asks for the matrix.
    let (_, r) = run(&["--static"]);
    assert_eq!(r["mode"], "static");
}

/// Staged Kubernetes NetworkPolicies: `Delete` removes the policy it stages (db is no longer
/// isolated: the denied flows to it open), `Set` adds one (the clients keep web on 80).
#[test]
fn staged_kubernetes_policies_preview_their_set_and_delete() {
    let (code, r) = replay("staged-k8s.yaml");
    assert_eq!(code, 1);
    assert_eq!(
        changed(&r).0,
        [
            "deny->allow client/c-0=>app/db-0:5432",
            "deny->allow client/c-1=>app/db-0:5432",
        ],
        "{r:#}"
    );
    let proposed: Vec<&str> = (r["proposed"].as_array().unwrap().iter())
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        proposed.iter().any(|p| p.starts_with(
            "staged StagedKubernetesNetworkPolicy app/db-allow-web (stagedAction Delete): removes "
        ) && p.ends_with("networkpolicies/app/knp.default.db-allow-web")),
        "{proposed:?}"
    );
    assert!(
        proposed.contains(&"NetworkPolicy app/knp.default.web-from-clients: new (staged StagedKubernetesNetworkPolicy app/web-from-clients, previewed as enforced)"),
        "{proposed:?}"
    );
}
