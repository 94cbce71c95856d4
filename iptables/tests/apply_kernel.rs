//! The applier against the real kernel, in network namespaces: both backends, idempotence,
//! coexistence with kube-proxy/Docker rules, drift repair, cleanup and error reporting.

mod support;

use std::time::Duration;

use felixrs_test_support::netns::Netns;
use iptables::apply::{Applier, ApplierConfig, ApplyError, Backend, ExecRunner, Mode};
use iptables::desired::{DesiredError, DesiredState, IpVersion, TableName};
use support::check::{assert_in_sync, foreign_lines, hashes_of, save, set_members, set_names};
use support::desired::{SET_DB, SET_WEB, mk_rules, mk_state};
use support::{kernel_netns, runner};

fn mk_applier(ns: &Netns, mode: Mode) -> Applier<ExecRunner> {
    let backend = match mode {
        Mode::Legacy => Backend::Legacy,
        Mode::Nft => Backend::Nft,
    };
    Applier::new(
        runner(ns),
        ApplierConfig {
            backend,
            initial_backoff: Duration::from_millis(1),
            ..ApplierConfig::default()
        },
    )
}

fn corpus(name: &str) -> String {
    let path = felixrs_test_support::iptables_corpus_file(name)
        .display()
        .to_string();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("corpus file {path} missing: {e}"))
}

fn apply_twice_on(mode: Mode) {
    let ns = kernel_netns();
    let desired = mk_state();
    let mut applier = mk_applier(&ns, mode);
    let first = applier.apply(&desired).unwrap();
    let mut written: Vec<TableName> = first.iptables.keys().copied().collect();
    written.sort_by_key(|t| t.as_str());
    assert_eq!(written, [TableName::Filter, TableName::Nat, TableName::Raw]);
    assert!(first.ipset_updates.starts_with("create "));
    assert_in_sync(&ns, mode, &desired);
    assert_eq!(set_members(&ns, SET_WEB), ["10.65.0.1", "10.65.0.2"]);
    assert_eq!(set_members(&ns, SET_DB), ["10.65.1.0/24"]);

    let second = applier.apply(&desired).unwrap();
    assert!(second.is_empty(), "second apply wrote {second:?}");
    assert_eq!(second.kernel_reads, 0);

    // A new applier (an agent restart) reads the kernel and finds nothing to do either.
    let mut restarted = mk_applier(&ns, mode);
    let third = restarted.apply(&desired).unwrap();
    assert_eq!(third.kernel_reads, 1);
    assert!(third.is_empty(), "apply after restart wrote {third:?}");

    // The other backend was never touched.
    let other = match mode {
        Mode::Legacy => Mode::Nft,
        Mode::Nft => Mode::Legacy,
    };
    let other_save = ns.ok(&other.save_program(IpVersion::V4), &[]);
    assert!(!other_save.contains("cali"), "{other_save}");
}

#[test]
fn apply_legacy_then_second_apply_writes_nothing() {
    apply_twice_on(Mode::Legacy);
}

#[test]
fn apply_nft_then_second_apply_writes_nothing() {
    apply_twice_on(Mode::Nft);
}

#[test]
fn auto_backend_follows_the_rules_already_there() {
    let ns = kernel_netns();
    ns.feed(
        "iptables-legacy-restore",
        &[],
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -s 192.0.2.1/32 -j DROP\nCOMMIT\n",
    );
    let mut a = Applier::new(runner(&ns), ApplierConfig::default());
    assert_eq!(a.mode().unwrap(), Mode::Legacy);

    let ns = kernel_netns();
    ns.feed(
        "iptables-nft-restore",
        &[],
        "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n",
    );
    ns.feed(
        "iptables-legacy-restore",
        &[],
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n-A INPUT -j ACCEPT\nCOMMIT\n",
    );
    let mut a = Applier::new(runner(&ns), ApplierConfig::default());
    assert_eq!(
        a.mode().unwrap(),
        Mode::Nft,
        "kubelet's hint chain wins over rule counts"
    );

    // No rules anywhere: the distribution's default (`iptables -V`) decides.
    let ns = kernel_netns();
    let version = ns.ok("iptables", &["-V"]);
    let expected = if version.contains("nf_tables") {
        Mode::Nft
    } else {
        Mode::Legacy
    };
    let mut a = Applier::new(runner(&ns), ApplierConfig::default());
    assert_eq!(a.mode().unwrap(), expected, "{version}");
}

