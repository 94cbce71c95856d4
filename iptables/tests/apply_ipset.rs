//! IP sets through the applier on the real kernel: ordering against the iptables write, member
//! deltas, metadata changes through a temporary set and swap, type changes, and cleanup.

mod support;

use std::time::Duration;

use felixrs_test_support::netns::Netns;
use iptables::apply::{Applier, ApplierConfig, ApplyError, Backend, ExecRunner, Mode};
use iptables::desired::{
    DesiredState, DesiredTable, HookPosition, IpSetKind, IpSetMember, IpSetSpec, IpVersion,
    TableName,
};
use support::check::{assert_in_sync, set_header, set_members, set_names};
use support::desired::{SET_DB, SET_WEB, mk_hook, mk_net, mk_rules, mk_state};
use support::{kernel_netns, runner};

fn mk_applier(ns: &Netns, backend: Backend, family: IpVersion) -> Applier<ExecRunner> {
    Applier::new(
        runner(ns),
        ApplierConfig {
            family,
            backend,
            initial_backoff: Duration::from_millis(1),
            ..ApplierConfig::default()
        },
    )
}

/// A filter table whose only chain matches `set` as source.
fn mk_matching(family: IpVersion, set: &str, kind: IpSetKind) -> DesiredState {
    let mut s = DesiredState::new(family);
    let mut t = DesiredTable::default();
    let dir = match kind {
        IpSetKind::Net | IpSetKind::Domain => "src",
        IpSetKind::IpPort => "src,src",
    };
    let body = format!("-m set --match-set {set} {dir} -j ACCEPT");
    t.chains.insert(
        "cali-INPUT".into(),
        mk_rules("cali-INPUT", &[body.as_str()]),
    );
    t.hooks = vec![mk_hook("INPUT", "-j cali-INPUT", HookPosition::Top)];
    s.tables.insert(TableName::Filter, t);
    let member = match (family, kind) {
        (IpVersion::V4, IpSetKind::Net) => mk_net("10.1.0.0/16"),
        (IpVersion::V6, IpSetKind::Net) => mk_net("fd00:1::/64"),
        (_, IpSetKind::IpPort) => IpSetMember::IpPort {
            addr: "10.1.2.3".parse().unwrap(),
            protocol: calc_graph::proto::Protocol::Tcp,
            port: 8080,
        },
        (_, IpSetKind::Domain) => {
            s.ip_sets.insert(
                set.into(),
                IpSetSpec::domain([("10.1.2.3".parse().unwrap(), 300)]),
            );
            return s;
        }
    };
    s.ip_sets.insert(set.into(), IpSetSpec::new(kind, [member]));
    s
}

#[test]
fn sets_exist_before_rules_use_them_and_go_after_rules_stop() {
    for mode in [Mode::Legacy, Mode::Nft] {
        let backend = if mode == Mode::Legacy {
            Backend::Legacy
        } else {
            Backend::Nft
        };
        let ns = kernel_netns();
        let mut applier = mk_applier(&ns, backend, IpVersion::V4);
        let a = mk_matching(IpVersion::V4, "cali40s:one", IpSetKind::Net);
        applier.apply(&a).unwrap();
        assert_eq!(set_header(&ns, "cali40s:one", "References"), "1");
        // One apply swaps the referenced set for a new one: the new set must exist before the
        // rule that uses it is written, the old one can only go after the rule is gone.
        let b = mk_matching(IpVersion::V4, "cali40s:two", IpSetKind::Net);
        let report = applier.apply(&b).unwrap();
        assert!(
            report
                .ipset_updates
                .starts_with("create cali40s:two hash:net")
        );
        assert_eq!(report.ipset_deletions, "destroy cali40s:one\n");
        assert_eq!(set_names(&ns), ["cali40s:two"]);
        assert_in_sync(&ns, mode, &b);
        assert!(applier.apply(&b).unwrap().is_empty());
    }
}

#[test]
fn member_changes_are_deltas() {
    let ns = kernel_netns();
    let mut applier = mk_applier(&ns, Backend::Nft, IpVersion::V4);
    let mut s = mk_state();
    applier.apply(&s).unwrap();
    let web = s.ip_sets.get_mut(SET_WEB).unwrap();
    web.members.remove(&mk_net("10.65.0.1/32"));
    web.members.insert(mk_net("10.65.0.3/32"));
    web.members.insert(mk_net("0.0.0.0/0"));
    let report = applier.apply(&s).unwrap();
    assert_eq!(
        report.ipset_updates,
        format!(
            "del {SET_WEB} 10.65.0.1\nadd {SET_WEB} 0.0.0.0/1\nadd {SET_WEB} 10.65.0.3\nadd {SET_WEB} 128.0.0.0/1\n"
        )
    );
    assert!(report.iptables.is_empty());
    assert_eq!(
        set_members(&ns, SET_WEB),
        ["0.0.0.0/1", "10.65.0.2", "10.65.0.3", "128.0.0.0/1"]
    );
    assert!(applier.refresh(&s).unwrap().is_empty());
}

