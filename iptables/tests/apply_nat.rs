//! The nat table on the kernel: the renderer's nat-outgoing (from IP pools) applied next to
//! kube-proxy and Docker nat rules, on both backends. Foreign rules survive every apply byte for
//! byte, our POSTROUTING hook stays after kube-proxy's, a pool change writes only IP set members,
//! and removing the last masquerading pool empties the chain and then destroys the pool sets.

mod support;

use std::time::Duration;

use calc_graph::proto::{IpPool, IpVersion, Output};
use felixrs_test_support::netns::Netns;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner, Mode};
use iptables::desired::TableName;
use iptables::render::{RenderConfig, Renderer};
use support::check::{assert_in_sync, foreign_lines, rules_of, save, set_members, set_names};
use support::{kernel_netns, runner};

const KUBE_AND_DOCKER: &str = "*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-ERIFXISQEP7F7OF4 - [0:0]
:KUBE-SEP-ERIFXISQEP7F7OF4 - [0:0]
:DOCKER - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A DOCKER -i docker0 -j RETURN
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-SVC-ERIFXISQEP7F7OF4
-A KUBE-SVC-ERIFXISQEP7F7OF4 ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SVC-ERIFXISQEP7F7OF4 -m comment --comment \"kube-system/kube-dns:dns -> 10.244.1.5:53\" -j KUBE-SEP-ERIFXISQEP7F7OF4
-A KUBE-SEP-ERIFXISQEP7F7OF4 -s 10.244.1.5/32 -m comment --comment \"kube-system/kube-dns:dns\" -j KUBE-MARK-MASQ
-A KUBE-SEP-ERIFXISQEP7F7OF4 -p udp -m comment --comment \"kube-system/kube-dns:dns\" -m udp -j DNAT --to-destination 10.244.1.5:53
COMMIT
";

fn pool(name: &str, cidr: &str, masquerade: bool) -> Output {
    Output::IpPoolUpdated(IpPool {
        name: name.into(),
        cidr: cidr.parse().unwrap(),
        masquerade,
        load_balancer_only: false,
    })
}

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

fn nat_next_to_kube_proxy(mode: Mode) {
    let ns = kernel_netns();
    ns.feed(
        &mode.restore_program(IpVersion::V4),
        &["--noflush"],
        KUBE_AND_DOCKER,
    );
    let foreign = foreign_lines(&save(&ns, mode, "nat"));
    assert!(foreign.iter().any(|l| l.contains("DNAT --to-destination")));

    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    r.apply_all([
        pool("pods", "10.244.0.0/16", true),
        pool("plain", "10.245.0.0/16", false),
        Output::InSync,
    ]);
    r.flush();
    let mut applier = mk_applier(&ns, mode);
    let desired = r.desired(IpVersion::V4);
    let first = applier.apply(&desired).unwrap();
    assert!(first.iptables.contains_key(&TableName::Nat), "{first:?}");
    assert_in_sync(&ns, mode, &desired);
    let nat = save(&ns, mode, "nat");
    assert_eq!(foreign_lines(&nat), foreign, "{nat}");
    let masq = rules_of(&nat, "cali-nat-outgoing");
    assert_eq!(masq.len(), 1, "{nat}");
    assert!(
        masq[0].ends_with("-m set --match-set cali40masq-ipam-pools src -m set ! --match-set cali40all-ipam-pools dst -j MASQUERADE --random-fully"),
        "{}",
        masq[0]
    );
    // Our POSTROUTING hook is appended after kube-proxy's and Docker's rules.
    let post = rules_of(&nat, "POSTROUTING");
    assert!(
        post.last().unwrap().contains("-j cali-POSTROUTING"),
        "{post:#?}"
    );
    assert!(post[0].contains("KUBE-POSTROUTING"), "{post:#?}");
    assert_eq!(set_members(&ns, "cali40masq-ipam-pools"), ["10.244.0.0/16"]);
    assert_eq!(
        set_members(&ns, "cali40all-ipam-pools"),
        ["10.244.0.0/16", "10.245.0.0/16"]
    );
    assert!(applier.apply(&desired).unwrap().is_empty());

    // A pool change writes IP set members only: no iptables transaction.
    r.apply(pool("plain", "10.245.0.0/16", true)).unwrap();
    r.flush();
    let desired = r.desired(IpVersion::V4);
    let report = applier.apply(&desired).unwrap();
    assert!(report.iptables.is_empty(), "{report:?}");
    assert!(report.ipset_updates.contains("10.245.0.0/16"), "{report:?}");
    assert_eq!(
        set_members(&ns, "cali40masq-ipam-pools"),
        ["10.244.0.0/16", "10.245.0.0/16"]
    );
    assert_eq!(foreign_lines(&save(&ns, mode, "nat")), foreign);

    // Something inserts above our PREROUTING hook: a refresh moves ours back on top and keeps it.
    ns.feed(
        &mode.restore_program(IpVersion::V4),
        &["--noflush"],
        "*nat\n-I PREROUTING 1 -s 192.0.2.0/24 -j RETURN\nCOMMIT\n",
    );
    let foreign = foreign_lines(&save(&ns, mode, "nat"));
    applier.refresh(&desired).unwrap();
    assert_in_sync(&ns, mode, &desired);
    assert_eq!(foreign_lines(&save(&ns, mode, "nat")), foreign);

    // No masquerading pool left: the rule goes, then the sets (nothing references them).
    r.apply_all([
        pool("pods", "10.244.0.0/16", false),
        pool("plain", "10.245.0.0/16", false),
    ]);
    r.flush();
    let desired = r.desired(IpVersion::V4);
    let report = applier.apply(&desired).unwrap();
    assert!(
        report.ipset_deletions.contains("cali40masq-ipam-pools"),
        "{report:?}"
    );
    assert_in_sync(&ns, mode, &desired);
    let nat = save(&ns, mode, "nat");
    assert!(rules_of(&nat, "cali-nat-outgoing").is_empty(), "{nat}");
    assert!(set_names(&ns).is_empty(), "{:?}", set_names(&ns));
    assert_eq!(foreign_lines(&nat), foreign);
}

#[test]
fn nat_outgoing_next_to_kube_proxy_nft() {
    nat_next_to_kube_proxy(Mode::Nft);
}

#[test]
fn nat_outgoing_next_to_kube_proxy_legacy() {
    nat_next_to_kube_proxy(Mode::Legacy);
}