#[test]
fn switching_backend_sweeps_our_leftovers_from_the_old_one() {
    let ns = kernel_netns();
    let desired = mk_state();
    mk_applier(&ns, Mode::Legacy).apply(&desired).unwrap();
    ns.feed(
        "iptables-legacy-restore",
        &["--noflush"],
        "*filter\n-A INPUT -s 192.0.2.9/32 -j DROP\nCOMMIT\n",
    );
    let mut nft = mk_applier(&ns, Mode::Nft);
    let report = nft.apply(&desired).unwrap();
    assert!(
        report.other_backend.contains_key(&TableName::Filter),
        "{report:?}"
    );
    let legacy = ns.ok("iptables-legacy-save", &[]);
    assert!(!legacy.contains("cali"), "{legacy}");
    assert!(
        legacy.contains("-A INPUT -s 192.0.2.9/32 -j DROP"),
        "{legacy}"
    );
    assert_in_sync(&ns, Mode::Nft, &desired);
    assert!(nft.refresh(&desired).unwrap().is_empty());

    // The same when the old backend was read ahead of the apply, with the view.
    let ns = kernel_netns();
    mk_applier(&ns, Mode::Legacy).apply(&desired).unwrap();
    let mut nft = mk_applier(&ns, Mode::Nft);
    nft.read_kernel().unwrap();
    let report = nft.apply(&desired).unwrap();
    assert!(
        report.other_backend.contains_key(&TableName::Filter) && report.saves == 3,
        "{report:?}"
    );
    let legacy = ns.ok("iptables-legacy-save", &[]);
    assert!(!legacy.contains("cali"), "{legacy}");
    assert_in_sync(&ns, Mode::Nft, &desired);
}

fn foreign_rules_survive(mode: Mode, file: &str) {
    let ns = kernel_netns();
    let restore = mode.restore_program(IpVersion::V4);
    ns.feed(&restore, &[], &corpus(file));
    let before: Vec<(String, Vec<String>)> = ["filter", "nat"]
        .iter()
        .map(|t| (t.to_string(), foreign_lines(&save(&ns, mode, t))))
        .collect();
    let desired = mk_state();
    let mut applier = mk_applier(&ns, mode);
    applier.apply(&desired).unwrap();
    assert_in_sync(&ns, mode, &desired);
    for (table, lines) in &before {
        let after = save(&ns, mode, table);
        assert_eq!(
            &foreign_lines(&after),
            lines,
            "foreign rules of {table} changed"
        );
        assert!(
            !after.contains("cali-old-chain"),
            "stale cali- chain kept:\n{after}"
        );
    }
    assert!(applier.apply(&desired).unwrap().is_empty());
    // Removing everything of ours leaves exactly the foreign rules.
    applier.apply(&DesiredState::new(IpVersion::V4)).unwrap();
    for (table, lines) in &before {
        let after = save(&ns, mode, table);
        assert!(!after.contains("cali"), "{after}");
        assert_eq!(&foreign_lines(&after), lines);
    }
    assert!(set_names(&ns).is_empty());
}

#[test]
fn kube_proxy_and_docker_rules_survive_byte_for_byte_nft() {
    foreign_rules_survive(Mode::Nft, "001-calico-felix-kube-docker.kernel.txt");
}

#[test]
fn docker_rules_survive_byte_for_byte_legacy() {
    foreign_rules_survive(
        Mode::Legacy,
        "033-iptsem-containern-topos1-docker.kernel.txt",
    );
    foreign_rules_survive(Mode::Legacy, "001-calico-felix-kube-docker.kernel.txt");
}

