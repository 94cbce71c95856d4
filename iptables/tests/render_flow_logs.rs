//! Flow logs (`RenderConfig::flow_logs`): Felix's flow-log NFLOG rules on every verdict (Allow
//! `A…`, Deny `D…`, Pass `N…`, tier end `DP<I|E>|<tier>`, profile allow/deny, no profile
//! matched), unlimited, group 1 ingress / 2 egress, copying only the headers (`--nflog-size`),
//! in both layouts (shared verdict chains and Felix's inlined one). With `--log-denied` too, flow
//! logs supersede it (one NFLOG rule per verdict, never a rate-limited one). Off: not one byte
//! changes. The kernel part loads the payload into a namespace this test creates (root).

mod render_support;

use calc_graph::proto::*;
use felixrs_test_support::netns::Netns;
use iptables::desired::TableName;
use iptables::render::{DenyLog, RenderConfig, Renderer};
use render_support::*;

fn renderer(flow_logs: bool, deny_log: Option<DenyLog>, share_chains: bool) -> Renderer {
    let mut r = Renderer::new(RenderConfig {
        flow_logs,
        deny_log,
        share_chains,
        ..RenderConfig::default()
    })
    .unwrap();
    let web = mk_np("prod", "web");
    let pass = mk_np("prod", "pass");
    let rule = |action, port| ParsedRule {
        action: Some(action),
        protocol: Some(Protocol::Tcp),
        dst_ports: ports(&[(port, port)]),
        ..Default::default()
    };
    let outputs = vec![
        Output::PolicyUpdated(mk_policy(
            pass.clone(),
            vec![rule(Action::Pass, 8080)],
            vec![],
        )),
        Output::PolicyUpdated(mk_policy(
            web.clone(),
            vec![rule(Action::Deny, 22), rule(Action::Allow, 80)],
            vec![],
        )),
        Output::ProfileUpdated(mk_profile("kns.prod", vec![mk_allow()], vec![mk_allow()])),
        Output::EndpointUpdated(mk_endpoint(
            "prod",
            "web-0",
            "cali1234567890a",
            &["10.1.0.1/32"],
            vec![
                mk_tier("security", vec![pass], vec![]),
                mk_tier("default", vec![web], vec![]),
            ],
            &["kns.prod"],
        )),
        Output::InSync,
    ];
    assert!(r.apply_all(outputs).is_empty());
    assert!(r.flush().is_empty());
    r
}

fn filter_text(r: &Renderer) -> String {
    let mut d4 = r.desired(IpVersion::V4).clone();
    d4.tables.retain(|t, _| *t == TableName::Filter);
    restore_text(&d4)
}

fn nflog_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.contains("NFLOG")).collect()
}

#[test]
fn every_verdict_is_logged_unlimited_with_headers_only_in_both_layouts() {
    for shared in [true, false] {
        let r = renderer(true, None, shared);
        let text = filter_text(&r);
        let logs = nflog_lines(&text);
        let has = |prefix: &str, group: u16| {
            logs.iter().any(|l| {
                l.contains(&format!("--nflog-prefix \"{prefix}\" "))
                    && l.contains(&format!("--nflog-group {group} "))
                    && l.contains("--nflog-size 80")
            })
        };
        for prefix in [
            "NPI0|np/prod/pass",
            "DPI0|np/prod/web",
            "API1|np/prod/web",
            "DPI|default",
            "ARI0|kns.prod",
            "DRI|__NO_MATCH__",
        ] {
            assert!(has(prefix, 1), "shared={shared}: no {prefix}:\n{text}");
        }
        for prefix in ["ARE0|kns.prod", "DRE|__NO_MATCH__"] {
            assert!(has(prefix, 2), "shared={shared}: no {prefix}:\n{text}");
        }
        assert!(
            !logs.iter().any(|l| l.contains("-m limit")),
            "flow-log rules are never rate-limited:\n{text}"
        );
        assert!(assert_parses_back(&r, IpVersion::V4) > 0);
    }
}

#[test]
fn flow_logs_supersede_deny_logging() {
    for shared in [true, false] {
        let both = filter_text(&renderer(true, Some(DenyLog::default()), shared));
        let flow = filter_text(&renderer(true, None, shared));
        assert_eq!(both, flow, "shared={shared}");
    }
}

#[test]
fn flow_logs_are_off_by_default() {
    for shared in [true, false] {
        assert!(!RenderConfig::default().flow_logs);
        let off = filter_text(&renderer(false, None, shared));
        assert!(nflog_lines(&off).is_empty(), "{off}");
        let deny_only = filter_text(&renderer(false, Some(DenyLog::default()), shared));
        assert!(
            nflog_lines(&deny_only)
                .iter()
                .all(|l| l.contains("-m limit") && !l.contains("--nflog-size")),
            "{deny_only}"
        );
    }
}

#[test]
fn the_kernel_takes_the_flow_log_rules() {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&[
        "ip",
        "iptables-legacy-restore",
        "iptables-legacy-save",
        "iptables-nft-restore",
        "iptables-nft-save",
    ]);
    let text = filter_text(&renderer(true, None, true));
    for (restore, save) in [
        ("iptables-legacy-restore", "iptables-legacy-save"),
        ("iptables-nft-restore", "iptables-nft-save"),
    ] {
        let ns = Netns::with_tag("flowlog");
        ns.feed(restore, &["--noflush"], &text);
        let got = ns.ok(save, &["-t", "filter"]);
        assert!(
            got.lines().any(|l| l.contains("API1|np/prod/web")
                && l.contains("--nflog-group 1")
                && l.contains("--nflog-size 80")),
            "{save}:\n{got}"
        );
        let (parsed, warnings) = iptables::parse::parse_save_lenient(&got).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(parsed.render(), got);
    }
}
