//! `felixrs trace` on a rule whose CIDR lists are net sets (shared layout): the set's name hides
//! its CIDRs, so the trace lists them under the rule; with `--share-chains false` the same packet
//! gets the same verdict through Felix's OR block.

mod support;

use std::path::PathBuf;

use support::trace::{felixrs, verdict};

/// The demo cluster plus a security-tier policy (before the tier's Pass-everything policy)
/// denying a list of ranges to every pod, except
/// one address: a positive list (a set) and a negated list beside it (another set).
fn manifests() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-cluster");
    for e in std::fs::read_dir(&demo).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml") {
            std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    std::fs::write(
        dir.path().join("90-lists.yaml"),
        "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata:
  name: security.block-lists
spec:
  tier: security
  order: 5
  selector: projectcalico.org/orchestrator == 'k8s'
  types: [Ingress]
  ingress:
    - action: Deny
      source:
        nets: [203.0.113.0/24, 192.0.2.0/24]
        notNets: [203.0.113.9/32, 203.0.113.10/32]
",
    )
    .unwrap();
    dir
}

fn trace(dir: &tempfile::TempDir, extra: &str, from: &str) -> String {
    felixrs(
        dir,
        &format!("trace --from {from} --to shop/web-0 --port 8080 {extra}"),
    )
}

#[test]
fn trace_lists_the_nets_of_a_rules_sets_and_both_layouts_agree() {
    let dir = manifests();
    let text = trace(&dir, "", "192.0.2.7");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert!(
        text.contains("dropped by ingress of GlobalNetworkPolicy security.block-lists"),
        "{text}"
    );
    let set = |list: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with("set cali40c:") && l.ends_with(list))
            .map(|l| l.trim_start().to_string())
            .unwrap_or_else(|| panic!("no set line holding {list}:\n{text}"))
    };
    let positive = set(" holds 192.0.2.0/24, 203.0.113.0/24");
    let negated = set(" holds 203.0.113.9/32, 203.0.113.10/32");
    // The rule above the lines names both sets, as iptables-save prints it.
    for (line, not) in [(&positive, ""), (&negated, "! ")] {
        let name = line.split_whitespace().nth(1).unwrap();
        assert!(
            text.contains(&format!("-m set {not}--match-set {name} src")),
            "{name}: {text}"
        );
    }
    // Excepted addresses pass the security tier (web allows 8080 from anywhere else); the
    // inlined layout decides every probe the same way, with no set at all.
    for (from, want) in [
        ("192.0.2.7", "DROP"),
        ("203.0.113.5", "DROP"),
        ("203.0.113.9", "ACCEPT"),
        ("198.18.0.1", "ACCEPT"),
    ] {
        for extra in ["", "--share-chains false"] {
            let text = trace(&dir, extra, from);
            assert!(verdict(&text).starts_with(want), "{from} {extra}: {text}");
            // (A rule shows in the trace when it matched: the Deny's sets for the drops.)
            let sets = text.contains("cali40c:");
            assert_eq!(sets, extra.is_empty() && want == "DROP", "{text}");
        }
    }
}
