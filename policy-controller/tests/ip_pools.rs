//! IP pools through the `policy-controller` binary against a real etcd: an IPPool in a manifest is
//! stored as written (and a malformed one skipped with its field named), the default pools come
//! from Calico's install options, and a manifest pool of the same name wins.

mod support;

use std::path::Path;
use std::process::Command;

use felixrs_test_support::etcd::Etcd;
use policy_controller::convert::RESOURCE_PREFIX;
use serde_json::Value;
use support::etcd::EtcdClientExt;

const BIN: &str = env!("CARGO_BIN_EXE_policy-controller");

fn sync_once(etcd: &Etcd, dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["sync", "--once", "--etcd-endpoints", &etcd.client_url()])
        .args(extra)
        .arg("--manifests")
        .arg(dir)
        .env_remove("CALICO_IPV4POOL_CIDR")
        .env_remove("CALICO_IPV6POOL_CIDR")
        .output()
        .expect("run policy-controller")
}

fn report(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

async fn pool(c: &mut etcd_client::Client, name: &str) -> Option<Value> {
    let key = format!("{RESOURCE_PREFIX}ippools/{name}");
    let r = c.get(key, None).await.unwrap();
    r.kvs()
        .first()
        .map(|kv| serde_json::from_slice(kv.value()).unwrap())
}

#[tokio::test]
async fn pools_from_manifests_and_from_the_default_pool_flags() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("pools.yaml"),
        r#"
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: edge, resourceVersion: "12"}
spec: {cidr: 10.90.0.0/16, natOutgoing: true, disabled: true, ipipMode: Never, vxlanMode: Never}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: broken}
spec: {cidr: 10.91.0.1/16}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: typo}
spec: {cidr: 10.92.0.0/16, natOutgoin: true}
"#,
    )
    .unwrap();

    let r = report(&sync_once(
        &etcd,
        dir.path(),
        &[
            "--default-ipv4-pool-cidr",
            "10.244.0.0/16",
            "--default-ipv6-pool-cidr",
            "fd00:10:244::/48",
        ],
    ));
    assert_eq!(r["created"], 3, "{r}");
    let skips: Vec<String> = r["skips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("{} {}: {}", s["name"], s["field"], s["message"]))
        .collect();
    assert_eq!(skips.len(), 2, "{skips:?}");
    assert!(
        skips
            .iter()
            .any(|s| s.contains("broken") && s.contains("spec.cidr")),
        "{skips:?}"
    );
    assert!(
        skips
            .iter()
            .any(|s| s.contains("typo") && s.contains("natOutgoin")),
        "{skips:?}"
    );
    let edge = pool(&mut c, "edge").await.unwrap();
    assert_eq!(edge["spec"]["disabled"], true);
    assert_eq!(edge["metadata"].get("resourceVersion"), None);
    let v4 = pool(&mut c, "default-ipv4-ippool").await.unwrap();
    assert_eq!(v4["spec"]["cidr"], "10.244.0.0/16");
    assert_eq!(v4["spec"]["natOutgoing"], true, "Calico's default for IPv4");
    let v6 = pool(&mut c, "default-ipv6-ippool").await.unwrap();
    assert_eq!(
        v6["spec"].get("natOutgoing"),
        None,
        "Calico's default for IPv6"
    );

    // A manifest pool of the default pool's name wins; without the flags the v6 pool goes.
    std::fs::write(
        dir.path().join("default.yaml"),
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: default-ipv4-ippool}\nspec: {cidr: 10.244.0.0/16, natOutgoing: false}\n",
    )
    .unwrap();
    let r = report(&sync_once(
        &etcd,
        dir.path(),
        &["--default-ipv4-pool-cidr", "10.244.0.0/16"],
    ));
    assert_eq!(
        (r["updated"].as_u64(), r["deleted"].as_u64()),
        (Some(1), Some(1)),
        "{r}"
    );
    let v4 = pool(&mut c, "default-ipv4-ippool").await.unwrap();
    assert_eq!(v4["spec"].get("natOutgoing"), None);
    assert!(pool(&mut c, "default-ipv6-ippool").await.is_none());

    // A bad flag stops the controller with the flag named, before anything is written.
    let out = sync_once(
        &etcd,
        dir.path(),
        &["--default-ipv4-pool-cidr", "10.244.0.0/28"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--default-ipv4-pool-cidr 10.244.0.0/28") && err.contains("block size"),
        "{err}"
    );
}
