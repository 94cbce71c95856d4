//! Host endpoints in the filter table: Felix's chains, dispatch, failsafes (felix-reference
//! §2.2, §2.7, §2.9), the ids Felix wrote for the static rules (corpus 002), and that a renderer
//! without host endpoints renders exactly what it rendered before host endpoint support.

mod render_support;

use calc_graph::proto::{IpVersion, Output};
use iptables::desired::TableName;
use iptables::render::host::FailsafePort;
use iptables::render::{RenderConfig, RenderError, Renderer};
use render_support::*;

const V4: IpVersion = IpVersion::V4;
const V6: IpVersion = IpVersion::V6;

fn texts(r: &Renderer, v: IpVersion, chain: &str) -> Vec<String> {
    let d = r.desired(v);
    d.tables[&TableName::Filter]
        .chains
        .get(chain)
        .unwrap_or_else(|| panic!("no chain {chain}"))
        .iter()
        .map(|r| r.restore_spec())
        .collect()
}

fn hashes(r: &Renderer, v: IpVersion, chain: &str) -> Vec<String> {
    let d = r.desired(v);
    d.tables[&TableName::Filter].chains[chain]
        .iter()
        .map(|r| r.hash.clone())
        .collect()
}

fn deny_all_host() -> Vec<Output> {
    let deny = calc_graph::proto::ParsedRule {
        action: Some(calc_graph::proto::Action::Deny),
        ..Default::default()
    };
    vec![
        Output::PolicyUpdated(mk_policy(
            mk_gnp("host-deny"),
            vec![deny.clone()],
            vec![deny],
        )),
        Output::HostEndpointUpdated(mk_host_endpoint(
            "node1-eth0",
            "eth0",
            vec![mk_tier(
                "default",
                vec![mk_gnp("host-deny")],
                vec![mk_gnp("host-deny")],
            )],
            vec![],
            &[],
        )),
        Output::InSync,
    ]
}

fn rendered(cfg: RenderConfig, outputs: Vec<Output>) -> Renderer {
    let mut r = Renderer::new(cfg).unwrap();
    assert!(r.apply_all(outputs).is_empty());
    assert!(r.flush().is_empty());
    r
}

#[test]
/// The rule texts are Felix's `endpointIptablesChain` for a host endpoint; the ids come from the
/// renderer's Felix hash (checked against Felix's own ids in `render_golden.rs` and below).
fn host_endpoint_chains_are_felix_s_with_failsafes_before_any_policy() {
    let r = rendered(RenderConfig::default(), deny_all_host());
    for v in [V4, V6] {
        assert_eq!(
            texts(&r, v, "cali-fh-eth0"),
            [
                "-m comment --comment \"cali:kX91ddsj1Tp4C4VQ\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-m comment --comment \"cali:DYR69dNDT9feLmul\" -m conntrack --ctstate INVALID -j DROP",
                "-m comment --comment \"cali:quxKiSbv8RfxxAso\" -j cali-failsafe-in",
                "-m comment --comment \"cali:RiaJEBeYSpjRjWAh\" -j MARK --set-xmark 0x0/0x30000",
                "-m comment --comment \"cali:bcu4FJeGkUWx-22-\" -m comment --comment \"Start of tier default\" -j MARK --set-xmark 0x0/0x20000",
                "-m comment --comment \"cali:VSPvFEosPgTbFsQP\" -m mark --mark 0x0/0x20000 -j cali-pi-gnp/host-deny",
                "-m comment --comment \"cali:YBlZC1BgHDqnd0iZ\" -m comment --comment \"Return if policy accepted\" -m mark --mark 0x10000/0x10000 -j RETURN",
                "-m comment --comment \"cali:yvs7RdWyBZox5uhX\" -m comment --comment \"End of tier default. Drop if no policies passed packet\" -m mark --mark 0x0/0x20000 -j DROP",
                "-m comment --comment \"cali:6QSpohFuSwu0DHs4\" -m comment --comment \"Drop if no profiles matched\" -j DROP",
            ],
            "{v:?}"
        );
        let th = texts(&r, v, "cali-th-eth0");
        assert!(th[2].ends_with("-j cali-failsafe-out"), "{th:?}");
        assert!(th[5].ends_with("-j cali-po-gnp/host-deny"), "{th:?}");
        // No applyOnForward policy: forwarded traffic through eth0 is allowed.
        for fw in ["cali-fhfw-eth0", "cali-thfw-eth0"] {
            let t = texts(&r, v, fw);
            assert_eq!(t.len(), 5, "{t:?}");
            assert!(!t.iter().any(|r| r.contains("failsafe")), "{t:?}");
            assert!(t[3].contains("Allow forwarded traffic by default"), "{t:?}");
            assert!(
                t[4].contains("Return for accepted forward traffic"),
                "{t:?}"
            );
        }
        let d = r.desired(v);
        let chains = &d.tables[&TableName::Filter].chains;
        assert!(chains.contains_key("cali-pi-gnp/host-deny"));
        assert!(chains.contains_key("cali-po-gnp/host-deny"));
    }
    // Dispatch: a goto per interface, no end rule (other interfaces are not policed).
    assert_eq!(
        texts(&r, V4, "cali-from-host-endpoint"),
        ["-m comment --comment \"cali:HIN_eur26mTLJ97D\" -i eth0 -g cali-fh-eth0"]
    );
    assert_eq!(texts(&r, V4, "cali-to-host-endpoint").len(), 1);
    assert!(texts(&r, V4, "cali-to-hep-forward")[0].contains("-o eth0"));
    assert!(texts(&r, V4, "cali-from-hep-forward")[0].contains("-g cali-fhfw-eth0"));
    // Felix's default failsafe ports; the first id is the one Felix writes for it.
    let fin = texts(&r, V4, "cali-failsafe-in");
    assert_eq!(fin.len(), 9);
    assert_eq!(
        fin[0],
        "-m comment --comment \"cali:wWFQM43tJU7wwnFZ\" -p tcp -m multiport --dports 22 -j ACCEPT"
    );
    assert!(
        fin[1].contains("-p udp -m multiport --dports 68"),
        "{fin:?}"
    );
    assert_eq!(texts(&r, V4, "cali-failsafe-out").len(), 9);
}

