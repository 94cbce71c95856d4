//! Host endpoints in mangle (preDNAT) and raw (doNotTrack): Felix's chains, the failsafe copies
//! (raw's with the reverse direction), the hooks that exist only while such policy does, and
//! that without it (or after it goes) the state is exactly as before (felix-reference §2.7-§2.9);
//! and every host endpoint's DNAT'd host egress in mangle `cali-POSTROUTING`.

mod render_support;

use calc_graph::proto::{Action, IpVersion, Output, ParsedRule, Protocol};
use iptables::desired::TableName;
use iptables::render::{RenderConfig, Renderer};
use render_support::*;

const V4: IpVersion = IpVersion::V4;
const V6: IpVersion = IpVersion::V6;

fn texts(r: &Renderer, v: IpVersion, table: TableName, chain: &str) -> Vec<String> {
    let d = r.desired(v);
    d.tables[&table]
        .chains
        .get(chain)
        .unwrap_or_else(|| panic!("no chain {chain} in {table:?}"))
        .iter()
        .map(|r| r.restore_spec())
        .collect()
}

fn hooks(r: &Renderer, v: IpVersion, table: TableName) -> Vec<String> {
    let d = r.desired(v);
    d.tables.get(&table).map_or_else(Vec::new, |t| {
        t.hooks
            .iter()
            .map(|h| format!("{} {}", h.kernel_chain, h.rule.restore_spec()))
            .collect()
    })
}

fn deny_port(port: u16) -> ParsedRule {
    ParsedRule {
        action: Some(Action::Deny),
        protocol: Some(Protocol::Tcp),
        dst_ports: ports(&[(port, port)]),
        ..Default::default()
    }
}

/// `node1-eth0` with a preDNAT policy denying tcp/30080 and a doNotTrack policy allowing all.
fn host_tables() -> Vec<Output> {
    let mut hep = mk_host_endpoint("node1-eth0", "eth0", vec![], vec![], &["allow-all"]);
    hep.pre_dnat_tiers = vec![mk_tier("default", vec![mk_gnp("nodeport")], vec![])];
    hep.untracked_tiers = vec![mk_tier(
        "default",
        vec![mk_gnp("untracked")],
        vec![mk_gnp("untracked")],
    )];
    let mut nodeport = mk_policy(mk_gnp("nodeport"), vec![deny_port(30080)], vec![]);
    nodeport.pre_dnat = true;
    let mut untracked = mk_policy(mk_gnp("untracked"), vec![mk_allow()], vec![mk_allow()]);
    untracked.untracked = true;
    vec![
        Output::ProfileUpdated(mk_profile("allow-all", vec![mk_allow()], vec![mk_allow()])),
        Output::PolicyUpdated(nodeport),
        Output::PolicyUpdated(untracked),
        Output::HostEndpointUpdated(hep),
        Output::InSync,
    ]
}

fn rendered(outputs: Vec<Output>) -> Renderer {
    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    assert!(r.apply_all(outputs).is_empty());
    assert!(r.flush().is_empty());
    r
}

fn strip_ids(t: &[String]) -> Vec<String> {
    t.iter()
        .map(|s| {
            let rest = s.split_once("\" ").map_or(s.as_str(), |(_, r)| r);
            rest.to_string()
        })
        .collect()
}