#[test]
fn maxelem_change_swaps_in_place_while_referenced() {
    let ns = kernel_netns();
    let mut applier = mk_applier(&ns, Backend::Legacy, IpVersion::V4);
    let mut s = mk_state();
    applier.apply(&s).unwrap();
    assert_eq!(set_header(&ns, SET_DB, "References"), "2");
    s.ip_sets.get_mut(SET_DB).unwrap().maxelem = 4096;
    let report = applier.apply(&s).unwrap();
    assert!(
        report
            .ipset_updates
            .contains(&format!("swap {SET_DB} cali4t0"))
    );
    assert!(
        report.iptables.is_empty(),
        "rules must not change: {report:?}"
    );
    assert!(set_header(&ns, SET_DB, "Header").contains("maxelem 4096"));
    assert_eq!(set_header(&ns, SET_DB, "References"), "2");
    assert_eq!(set_members(&ns, SET_DB), ["10.65.1.0/24"]);
    assert!(!set_names(&ns).iter().any(|n| n.starts_with("cali4t")));
    assert!(applier.refresh(&s).unwrap().is_empty());
}

#[test]
fn type_change_recreates_unreferenced_and_refuses_referenced_sets() {
    let ns = kernel_netns();
    let mut applier = mk_applier(&ns, Backend::Nft, IpVersion::V4);
    let mut s = mk_state();
    s.ip_sets.insert(
        "cali40n:spare".into(),
        IpSetSpec::new(IpSetKind::Net, [mk_net("10.7.0.0/16")]),
    );
    applier.apply(&s).unwrap();
    s.ip_sets.insert(
        "cali40n:spare".into(),
        IpSetSpec::new(
            IpSetKind::IpPort,
            [IpSetMember::IpPort {
                addr: "10.7.0.1".parse().unwrap(),
                protocol: calc_graph::proto::Protocol::Udp,
                port: 53,
            }],
        ),
    );
    applier.apply(&s).unwrap();
    assert_eq!(set_header(&ns, "cali40n:spare", "Type"), "hash:ip,port");
    assert_eq!(set_members(&ns, "cali40n:spare"), ["10.7.0.1,udp:53"]);

    s.ip_sets.get_mut(SET_WEB).unwrap().kind = IpSetKind::IpPort;
    s.ip_sets.get_mut(SET_WEB).unwrap().members.clear();
    let err = applier.apply(&s).unwrap_err();
    assert!(
        matches!(&err, ApplyError::IpSetTypeInUse { set, .. } if set == SET_WEB),
        "{err}"
    );
    assert!(err.to_string().contains(SET_WEB));
    assert_eq!(set_header(&ns, SET_WEB, "Type"), "hash:net");
}

#[test]
fn leftover_sets_go_foreign_sets_stay_and_in_use_sets_are_reported() {
    let ns = kernel_netns();
    ns.feed(
        "ipset",
        &["restore"],
        "create cali40s:leftover hash:net family inet\ncreate cali4t3 hash:net family inet\n\
         create cali40s:pinned hash:net family inet\ncreate cali40s:zz hash:net family inet\n\
         create KUBE-SET hash:ip family inet\ncreate cali60s:v6 hash:net family inet6\n",
    );
    // A foreign rule keeps one of our stale sets in use.
    ns.feed(
        "iptables-nft-restore",
        &["--noflush"],
        "*filter\n-A INPUT -m set --match-set cali40s:pinned src -j DROP\nCOMMIT\n",
    );
    let mut applier = mk_applier(&ns, Backend::Nft, IpVersion::V4);
    let s = mk_state();
    let report = applier.apply(&s).unwrap();
    assert_eq!(report.undeletable_sets, ["cali40s:pinned"]);
    let mut names = set_names(&ns);
    names.sort();
    assert_eq!(
        names,
        ["KUBE-SET", SET_DB, "cali40s:pinned", SET_WEB, "cali60s:v6"]
    );
}

#[test]
fn ipv6_applier_writes_ip6tables_and_cali6_sets_only() {
    let ns = kernel_netns();
    let mut v4 = mk_applier(&ns, Backend::Nft, IpVersion::V4);
    v4.apply(&mk_state()).unwrap();
    let mut v6 = mk_applier(&ns, Backend::Nft, IpVersion::V6);
    let s6 = mk_matching(IpVersion::V6, "cali60s:v6pods", IpSetKind::Net);
    let report = v6.apply(&s6).unwrap();
    assert!(report.ipset_updates.contains("family inet6"));
    let save6 = ns.ok("ip6tables-nft-save", &["-t", "filter"]);
    assert!(save6.contains("--match-set cali60s:v6pods src"), "{save6}");
    assert_eq!(set_members(&ns, "cali60s:v6pods"), ["fd00:1::/64"]);
    // Neither family's applier removes the other's sets.
    assert!(v4.refresh(&mk_state()).unwrap().is_empty());
    assert!(v6.refresh(&s6).unwrap().is_empty());
    assert!(set_names(&ns).contains(&SET_WEB.to_string()));
    // A v4 state handed to the v6 applier is refused.
    assert!(matches!(
        v6.apply(&mk_state()),
        Err(ApplyError::FamilyMismatch { .. })
    ));
}
