//! The applier's fast drift check on the real kernel (legacy and nft, in a namespace this test
//! creates), for every tamper of issue 23: each is found on the next check, named, and repaired
//! alone; a foreign rule is kept; when nothing changed the check re-reads no table. Each backend
//! is run twice: with its fast signal (the applier in the namespace, as the agent is: nft's
//! generation id, legacy's table summaries) and with the save hash (its programs run through
//! `ip netns exec`). Then rules of ours replaced in place keeping their ids (`iptables -R`, and
//! `nft replace rule` on nft): each found by its body and its chain alone rewritten. Legacy's
//! summaries and contents hash are checked v4 and v6, and the contents hash on an edit in place
//! the summaries cannot see.

mod support;

use std::process::Command;

use felixrs_test_support::netns::in_netns;
use iptables::apply::signal::{legacy_contents, legacy_info};
use iptables::apply::xt_info::XtInfo;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner};
use iptables::desired::{DesiredState, DesiredTable, IpVersion, TableName};
use support::desired::{SET_DB, SET_WEB, mk_rules, mk_state};
use support::kernel_netns;

const TW: &str = "cali-tw-calia1b2c3d4e5f";

/// Runs a tool in the calling thread's namespace and returns its stdout.
fn ok(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Our tables as the kernel has them, without what moves by itself.
fn ours(ipt: &str) -> String {
    ok(&format!("{ipt}-save"), &[])
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with(':'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A tamper: its name, what is done (`ipt`, `nft` or `ipset` invocations), the objects the check
/// must name.
type Tamper = (&'static str, Vec<Vec<&'static str>>, Vec<String>);

/// Each tamper of the table.
fn tampers(nft: bool) -> Vec<Tamper> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut t = vec![
        (
            "hook deleted",
            vec![vec!["ipt", "-D", "FORWARD", "1"]],
            s(&["filter/FORWARD"]),
        ),
        (
            "root chain flushed",
            vec![vec!["ipt", "-F", "cali-FORWARD"]],
            s(&["filter/cali-FORWARD"]),
        ),
        (
            "accept at the top of cali-FORWARD",
            vec![vec!["ipt", "-I", "cali-FORWARD", "1", "-j", "ACCEPT"]],
            s(&["filter/cali-FORWARD"]),
        ),
        (
            "workload chain flushed",
            vec![vec!["ipt", "-F", TW]],
            vec![format!("filter/{TW}")],
        ),
        (
            "accept at the top of the workload chain",
            vec![vec!["ipt", "-I", TW, "1", "-j", "ACCEPT"]],
            vec![format!("filter/{TW}")],
        ),
        (
            "accept at the top of a policy chain",
            vec![vec![
                "ipt",
                "-I",
                "cali-pi-_web-allow-db",
                "1",
                "-j",
                "ACCEPT",
            ]],
            s(&["filter/cali-pi-_web-allow-db"]),
        ),
        (
            "dispatch rule deleted",
            vec![vec!["ipt", "-D", "cali-to-wl-dispatch", "1"]],
            s(&["filter/cali-to-wl-dispatch"]),
        ),
        (
            "dispatch rule and workload chain deleted",
            vec![
                vec!["ipt", "-D", "cali-to-wl-dispatch", "1"],
                vec!["ipt", "-F", TW],
                vec!["ipt", "-X", TW],
            ],
            vec![
                "filter/cali-to-wl-dispatch".to_string(),
                format!("filter/{TW}"),
            ],
        ),
        (
            "nat chain flushed",
            vec![vec!["ipt", "-t", "nat", "-F", "cali-nat-outgoing"]],
            s(&["nat/cali-nat-outgoing"]),
        ),
        (
            "raw chain edited",
            vec![vec![
                "ipt",
                "-t",
                "raw",
                "-I",
                "cali-PREROUTING",
                "1",
                "-j",
                "ACCEPT",
            ]],
            s(&["raw/cali-PREROUTING"]),
        ),
        (
            "set flushed",
            vec![vec!["ipset", "flush", SET_WEB]],
            vec![format!("ipset/{SET_WEB}")],
        ),
        (
            "set members swapped, same count",
            vec![
                vec!["ipset", "del", SET_WEB, "10.65.0.1"],
                vec!["ipset", "add", SET_WEB, "10.65.0.9"],
            ],
            vec![format!("ipset/{SET_WEB}")],
        ),
    ];
    if nft {
        t.push((
            "accept inserted in cali-FORWARD through nft",
            vec![vec![
                "nft",
                "insert",
                "rule",
                "ip",
                "filter",
                "cali-FORWARD",
                "accept",
            ]],
            s(&["filter/cali-FORWARD"]),
        ));
        t.push((
            "workload chain flushed through nft",
            vec![vec!["nft", "flush", "chain", "ip", "filter", TW]],
            vec![format!("filter/{TW}")],
        ));
    }
    t
}

fn drift(backend: Backend, ipt: &'static str, in_namespace: bool) {
    let ns = kernel_netns();
    let name = ns.name().to_string();
    in_netns(ns.name(), move || {
        let runner = match in_namespace {
            true => ExecRunner::new(),
            false => ExecRunner::in_netns(&name).unwrap(),
        };
        let desired = mk_state();
        let config = ApplierConfig {
            backend,
            // legacy: the contents hash on every check (its cadence is the agent's budget's).
            contents_hash_factor: 0,
            ..ApplierConfig::default()
        };
        let mut applier = Applier::new(runner, config.clone());
        applier.apply(&desired).unwrap();
        let before = ours(ipt);
        let sets = ok("ipset", &["save"]);
        // Nothing changed: no table is re-read (the first check learns the signal's value).
        applier.check_drift(&desired, None).unwrap();
        for _ in 0..2 {
            let (d, report) = applier.check_drift(&desired, None).unwrap();
            assert!(d.drifted.is_empty() && report.is_none(), "{d:?}");
            assert_eq!(d.listings, 0, "{d:?}");
        }

        // The other family's applier, sharing the count of our restores: its writes move the
        // generation, and are not taken for someone else's.
        if in_namespace {
            let mut v6 = DesiredState::new(IpVersion::V6);
            let mut filter = DesiredTable::default();
            let rules = mk_rules("cali-x", &["-j ACCEPT"]);
            filter.chains.insert("cali-x".to_string(), rules);
            v6.tables.insert(TableName::Filter, filter);
            let family = IpVersion::V6;
            let mut other = Applier::new(ExecRunner::new(), ApplierConfig { family, ..config });
            other.share_restore_count(&applier);
            assert!(!other.apply(&v6).unwrap().iptables.is_empty());
            let (d, _) = applier.check_drift(&desired, None).unwrap();
            assert_eq!(d.listings, 0, "{d:?}");
        }

        // A foreign rule appended below our (top) hook in INPUT: nothing of ours to repair.
        ok(ipt, &["-A", "INPUT", "-s", "192.0.2.9/32", "-j", "ACCEPT"]);
        let (d, report) = applier.check_drift(&desired, None).unwrap();
        assert!(d.drifted.is_empty() && report.is_none(), "{d:?}");
        assert_eq!(d.listings, 1, "the change was seen");
        ok(ipt, &["-D", "INPUT", "-s", "192.0.2.9/32", "-j", "ACCEPT"]);
        applier.check_drift(&desired, None).unwrap();

        // A foreign rule above our hook: reported, the hook goes back on top, the rule stays.
        ok(
            ipt,
            &["-I", "FORWARD", "1", "-s", "192.0.2.1/32", "-j", "DROP"],
        );
        let (d, _) = applier.check_drift(&desired, None).unwrap();
        assert_eq!(d.drifted, vec!["filter/FORWARD".to_string()]);
        let forward = ok(ipt, &["-S", "FORWARD"]);
        let rules: Vec<_> = forward.lines().filter(|l| l.starts_with("-A")).collect();
        assert!(
            rules[0].contains("cali-FORWARD") && rules[1].contains("192.0.2.1"),
            "{forward}"
        );
        ok(ipt, &["-D", "FORWARD", "-s", "192.0.2.1/32", "-j", "DROP"]);
        let (d, _) = applier.check_drift(&desired, None).unwrap();
        assert!(d.drifted.is_empty(), "{d:?}");
        assert_eq!(ours(ipt), before);

        for (what, steps, objects) in tampers(ipt.contains("nft")) {
            for step in &steps {
                let program = if step[0] == "ipt" { ipt } else { step[0] };
                ok(program, &step[1..]);
            }
            let (d, report) = applier.check_drift(&desired, None).unwrap();
            let mut found = d.drifted.clone();
            found.sort();
            let mut want = objects.clone();
            want.sort();
            assert_eq!(found, want, "{what}: {d:?}");
            assert_eq!(d.full_refresh, what == "root chain flushed", "{what}");
            let written = report.unwrap_or_else(|| panic!("{what}: nothing written"));
            assert_eq!(
                written.kernel_reads, 0,
                "{what}: repaired without a full re-read"
            );
            if objects[0].starts_with("ipset/") {
                assert!(written.iptables.is_empty(), "{what}: {written:?}");
                assert!(
                    !written.ipset_updates.contains(SET_DB),
                    "{what}: {written:?}"
                );
            } else {
                assert_eq!(
                    written.iptables.len(),
                    1,
                    "{what}: one transaction: {written:?}"
                );
            }
            assert_eq!(ours(ipt), before, "{what}");
            let mut now = ok("ipset", &["save"])
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>();
            let mut then = sets.lines().map(str::to_string).collect::<Vec<_>>();
            now.sort();
            then.sort();
            assert_eq!(now, then, "{what}");
            // Our own repair is not drift: the next check finds nothing.
            let (d, report) = applier.check_drift(&desired, None).unwrap();
            assert!(
                d.drifted.is_empty() && report.is_none(),
                "{what}: after repair {d:?}"
            );
            // With the fast signals our own restores are accounted for: nothing is re-read
            // (nft at once; legacy's contents hash, not taken around writes, re-reads once).
            let nft = backend == Backend::Nft;
            assert!(!in_namespace || !nft || d.listings == 0, "{what}: {d:?}");
            let (d, _) = applier.check_drift(&desired, None).unwrap();
            assert!(!in_namespace || d.listings == 0, "{what}: {d:?}");
        }

        // Rules of ours replaced in place keeping their ids: each found by its body, its chain
        // alone rewritten; legacy's same-size edits (a standard target swapped, a port changed)
        // on the fast signal.
        for (what, chain, steps) in edits_in_place(&desired, ipt) {
            for step in &steps {
                let args: Vec<String> = step[1..].iter().map(|a| nft_handle(a, &chain)).collect();
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ok(&step[0], &args);
            }
            assert_ne!(ours(ipt), before, "{what}: the tamper took");
            let (d, report) = applier.check_drift(&desired, None).unwrap();
            let want = vec![format!("filter/{chain}")];
            assert_eq!(d.drifted, want, "{what}: {d:?}");
            assert_eq!(d.edited, want, "{what}: {d:?}");
            assert_eq!(d.listings, 1, "{what}");
            let written = report.unwrap_or_else(|| panic!("{what}: nothing written"));
            assert_eq!(written.iptables.len(), 1, "{what}: {written:?}");
            assert_eq!(
                written.iptables[&TableName::Filter]
                    .matches("\n-R ")
                    .count(),
                1,
                "{what}: the one rule replaced: {written:?}"
            );
            assert_eq!(ours(ipt), before, "{what}");
            let (d, report) = applier.check_drift(&desired, None).unwrap();
            assert!(
                d.drifted.is_empty() && report.is_none(),
                "{what}: after repair {d:?}"
            );
        }
    });
}

/// `#<i>`: the nft handle of rule `i` of `chain` (v4 filter) now; any other argument as it is.
fn nft_handle(arg: &str, chain: &str) -> String {
    let Some(i) = arg.strip_prefix('#').and_then(|i| i.parse::<usize>().ok()) else {
        return arg.to_string();
    };
    let listing = ok("nft", &["-a", "list", "chain", "ip", "filter", chain]);
    (listing.lines())
        .filter(|l| !l.contains("chain ") && l.contains("# handle "))
        .nth(i)
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no rule {i} in {listing}"))
        .to_string()
}

/// Edits in place of rules of ours that keep their `cali:` comment: through `iptables -R`, in the
/// workload chain (`DROP` -> `ACCEPT`) and the policy chain (its port, and `RETURN` ->
/// `ACCEPT`: both the same size in a legacy table); with nft also `nft replace rule`. Each: a
/// name, the chain, the commands.
fn edits_in_place(desired: &DesiredState, ipt: &str) -> Vec<(String, String, Vec<Vec<String>>)> {
    const PI: &str = "cali-pi-_web-allow-db";
    let rule = |chain: &str, i: usize| desired.tables[&TableName::Filter].chains[chain][i].clone();
    let replace = |chain: &str, i: usize, body: String| {
        let mut args: Vec<String> = [ipt, "-R", chain].map(str::to_string).to_vec();
        args.push((i + 1).to_string());
        args.extend(["-m", "comment", "--comment"].map(str::to_string));
        args.push(format!("cali:{}", rule(chain, i).hash));
        args.extend(body.split(' ').map(str::to_string));
        vec![args]
    };
    let invalid = rule(TW, 1);
    assert_eq!(invalid.body(), "-m conntrack --ctstate INVALID -j DROP");
    let port = rule(PI, 0);
    assert!(port.body().contains("--dports 5432 "), "{port:?}");
    let ret = rule(PI, 1);
    assert!(ret.body().ends_with("-j RETURN"), "{ret:?}");
    let mut edits = vec![
        (
            "workload chain rule's DROP made ACCEPT, id kept".to_string(),
            TW.to_string(),
            replace(TW, 1, invalid.body().replace("DROP", "ACCEPT")),
        ),
        (
            "policy chain rule's port changed, id kept".to_string(),
            PI.to_string(),
            replace(PI, 0, port.body().replace("5432", "5433")),
        ),
        (
            "policy chain rule's RETURN made ACCEPT, id kept".to_string(),
            PI.to_string(),
            replace(PI, 1, ret.body().replace("RETURN", "ACCEPT")),
        ),
    ];
    if ipt.contains("nft") {
        // nft's own comment is the one iptables-nft reads back as `-m comment`.
        // The handle is looked up when the step runs (`#<i>`: the chain's rule i).
        let nft = |chain: &str, i: usize, stmt: &str| {
            let handle = format!("#{i}");
            let comment = format!("\"cali:{}\"", rule(chain, i).hash);
            let mut args: Vec<String> = ["nft", "replace", "rule", "ip", "filter", chain, "handle"]
                .map(str::to_string)
                .to_vec();
            args.push(handle);
            args.extend(stmt.split(' ').map(str::to_string));
            args.extend(["comment".to_string(), comment]);
            vec![args]
        };
        edits.push((
            "workload chain rule replaced by an accept through nft, id kept".to_string(),
            TW.to_string(),
            nft(TW, 1, "counter accept"),
        ));
        edits.push((
            "policy chain rule's port changed through nft, id kept".to_string(),
            PI.to_string(),
            nft(PI, 0, "meta l4proto tcp tcp dport 5433 counter accept"),
        ));
    }
    edits
}

#[test]
fn every_tamper_is_found_and_repaired_alone_legacy() {
    drift(Backend::Legacy, "iptables-legacy", false);
}

#[test]
fn every_tamper_is_found_and_repaired_alone_legacy_summaries() {
    drift(Backend::Legacy, "iptables-legacy", true);
}

#[test]
fn every_tamper_is_found_and_repaired_alone_nft_generation() {
    drift(Backend::Nft, "iptables-nft", true);
}

#[test]
fn every_tamper_is_found_and_repaired_alone_nft_save_hash() {
    drift(Backend::Nft, "iptables-nft", false);
}

/// Legacy's signals, v4 and v6, on a namespace's own tables: still while nothing changes; the
/// summaries moved by a flush, an insert, a delete, a chain created or deleted, in filter and in
/// nat, blind to an edit in place of the same size, which moves the contents hash; and never
/// creating a table the kernel did not have.
#[test]
fn the_legacy_summaries_move_on_every_structural_change() {
    let ns = kernel_netns();
    in_netns(ns.name(), || {
        for (family, ipt, names) in [
            (
                IpVersion::V4,
                "iptables-legacy",
                "/proc/thread-self/net/ip_tables_names",
            ),
            (
                IpVersion::V6,
                "ip6tables-legacy",
                "/proc/thread-self/net/ip6_tables_names",
            ),
        ] {
            ok(ipt, &["-N", "cali-x"]);
            ok(ipt, &["-A", "cali-x", "-j", "ACCEPT"]);
            ok(ipt, &["-I", "FORWARD", "1", "-j", "cali-x"]);
            ok(ipt, &["-t", "nat", "-N", "cali-n"]);
            let mut xt = XtInfo::open(family).unwrap();
            let tables = std::fs::read_to_string(names).unwrap();
            assert!(!tables.contains("raw"), "{tables}");
            let mut last = legacy_info(&xt).unwrap();
            assert_eq!(
                legacy_info(&xt).unwrap(),
                last,
                "{family:?}: nothing changed"
            );
            assert!(xt.get("nat").unwrap().num_entries > 0);
            for step in [
                &["-I", "cali-x", "1", "-j", "DROP"][..],
                &["-D", "cali-x", "1"],
                &["-F", "cali-x"],
                &["-A", "cali-x", "-j", "RETURN"],
                &["-N", "cali-y"],
                &["-X", "cali-y"],
                &["-t", "nat", "-A", "cali-n", "-j", "RETURN"],
                &["-t", "nat", "-F", "cali-n"],
                &["-t", "nat", "-X", "cali-n"],
            ] {
                ok(ipt, step);
                let now = legacy_info(&xt).unwrap();
                assert_ne!(now, last, "{family:?}: {step:?} did not move the signal");
                last = now;
            }
            // The same size: unseen by the summaries, seen by the contents; still after.
            let contents = legacy_contents(&mut xt).unwrap();
            assert_eq!(legacy_contents(&mut xt).unwrap(), contents, "{family:?}");
            ok(ipt, &["-R", "cali-x", "1", "-j", "ACCEPT"]);
            assert_eq!(legacy_info(&xt).unwrap(), last, "{family:?}");
            let moved = legacy_contents(&mut xt).unwrap();
            assert_ne!(moved, contents, "{family:?}: -R of the same size");
            // Counters are no content: the same rule with other counters moves nothing.
            ok(
                ipt,
                &["-R", "cali-x", "1", "-c", "7", "700", "-j", "ACCEPT"],
            );
            assert!(ok(&format!("{ipt}-save"), &["-c"]).contains("[7:700] -A cali-x"));
            assert_eq!(legacy_contents(&mut xt).unwrap(), moved, "{family:?}");
            assert_eq!(std::fs::read_to_string(names).unwrap(), tables);
            assert_eq!(
                xt.get("no-such-table").unwrap_err().kind(),
                std::io::ErrorKind::NotFound
            );
        }
    });
}

/// An edit in place that keeps the blob's size (a policy rule's target flipped, under another
/// comment) escapes the summaries; the contents hash finds it on the next check.
#[test]
fn an_edit_in_place_is_found_by_the_legacy_contents_hash() {
    let ns = kernel_netns();
    in_netns(ns.name(), || {
        let desired = mk_state();
        let config = ApplierConfig {
            backend: Backend::Legacy,
            contents_hash_factor: 0,
            ..ApplierConfig::default()
        };
        let mut applier = Applier::new(ExecRunner::new(), config);
        applier.apply(&desired).unwrap();
        applier.check_drift(&desired, None).unwrap();
        let before = ours("iptables-legacy");
        let xt = XtInfo::open(IpVersion::V4).unwrap();
        let info = legacy_info(&xt).unwrap();
        // The first rule of the policy chain with a standard target, flipped: same size.
        let chain = "cali-pi-_web-allow-db";
        let rules = ok("iptables-legacy", &["-S", chain]);
        let (n, rule) = (rules.lines().filter(|l| l.starts_with("-A ")).enumerate())
            .find(|(_, l)| {
                l.ends_with("-j ACCEPT") || l.ends_with("-j DROP") || l.ends_with("-j RETURN")
            })
            .unwrap_or_else(|| panic!("no standard target in {rules}"));
        let flipped = if rule.ends_with("-j DROP") {
            "ACCEPT"
        } else {
            "DROP"
        };
        // Our comments hold no space: their quotes go.
        let mut args: Vec<String> = rule
            .replace('"', "")
            .split(' ')
            .map(str::to_string)
            .collect();
        args[0] = "-R".to_string();
        args.insert(2, (n + 1).to_string());
        *args.last_mut().unwrap() = flipped.to_string();
        // Under another comment (a rule keeping our hash is ours as far as any plan can tell:
        // rules are compared by hash). The comment match has a fixed size.
        let at = 1 + args.iter().position(|a| a == "--comment").unwrap();
        args[at] = "tampered".to_string();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok("iptables-legacy", &args);
        assert_ne!(ours("iptables-legacy"), before);
        assert_eq!(
            legacy_info(&xt).unwrap(),
            info,
            "the summaries cannot see it"
        );
        let (d, report) = applier.check_drift(&desired, None).unwrap();
        assert_eq!(d.drifted, vec![format!("filter/{chain}")], "{d:?}");
        assert_eq!(d.listings, 1);
        assert!(report.is_some());
        assert_eq!(ours("iptables-legacy"), before);
    });
}