#[test]
fn pre_dnat_policy_is_rendered_in_mangle_before_the_dnat() {
    let r = rendered(host_tables());
    for v in [V4, V6] {
        assert_eq!(
            hooks(&r, v, TableName::Mangle),
            [
                "POSTROUTING -m comment --comment \"cali:O3lYWMrLQYEMJtB5\" -j cali-POSTROUTING",
                "PREROUTING -m comment --comment \"cali:6gwbT8clXdHdC1b1\" -j cali-PREROUTING"
            ],
            "{v:?}"
        );
        assert_eq!(
            strip_ids(&texts(&r, v, TableName::Mangle, "cali-PREROUTING")),
            [
                "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-m mark --mark 0x10000/0x10000 -j ACCEPT",
                "-i cali+ -j ACCEPT",
                "-j cali-from-host-endpoint",
                "-m comment --comment \"Host endpoint policy accepted packet.\" -m mark --mark 0x10000/0x10000 -j ACCEPT",
            ],
            "{v:?}"
        );
        assert_eq!(
            strip_ids(&texts(&r, v, TableName::Mangle, "cali-from-host-endpoint")),
            ["-i eth0 -g cali-fh-eth0"]
        );
        // Failsafe first; no conntrack rules, no end-of-tier drop, no profiles.
        assert_eq!(
            strip_ids(&texts(&r, v, TableName::Mangle, "cali-fh-eth0")),
            [
                "-j cali-failsafe-in",
                "-j MARK --set-xmark 0x0/0x30000",
                "-m comment --comment \"Start of tier default\" -j MARK --set-xmark 0x0/0x20000",
                "-m mark --mark 0x0/0x20000 -j cali-pi-gnp/nodeport",
                "-m comment --comment \"Return if policy accepted\" -m mark --mark 0x10000/0x10000 -j RETURN",
            ]
        );
        let pi = texts(&r, v, TableName::Mangle, "cali-pi-gnp/nodeport");
        assert!(pi.iter().any(|t| t.contains("--dports 30080")), "{pi:?}");
        assert!(pi.iter().any(|t| t.ends_with("-j DROP")), "{pi:?}");
        assert_eq!(
            texts(&r, v, TableName::Mangle, "cali-failsafe-in"),
            texts(&r, v, TableName::Filter, "cali-failsafe-in")
        );
        let d = r.desired(v);
        // The preDNAT policy is never in the filter table.
        assert!(
            !d.tables[&TableName::Filter]
                .chains
                .contains_key("cali-pi-gnp/nodeport")
        );
        assert_parses_back(&r, v);
    }
}

#[test]
fn untracked_policy_is_rendered_in_raw_with_notrack_both_ways() {
    let r = rendered(host_tables());
    for v in [V4, V6] {
        // The ids Felix writes for its raw hooks.
        assert_eq!(
            hooks(&r, v, TableName::Raw),
            [
                "PREROUTING -m comment --comment \"cali:6gwbT8clXdHdC1b1\" -j cali-PREROUTING",
                "OUTPUT -m comment --comment \"cali:tVnHkvAo15HuiPy0\" -j cali-OUTPUT",
            ]
        );
        let pre = strip_ids(&texts(&r, v, TableName::Raw, "cali-PREROUTING"));
        assert_eq!(pre[0], "-j MARK --set-xmark 0x0/0x1b0000", "{pre:?}");
        assert_eq!(pre[1], "-i cali+ -j MARK --set-xmark 0x80000/0x80000");
        assert!(pre[2].contains("-m rpfilter --invert -j DROP"), "{pre:?}");
        assert_eq!(
            pre[3],
            "-m mark --mark 0x0/0x80000 -j cali-from-host-endpoint"
        );
        assert_eq!(pre[4], "-m mark --mark 0x10000/0x10000 -j ACCEPT");
        assert_eq!(
            strip_ids(&texts(&r, v, TableName::Raw, "cali-OUTPUT")),
            [
                "-j MARK --set-xmark 0x0/0x1b0000",
                "-j cali-to-host-endpoint",
                "-m mark --mark 0x10000/0x10000 -j ACCEPT",
            ]
        );
        for (chain, failsafe, policy) in [
            ("cali-fh-eth0", "cali-failsafe-in", "cali-pi-gnp/untracked"),
            ("cali-th-eth0", "cali-failsafe-out", "cali-po-gnp/untracked"),
        ] {
            assert_eq!(
                strip_ids(&texts(&r, v, TableName::Raw, chain)),
                [
                    format!("-j {failsafe}"),
                    "-j MARK --set-xmark 0x0/0x30000".to_string(),
                    "-m comment --comment \"Start of tier default\" -j MARK --set-xmark 0x0/0x20000".to_string(),
                    format!("-m mark --mark 0x0/0x20000 -j {policy}"),
                    "-m mark --mark 0x10000/0x10000 -j NOTRACK".to_string(),
                    "-m comment --comment \"Return if policy accepted\" -m mark --mark 0x10000/0x10000 -j RETURN".to_string(),
                ]
            );
            let p = texts(&r, v, TableName::Raw, policy);
            assert!(p.iter().any(|t| t.contains("0x10000/0x10000")), "{p:?}");
        }
        // raw failsafes: own ports by destination, then the other direction's by source.
        let fin = strip_ids(&texts(&r, v, TableName::Raw, "cali-failsafe-in"));
        assert_eq!(fin.len(), 18, "{fin:?}");
        assert_eq!(fin[0], "-p tcp -m multiport --dports 22 -j ACCEPT");
        assert_eq!(fin[9], "-p udp -m multiport --sports 53 -j ACCEPT");
        let fout = strip_ids(&texts(&r, v, TableName::Raw, "cali-failsafe-out"));
        assert_eq!(fout[0], "-p udp -m multiport --dports 53 -j ACCEPT");
        assert_eq!(fout[9], "-p tcp -m multiport --sports 22 -j ACCEPT");
        assert_parses_back(&r, v);
    }
}