/// The static rules with host endpoints carry the ids a live Felix wrote (corpus 002): in
/// `cali-FORWARD`, the from-hep-forward jump and the to-hep-forward jump.
#[test]
fn static_host_rules_have_felix_s_ids() {
    let r = rendered(RenderConfig::default(), deny_all_host());
    let fwd = hashes(&r, V4, "cali-FORWARD");
    assert_eq!(
        fwd,
        [
            "W_vvds1Nw3n9QE2f",
            "ZfgmjuiLaA8Pg0kp",
            "tAzwBLPaV-j53OOZ",
            "4Z0Pf0byo05NFe-P",
            "hQ7Oc16wmUtLuneJ"
        ]
    );
    let input = texts(&r, V4, "cali-INPUT");
    assert!(
        input[3].ends_with("-j cali-from-host-endpoint"),
        "{input:?}"
    );
    assert!(input[4].contains("Host endpoint policy accepted packet."));
    let output = texts(&r, V4, "cali-OUTPUT");
    assert!(
        output[3].ends_with("-m conntrack ! --ctstate DNAT -j cali-to-host-endpoint"),
        "{output:?}"
    );
    assert!(output[4].contains("Host endpoint policy accepted packet."));
    for v in [V4, V6] {
        assert_parses_back(&r, v);
    }
}

#[test]
fn without_host_endpoints_the_output_is_unchanged_and_removing_the_last_restores_it() {
    let plain = Renderer::new(RenderConfig::default()).unwrap();
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    assert!(r.apply_all(deny_all_host()).is_empty());
    assert!(r.flush().is_empty());
    assert_ne!(r.desired(V4), plain.desired(V4));
    r.apply(Output::HostEndpointRemoved("node1-eth0".into()))
        .unwrap();
    r.apply(Output::PolicyRemoved(mk_gnp("host-deny"))).unwrap();
    assert!(r.flush().is_empty());
    for v in [V4, V6] {
        assert_eq!(r.desired(v), plain.desired(v), "{v:?}");
    }
}

