//! Backend auto-detection in the Felix order (kubelet hint chains in nft mangle, then legacy
//! mangle, then rule counts; `iptables -V` breaks ties) against real kernels in network namespaces, and the seeded first
//! apply: the full saves detection read are not read again.

mod support;

use std::time::Duration;

use felixrs_test_support::netns::Netns;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner, Mode, Reason, backend};
use iptables::desired::{IpVersion, TableName};
use support::check::{assert_in_sync, set_members};
use support::desired::{SET_WEB, mk_state};
use support::{kernel_netns, runner};

const HINT: &str = "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n";
const TWO_RULES: &str =
    "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n-A INPUT -j ACCEPT\nCOMMIT\n";

fn mk_auto(ns: &Netns) -> Applier<ExecRunner> {
    Applier::new(
        runner(ns),
        ApplierConfig {
            backend: Backend::Auto,
            initial_backoff: Duration::from_millis(1),
            ..ApplierConfig::default()
        },
    )
}

fn legacy_tables(ns: &Netns, file: &str) -> String {
    ns.run("cat", &[file])
        .stdout
        .iter()
        .map(|&b| b as char)
        .collect()
}

#[test]
fn hint_in_legacy_mangle_picks_legacy_over_more_nft_rules() {
    let ns = kernel_netns();
    ns.feed("iptables-nft-restore", &[], TWO_RULES);
    ns.feed("iptables-legacy-restore", &[], HINT);
    let d = backend::detect(&runner(&ns), Backend::Auto).unwrap();
    assert_eq!((d.mode, d.reason), (Mode::Legacy, Reason::LegacyHint));
    // All four whole saves are kept for the first apply (view + sweep).
    assert_eq!(d.saves_run(), 4);
    assert!(
        d.save(Mode::Legacy, IpVersion::V4)
            .unwrap()
            .contains("KUBE-IPTABLES-HINT")
    );
}

#[test]
fn hint_in_nft_mangle_picks_nft_over_more_legacy_rules() {
    for (program, what) in [
        ("ip6tables-nft-restore", "v6 hint"),
        ("iptables-nft-restore", "v4 hint"),
    ] {
        let ns = kernel_netns();
        ns.feed("iptables-legacy-restore", &[], TWO_RULES);
        ns.feed(program, &[], HINT);
        let d = backend::detect(&runner(&ns), Backend::Auto).unwrap();
        assert_eq!((d.mode, d.reason), (Mode::Nft, Reason::NftHint), "{what}");
    }
}

#[test]
fn detection_never_creates_a_legacy_table() {
    let ns = kernel_netns();
    ns.feed("iptables-nft-restore", &[], TWO_RULES);
    let d = backend::detect(&runner(&ns), Backend::Auto).unwrap();
    assert_eq!((d.mode, d.reason), (Mode::Nft, Reason::RuleCount));
    for file in ["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"] {
        let names = legacy_tables(&ns, file);
        assert!(!names.contains("mangle"), "{file}: {names}");
    }
    // The fallback kept all four full saves for the first apply.
    assert_eq!(d.saves_run(), 4);
    assert!(
        d.save(Mode::Nft, IpVersion::V4)
            .unwrap()
            .contains("-A INPUT -j ACCEPT")
    );
    assert!(d.save(Mode::Legacy, IpVersion::V6).is_some());
}

#[test]
fn restarted_auto_applier_reads_each_save_once_and_still_repairs_drift() {
    let ns = kernel_netns();
    let desired = mk_state();
    // A first agent programmed nft; its rules outnumber legacy's, so rule counts pick nft.
    let mut first = mk_auto(&ns);
    assert!(!first.apply(&desired).unwrap().is_empty());
    assert_eq!(first.mode().unwrap(), Mode::Nft);

    // Restart on an untouched kernel: detection's full saves seed the view and the sweep, so
    // the only save the apply itself runs is `ipset save`, and nothing is written.
    let mut restarted = mk_auto(&ns);
    let report = restarted.apply(&desired).unwrap();
    assert!(report.is_empty(), "{report:?}");
    assert_eq!((report.kernel_reads, report.saves), (1, 1), "{report:?}");

    // Drift while the agent was down is repaired by the seeded first apply.
    ns.ok("iptables-nft", &["-F", "cali-FORWARD"]);
    ns.ok("iptables-nft", &["-D", "INPUT", "1"]);
    ns.ok("ipset", &["del", SET_WEB, "10.65.0.1"]);
    let mut again = mk_auto(&ns);
    let repair = again.apply(&desired).unwrap();
    assert_eq!((repair.kernel_reads, repair.saves), (1, 1), "{repair:?}");
    let filter = &repair.iptables[&TableName::Filter];
    assert!(filter.contains("-I INPUT 1 "), "{filter}");
    assert!(filter.contains("-A cali-FORWARD "), "{filter}");
    assert_in_sync(&ns, Mode::Nft, &desired);
    assert_eq!(set_members(&ns, SET_WEB), ["10.65.0.1", "10.65.0.2"]);

    // Later applies read nothing; a refresh reads ours, the sets and the other backend.
    let quiet = again.apply(&desired).unwrap();
    assert_eq!((quiet.kernel_reads, quiet.saves), (0, 0), "{quiet:?}");
    let refresh = again.refresh(&desired).unwrap();
    assert_eq!((refresh.kernel_reads, refresh.saves), (1, 3), "{refresh:?}");
}

#[test]
fn a_read_ahead_is_the_next_applys_read_and_its_view_is_planned_whole() {
    let ns = kernel_netns();
    let desired = mk_state();
    let mut first = mk_auto(&ns);
    assert!(!first.apply(&desired).unwrap().is_empty());
    // Drift while the agent was down.
    ns.ok("iptables-nft", &["-F", "cali-FORWARD"]);

    // The restarted agent reads the kernel while it renders; reading again is a no-op.
    let mut restarted = mk_auto(&ns);
    assert!(!restarted.has_view());
    restarted.read_kernel().unwrap();
    restarted.read_kernel().unwrap();
    assert!(restarted.has_view());
    // The read and its save are the apply's; a new view is planned whole, whatever the
    // change log says, so the drift is repaired.
    let report = restarted
        .apply_changes(&desired, &iptables::desired::Changes::default())
        .unwrap();
    assert_eq!((report.kernel_reads, report.saves), (1, 1), "{report:?}");
    let filter = &report.iptables[&TableName::Filter];
    assert!(filter.contains("-A cali-FORWARD "), "{filter}");
    assert_in_sync(&ns, Mode::Nft, &desired);
    assert_eq!(restarted.mode().unwrap(), Mode::Nft);
}

#[test]
fn hint_detected_first_apply_only_reads_the_sets() {
    let ns = kernel_netns();
    ns.feed("iptables-nft-restore", &[], HINT);
    let mut a = mk_auto(&ns);
    let report = a.apply(&mk_state()).unwrap();
    assert_eq!((report.kernel_reads, report.saves), (1, 1), "{report:?}");
    assert_eq!(a.mode().unwrap(), Mode::Nft);
    assert_in_sync(&ns, Mode::Nft, &mk_state());
}