fn drift_is_repaired(mode: Mode) {
    let ns = kernel_netns();
    let desired = mk_state();
    let mut applier = mk_applier(&ns, mode);
    applier.apply(&desired).unwrap();
    let ipt = format!(
        "iptables-{}",
        match mode {
            Mode::Legacy => "legacy",
            Mode::Nft => "nft",
        }
    );
    ns.ok(&ipt, &["-F", "cali-FORWARD"]);
    ns.ok(&ipt, &["-D", "INPUT", "1"]);
    ns.ok(&ipt, &["-I", "cali-OUTPUT", "1", "-j", "ACCEPT"]);
    ns.ok(
        &ipt,
        &["-I", "FORWARD", "1", "-s", "192.0.2.1", "-j", "DROP"],
    );
    ns.ok("ipset", &["del", SET_WEB, "10.65.0.1"]);
    ns.ok("ipset", &["add", SET_DB, "10.66.0.0/16"]);

    let repair = applier.refresh(&desired).unwrap();
    assert_eq!(repair.kernel_reads, 1);
    let filter = &repair.iptables[&TableName::Filter];
    assert!(filter.contains("-I INPUT 1 "), "{filter}");
    assert!(filter.contains("-D FORWARD "), "{filter}");
    assert!(filter.contains("-A cali-FORWARD "), "{filter}");
    assert!(filter.contains("-D cali-OUTPUT 3"), "{filter}");
    assert!(
        repair
            .ipset_updates
            .contains(&format!("add {SET_WEB} 10.65.0.1"))
    );
    assert!(
        repair
            .ipset_updates
            .contains(&format!("del {SET_DB} 10.66.0.0/16"))
    );
    assert_in_sync(&ns, mode, &desired);
    // The foreign rule stays, now below our hook.
    let f = save(&ns, mode, "filter");
    let fwd = hashes_of(&f, "FORWARD");
    assert!(fwd[0].is_some() && fwd[1].is_none(), "{f}");
    assert!(f.contains("-A FORWARD -s 192.0.2.1/32 -j DROP"));
    assert_eq!(set_members(&ns, SET_WEB), ["10.65.0.1", "10.65.0.2"]);
    assert!(applier.refresh(&desired).unwrap().is_empty());
}

#[test]
fn refresh_repairs_drift_legacy() {
    drift_is_repaired(Mode::Legacy);
}

#[test]
fn refresh_repairs_drift_nft() {
    drift_is_repaired(Mode::Nft);
}

#[test]
fn removed_chains_hooks_and_tables_are_cleaned_in_one_transaction() {
    let ns = kernel_netns();
    let mode = Mode::Nft;
    let mut applier = mk_applier(&ns, mode);
    let full = mk_state();
    applier.apply(&full).unwrap();

    let mut smaller = full.clone();
    smaller.tables.remove(&TableName::Nat);
    let filter = smaller.tables.get_mut(&TableName::Filter).unwrap();
    filter.chains.remove("cali-pi-_web-allow-db");
    let tw = "cali-tw-calia1b2c3d4e5f";
    filter.chains.insert(
        tw.into(),
        mk_rules(
            tw,
            &[
                "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-j DROP",
            ],
        ),
    );
    smaller.ip_sets.remove(SET_DB);
    let report = applier.apply(&smaller).unwrap();
    let payload = &report.iptables[&TableName::Filter];
    // Flush first, replace in place, delete last.
    let flush = payload.find(":cali-pi-_web-allow-db - [0:0]").unwrap();
    let replace = payload.find(&format!("-R {tw} 2 ")).unwrap();
    let delete = payload.find("-X cali-pi-_web-allow-db").unwrap();
    assert!(flush < replace && replace < delete, "{payload}");
    assert!(
        !payload.contains(&format!("-R {tw} 1 ")),
        "unchanged rule rewritten:\n{payload}"
    );
    assert!(
        report
            .ipset_deletions
            .contains(&format!("destroy {SET_DB}"))
    );
    assert_in_sync(&ns, mode, &smaller);
    let nat = save(&ns, mode, "nat");
    assert!(!nat.contains("cali"), "{nat}");
    assert_eq!(set_names(&ns), [SET_WEB]);
}

