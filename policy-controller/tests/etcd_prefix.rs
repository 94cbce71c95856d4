//! Two clusters in one etcd (`--etcd-prefix`): each controller writes, marks and deletes only its
//! own cluster's keys; a bad prefix is refused naming it.

use std::path::Path;
use std::process::Command;

use felixrs_test_support::etcd::Etcd;

const BIN: &str = env!("CARGO_BIN_EXE_policy-controller");

const CLUSTER_A: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shared}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: only-a}
spec: {selector: all(), types: [Ingress]}
"#;

const CLUSTER_B: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shared, labels: {in: b}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: shared, labels: {app: x}}
spec: {nodeName: node-b, containers: [{name: c, image: i}]}
status: {phase: Running, podIP: 10.9.0.1}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: only-b}
spec: {selector: all(), types: [Ingress]}
"#;

fn sync_once(etcd: &Etcd, prefix: Option<&str>, manifests: &Path) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["sync", "--once", "--etcd-endpoints", &etcd.client_url()]);
    if let Some(p) = prefix {
        cmd.args(["--etcd-prefix", p]);
    }
    cmd.arg("--manifests").arg(manifests);
    cmd.output().expect("run policy-controller")
}

fn ok(out: std::process::Output) {
    assert!(
        out.status.success(),
        "stdout {}\nstderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn keys(etcd: &Etcd) -> Vec<String> {
    etcd.ctl(&["get", "--prefix", "--keys-only", "/"], None)
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

#[test]
fn two_prefixes_in_one_etcd_never_touch_each_other() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let (a, b, empty) = (
        dir.path().join("a.yaml"),
        dir.path().join("b.yaml"),
        dir.path().join("empty.yaml"),
    );
    std::fs::write(&a, CLUSTER_A).unwrap();
    std::fs::write(&b, CLUSTER_B).unwrap();
    std::fs::write(&empty, "").unwrap();
    const B: &str = "/clusters/b/calico";

    ok(sync_once(&etcd, Some(B), &b));
    ok(sync_once(&etcd, None, &a));
    let all = keys(&etcd);
    let res = "/resources/v3/projectcalico.org/";
    let under = |p: &str| -> Vec<&str> {
        all.iter()
            .filter_map(|k| k.strip_prefix(&format!("{p}{res}")))
            .collect()
    };
    assert_eq!(
        under("/calico"),
        vec!["globalnetworkpolicies/only-a", "profiles/kns.shared"],
        "{all:#?}"
    );
    assert_eq!(
        under(B),
        vec![
            "globalnetworkpolicies/only-b",
            "profiles/kns.shared",
            "workloadendpoints/shared/node--b-k8s-p-eth0",
        ],
        "{all:#?}"
    );
    // Each cluster's ownership markers live with it; the default's where they always were.
    assert!(all.contains(&format!(
        "/felixrs/policy-controller/owned/calico{res}globalnetworkpolicies/only-a"
    )));
    assert!(all.contains(&format!(
        "{B}/felixrs/policy-controller/owned/calico{res}globalnetworkpolicies/only-b"
    )));
    // B's namespace labels are B's.
    let profile = etcd
        .get(&format!("{B}{res}profiles/kns.shared"))
        .expect("b's profile");
    assert!(profile.contains("pcns.in"), "{profile}");

    // Cluster A empties: only A's keys go, B's all stay.
    ok(sync_once(&etcd, None, &empty));
    let after = keys(&etcd);
    assert!(
        !after.iter().any(|k| k.starts_with("/calico/")),
        "{after:#?}"
    );
    assert_eq!(
        after.iter().filter(|k| k.starts_with(B)).count(),
        4,
        "b's 3 resources and its marker: {after:#?}"
    );
    // And B's second pass over the same manifests writes nothing.
    let out = sync_once(&etcd, Some(B), &b);
    let line = String::from_utf8_lossy(&out.stdout).to_string();
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(
        (
            v["created"].as_u64(),
            v["updated"].as_u64(),
            v["deleted"].as_u64()
        ),
        (Some(0), Some(0), Some(0)),
        "{line}"
    );
}

#[test]
fn a_bad_prefix_is_refused_naming_it() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.yaml");
    std::fs::write(&m, CLUSTER_A).unwrap();
    let out = sync_once(&etcd, Some("clusters/b/"), &m);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--etcd-prefix") && err.contains("\"clusters/b/\""),
        "{err}"
    );
    assert!(keys(&etcd).is_empty(), "nothing written");
}

/// RemoteClusterConfiguration manifests are stored for the agents, under the cluster's prefix; an
/// invalid one (an unknown field) is skipped, naming the object and the field.
#[test]
fn remote_cluster_configurations_pass_through_strictly() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("rcc.yaml");
    std::fs::write(
        &m,
        r#"
apiVersion: projectcalico.org/v3
kind: RemoteClusterConfiguration
metadata: {name: west, resourceVersion: "7"}
spec: {datastoreType: etcdv3, etcdEndpoints: "https://10.0.0.1:2379", etcdPrefix: /west/calico}
---
apiVersion: projectcalico.org/v3
kind: RemoteClusterConfiguration
metadata: {name: east}
spec: {datastoreType: etcdv3, etcdEndpoints: "https://10.0.0.2:2379", kubeconfig: /k}
"#,
    )
    .unwrap();
    let out = sync_once(&etcd, Some("/clusters/b/calico"), &m);
    ok(out.clone());
    let report: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(report["created"], 1, "{report}");
    let skips = report["skips"].to_string();
    assert!(
        skips.contains("east") && skips.contains("spec.kubeconfig"),
        "{skips}"
    );
    let key = "/remoteclusterconfigurations/west";
    let stored = etcd
        .get(&format!(
            "/clusters/b/calico/resources/v3/projectcalico.org{key}"
        ))
        .expect("stored under the prefix");
    let rc = calc_graph::model::RemoteCluster::from_etcd(
        &calc_graph::model::remote_cluster_key("west"),
        stored.as_bytes(),
    )
    .expect("the agent's model reads it");
    assert_eq!(rc.prefix.as_str(), "/west/calico");
    assert!(!stored.contains("resourceVersion"), "{stored}");
    // Idempotent.
    let again: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&sync_once(&etcd, Some("/clusters/b/calico"), &m).stdout).trim(),
    )
    .unwrap();
    assert_eq!(
        (again["created"].as_u64(), again["updated"].as_u64()),
        (Some(0), Some(0))
    );
}