#[test]
fn the_all_interfaces_endpoint_gets_pre_dnat_but_never_raw() {
    let mut outputs = host_tables();
    let Output::HostEndpointUpdated(hep) = &mut outputs[3] else {
        unreachable!()
    };
    hep.interface_name = "*".into();
    let r = rendered(outputs);
    assert_eq!(
        strip_ids(&texts(&r, V4, TableName::Mangle, "cali-from-host-endpoint")),
        ["-g cali-fh-any-interface-at-all"]
    );
    let d = r.desired(V4);
    let raw = &d.tables[&TableName::Raw];
    assert!(!raw.chains.contains_key("cali-OUTPUT"));
    assert!(!raw.chains.contains_key("cali-failsafe-in"));
    assert_eq!(raw.hooks.len(), 1);
}

#[test]
fn removing_the_policies_restores_the_tables_exactly() {
    let plain = rendered(vec![Output::InSync]);
    let mut r = rendered(host_tables());
    r.apply(Output::HostEndpointRemoved("node1-eth0".into()))
        .unwrap();
    for id in ["nodeport", "untracked"] {
        r.apply(Output::PolicyRemoved(mk_gnp(id))).unwrap();
    }
    r.apply(Output::ProfileRemoved("allow-all".into())).unwrap();
    assert!(r.flush().is_empty());
    for v in [V4, V6] {
        assert_eq!(r.desired(v), plain.desired(v), "{v:?}");
    }
}

#[test]
fn a_changed_pre_dnat_policy_is_re_rendered_in_mangle() {
    let mut r = rendered(host_tables());
    let mut p = mk_policy(mk_gnp("nodeport"), vec![deny_port(30081)], vec![]);
    p.pre_dnat = true;
    r.apply(Output::PolicyUpdated(p)).unwrap();
    assert!(r.flush().is_empty());
    let pi = texts(&r, V4, TableName::Mangle, "cali-pi-gnp/nodeport");
    assert!(pi.iter().any(|t| t.contains("--dports 30081")), "{pi:?}");
}

/// `node1-eth0` with a normal egress policy denying tcp/8443 and the `allow-all` profile, and
/// nothing preDNAT or untracked.
fn egress_only() -> Vec<Output> {
    let hep = mk_host_endpoint(
        "node1-eth0",
        "eth0",
        vec![mk_tier("default", vec![], vec![mk_gnp("deny-8443")])],
        vec![],
        &["allow-all"],
    );
    vec![
        Output::ProfileUpdated(mk_profile("allow-all", vec![mk_allow()], vec![mk_allow()])),
        Output::PolicyUpdated(mk_policy(
            mk_gnp("deny-8443"),
            vec![],
            vec![deny_port(8443)],
        )),
        Output::HostEndpointUpdated(hep),
        Output::InSync,
    ]
}

