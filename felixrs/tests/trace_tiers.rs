//! `felixrs trace` and `render` through admin-style tiers (named as Calico names the tiers of
//! AdminNetworkPolicy and BaselineAdminNetworkPolicy): the trace names the tier, the policy and the
//! action that decided, a Pass and the tier it left, and "end of tier" drops; `render` prints the
//! tier comments.

mod support;

use support::trace::{assert_contains, felixrs, verdict};

const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Namespace
metadata: {name: y, labels: {team: y}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
spec: {nodeName: node-1, containers: [{name: c, image: i}]}
status: {phase: Running, podIPs: [{ip: 10.65.1.10}, {ip: 'fd65:1::10'}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: y, labels: {app: b}}
spec: {nodeName: node-1, containers: [{name: c, image: i}]}
status: {phase: Running, podIPs: [{ip: 10.65.1.11}, {ip: 'fd65:1::11'}]}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: x, labels: {app: c}}
spec: {nodeName: node-1, containers: [{name: c, image: i}]}
status: {phase: Running, podIPs: [{ip: 10.65.1.12}, {ip: 'fd65:1::12'}]}
---
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: adminnetworkpolicy}
spec: {order: 1000, defaultAction: Pass}
---
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: baselineadminnetworkpolicy}
spec: {order: 10000000, defaultAction: Pass}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: adminnetworkpolicy.guard-x}
spec:
  tier: adminnetworkpolicy
  order: 10
  selector: projectcalico.org/namespace == 'x'
  types: [Ingress]
  ingress:
  - {action: Deny, protocol: TCP, destination: {ports: [22]}}
  - {action: Pass, protocol: TCP, destination: {ports: [80]}}
  - {action: Allow, protocol: ICMP, icmp: {type: 8}}
  - {action: Allow, protocol: ICMPv6, icmp: {type: 128}}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: baselineadminnetworkpolicy.default-deny}
spec:
  tier: baselineadminnetworkpolicy
  order: 10
  selector: projectcalico.org/namespace == 'x'
  types: [Ingress]
  ingress:
  - {action: Deny}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-8080, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  ingress: [{ports: [{port: 8080}]}]
"#;

fn manifests() -> tempfile::TempDir {
    support::trace::manifests(&[("cluster.yaml", CLUSTER)])
}

#[test]
fn a_deny_in_the_admin_tier_is_named_with_its_tier() {
    let dir = manifests();
    let text = felixrs(&dir, "trace --from y/b --to x/a --port 22");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert_contains(
        &text,
        &[
            "dropped by ingress of GlobalNetworkPolicy adminnetworkpolicy.guard-x (cali-pi-",
            "): a Deny rule of tier adminnetworkpolicy",
        ],
    );
}

#[test]
fn a_pass_names_the_tier_it_left_and_a_later_tier_decides() {
    let dir = manifests();
    // The default tier's policy allows only 8080: 80 is passed by the admin tier, and the default
    // tier's end drops it before the baseline tier is reached.
    let text = felixrs(&dir, "trace --from y/b --to x/a --port 80");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert_contains(
        &text,
        &[
            "passed by ingress of GlobalNetworkPolicy adminnetworkpolicy.guard-x",
            ": a Pass rule of tier adminnetworkpolicy, on to the next tier",
            ": the end of tier default, whose policies select the endpoint but none allowed, denied or passed the packet",
        ],
    );
    assert!(!text.contains("allowed by ingress"), "{text}");
    // x/c has no policy in the default tier: the baseline tier's Deny decides.
    let text = felixrs(&dir, "trace --from y/b --to x/c --port 80");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert_contains(
        &text,
        &[
            ": a Pass rule of tier adminnetworkpolicy, on to the next tier",
            "dropped by ingress of GlobalNetworkPolicy baselineadminnetworkpolicy.default-deny",
            ": a Deny rule of tier baselineadminnetworkpolicy",
        ],
    );
    assert!(!text.contains("End of tier default"), "{text}");
}

#[test]
fn an_allow_in_the_default_tier_after_an_admin_tier_without_a_match() {
    let dir = manifests();
    let text = felixrs(&dir, "trace --from y/b --to x/a --port 8080");
    assert!(verdict(&text).starts_with("ACCEPT"), "{text}");
    assert_contains(
        &text,
        &[
            "allowed by ingress of NetworkPolicy x/knp.default.only-8080",
            ": an Allow rule of tier default",
        ],
    );
    assert!(!text.contains("passed by"), "{text}");
}

#[test]
fn icmp_types_decide_per_family() {
    let dir = manifests();
    for args in [
        "trace --from y/b --to x/a --protocol icmp",
        "trace --from y/b --to x/a --protocol icmp --ipv6",
    ] {
        let text = felixrs(&dir, args);
        assert!(verdict(&text).starts_with("ACCEPT"), "{args}:\n{text}");
        assert_contains(&text, &[": an Allow rule of tier adminnetworkpolicy"]);
    }
    // An echo reply (type 0) is no echo request: the admin tier does not match, the default
    // tier's policy (TCP 8080 only) ends in its drop.
    let text = felixrs(
        &dir,
        "trace --from y/b --to x/a --protocol icmp --icmp-type 0",
    );
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert_contains(&text, &[": the end of tier default"]);
    // So is every other IP protocol.
    let text = felixrs(&dir, "trace --from y/b --to x/a --protocol 253");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert_contains(&text, &["protocol 253 ", ": the end of tier default"]);
}

#[test]
fn render_shows_the_tier_comments() {
    let dir = manifests();
    let text = felixrs(&dir, "render");
    assert_contains(
        &text,
        &[
            "Start of tier adminnetworkpolicy",
            "Start of tier default",
            "End of tier default. Drop if no policies passed packet",
            "Start of tier baselineadminnetworkpolicy",
            "-m icmp --icmp-type 8",
            "-m icmp6 --icmpv6-type 128",
        ],
    );
    // Tiers whose default action is Pass have no end-of-tier drop.
    assert!(!text.contains("End of tier adminnetworkpolicy"), "{text}");
    assert!(
        !text.contains("End of tier baselineadminnetworkpolicy"),
        "{text}"
    );
    // Tiers in order: admin, default, baseline.
    let pos = |s: &str| text.find(s).unwrap();
    assert!(pos("Start of tier adminnetworkpolicy") < pos("Start of tier default"));
    assert!(pos("Start of tier default") < pos("Start of tier baselineadminnetworkpolicy"));
}
