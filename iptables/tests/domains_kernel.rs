//! FQDN egress policy on the real kernel (issue 16), in a throwaway network namespace: a domain
//! rule's sets are created as `hash:ip ... timeout 0` and filled with the learned members and
//! their timeouts before the rules that reference them; a member the learner adds behind the
//! applier's back survives re-applies and drift checks; the mangle DNS hold and its hook are
//! programmed; removing the policy removes the rules and then destroys the sets; `cleanup`
//! removes the mangle chain and hook too. The kernel trace reads the domain set's contents.
//! Needs root and iptables/ipset (CI has them); fails loudly otherwise.

mod render_support;
mod support;

use std::net::IpAddr;
use std::sync::Arc;

use calc_graph::proto::*;
use iptables::apply::{Applier, ApplierConfig, Backend};
use iptables::desired::{IpVersion as V, TableName, ipset};
use iptables::render::trace::{self, Packet};
use iptables::render::trace_kernel::KernelRules;
use iptables::render::{DomainMembers, LearnedAddr, RenderConfig, Renderer};
use render_support::*;
use support::check::{assert_in_sync, save_family, set_header, set_members, set_names};
use support::{kernel_netns, runner};

#[derive(Debug)]
struct Learned(Vec<(&'static str, LearnedAddr)>);

impl DomainMembers for Learned {
    fn learned(&self, patterns: &[DomainPattern]) -> Vec<LearnedAddr> {
        (self.0.iter())
            .filter(|(n, _)| patterns.iter().any(|p| p.matches(n)))
            .map(|(_, a)| *a)
            .collect()
    }
}

fn learned(addr: &str, secs: u32) -> LearnedAddr {
    LearnedAddr {
        addr: addr.parse().unwrap(),
        remaining_secs: secs,
    }
}

const SET: &str = "d:kernel-test-set";
const SET4: &str = "cali40d:kernel-test-set";
const SET6: &str = "cali60d:kernel-test-set";

fn policy(with_domains: bool, extra_port: bool) -> ActivePolicy {
    let mut rules = Vec::new();
    if with_domains {
        rules.push(ParsedRule {
            protocol: Some(Protocol::Tcp),
            dst_ports: ports(&[(443, 443)]),
            dst_domain_ip_set_ids: vec![SET.into()],
            ..mk_allow()
        });
    }
    if extra_port {
        rules.push(ParsedRule {
            protocol: Some(Protocol::Udp),
            dst_ports: ports(&[(53, 53)]),
            ..mk_allow()
        });
    }
    mk_policy(mk_np("prod", "to-example"), vec![], rules)
}

fn start() -> Renderer {
    let mut r = Renderer::new(RenderConfig {
        dns_trusted_servers: vec![
            "10.96.0.10:53".parse().unwrap(),
            "[fd00:96::a]:53".parse().unwrap(),
        ],
        dns_queue_num: 100,
        ..RenderConfig::default()
    })
    .unwrap();
    r.set_domain_members(Arc::new(Learned(vec![
        ("www.example.com", learned("93.184.216.34", 600)),
        ("example.com", learned("2606:2800:220:1::1", 300)),
        ("unrelated.org", learned("1.2.3.4", 600)),
        // A DNS TTL may be up to 2^31 - 1: cut to the kernel's limit, never a failed restore.
        ("huge.example.com", learned("93.184.216.99", u32::MAX)),
    ])));
    let pol = mk_np("prod", "to-example");
    let mut ep = mk_endpoint(
        "prod",
        "web",
        "calia1",
        &["10.0.0.1/32"],
        vec![mk_tier("default", vec![], vec![pol])],
        &["kns.prod"],
    );
    ep.ipv6_nets = vec![net("fd00::1/128")];
    let errors = r.apply_all([
        Output::DomainSetCreated {
            id: SET.into(),
            patterns: vec![
                DomainPattern::parse("*.example.com").unwrap(),
                DomainPattern::parse("example.com").unwrap(),
            ]
            .into(),
        },
        Output::PolicyUpdated(policy(true, false)),
        Output::ProfileUpdated(mk_profile("kns.prod", vec![mk_allow()], vec![mk_allow()])),
        Output::EndpointUpdated(ep),
        Output::InSync,
    ]);
    assert_eq!(errors, vec![]);
    assert_eq!(r.flush(), vec![]);
    r
}

/// `add <set> <member> timeout N` → (member, N).
fn timed_members(ns: &felixrs_test_support::netns::Netns, set: &str) -> Vec<(String, u32)> {
    set_members(ns, set)
        .iter()
        .map(|m| {
            let mut w = m.split_whitespace();
            let addr = w.next().unwrap().to_string();
            assert_eq!(w.next(), Some("timeout"), "{m}: no timeout");
            (addr, w.next().unwrap().parse().unwrap())
        })
        .collect()
}

fn domain_sets_on_the_kernel(backend: Backend) {
    let ns = kernel_netns();
    let mut r = start();
    let mut appliers: Vec<(V, Applier<_>)> = [V::V4, V::V6]
        .into_iter()
        .map(|v| {
            let a = Applier::new(
                runner(&ns),
                ApplierConfig {
                    family: v,
                    backend,
                    ..ApplierConfig::default()
                },
            );
            (v, a)
        })
        .collect();
    for (v, a) in &mut appliers {
        let report = a.apply(&r.desired(*v)).unwrap();
        assert!(report.ipset_updates.contains("timeout 0"), "{report:?}");
        let mode = a.mode().unwrap();
        assert_in_sync(&ns, mode, &r.desired(*v));
    }
    let mode = appliers[0].1.mode().unwrap();

    // Sets: hash:ip with timeout support, created full with the learned members and timeouts.
    for (set, addr, max) in [
        (SET4, "93.184.216.34", 600),
        (SET6, "2606:2800:220:1::1", 300),
    ] {
        assert_eq!(set_header(&ns, set, "Type"), "hash:ip");
        let header = set_header(&ns, set, "Header");
        assert!(header.contains(" timeout 0"), "{header}");
        assert_eq!(set_header(&ns, set, "References"), "1");
        let members: Vec<(String, u32)> = timed_members(&ns, set)
            .into_iter()
            .filter(|m| m.0 != "93.184.216.99")
            .collect();
        assert_eq!(members.len(), 1, "{members:?}");
        assert_eq!(members[0].0, addr);
        assert!(
            members[0].1 > 0 && members[0].1 <= max,
            "{members:?}: timeout from the learner"
        );
    }
    let huge = timed_members(&ns, SET4);
    assert!(
        huge.iter()
            .any(|(a, t)| a == "93.184.216.99" && *t > 2_000_000 && *t <= 2_147_483),
        "{huge:?}"
    );
    // The rule references the set as a destination match.
    let filter = save_family(&ns, mode, V::V4, "filter");
    assert!(
        filter.contains(&format!("-m set --match-set {SET4} dst")),
        "{filter}"
    );
    // The DNS hold: mangle cali-POSTROUTING with its hook at the top of POSTROUTING.
    let mangle = save_family(&ns, mode, V::V4, "mangle");
    let hold: Vec<&str> = mangle
        .lines()
        .filter(|l| l.starts_with("-A cali-POSTROUTING"))
        .collect();
    assert_eq!(hold.len(), 2, "{mangle}");
    assert!(
        hold[0].contains("-s 10.96.0.10/32 -o cali+ -p udp")
            && hold[0].contains("--sport 53")
            && hold[0].contains("--ctdir REPLY")
            && hold[0].contains("-j NFQUEUE --queue-num 100")
            && !hold[0].contains("bypass"),
        "{}",
        hold[0]
    );
    let hook = mangle
        .lines()
        .find(|l| l.starts_with("-A POSTROUTING"))
        .unwrap_or_default();
    assert!(hook.ends_with("-j cali-POSTROUTING"), "{mangle}");
    assert!(save_family(&ns, mode, V::V6, "mangle").contains("-s fd00:96::a/128"));

    // The kernel trace reads the set's contents and names the domain set with the seconds left.
    let pkt = {
        let mut p = Packet::new(
            "10.0.0.1".parse().unwrap(),
            "93.184.216.34".parse().unwrap(),
            6,
            40000,
            443,
        );
        p.in_iface = "calia1".into();
        p.out_iface = "eth0".into();
        p
    };
    let (ruleset, _) = iptables::parse::parse_save_lenient(&filter).unwrap();
    let table = ruleset.table(iptables::model::TableName::Filter).unwrap();
    let sets = ipset::parse_save(V::V4, &ns.ok("ipset", &["save"]));
    let k = KernelRules::new(table, &sets, &pkt);
    let t = trace::trace(&k, "FORWARD", &pkt).unwrap();
    let hits = k.domain_hits(&t, &pkt, &|s| r.domain_set_patterns(s).map(<[_]>::to_vec));
    assert_eq!(hits.len(), 1, "{t:?}");
    assert_eq!(hits[0].set, SET4);
    assert_eq!(hits[0].patterns.len(), 2);
    assert!(hits[0].remaining_secs.is_some_and(|s| s > 0 && s <= 600));
    let mut other = pkt.clone();
    other.dst = "1.2.3.4".parse::<IpAddr>().unwrap();
    let k = KernelRules::new(table, &sets, &other);
    let t = trace::trace(&k, "FORWARD", &other).unwrap();
    assert!(k.domain_hits(&t, &other, &|_| None).is_empty());

    // The learner adds a member behind the applier's back: re-applies, a rule change and the
    // drift check never remove it (nor re-fill the set).
    ns.ok("ipset", &["add", SET4, "10.77.0.1", "timeout", "900"]);
    let (v, a) = &mut appliers[0];
    assert!(a.apply(&r.desired(*v)).unwrap().is_empty());
    r.apply(Output::PolicyUpdated(policy(true, true))).unwrap();
    assert_eq!(r.flush(), vec![]);
    let report = a.apply(&r.desired(*v)).unwrap();
    assert!(report.iptables.contains_key(&TableName::Filter));
    assert!(report.ipset_updates.is_empty(), "{report:?}");
    let (drift, repaired) = a.check_drift(&r.desired(*v), None).unwrap();
    assert!(drift.sets.is_empty(), "{drift:?}");
    assert!(repaired.is_none_or(|rep| rep.ipset_updates.is_empty()));
    a.refresh(&r.desired(*v)).unwrap();
    let members: Vec<String> = timed_members(&ns, SET4).into_iter().map(|m| m.0).collect();
    assert_eq!(members, ["10.77.0.1", "93.184.216.34", "93.184.216.99"]);

    // The DNS hold's hook deleted behind our back is drift, repaired by the fast check.
    let list = mode.list_program(V::V4);
    ns.ok(&list, &["-t", "mangle", "-D", "POSTROUTING", "1"]);
    let (drift, repaired) = a.check_drift(&r.desired(*v), None).unwrap();
    assert!(
        drift.drifted.iter().any(|d| d.contains("POSTROUTING")),
        "{drift:?}"
    );
    assert!(repaired.is_some_and(|rep| rep.iptables.contains_key(&TableName::Mangle)));
    assert_in_sync(&ns, mode, &r.desired(*v));

    // The policy loses its domain rule; the graph then removes the set: rules go first, then
    // the set is destroyed (the kernel refuses to destroy a referenced set).
    r.apply(Output::PolicyUpdated(policy(false, true))).unwrap();
    r.apply(Output::IpSetRemoved(SET.into())).unwrap();
    assert_eq!(r.flush(), vec![]);
    for (v, a) in &mut appliers {
        let report = a.apply(&r.desired(*v)).unwrap();
        assert!(report.undeletable_sets.is_empty(), "{report:?}");
        assert!(
            report.ipset_deletions.contains("destroy cali"),
            "{report:?}"
        );
        assert_in_sync(&ns, a.mode().unwrap(), &r.desired(*v));
    }
    let names = set_names(&ns);
    assert!(!names.iter().any(|n| n == SET4 || n == SET6), "{names:?}");

    // cleanup removes the DNS hold (mangle chain and hook) with everything else of ours.
    ns.ok(
        "iptables-nft",
        &["-t", "mangle", "-A", "POSTROUTING", "-j", "ACCEPT"],
    );
    let plan = iptables::apply::cleanup::plan(&runner(&ns)).unwrap();
    let report = iptables::apply::cleanup::execute(&runner(&ns), &plan);
    assert!(report.failures.is_empty(), "{report:?}");
    for v in [V::V4, V::V6] {
        let mangle = save_family(&ns, mode, v, "mangle");
        assert!(!mangle.contains("cali"), "{mangle}");
    }
    assert!(
        save_family(&ns, iptables::apply::Mode::Nft, V::V4, "mangle")
            .contains("-A POSTROUTING -j ACCEPT"),
        "a foreign mangle rule survives cleanup"
    );
}

#[test]
fn domain_sets_on_the_kernel_nft() {
    domain_sets_on_the_kernel(Backend::Nft);
}

#[test]
fn domain_sets_on_the_kernel_legacy() {
    domain_sets_on_the_kernel(Backend::Legacy);
}

/// Forwarded packets: a pod's egress to a domain rule reaches exactly the learned addresses; an
/// address the learner adds later is reachable at once (no apply), and denied again when its
/// entry expires in the kernel (no agent work).
#[test]
fn a_domain_rule_allows_exactly_the_learned_addresses() {
    use felixrs_test_support::netns::veth;
    use support::tcp;
    let (pod, node, outside) = (kernel_netns(), kernel_netns(), kernel_netns());
    veth(&outside, "fxa", &node, "fxh");
    veth(&pod, "eth0", &node, "cali12345");
    for a in ["10.99.0.1/24", "10.99.0.2/24"] {
        outside.ok("ip", &["addr", "add", a, "dev", "fxa"]);
    }
    outside.ok("ip", &["route", "add", "default", "via", "10.99.0.254"]);
    node.ok("ip", &["addr", "add", "10.99.0.254/24", "dev", "fxh"]);
    node.ok("ip", &["addr", "add", "10.98.0.1/24", "dev", "cali12345"]);
    node.ok("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    pod.ok("ip", &["addr", "add", "10.98.0.2/24", "dev", "eth0"]);
    pod.ok("ip", &["route", "add", "default", "via", "10.98.0.1"]);
    for a in ["10.99.0.1", "10.99.0.2"] {
        tcp::serve(&outside, a, 8080);
    }
    assert!(
        tcp::connects_eventually(&pod, "10.99.0.2", 8080),
        "no routing before policy"
    );

    let mut r = Renderer::new(RenderConfig::default()).unwrap();
    r.set_domain_members(Arc::new(Learned(vec![(
        "api.example.com",
        learned("10.99.0.1", 600),
    )])));
    let pol = mk_np("default", "to-api");
    let rule = ParsedRule {
        protocol: Some(Protocol::Tcp),
        dst_ports: ports(&[(8080, 8080)]),
        dst_domain_ip_set_ids: vec![SET.into()],
        ..mk_allow()
    };
    let ep = mk_endpoint(
        "default",
        "pod",
        "cali12345",
        &["10.98.0.2/32"],
        vec![mk_tier("default", vec![], vec![pol.clone()])],
        &["kns.default"],
    );
    let errors = r.apply_all([
        Output::DomainSetCreated {
            id: SET.into(),
            patterns: vec![DomainPattern::parse("api.example.com").unwrap()].into(),
        },
        Output::PolicyUpdated(mk_policy(pol, vec![], vec![rule])),
        Output::ProfileUpdated(mk_profile(
            "kns.default",
            vec![mk_allow()],
            vec![mk_allow()],
        )),
        Output::EndpointUpdated(ep),
        Output::InSync,
    ]);
    assert_eq!(errors, vec![]);
    assert_eq!(r.flush(), vec![]);
    let mut applier = Applier::new(
        runner(&node),
        ApplierConfig {
            backend: Backend::Nft,
            ..ApplierConfig::default()
        },
    );
    applier.apply(&r.desired(V::V4)).unwrap();

    assert!(
        tcp::connects_eventually(&pod, "10.99.0.1", 8080),
        "learned address denied"
    );
    assert!(
        !tcp::connects(&pod, "10.99.0.2", 8080),
        "an address never in an answer must stay denied"
    );
    // The learner adds an address with a short TTL: allowed at once, without an apply ...
    node.ok("ipset", &["add", SET4, "10.99.0.2", "timeout", "3"]);
    assert!(
        tcp::connects_eventually(&pod, "10.99.0.2", 8080),
        "a newly learned address is denied"
    );
    // ... and denied again once the kernel expired it (polled, with a generous deadline).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while tcp::connects(&pod, "10.99.0.2", 8080) {
        assert!(
            std::time::Instant::now() < deadline,
            "an expired address is still allowed"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        !set_members(&node, SET4)
            .iter()
            .any(|m| m.starts_with("10.99.0.2 "))
    );
    assert!(
        tcp::connects_eventually(&pod, "10.99.0.1", 8080),
        "the unexpired address stays allowed"
    );
}
