//! Another writer races the applier on the real kernel: right before our first write, a real
//! command changes the state our payload was planned against, so the write fails; the applier
//! must re-read, re-plan and succeed on the retry, leaving the kernel exactly as desired.

mod support;

use std::process::Output;
use std::sync::Mutex;
use std::time::Duration;

use felixrs_test_support::netns::Netns;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner, Mode, RunError, Runner};
use iptables::desired::{IpSetKind, IpSetSpec, TableName};
use support::check::{assert_in_sync, set_members};
use support::desired::{SET_WEB, mk_net, mk_rules, mk_state};
use support::{kernel_netns, runner};

/// Runs everything for real; before the first call of `trigger`, runs `race` (once).
struct RacingRunner {
    inner: ExecRunner,
    trigger: &'static str,
    race: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Runner for RacingRunner {
    fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<Output, RunError> {
        if program == self.trigger
            && let Some(race) = self.race.lock().unwrap().take()
        {
            race();
        }
        self.inner.run(program, args, stdin)
    }
}

fn mk_racing(
    ns: &Netns,
    trigger: &'static str,
    race: impl FnOnce() + Send + 'static,
) -> Applier<RacingRunner> {
    Applier::new(
        RacingRunner {
            inner: runner(ns),
            trigger,
            race: Mutex::new(Some(Box::new(race))),
        },
        ApplierConfig {
            backend: Backend::Nft,
            initial_backoff: Duration::from_millis(1),
            ..ApplierConfig::default()
        },
    )
}

#[test]
fn iptables_write_that_loses_a_race_is_replanned_and_retried() {
    let ns = kernel_netns();
    let name = ns.name().to_string();
    let mut applier = mk_racing(&ns, "iptables-nft-restore", || {});
    let mut desired = mk_state();
    applier.apply(&desired).unwrap();

    // Next apply deletes the last rule of cali-OUTPUT by index; the racer flushes the chain first.
    let mut applier = mk_racing(&ns, "iptables-nft-restore", move || {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &name, "iptables-nft", "-F", "cali-OUTPUT"])
            .output()
            .unwrap();
        assert!(out.status.success());
    });
    applier.apply(&desired).unwrap(); // first read of this applier: nothing to do
    let filter = desired.tables.get_mut(&TableName::Filter).unwrap();
    filter.chains.insert(
        "cali-OUTPUT".into(),
        mk_rules("cali-OUTPUT", &["-m mark --mark 0x10000/0x10000 -j ACCEPT"]),
    );
    let report = applier.apply(&desired).unwrap();
    assert_eq!(report.retries, 1, "{report:?}");
    assert_eq!(report.kernel_reads, 1, "the retry re-reads the table");
    assert!(report.iptables[&TableName::Filter].contains("-A cali-OUTPUT "));
    assert_in_sync(&ns, Mode::Nft, &desired);
    assert!(applier.refresh(&desired).unwrap().is_empty());
}

#[test]
fn ipset_write_that_loses_a_race_is_replanned_and_retried() {
    let ns = kernel_netns();
    let name = ns.name().to_string();
    let mut desired = mk_state();
    desired.ip_sets.insert(
        "cali40s:spare".into(),
        IpSetSpec::new(IpSetKind::Net, [mk_net("10.5.0.0/16")]),
    );
    let mut applier = mk_racing(&ns, "ipset", || {});
    applier.apply(&desired).unwrap();
    // Arm the race once the view is read: the next ipset call (our phase 1 delta) finds the
    // set it adds to destroyed by someone else.
    *applier.runner().race.lock().unwrap() = Some(Box::new(move || {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &name, "ipset", "destroy", "cali40s:spare"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }));
    let spare = desired.ip_sets.get_mut("cali40s:spare").unwrap();
    spare.members.insert(mk_net("10.6.0.0/16"));
    let web = desired.ip_sets.get_mut(SET_WEB).unwrap();
    web.members.insert(mk_net("10.65.0.9/32"));
    let report = applier.apply(&desired).unwrap();
    assert_eq!(report.retries, 1, "{report:?}");
    assert!(
        report.ipset_updates.starts_with("create cali40s:spare"),
        "{}",
        report.ipset_updates
    );
    assert_eq!(
        set_members(&ns, "cali40s:spare"),
        ["10.5.0.0/16", "10.6.0.0/16"]
    );
    assert!(set_members(&ns, SET_WEB).contains(&"10.65.0.9".to_string()));
    assert!(applier.refresh(&desired).unwrap().is_empty());
}
