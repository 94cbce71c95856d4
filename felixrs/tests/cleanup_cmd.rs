//! `felixrs cleanup` on the real kernel, in a throw-away network namespace (root; both backends,
//! both families): a node with foreign rules, chains and sets in every table of both backends,
//! the agent's state programmed by the real applier in one backend and leftovers of ours in the
//! other. `--dry-run` prints what it would remove and changes nothing; cleanup then leaves exactly
//! the foreign state (every save line byte for byte, every foreign set), and a second run finds
//! nothing.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use calc_graph::proto::IpVersion as ProtoIp;
use felixrs::cmd::shared::dataplane_args::DataplaneArgs;
use felixrs::cmd::shared::node_view::{SourceArgs, render_node};
use felixrs_test_support::netns::Netns;
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner, Mode};
use iptables::desired::IpVersion;

const TOOLS: &[&str] = &[
    "ip",
    "ipset",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-legacy-save",
    "ip6tables-legacy-restore",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
];

/// Foreign state in every table: kube-proxy-like chains, a chain whose name starts with "cali"
/// but not "cali-", a rule whose comment mentions `cali:` but not first, a `cali:`-commented rule
/// in a foreign chain (not a hook of ours: we only hook built-in chains), a rule using a foreign
/// set, option-like comment text.
fn foreign_payload(family: IpVersion) -> String {
    let set_rule = match family {
        IpVersion::V4 => "-A OUTPUT -m set --match-set kube-foreign4 dst -j DROP\n",
        IpVersion::V6 => "-A OUTPUT -m set --match-set kube-foreign6 dst -j DROP\n",
    };
    format!(
        "*raw\n\
         :KUBE-RAW - [0:0]\n\
         -A PREROUTING -j KUBE-RAW\n\
         -A KUBE-RAW -p udp --dport 4789 -j NOTRACK\n\
         COMMIT\n\
         *mangle\n\
         :KUBE-IPTABLES-HINT - [0:0]\n\
         -A POSTROUTING -p tcp --dport 53 -j ACCEPT\n\
         COMMIT\n\
         *nat\n\
         :KUBE-SERVICES - [0:0]\n\
         :calico-nat - [0:0]\n\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -j calico-nat\n\
         -A KUBE-SERVICES -p tcp --dport 8080 -j RETURN\n\
         COMMIT\n\
         *filter\n\
         :KUBE-FIREWALL - [0:0]\n\
         :calico-foreign - [0:0]\n\
         -A INPUT -j KUBE-FIREWALL\n\
         -A FORWARD -m comment --comment \"not ours: cali:AAAAAAAAAAAAAAAA\" -j calico-foreign\n\
         -A FORWARD -m comment --comment \"-j ACCEPT --dport 1 \\\"x\" -j ACCEPT\n\
         {set_rule}\
         -A KUBE-FIREWALL -p tcp --dport 10250 -j DROP\n\
         -A calico-foreign -m comment --comment \"cali:BBBBBBBBBBBBBBBB\" -j RETURN\n\
         COMMIT\n"
    )
}

/// Leftovers of an older agent in a backend (as after a backend switch).
const LEFTOVER: &str = "*filter\n\
    :cali-OLD-LEFTOVER - [0:0]\n\
    -A cali-OLD-LEFTOVER -m comment --comment \"cali:CCCCCCCCCCCCCCCC\" -j DROP\n\
    -I FORWARD 1 -m comment --comment \"cali:DDDDDDDDDDDDDDDD\" -j cali-OLD-LEFTOVER\n\
    COMMIT\n\
    *raw\n\
    :cali-OLD-RAW - [0:0]\n\
    -A PREROUTING -m comment --comment \"cali:EEEEEEEEEEEEEEEE\" -j cali-OLD-RAW\n\
    COMMIT\n";

fn families() -> [IpVersion; 2] {
    [IpVersion::V4, IpVersion::V6]
}