#[test]
fn the_all_interfaces_endpoint_is_the_dispatch_default() {
    let allow = mk_policy(mk_gnp("fwd"), vec![mk_allow()], vec![]);
    let r = rendered(
        RenderConfig::default(),
        vec![
            Output::PolicyUpdated(allow),
            Output::ProfileUpdated(mk_profile(
                "projectcalico-default-allow",
                vec![mk_allow()],
                vec![mk_allow()],
            )),
            Output::HostEndpointUpdated(mk_host_endpoint(
                "node1-auto-hep",
                "*",
                vec![mk_tier("default", vec![mk_gnp("fwd")], vec![])],
                vec![mk_tier("default", vec![mk_gnp("fwd")], vec![])],
                &["projectcalico-default-allow"],
            )),
            Output::HostEndpointUpdated(mk_host_endpoint(
                "node1-eth1",
                "eth1",
                vec![],
                vec![],
                &[],
            )),
            Output::InSync,
        ],
    );
    let from = texts(&r, V4, "cali-from-host-endpoint");
    assert_eq!(from.len(), 2, "{from:?}");
    assert!(from[0].contains("-i eth1") && from[0].ends_with("-g cali-fh-eth1"));
    assert!(
        from[1].ends_with("-g cali-fh-any-interface-at-all"),
        "{from:?}"
    );
    let to = texts(&r, V4, "cali-to-host-endpoint");
    assert!(to[1].ends_with("-g cali-th-any-interface-at-all"), "{to:?}");
    let fwd = texts(&r, V4, "cali-from-hep-forward");
    let all_fw =
        iptables::render::host::hep_chain_name(iptables::render::host::HepChain::FromForward, "*");
    assert!(fwd[1].ends_with(&format!("-g {all_fw}")), "{fwd:?}");
    // The applyOnForward policy is in the all-interfaces endpoint's forward ingress chain.
    assert!(
        texts(&r, V4, &all_fw)
            .iter()
            .any(|t| t.contains("cali-pi-gnp/fwd"))
    );
    let fh = texts(&r, V4, "cali-fh-any-interface-at-all");
    let profile = iptables::render::names::profile_chain_name("projectcalico-default-allow", true);
    assert!(
        fh.iter().any(|t| t.ends_with(&format!("-j {profile}"))),
        "{fh:?}"
    );
    // eth1's endpoint has no policy and no profile: everything but the failsafes is dropped.
    let eth1 = texts(&r, V4, "cali-fh-eth1");
    assert!(eth1[2].ends_with("-j cali-failsafe-in"));
    assert!(eth1.last().unwrap().contains("Drop if no profiles matched"));
}

#[test]
fn failsafe_ports_are_configurable_per_family_and_can_be_turned_off() {
    let cfg = RenderConfig {
        failsafe_inbound: vec![
            "tcp:22".parse::<FailsafePort>().unwrap(),
            "udp:10.0.0.0/8:53".parse().unwrap(),
            "tcp:[fd00::/8]:2222".parse().unwrap(),
        ],
        failsafe_outbound: vec![],
        ..RenderConfig::default()
    };
    let r = rendered(cfg, deny_all_host());
    let v4 = texts(&r, V4, "cali-failsafe-in");
    assert_eq!(v4.len(), 2, "{v4:?}");
    assert!(
        v4[1].contains("-s 10.0.0.0/8") && v4[1].contains("--dports 53"),
        "{v4:?}"
    );
    let v6 = texts(&r, V6, "cali-failsafe-in");
    assert_eq!(v6.len(), 2, "{v6:?}");
    assert!(
        v6[1].contains("-s fd00::/8") && v6[1].contains("--dports 2222"),
        "{v6:?}"
    );
    assert!(texts(&r, V4, "cali-failsafe-out").is_empty());
}

#[test]
fn a_bad_interface_name_is_an_error_naming_the_host_endpoint() {
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    let e = r
        .apply(Output::HostEndpointUpdated(mk_host_endpoint(
            "h",
            "eth0;x",
            vec![],
            vec![],
            &[],
        )))
        .unwrap_err();
    assert!(matches!(e, RenderError::InvalidHostInterface { .. }));
    assert!(
        e.to_string()
            .starts_with("host endpoint h: invalid interfaceName"),
        "{e}"
    );
    assert!(r.flush().is_empty());
    assert!(r.chain(V4, TableName::Filter, "cali-failsafe-in").is_none());
}

fn addrs(ifaces: &[(&str, &[&str])]) -> std::collections::BTreeMap<String, Vec<std::net::IpAddr>> {
    ifaces
        .iter()
        .map(|(i, a)| {
            (
                i.to_string(),
                a.iter().map(|a| a.parse().unwrap()).collect(),
            )
        })
        .collect()
}

