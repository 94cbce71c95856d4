//! Egress by domain name through the controller, against a real etcd: the network-policy-api
//! `domainNames` peer from the API server (kube-rs watchers, strict decoding) becomes Calico's
//! `destination.domains`, a bad name is reported by object and field while the rest is stored; and
//! Calico v3 NetworkPolicy/GlobalNetworkPolicy with `destination.domains` from manifests
//! (`policy-controller sync`) reach etcd as the agent would read them had they been written there
//! directly.

mod support;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calc_graph::model::Resource;
use felixrs_test_support::etcd::Etcd;
use policy_controller::convert::RESOURCE_PREFIX;
use policy_controller::index::Index;
use policy_controller::k8s_source::{self, KINDS};
use policy_controller::manifests::ManifestSet;
use policy_controller::writer::Writer;
use policy_controller::{ConvertOptions, ObjectRef};
use serde_json::{Value, json};
use support::etcd::EtcdClientExt;
use support::fake_apiserver::FakeApiServer;

const BIN: &str = env!("CARGO_BIN_EXE_policy-controller");

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn etcd_raw(c: &mut etcd_client::Client, key: &str) -> Option<Vec<u8>> {
    let r = c
        .get(format!("{RESOURCE_PREFIX}{key}"), None)
        .await
        .unwrap();
    r.kvs().first().map(|kv| kv.value().to_vec())
}

#[tokio::test]
async fn domain_names_from_the_api_become_calico_domains() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let api = FakeApiServer::start().await;
    api.apply(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "AdminNetworkPolicy",
        "metadata": {"name": "apis"},
        "spec": {"priority": 10, "subject": {"namespaces": {}},
                 "egress": [{"action": "Allow", "to": [{"domainNames": ["API.example.com.", "*.s3.example.net"]}],
                             "ports": [{"portNumber": {"port": 443}}]},
                            {"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]}]},
    }));
    api.apply(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
        "metadata": {"name": "registry"},
        "spec": {"tier": "Admin", "priority": 11, "subject": {"namespaces": {}},
                 "egress": [{"action": "Accept", "to": [{"domainNames": ["registry.example.org"]}],
                             "protocols": [{"tcp": {"destinationPort": {"number": 443}}}]},
                            {"action": "Accept", "to": [{"domainNames": ["bad..example.org"]}]}]},
    }));
    let index = Arc::new(Mutex::new(Index::new(
        ConvertOptions::default(),
        &KINDS,
        ManifestSet::default(),
    )));
    let changed = Arc::new(tokio::sync::Notify::new());
    let tasks = k8s_source::spawn_all(api.client(), index.clone(), changed.clone());
    let mut writer = Writer::new(c.clone());
    let registry = ObjectRef::new("ClusterNetworkPolicy", None, "registry");
    wait_until("the initial lists", || {
        let i = index.lock().unwrap();
        i.is_ready() && i.contains(&registry)
    })
    .await;
    let state = index.lock().unwrap().desired().expect("index ready");
    writer.sync(&state.desired).await.unwrap();

    let anp: Value = serde_json::from_slice(
        &etcd_raw(&mut c, "globalnetworkpolicies/kanp.adminnetworkpolicy.apis")
            .await
            .expect("the ANP is stored"),
    )
    .unwrap();
    assert_eq!(
        anp["spec"]["egress"][0],
        json!({"action": "Allow", "protocol": "TCP",
               "destination": {"domains": ["api.example.com", "*.s3.example.net"], "ports": [443]}})
    );
    assert_eq!(anp["spec"]["egress"][1]["action"], "Deny");
    let cnp: Value = serde_json::from_slice(
        &etcd_raw(&mut c, "globalnetworkpolicies/kcnp.registry")
            .await
            .expect("the CNP is stored despite its bad rule"),
    )
    .unwrap();
    // The bad name's Accept rule is dropped (fail closed), the good one kept.
    assert_eq!(
        cnp["spec"]["egress"],
        json!([{"action": "Allow", "protocol": "TCP",
                "destination": {"domains": ["registry.example.org"], "ports": [443]}}])
    );
    let bad: Vec<_> = state
        .skips
        .iter()
        .filter(|s| s.kind == "ClusterNetworkPolicy")
        .map(|s| (s.name.as_str(), s.field.as_str(), s.message.as_str()))
        .collect();
    assert_eq!(
        bad,
        vec![(
            "registry",
            "spec.egress[1].to[0].domainNames[0]",
            "invalid domain name \"bad..example.org\": empty label (rule dropped)"
        )]
    );
    // Every stored document decodes with the agent's own model, domains included.
    for key in [
        "globalnetworkpolicies/kanp.adminnetworkpolicy.apis",
        "globalnetworkpolicies/kcnp.registry",
    ] {
        let raw = etcd_raw(&mut c, key).await.unwrap();
        let Resource::GlobalNetworkPolicy(p) = Resource::from_json(&raw).unwrap() else {
            panic!("{key} is not a GlobalNetworkPolicy");
        };
        assert!(!p.spec.egress[0].destination.domains.is_empty(), "{key}");
    }
    for t in tasks {
        t.abort();
    }
}

const V3_DOMAINS: &str = r#"
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: allow-apis, namespace: web}
spec:
  selector: app == 'client'
  types: [Egress]
  egress:
  - action: Allow
    protocol: UDP
    destination: {ports: [53]}
  - action: Allow
    protocol: TCP
    destination:
      domains: [api.example.com, "*.cdn.example.com"]
      ports: [443]
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: registry}
spec:
  tier: default
  order: 10
  selector: all()
  types: [Egress]
  egress:
  - action: Allow
    destination: {domains: [Registry.Example.ORG]}
"#;

/// Each document as JSON, the way `kubectl`/`calicoctl` would write it straight into etcd.
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---\n")
        .map(|d| serde_yaml::from_str::<Value>(d).unwrap())
        .collect()
}

#[tokio::test]
async fn calico_v3_domains_from_manifests_are_stored_as_from_etcd() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("domains.yaml"), V3_DOMAINS).unwrap();
    let out = Command::new(BIN)
        .args(["sync", "--once", "--etcd-endpoints", &etcd.client_url()])
        .arg("--manifests")
        .arg(dir.path())
        .output()
        .expect("run policy-controller");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    // Nothing skipped or failed safe: `domains` is a field the dataplane enforces.
    assert_eq!(report["skips"], json!([]), "{report}");

    for (doc, key) in documents(V3_DOMAINS).into_iter().zip([
        "networkpolicies/web/allow-apis",
        "globalnetworkpolicies/registry",
    ]) {
        let stored = etcd_raw(&mut c, key)
            .await
            .unwrap_or_else(|| panic!("{key} not stored: {report}"));
        // What the agent decodes from the controller's write equals what it decodes from the
        // document written to etcd directly, and the bytes are the model's canonical encoding.
        let direct = Resource::from_json(serde_json::to_string(&doc).unwrap().as_bytes()).unwrap();
        let via_sync = Resource::from_json(&stored).unwrap();
        assert_eq!(via_sync, direct, "{key}");
        assert_eq!(
            String::from_utf8(stored).unwrap(),
            direct.to_json(),
            "{key}"
        );
        let egress = match &via_sync {
            Resource::NetworkPolicy(p) => &p.spec.egress,
            Resource::GlobalNetworkPolicy(p) => &p.spec.egress,
            other => panic!("{key}: unexpected {other:?}"),
        };
        assert!(
            egress.iter().any(|r| !r.destination.domains.is_empty()),
            "{key}: domains lost"
        );
    }
}
