//! Decode cost of the resource model on a fixed snapshot: 2,000 WorkloadEndpoints and 500
//! NetworkPolicies (with 4 rules each), as the agent decodes them from etcd at startup.
//!
//! Floor: `serde_json::from_slice::<Value>` of the same bytes (parsing the JSON at all).
//! Measured: `Resource::from_etcd` (head parse + typed decode + unknown-field check + key check),
//! the unknown-field check alone (`schema_check_only`), then `validate`, and `to_json`. Run: `cargo bench -p calc-graph --bench model_decode`.

use std::hint::black_box;

use calc_graph::model::{Resource, schema};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;

fn mk_snapshot() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..2000u32 {
        let ns = format!("ns{}", i % 20);
        let name = format!("node{}-k8s-app--{i}-eth0", i % 50);
        let doc = json!({
            "apiVersion": "projectcalico.org/v3", "kind": "WorkloadEndpoint",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": format!("{i}"),
                         "labels": {"app": format!("app{}", i % 40), "projectcalico.org/namespace": ns,
                                    "projectcalico.org/orchestrator": "k8s",
                                    "projectcalico.org/serviceaccount": "default"}},
            "spec": {"orchestrator": "k8s", "node": format!("node{}", i % 50), "pod": format!("app-{i}"),
                     "endpoint": "eth0", "containerID": format!("{i:064x}"),
                     "ipNetworks": [format!("10.{}.{}.{}/32", i >> 16, (i >> 8) & 255, i & 255)],
                     "profiles": [format!("kns.{ns}"), format!("ksa.{ns}.default")],
                     "interfaceName": format!("cali{i:011x}"),
                     "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]}
        });
        let key = format!("/calico/resources/v3/projectcalico.org/workloadendpoints/{ns}/{name}");
        out.push((key, serde_json::to_vec(&doc).unwrap()));
    }
    for i in 0..500u32 {
        let ns = format!("ns{}", i % 20);
        let name = format!("knp.default.policy-{i}");
        let doc = json!({
            "apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"tier": "default", "order": 1000, "types": ["Ingress", "Egress"],
                     "selector": format!("projectcalico.org/orchestrator == 'k8s' && app == 'app{}'", i % 40),
                     "ingress": [
                        {"action": "Allow", "protocol": "TCP",
                         "source": {"selector": "projectcalico.org/orchestrator == 'k8s' && role in {'fe', 'api'}"},
                         "destination": {"ports": [80, 443, "8000:8100", "http"]}},
                        {"action": "Allow", "source": {"namespaceSelector": "team == 'ops'"}},
                        {"action": "Allow", "source": {"nets": ["10.0.0.0/8"], "notNets": ["10.1.0.0/16"]}}],
                     "egress": [{"action": "Allow", "protocol": "UDP", "destination": {"ports": [53]}}]}
        });
        let key = format!("/calico/resources/v3/projectcalico.org/networkpolicies/{ns}/{name}");
        out.push((key, serde_json::to_vec(&doc).unwrap()));
    }
    out
}

fn bench(c: &mut Criterion) {
    let snapshot = mk_snapshot();
    let decoded: Vec<Resource> = snapshot
        .iter()
        .map(|(k, v)| Resource::from_etcd(k, v).unwrap().1)
        .collect();
    assert!(decoded.iter().all(|r| r.validate().is_ok()));

    let mut g = c.benchmark_group("model_snapshot_2500");
    g.throughput(Throughput::Elements(snapshot.len() as u64));
    g.sample_size(20);
    g.bench_function("floor_serde_json_value", |b| {
        b.iter(|| {
            for (_, v) in &snapshot {
                black_box(serde_json::from_slice::<serde_json::Value>(v).unwrap());
            }
        })
    });
    g.bench_function("from_etcd", |b| {
        b.iter(|| {
            for (k, v) in &snapshot {
                black_box(Resource::from_etcd(k, v).unwrap());
            }
        })
    });
    g.bench_function("schema_check_only", |b| {
        b.iter(|| {
            for (k, v) in &snapshot {
                let kind = calc_graph::model::ResourceKey::parse_etcd_key(k)
                    .unwrap()
                    .kind;
                black_box(schema::unknown_fields(schema::calico_document(kind), v));
            }
        })
    });
    g.bench_function("validate", |b| {
        b.iter(|| {
            for r in &decoded {
                black_box(r.validate()).unwrap();
            }
        })
    });
    g.bench_function("to_json", |b| {
        b.iter(|| {
            for r in &decoded {
                black_box(r.to_json());
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