/// Every save of both backends and families, comments (timestamps) dropped and built-in chain
/// counters cut; everything else byte for byte.
fn saves(ns: &Netns) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for mode in [Mode::Legacy, Mode::Nft] {
        for family in families() {
            let program = mode.save_program(family);
            let text = ns.ok(&program, &[]);
            let lines = text
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| match l.find(" [") {
                    Some(i) if l.starts_with(':') => l[..i].to_string(),
                    _ => l.to_string(),
                })
                .collect();
            out.push((program, lines));
        }
    }
    out
}

fn set_names(ns: &Netns) -> Vec<String> {
    let mut v: Vec<String> = ns
        .ok("ipset", &["list", "-n"])
        .lines()
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

fn felixrs(ns: &Netns, args: &[&str]) -> Output {
    ns.command(env!("CARGO_BIN_EXE_felixrs"))
        .args(args)
        .output()
        .expect("run felixrs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn program_agent_state(ns: &Netns, mode: Mode) {
    let manifests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-cluster");
    let view = render_node(
        &SourceArgs::manifests(vec![manifests]),
        "node-1",
        &DataplaneArgs::default(),
    )
    .expect("render demo cluster");
    let backend = match mode {
        Mode::Legacy => Backend::Legacy,
        Mode::Nft => Backend::Nft,
    };
    for (family, v) in [(IpVersion::V4, ProtoIp::V4), (IpVersion::V6, ProtoIp::V6)] {
        let desired = view.renderer.desired(v);
        assert!(!desired.tables.is_empty());
        let mut applier = Applier::new(
            ExecRunner::in_netns(ns.name()).unwrap(),
            ApplierConfig {
                family,
                backend,
                initial_backoff: Duration::from_millis(1),
                ..ApplierConfig::default()
            },
        );
        applier.apply(&desired).expect("apply the agent's state");
    }
}

fn cleanup_removes_ours_only(mode: Mode) {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(TOOLS);
    let ns = Netns::with_tag("cleanup");
    ns.ok("ipset", &["create", "kube-foreign4", "hash:ip"]);
    ns.ok("ipset", &["add", "kube-foreign4", "10.9.9.9"]);
    ns.ok(
        "ipset",
        &["create", "kube-foreign6", "hash:ip", "family", "inet6"],
    );
    ns.ok("ipset", &["create", "calico-x", "hash:net"]);
    for m in [Mode::Legacy, Mode::Nft] {
        for family in families() {
            ns.feed(
                &m.restore_program(family),
                &["--noflush"],
                &foreign_payload(family),
            );
        }
    }
    let foreign_saves = saves(&ns);
    let foreign_sets = set_names(&ns);

    program_agent_state(&ns, mode);
    for family in families() {
        ns.feed(
            &mode.other().restore_program(family),
            &["--noflush"],
            LEFTOVER,
        );
    }
    let programmed = saves(&ns);
    assert_ne!(programmed, foreign_saves);
    let ours = mode.save_program(IpVersion::V4);
    let ours_v4 = &programmed.iter().find(|(p, _)| *p == ours).unwrap().1;
    assert!(ours_v4.iter().any(|l| l == ":cali-FORWARD -"));
    let programmed_sets = set_names(&ns);
    assert!(
        programmed_sets.iter().any(|s| s.starts_with("cali40")),
        "{programmed_sets:?}"
    );

    // --dry-run: lists what it would remove, touches nothing.
    let dry = felixrs(&ns, &["cleanup", "--dry-run"]);
    let dry_out = text(&dry.stdout);
    assert!(dry.status.success(), "{}", text(&dry.stderr));
    for want in [
        format!(
            "# {} --noflush (IPv4, filter)",
            mode.restore_program(IpVersion::V4)
        ),
        format!(
            "# {} --noflush (IPv6, filter)",
            mode.restore_program(IpVersion::V6)
        ),
        format!(
            "# {} --noflush (IPv4, raw)",
            mode.other().restore_program(IpVersion::V4)
        ),
        "-X cali-FORWARD".to_string(),
        "-X cali-OLD-LEFTOVER".to_string(),
        "-X cali-OLD-RAW".to_string(),
        "-D FORWARD -m comment --comment \"cali:DDDDDDDDDDDDDDDD\" -j cali-OLD-LEFTOVER"
            .to_string(),
    ] {
        assert!(
            dry_out.contains(&want),
            "dry run lacks {want:?}:\n{dry_out}"
        );
    }
    for set in programmed_sets.iter().filter(|s| s.starts_with("cali")) {
        if set.starts_with("cali4") || set.starts_with("cali6") {
            assert!(dry_out.contains(&format!("destroy {set}\n")), "{dry_out}");
        } else {
            assert!(!dry_out.contains(&format!("destroy {set}\n")), "{dry_out}");
        }
    }
    assert!(!dry_out.contains("calico-foreign"), "{dry_out}");
    assert!(!dry_out.contains("KUBE-"), "{dry_out}");
    assert_eq!(saves(&ns), programmed, "--dry-run changed the kernel");
    assert_eq!(set_names(&ns), programmed_sets, "--dry-run changed ip sets");

    // cleanup: exactly the foreign state remains.
    let run = felixrs(&ns, &["cleanup"]);
    assert!(
        run.status.success(),
        "{}\n{}",
        text(&run.stdout),
        text(&run.stderr)
    );
    assert!(
        text(&run.stdout).contains("removed "),
        "{}",
        text(&run.stdout)
    );
    let after = saves(&ns);
    for ((program, want), (_, got)) in foreign_saves.iter().zip(&after) {
        pretty_assertions::assert_eq!(want, got, "{program} after cleanup");
    }
    assert_eq!(set_names(&ns), foreign_sets);

    // Idempotent: nothing left to remove.
    let again = felixrs(&ns, &["cleanup"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout).trim(), "nothing of ours to remove");
    let dry_again = felixrs(&ns, &["cleanup", "--dry-run"]);
    assert_eq!(
        text(&dry_again.stdout).trim(),
        "# nothing of ours to remove"
    );
}

#[test]
fn cleanup_after_legacy_agent_leaves_foreign_state_byte_for_byte() {
    cleanup_removes_ours_only(Mode::Legacy);
}

#[test]
fn cleanup_after_nft_agent_leaves_foreign_state_byte_for_byte() {
    cleanup_removes_ours_only(Mode::Nft);
}

/// A foreign rule that jumps to one of our chains: the chain is flushed (nothing of ours runs
/// there), kept (deleting it would fail the transaction), and cleanup says so and fails; every
/// other chain and set of ours is still removed.
#[test]
fn cleanup_keeps_a_chain_a_foreign_rule_jumps_to_and_says_so() {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(TOOLS);
    let ns = Netns::with_tag("cleanup");
    program_agent_state(&ns, Mode::Nft);
    ns.feed(
        "iptables-nft-restore",
        &["--noflush"],
        "*filter\n:FOREIGN - [0:0]\n-A FOREIGN -j cali-FORWARD\nCOMMIT\n",
    );
    let run = felixrs(&ns, &["cleanup"]);
    let stderr = text(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("chain cali-FORWARD flushed but kept"),
        "{stderr}"
    );
    let save = ns.ok("iptables-nft-save", &["-t", "filter"]);
    let ours: Vec<&str> = save
        .lines()
        .filter(|l| l.contains("cali-") || l.contains("\"cali:"))
        .collect();
    assert_eq!(
        ours,
        [":cali-FORWARD - [0:0]", "-A FOREIGN -j cali-FORWARD"],
        "{save}"
    );
    assert!(
        !set_names(&ns)
            .iter()
            .any(|s| s.starts_with("cali4") || s.starts_with("cali6"))
    );
}

/// Not root: a clear error, nothing read or written.
#[test]
fn cleanup_refuses_to_run_without_root() {
    felixrs_test_support::require_root();
    felixrs_test_support::require_tools(&["setpriv"]);
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_felixrs"))
        .args(["cleanup", "--dry-run"])
        .output()
        .expect("run setpriv");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("felixrs cleanup: must run as root"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
