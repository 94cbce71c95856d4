//! `felixrs trace` with staged policies (Calico's pending policies): the enforced path as
//! before, and a `staged:` section with the verdict every staged policy, enforced in its tier
//! and order, would give, naming the staged policy that decides. Each staged kind and both
//! staged actions; and a staged policy never changes a rendered byte.

mod support;

use support::trace::{felixrs, verdict};

const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Namespace
metadata: {name: y}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
spec: {nodeName: node-1, containers: [{name: c, image: i}]}
status: {phase: Running, podIPs: [{ip: 10.65.1.10}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: y, labels: {app: b}}
spec: {nodeName: node-1, containers: [{name: c, image: i}]}
status: {phase: Running, podIPs: [{ip: 10.65.1.11}]}
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: web, namespace: x}
spec:
  selector: app == 'a'
  types: [Ingress]
  ingress:
  - {action: Allow, protocol: TCP, destination: {ports: [8080]}}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: guard}
spec:
  order: 10
  selector: projectcalico.org/namespace == 'x'
  types: [Ingress]
  ingress:
  - {action: Deny, protocol: TCP, destination: {ports: [22]}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: k8s-web, namespace: y}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress: [{ports: [{port: 8080}]}]
"#;

fn manifests(staged: &str) -> tempfile::TempDir {
    let mut files = vec![("cluster.yaml", CLUSTER)];
    if !staged.is_empty() {
        files.push(("staged.yaml", staged));
    }
    support::trace::manifests(&files)
}

fn staged_line(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("staged: "))
}

/// The report without its staged section: what `trace` printed before staged policies existed.
fn enforced_part(text: &str) -> String {
    text.lines()
        .take_while(|l| !l.starts_with("staged: "))
        .map(|l| format!("{l}\n"))
        .collect()
}

const STAGED_DENY_ALL: &str = r#"
apiVersion: projectcalico.org/v3
kind: StagedGlobalNetworkPolicy
metadata: {name: deny-all}
spec:
  stagedAction: Set
  order: 1
  selector: all()
  types: [Ingress]
  ingress: [{action: Deny}]
"#;

#[test]
fn without_staged_policies_there_is_no_staged_section() {
    let dir = manifests("");
    let text = felixrs(&dir, "trace --from y/b --to x/a --port 8080");
    assert!(verdict(&text).starts_with("ACCEPT"), "{text}");
    assert_eq!(staged_line(&text), None, "{text}");
}

#[test]
fn a_staged_deny_all_over_an_allow_would_drop_and_changes_nothing_enforced() {
    let plain = manifests("");
    let staged = manifests(STAGED_DENY_ALL);
    let args = "trace --from y/b --to x/a --port 8080";
    let (before, text) = (felixrs(&plain, args), felixrs(&staged, args));
    assert!(verdict(&text).starts_with("ACCEPT"), "{text}");
    assert_eq!(
        enforced_part(&text),
        before,
        "the enforced trace is unchanged"
    );
    assert_eq!(
        staged_line(&text),
        Some("DROP (enforced: ACCEPT), with every staged policy enforced in its tier and order"),
        "{text}"
    );
    assert!(
        text.contains("  dropped by StagedGlobalNetworkPolicy deny-all (tier default)"),
        "{text}"
    );
    // Rendering: not one byte differs (no staged chain, rule or set reaches the kernel).
    assert_eq!(felixrs(&plain, "render"), felixrs(&staged, "render"));
    assert!(!felixrs(&staged, "render").contains("sgnp"));
}

#[test]
fn a_staged_network_policy_replaces_the_enforced_one_of_its_name() {
    let dir = manifests(
        r#"
apiVersion: projectcalico.org/v3
kind: StagedNetworkPolicy
metadata: {name: web, namespace: x}
spec:
  selector: app == 'a'
  types: [Ingress]
  ingress:
  - {action: Allow, protocol: TCP, destination: {ports: [9090]}}
"#,
    );
    // 8080: allowed by the enforced web, which the staged one replaces: the tier's end drops.
    let text = felixrs(&dir, "trace --from y/b --to x/a --port 8080");
    assert!(verdict(&text).starts_with("ACCEPT"), "{text}");
    assert!(staged_line(&text).unwrap().starts_with("DROP"), "{text}");
    assert!(
        text.contains("  dropped at the end of tier default"),
        "{text}"
    );
    // 9090: dropped today, allowed by the staged policy.
    let text = felixrs(&dir, "trace --from y/b --to x/a --port 9090");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert!(staged_line(&text).unwrap().starts_with("ACCEPT"), "{text}");
    assert!(
        text.contains("  allowed by StagedNetworkPolicy x/web (tier default)"),
        "{text}"
    );
    // 22: the guard (not shadowed) still drops first: same as enforced.
    let text = felixrs(&dir, "trace --from y/b --to x/a --port 22");
    assert_eq!(
        staged_line(&text),
        Some("same as enforced (DROP)"),
        "{text}"
    );
    assert!(
        text.contains("  dropped by GlobalNetworkPolicy guard"),
        "{text}"
    );
}

