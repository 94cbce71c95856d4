//! The applier's fast drift check on the real kernel (legacy and nft, in a namespace this test
//! creates): nothing drifted means nothing written; a flushed root chain is a full refresh; a
//! foreign rule pushed above our hook moves the hook back to the top and keeps the foreign rule;
//! an edited rule of ours is rewritten; a foreign rule appended below our top hook is not drift;
//! a flushed IP set of ours is found by its member count and only it is rewritten.

mod support;

use iptables::apply::{Applier, ApplierConfig, Backend};
use iptables::desired::TableName;
use support::desired::{SET_DB, SET_WEB, mk_state};
use support::{kernel_netns, runner};

fn drift(backend: Backend, ipt: &str) {
    let ns = kernel_netns();
    let desired = mk_state();
    let mut applier = Applier::new(
        runner(&ns),
        ApplierConfig {
            backend,
            ..ApplierConfig::default()
        },
    );
    applier.apply(&desired).unwrap();
    let list = |chain: &str| ns.ok(ipt, &["-S", chain]);
    let forward = list("cali-FORWARD");

    for _ in 0..2 {
        let (d, report) = applier.check_drift(&desired).unwrap();
        assert!(d.drifted.is_empty() && report.is_none(), "{d:?}");
        assert_eq!(d.listings, 6);
    }

    // A foreign rule appended below our (top) hook in INPUT: nothing of ours to repair. (In
    // FORWARD it would land below our appended rules, which go back to the bottom: drift, as
    // the full refresh sees it too.)
    ns.ok(ipt, &["-A", "INPUT", "-s", "192.0.2.9/32", "-j", "ACCEPT"]);
    let (d, report) = applier.check_drift(&desired).unwrap();
    assert!(d.drifted.is_empty() && report.is_none(), "{d:?}");

    ns.ok(ipt, &["-F", "cali-FORWARD"]);
    let (d, report) = applier.check_drift(&desired).unwrap();
    assert_eq!(d.drifted, vec!["filter/cali-FORWARD".to_string()]);
    assert!(d.full_refresh);
    assert!(report.unwrap().kernel_reads > 0);
    assert_eq!(list("cali-FORWARD"), forward);

    ns.ok(
        ipt,
        &["-I", "FORWARD", "1", "-s", "192.0.2.1/32", "-j", "DROP"],
    );
    let (d, report) = applier.check_drift(&desired).unwrap();
    assert_eq!(d.drifted, vec!["filter/FORWARD".to_string()]);
    assert!(!d.full_refresh);
    let written = report.unwrap();
    assert_eq!(
        written.kernel_reads, 0,
        "only the drifted chain is repaired"
    );
    assert_eq!(written.iptables.len(), 1);
    assert!(written.iptables.contains_key(&TableName::Filter));
    let now = list("FORWARD");
    let first_rule = now.lines().find(|l| l.starts_with("-A")).unwrap();
    assert!(first_rule.contains("cali-FORWARD"), "{now}");
    assert!(now.contains("192.0.2.1"), "{now}");
    assert!(list("INPUT").contains("192.0.2.9"));

    ns.ok(ipt, &["-R", "cali-FORWARD", "2", "-j", "ACCEPT"]);
    let (d, _) = applier.check_drift(&desired).unwrap();
    assert_eq!(d.drifted, vec!["filter/cali-FORWARD".to_string()]);
    assert!(!d.full_refresh);
    assert_eq!(list("cali-FORWARD"), forward);
    let (d, report) = applier.check_drift(&desired).unwrap();
    assert!(d.drifted.is_empty() && report.is_none(), "{d:?}");

    // One of our sets flushed: only that set is rewritten.
    ns.ok("ipset", &["flush", SET_WEB]);
    let (d, report) = applier.check_drift(&desired).unwrap();
    assert_eq!(d.sets, vec![SET_WEB.to_string()], "{d:?}");
    assert_eq!(d.drifted, vec![format!("ipset/{SET_WEB}")]);
    let written = report.unwrap();
    assert!(written.iptables.is_empty(), "{written:?}");
    assert!(written.ipset_updates.contains(SET_WEB), "{written:?}");
    assert!(!written.ipset_updates.contains(SET_DB), "{written:?}");
    let members = ns.ok("ipset", &["list", SET_WEB]);
    assert!(
        members.contains("10.65.0.1") && members.contains("10.65.0.2"),
        "{members}"
    );
    let (d, report) = applier.check_drift(&desired).unwrap();
    assert!(d.drifted.is_empty() && report.is_none(), "{d:?}");
}

#[test]
fn drift_is_found_and_repaired_narrowly_legacy() {
    drift(Backend::Legacy, "iptables-legacy");
}

#[test]
fn drift_is_found_and_repaired_narrowly_nft() {
    drift(Backend::Nft, "iptables-nft");
}
