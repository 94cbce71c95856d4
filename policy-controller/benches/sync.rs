//! Fixed-input benchmark of the controller's two hot paths, each against its floor.
//!
//! * convert: 2,000 pods + 500 NetworkPolicies + 100 namespaces, decoded from JSON, converted into
//!   the model, validated and encoded as stored (once). Floor: decoding the same JSON into the k8s
//!   types only.
//! * writer: a no-op reconcile of 5,000 stored endpoints against a real etcd (read + compare, nothing
//!   to write). Floor: one ranged get of the same prefix.
//!
//! Run: `cargo bench -p policy-controller --bench sync` (needs /usr/bin/etcd).

#[allow(dead_code)]
#[path = "../tests/support/etcd.rs"]
mod etcd_client_ext;

use std::time::{Duration, Instant};

use etcd_client_ext::EtcdClientExt;
use felixrs_test_support::etcd::Etcd;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use policy_controller::ConvertOptions;
use policy_controller::convert::{self, RESOURCE_PREFIX};
use policy_controller::writer::{Desired, Writer};
use serde_json::{Value, json};

fn inputs() -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let pods = (0..2000)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("web-{i}"), "namespace": format!("ns-{}", i % 100),
                             "labels": {"app": format!("app-{}", i % 20), "tier": "web"}},
                "spec": {"nodeName": format!("node-{}", i % 50), "containers": [{"name": "c", "image": "x",
                         "ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"phase": "Running", "podIP": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)}})
        })
        .collect();
    let nps = (0..500)
        .map(|i| {
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": format!("np-{i}"), "namespace": format!("ns-{}", i % 100)},
                "spec": {"podSelector": {"matchLabels": {"app": format!("app-{}", i % 20)}},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "web"}}},
                                          {"namespaceSelector": {"matchLabels": {"team": "a"}}},
                                          {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                                 "ports": [{"port": 80}, {"port": 81}, {"port": "http"}, {"port": 53, "protocol": "UDP"}]}],
                    "egress": [{"to": [{"podSelector": {}}]}]}})
        })
        .collect();
    let nss = (0..100)
        .map(|i| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("ns-{i}"), "labels": {"team": "a"}}}))
        .collect();
    (pods, nps, nss)
}

fn median(mut f: impl FnMut() -> Duration, runs: usize) -> Duration {
    let mut v: Vec<Duration> = (0..runs).map(|_| f()).collect();
    v.sort();
    v[runs / 2]
}

fn bench_convert() {
    let (pods, nps, nss) = inputs();
    let opts = ConvertOptions::default();
    let decode_only = median(
        || {
            let t = Instant::now();
            let mut n = 0;
            for p in &pods {
                n += serde_json::from_value::<Pod>(p.clone()).is_ok() as usize;
            }
            for p in &nps {
                n += serde_json::from_value::<NetworkPolicy>(p.clone()).is_ok() as usize;
            }
            for p in &nss {
                n += serde_json::from_value::<Namespace>(p.clone()).is_ok() as usize;
            }
            assert_eq!(n, 2600);
            t.elapsed()
        },
        7,
    );
    let full = median(
        || {
            let t = Instant::now();
            let mut n = 0;
            for p in &pods {
                let o: Pod = serde_json::from_value(p.clone()).unwrap();
                n += convert::pod_to_workload_endpoint(&o, &opts)
                    .resource
                    .map(|r| r.to_json())
                    .is_some() as usize;
            }
            for p in &nps {
                let o: NetworkPolicy = serde_json::from_value(p.clone()).unwrap();
                n += convert::network_policy_to_calico(&o, &opts)
                    .resource
                    .map(|r| r.to_json())
                    .is_some() as usize;
            }
            for p in &nss {
                let o: Namespace = serde_json::from_value(p.clone()).unwrap();
                n += convert::namespace_to_profile(&o, &opts)
                    .resource
                    .map(|r| r.to_json())
                    .is_some() as usize;
            }
            assert_eq!(n, 2600);
            t.elapsed()
        },
        7,
    );
    println!(
        "convert 2600 objects: decode-only floor {decode_only:?}, decode+convert+validate {full:?} \
         ({:.1} us/object, {:.1}x floor)",
        full.as_secs_f64() * 1e6 / 2600.0,
        full.as_secs_f64() / decode_only.as_secs_f64()
    );
}

async fn bench_writer() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let desired = Desired {
        resources: (0..5000)
            .map(|i| {
                (
                    format!("{RESOURCE_PREFIX}workloadendpoints/ns/node-k8s-p{i}-eth0"),
                    format!(r#"{{"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint","metadata":{{"name":"node-k8s-p{i}-eth0","namespace":"ns"}},"spec":{{"ipNetworks":["10.0.{}.{}/32"]}}}}"#, i / 256, i % 256),
                )
            })
            .collect(),
        ..Desired::default()
    };
    let mut w = Writer::new(c.clone());
    let t = Instant::now();
    let s = w.sync(&desired).await.unwrap();
    let initial = t.elapsed();
    assert_eq!(s.created, 5000);
    let mut noop = Vec::new();
    let mut floor = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let s = w.sync(&desired).await.unwrap();
        noop.push(t.elapsed());
        assert_eq!(s.created + s.updated + s.deleted, 0);
        let t = Instant::now();
        let r = c
            .get(
                RESOURCE_PREFIX,
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        floor.push(t.elapsed());
        assert_eq!(r.count(), 5000);
    }
    noop.sort();
    floor.sort();
    println!(
        "writer 5000 endpoints: initial sync {initial:?}; no-op pass {:?} vs ranged-get floor {:?} ({:.1}x)",
        noop[3],
        floor[3],
        noop[3].as_secs_f64() / floor[3].as_secs_f64()
    );
}

fn main() {
    // `cargo test --benches` runs this with `--bench`-less args; keep it cheap then.
    bench_convert();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(bench_writer());
}