#[test]
fn dnat_host_egress_is_policed_in_mangle_postrouting() {
    let r = rendered(egress_only());
    for v in [V4, V6] {
        assert_eq!(
            hooks(&r, v, TableName::Mangle),
            ["POSTROUTING -m comment --comment \"cali:O3lYWMrLQYEMJtB5\" -j cali-POSTROUTING"],
            "{v:?}"
        );
        assert_eq!(
            strip_ids(&texts(&r, v, TableName::Mangle, "cali-POSTROUTING")),
            [
                "-m mark --mark 0x10000/0x10000 -j RETURN",
                "-j MARK --set-xmark 0x0/0x1b0000",
                "-m conntrack --ctstate DNAT -j cali-to-host-endpoint",
                "-m comment --comment \"Host endpoint policy accepted packet.\" -m mark --mark 0x10000/0x10000 -j RETURN",
            ],
            "{v:?}"
        );
        assert_eq!(
            strip_ids(&texts(&r, v, TableName::Mangle, "cali-to-host-endpoint")),
            ["-o eth0 -g cali-th-eth0"]
        );
        // RETURN is the allow action; failsafe before any policy; end-of-tier and profile drops.
        let th = strip_ids(&texts(&r, v, TableName::Mangle, "cali-th-eth0"));
        assert_eq!(
            th[..5],
            [
                "-m conntrack --ctstate RELATED,ESTABLISHED -j MARK --set-xmark 0x10000/0x10000",
                "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
                "-m conntrack --ctstate INVALID -j DROP",
                "-j cali-failsafe-out",
                "-j MARK --set-xmark 0x0/0x30000",
            ],
            "{th:?}"
        );
        assert!(
            th.iter().any(|t| t.ends_with("-j cali-po-gnp/deny-8443")),
            "{th:?}"
        );
        assert!(
            th.iter().any(|t| t.ends_with("-j cali-pro-allow-all")),
            "{th:?}"
        );
        assert!(!th.iter().any(|t| t.ends_with("-j ACCEPT")), "{th:?}");
        assert!(th.last().unwrap().ends_with("-j DROP"), "{th:?}");
        let po = texts(&r, v, TableName::Mangle, "cali-po-gnp/deny-8443");
        assert!(po.iter().any(|t| t.contains("--dports 8443")), "{po:?}");
        texts(&r, v, TableName::Mangle, "cali-pro-allow-all");
        assert_eq!(
            texts(&r, v, TableName::Mangle, "cali-failsafe-out"),
            texts(&r, v, TableName::Filter, "cali-failsafe-out")
        );
        let d = r.desired(v);
        let mangle = &d.tables[&TableName::Mangle].chains;
        // Neither preDNAT's side nor the ingress policy chains.
        for absent in [
            "cali-PREROUTING",
            "cali-failsafe-in",
            "cali-from-host-endpoint",
        ] {
            assert!(!mangle.contains_key(absent), "{absent}");
        }
        assert_parses_back(&r, v);
    }
}

#[test]
fn host_egress_shares_cali_postrouting_with_the_dns_hold_and_leaves_it_as_it_was() {
    let cfg = || RenderConfig {
        dns_trusted_servers: vec!["10.96.0.10:53".parse().unwrap()],
        ..RenderConfig::default()
    };
    let plain = {
        let mut r = Renderer::new(cfg()).unwrap();
        r.apply_all(vec![Output::InSync]);
        r.flush();
        r
    };
    let mut r = Renderer::new(cfg()).unwrap();
    assert!(r.apply_all(egress_only()).is_empty());
    assert!(r.flush().is_empty());
    let dns = texts(&plain, V4, TableName::Mangle, "cali-POSTROUTING");
    let both = texts(&r, V4, TableName::Mangle, "cali-POSTROUTING");
    // The DNS hold rules first: a response to a pod is queued before the forwarded-traffic RETURN.
    assert_eq!(both[..dns.len()], dns[..]);
    assert_eq!(both.len(), dns.len() + 4);
    assert_eq!(hooks(&r, V4, TableName::Mangle).len(), 1);
    // v6 has no trusted server: the host endpoint rules alone.
    assert_eq!(
        texts(&r, V6, TableName::Mangle, "cali-POSTROUTING").len(),
        4
    );
    r.apply(Output::HostEndpointRemoved("node1-eth0".into()))
        .unwrap();
    r.apply(Output::PolicyRemoved(mk_gnp("deny-8443"))).unwrap();
    r.apply(Output::ProfileRemoved("allow-all".into())).unwrap();
    assert!(r.flush().is_empty());
    for v in [V4, V6] {
        assert_eq!(r.desired(v), plain.desired(v), "{v:?}");
    }
}

#[test]
fn a_changed_profile_is_re_rendered_in_mangle() {
    let mut r = rendered(egress_only());
    r.apply(Output::ProfileUpdated(mk_profile(
        "allow-all",
        vec![mk_allow()],
        vec![deny_port(9999)],
    )))
    .unwrap();
    assert!(r.flush().is_empty());
    let pro = texts(&r, V4, TableName::Mangle, "cali-pro-allow-all");
    assert!(pro.iter().any(|t| t.contains("--dports 9999")), "{pro:?}");
}