fn chains_of(r: &Renderer, v: IpVersion, table: TableName, prefix: &str) -> Vec<String> {
    let d = r.desired(v);
    d.tables.get(&table).map_or_else(Vec::new, |t| {
        (t.chains.keys().filter(|c| c.starts_with(prefix)))
            .cloned()
            .collect()
    })
}

#[test]
fn an_endpoint_without_interface_name_follows_its_expected_ips() {
    let plain = rendered(RenderConfig::default(), vec![Output::InSync]);
    let mut hep = mk_host_endpoint("a-by-ip", "", vec![], vec![], &["allow-all"]);
    hep.ipv4_addrs = vec!["192.0.2.5".parse().unwrap()];
    hep.ipv6_addrs = vec!["2001:db8::5".parse().unwrap()];
    let mut r = rendered(
        RenderConfig::default(),
        vec![
            Output::ProfileUpdated(mk_profile("allow-all", vec![mk_allow()], vec![mk_allow()])),
            Output::HostEndpointUpdated(hep),
            Output::InSync,
        ],
    );
    // Its addresses are on no interface: not programmed (the tables are as without it), and
    // reported.
    assert!(r.needs_host_interfaces());
    assert_eq!(r.unresolved_host_endpoints(), ["a-by-ip"]);
    for v in [V4, V6] {
        assert_eq!(r.desired(v), plain.desired(v), "{v:?}");
    }

    // An interface carries the v6 address (and the v4 address is elsewhere: both match).
    r.set_host_interfaces(addrs(&[
        ("eth1", &["198.51.100.1", "2001:db8::5"]),
        ("eth2", &["192.0.2.5"]),
        ("lo", &["127.0.0.1"]),
    ]));
    assert!(r.flush().is_empty());
    assert!(r.unresolved_host_endpoints().is_empty());
    for v in [V4, V6] {
        assert_eq!(
            chains_of(&r, v, TableName::Filter, "cali-fh-"),
            ["cali-fh-eth1", "cali-fh-eth2"],
            "{v:?}"
        );
        assert_eq!(
            chains_of(&r, v, TableName::Mangle, "cali-th-"),
            ["cali-th-eth1", "cali-th-eth2"]
        );
        let fh = texts(&r, v, "cali-fh-eth1");
        assert!(
            fh.iter().any(|t| t.ends_with("-j cali-pri-allow-all")),
            "{fh:?}"
        );
        let dispatch = texts(&r, v, "cali-from-host-endpoint");
        assert!(
            dispatch.iter().any(|t| t.contains("-i eth1 ")),
            "{dispatch:?}"
        );
        assert_parses_back(&r, v);
    }

    // An endpoint naming eth1 wins it over the address match, though its name sorts later.
    r.apply(Output::HostEndpointUpdated(mk_host_endpoint(
        "z-named",
        "eth1",
        vec![],
        vec![],
        &[],
    )))
    .unwrap();
    assert!(r.flush().is_empty());
    let fh = texts(&r, V4, "cali-fh-eth1");
    assert!(
        !fh.iter().any(|t| t.contains("cali-pri-allow-all")),
        "{fh:?}"
    );
    let fh2 = texts(&r, V4, "cali-fh-eth2");
    assert!(
        fh2.iter().any(|t| t.ends_with("-j cali-pri-allow-all")),
        "{fh2:?}"
    );

    // The address moves: the endpoint follows it, and leaves the interface it left.
    r.set_host_interfaces(addrs(&[("eth3", &["192.0.2.5"])]));
    assert!(r.flush().is_empty());
    assert_eq!(
        chains_of(&r, V4, TableName::Filter, "cali-fh-"),
        ["cali-fh-eth1", "cali-fh-eth3"]
    );

    // Gone from every interface, then removed: the tables are as before.
    r.apply(Output::HostEndpointRemoved("z-named".into()))
        .unwrap();
    r.set_host_interfaces(addrs(&[]));
    assert!(r.flush().is_empty());
    assert_eq!(r.unresolved_host_endpoints(), ["a-by-ip"]);
    for v in [V4, V6] {
        assert_eq!(r.desired(v), plain.desired(v), "{v:?}");
    }
}