#[test]
fn persistent_failure_names_table_and_payload_line_and_writes_nothing() {
    for mode in [Mode::Legacy, Mode::Nft] {
        let ns = kernel_netns();
        let mut applier = mk_applier(&ns, mode);
        let mut bad = mk_state();
        bad.tables
            .get_mut(&TableName::Filter)
            .unwrap()
            .chains
            .insert(
                "cali-bad".into(),
                mk_rules("cali-bad", &["-j NOSUCHTARGET"]),
            );
        let err = applier.apply(&bad).unwrap_err();
        eprintln!("{mode:?}: {err}");
        assert!(
            err.to_string()
                .contains("writing table filter failed after 5 attempts")
        );
        match &err {
            ApplyError::Restore {
                table,
                attempts,
                line,
                line_text,
                ..
            } => {
                assert_eq!(*table, TableName::Filter);
                assert_eq!(*attempts, 5);
                assert!(line.is_some(), "{err}");
                let text = line_text.as_deref().unwrap_or_default();
                assert!(
                    text.starts_with("-A cali-bad ") && text.contains("NOSUCHTARGET"),
                    "{mode:?}: blamed line {text:?}: {err}"
                );
            }
            other => panic!("unexpected error {other}"),
        }
        // The filter transaction is atomic: nothing of it is in the kernel.
        let f = save(&ns, mode, "filter");
        assert!(!f.contains("cali"), "{f}");
        // Fixing the input makes the next apply succeed.
        applier.apply(&mk_state()).unwrap();
        assert_in_sync(&ns, mode, &mk_state());
    }
}

#[test]
fn invalid_input_is_refused_before_anything_is_written() {
    let ns = kernel_netns();
    let mut applier = mk_applier(&ns, Mode::Nft);
    let mut bad = mk_state();
    bad.tables
        .get_mut(&TableName::Nat)
        .unwrap()
        .chains
        .insert("KUBE-SERVICES".into(), vec![]);
    let err = applier.apply(&bad).unwrap_err();
    assert!(
        matches!(&err, ApplyError::Invalid(DesiredError::InvalidChain { chain, .. }) if chain == "KUBE-SERVICES"),
        "{err}"
    );
    let mut bad = mk_state();
    bad.tables
        .get_mut(&TableName::Filter)
        .unwrap()
        .chains
        .insert(
            "cali-x".into(),
            mk_rules("cali-x", &["-j ACCEPT\nCOMMIT\n*nat"]),
        );
    let err = applier.apply(&bad).unwrap_err();
    assert!(err.to_string().contains("cali-x"), "{err}");
    let everything = ns.ok("iptables-nft-save", &[]);
    assert!(!everything.contains("cali"), "{everything}");
    assert!(set_names(&ns).is_empty());
}

#[test]
fn reread_every_apply_repairs_drift_without_refresh() {
    let ns = kernel_netns();
    let desired = mk_state();
    let mut applier = Applier::new(
        runner(&ns),
        ApplierConfig {
            backend: Backend::Nft,
            reread_every_apply: true,
            ..ApplierConfig::default()
        },
    );
    applier.apply(&desired).unwrap();
    let quiet = applier.apply(&desired).unwrap();
    assert!(quiet.is_empty() && quiet.kernel_reads == 1, "{quiet:?}");
    ns.ok("iptables-nft", &["-F", "cali-INPUT"]);
    let repair = applier.apply(&desired).unwrap();
    assert!(
        repair.iptables[&TableName::Filter].contains("-A cali-INPUT "),
        "{repair:?}"
    );
    assert_in_sync(&ns, Mode::Nft, &desired);
}

#[test]
fn preview_is_exactly_what_a_first_apply_writes() {
    let desired = mk_state();
    let text = iptables::desired::preview(&desired).unwrap();
    let ns = kernel_netns();
    let report = mk_applier(&ns, Mode::Nft).apply(&desired).unwrap();
    let mut expected = format!("# ipset restore (IPv4)\n{}", report.ipset_updates);
    for table in TableName::ALL {
        if let Some(p) = report.iptables.get(&table) {
            expected.push_str(&format!(
                "# iptables-restore --noflush (IPv4, {table})\n{p}"
            ));
        }
    }
    assert_eq!(text, expected);
}