#[test]
fn a_staged_delete_removes_the_enforced_policy_from_the_view() {
    let dir = manifests(
        r#"
apiVersion: projectcalico.org/v3
kind: StagedGlobalNetworkPolicy
metadata: {name: guard}
spec: {stagedAction: Delete}
"#,
    );
    // 22 is dropped by guard; without guard, web (8080 only) is the only policy: still a drop,
    // but at the tier's end.
    let text = felixrs(&dir, "trace --from y/b --to x/a --port 22");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert_eq!(
        staged_line(&text),
        Some("same as enforced (DROP)"),
        "{text}"
    );
    assert!(
        text.contains("  dropped at the end of tier default"),
        "{text}"
    );
    assert!(!text.contains("StagedGlobalNetworkPolicy"), "{text}");
}

#[test]
fn staged_kubernetes_network_policies_set_and_delete() {
    let set = manifests(
        r#"
apiVersion: projectcalico.org/v3
kind: StagedKubernetesNetworkPolicy
metadata: {name: k8s-web, namespace: y}
spec:
  stagedAction: Set
  podSelector: {matchLabels: {app: b}}
  ingress: [{ports: [{port: 9090}]}]
"#,
    );
    let text = felixrs(&set, "trace --from x/a --to y/b --port 9090");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert!(staged_line(&text).unwrap().starts_with("ACCEPT"), "{text}");
    assert!(
        text.contains("  allowed by StagedKubernetesNetworkPolicy y/k8s-web (tier default)"),
        "{text}"
    );
    let text = felixrs(&set, "trace --from x/a --to y/b --port 8080");
    assert!(verdict(&text).starts_with("ACCEPT"), "{text}");
    assert!(staged_line(&text).unwrap().starts_with("DROP"), "{text}");

    let delete = manifests(
        r#"
apiVersion: projectcalico.org/v3
kind: StagedKubernetesNetworkPolicy
metadata: {name: k8s-web, namespace: y}
spec: {stagedAction: Delete}
"#,
    );
    // Without knp.default.k8s-web, y/b has no policy: its profile allows.
    let text = felixrs(&delete, "trace --from x/a --to y/b --port 9090");
    assert_eq!(verdict(&text), "DROP", "{text}");
    assert!(staged_line(&text).unwrap().starts_with("ACCEPT"), "{text}");
    assert!(text.contains("  allowed by profile kns.y"), "{text}");
}

/// The flow collector's seam: the staged verdict of a connection on the reporter's side, with
/// the staged policy's identity; `None` where nothing staged changes that side.
#[test]
fn pending_policies_answer_for_the_reporters_side_only() {
    use felixrs::cmd::shared::dataplane_args::DataplaneArgs;
    use felixrs::cmd::shared::node_view::{SourceArgs, render_node};
    use felixrs::flowlog::{Connection, FlowAction, PendingPolicies, Reporter};
    use felixrs::staged::StagedView;

    let dir = manifests(STAGED_DENY_ALL);
    let source = SourceArgs::manifests(vec![dir.path().to_path_buf()]);
    let dataplane = DataplaneArgs::default();
    let view = render_node(&source, "node-1", &dataplane).unwrap();
    let staged = StagedView::from_outputs(dataplane.render_config(), &view.outputs).unwrap();
    let conn = Connection {
        proto: 6,
        src: "10.65.1.11".parse().unwrap(),
        dst: "10.65.1.10".parse().unwrap(),
        src_port: Some(40000),
        dst_port: Some(8080),
        icmp: None,
    };
    let (action, hits) = staged
        .pending(&conn, Reporter::Dst)
        .expect("a's ingress is staged");
    assert_eq!(action, FlowAction::Deny);
    let hit = hits.last().unwrap();
    assert_eq!(
        (
            hit.kind.as_str(),
            hit.name.as_str(),
            hit.tier.as_deref(),
            hit.action
        ),
        (
            "StagedGlobalNetworkPolicy",
            "deny-all",
            Some("default"),
            FlowAction::Deny
        )
    );
    // b's egress has no staged policy (the deny-all is ingress only).
    assert_eq!(staged.pending(&conn, Reporter::Src), None);
    // Without staged policies nothing is pending, and nothing is rendered.
    let plain = manifests("");
    let view = render_node(
        &SourceArgs::manifests(vec![plain.path().to_path_buf()]),
        "node-1",
        &dataplane,
    )
    .unwrap();
    let staged = StagedView::from_outputs(dataplane.render_config(), &view.outputs).unwrap();
    assert!(staged.is_empty());
    assert_eq!(staged.pending(&conn, Reporter::Dst), None);
}
