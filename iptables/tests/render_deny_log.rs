//! Deny logging (`RenderConfig::deny_log`): a kernel-rate-limited NFLOG rule before every Deny
//! rule's DROP, every tier end and every "no profile matched", with Felix's prefixes and groups;
//! off by default (byte-identical output). Hostile policy names never change the payload's
//! structure or the prefix's. The kernel part loads the payload into a namespace this test
//! creates (root).

mod render_support;

use calc_graph::proto::*;
use felixrs_test_support::netns::Netns;
use iptables::desired::TableName;
use iptables::render::{DenyLog, RenderConfig, Renderer};
use render_support::*;

const HOSTILE: &str = "evil\" -j ACCEPT\n--nflog-prefix x|";

fn renderer(deny_log: Option<DenyLog>) -> Renderer {
    let mut r = Renderer::new(RenderConfig {
        deny_log,
        ..RenderConfig::default()
    })
    .unwrap();
    let web = mk_np("prod", "web");
    let evil = mk_np("prod", HOSTILE);
    let deny = ParsedRule {
        action: Some(Action::Deny),
        protocol: Some(Protocol::Tcp),
        dst_ports: ports(&[(22, 22)]),
        ..Default::default()
    };
    let mut outputs = vec![
        Output::PolicyUpdated(mk_policy(web.clone(), vec![deny.clone()], vec![])),
        Output::PolicyUpdated(mk_policy(evil.clone(), vec![deny], vec![])),
        Output::ProfileUpdated(mk_profile("kns.prod", vec![], vec![mk_allow()])),
    ];
    outputs.push(Output::EndpointUpdated(mk_endpoint(
        "prod",
        "web-0",
        "cali1234567890a",
        &["10.1.0.1/32"],
        vec![mk_tier("default", vec![web, evil], vec![])],
        &["kns.prod"],
    )));
    outputs.push(Output::InSync);
    assert!(r.apply_all(outputs).is_empty());
    assert!(r.flush().is_empty());
    r
}

fn filter_text(r: &Renderer) -> String {
    let d = r.desired(IpVersion::V4);
    let mut d4 = d.clone();
    d4.tables.retain(|t, _| *t == TableName::Filter);
    restore_text(&d4)
}

#[test]
fn denied_packets_are_logged_with_felix_prefixes_before_each_drop() {
    let r = renderer(Some(DenyLog::default()));
    let text = filter_text(&r);
    let nflog: Vec<&str> = text.lines().filter(|l| l.contains("NFLOG")).collect();
    let limit = "-m limit --limit 10/sec --limit-burst 20";
    assert!(
        nflog.iter().any(|l| l.contains("DPI|default")
            && l.contains(limit)
            && l.contains("--nflog-group 1")),
        "no tier-end log:\n{text}"
    );
    assert!(
        nflog
            .iter()
            .any(|l| l.contains("DRE|__NO_MATCH__") && l.contains("--nflog-group 2")),
        "no egress no-profile log:\n{text}"
    );
    assert!(
        nflog
            .iter()
            .any(|l| l.contains("\"DPI0|np/prod/web\"") && l.contains(limit)),
        "no policy deny log:\n{text}"
    );
    // Every NFLOG rule sits right before a DROP (or, shared layout, the goto to the drop chain).
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.contains("NFLOG") {
            let next = lines[i + 1];
            assert!(
                next.ends_with("-j DROP") || next.ends_with("-g cali-verdict-drop"),
                "{l}\n{next}"
            );
        }
    }
    // The hostile name: one line per rule, and the prefix holds only safe characters.
    for l in &nflog {
        let prefix = l.split("--nflog-prefix ").nth(1).unwrap();
        let prefix = prefix.split(' ').next().unwrap().trim_matches('"');
        assert!(prefix.len() <= 63, "{prefix}");
        assert!(
            prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._:/=-|".contains(c)),
            "{prefix:?}"
        );
    }
    assert!(!text.contains("-j ACCEPT\n--nflog"), "{text}");
    assert!(assert_parses_back(&r, IpVersion::V4) > 0);
}

#[test]
fn deny_logging_is_off_by_default() {
    let off = filter_text(&renderer(None));
    assert!(!off.contains("NFLOG"), "{off}");
    let on = filter_text(&renderer(Some(DenyLog::default())));
    // Only NFLOG lines were added (other rules' ids may move after them, and shared chains are
    // named after a hash of their rules, so their names change too).
    let strip = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.contains("NFLOG"))
            .map(|l| {
                l.split(" -m comment --comment \"cali:")
                    .next()
                    .unwrap()
                    .split(' ')
                    .map(|w| {
                        for shared in [":cali-si-", ":cali-so-", "cali-si-", "cali-so-"] {
                            if w.starts_with(shared) {
                                return shared;
                            }
                        }
                        w
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    };
    assert_eq!(strip(&off), strip(&on));
}

#[test]
fn the_kernel_takes_the_deny_log_rules() {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&[
        "ip",
        "iptables-legacy-restore",
        "iptables-legacy-save",
        "iptables-nft-restore",
        "iptables-nft-save",
    ]);
    let r = renderer(Some(DenyLog::default()));
    let text = filter_text(&r);
    for (restore, save) in [
        ("iptables-legacy-restore", "iptables-legacy-save"),
        ("iptables-nft-restore", "iptables-nft-save"),
    ] {
        let ns = Netns::with_tag("denylog");
        ns.feed(restore, &["--noflush"], &text);
        let got = ns.ok(save, &["-t", "filter"]);
        assert!(
            got.lines().any(
                |l| l.contains("-m limit --limit 10/sec --limit-burst 20 -j NFLOG")
                    && l.contains("DPI|default")
                    && l.contains("--nflog-group 1")
            ),
            "{save}:\n{got}"
        );
        let (parsed, warnings) = iptables::parse::parse_save_lenient(&got).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(parsed.render(), got);
    }
}
