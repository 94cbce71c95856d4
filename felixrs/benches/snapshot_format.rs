//! Snapshot format measurement: the binary v1 format vs JSON, for 2,000 policies + 100k endpoints.
//!
//! `cargo bench -p felixrs --bench snapshot_format` (fixed inputs, 3 runs each, best reported).
//! Write = encode + atomic durable write (temp, fsync, rename, fsync dir); read = read + verify +
//! decode into the agent's map.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use felixrs::agent::snapshot::{self, KvMap, Snapshot, SnapshotStore};
use sha2::{Digest, Sha256};

const PREFIX: &str = "/calico/resources/v3/projectcalico.org/";

fn mk_input() -> Snapshot {
    let mut kvs = KvMap::new();
    for i in 0..100_000u32 {
        let ns = format!("ns{}", i % 200);
        let name = format!("node--{}-k8s-pod--{i}-eth0", i % 500);
        let v = format!(
            r#"{{"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint","metadata":{{"name":"{name}","namespace":"{ns}","uid":"0f0e0d0c-{i:08x}","resourceVersion":"{i}","labels":{{"app":"app{a}","tier":"backend","projectcalico.org/namespace":"{ns}","projectcalico.org/orchestrator":"k8s","projectcalico.org/serviceaccount":"default"}}}},"spec":{{"orchestrator":"k8s","node":"node-{n}","pod":"pod-{i}","endpoint":"eth0","serviceAccountName":"default","interfaceName":"cali{i:011x}","ipNetworks":["10.{b}.{c}.{d}/32"],"profiles":["kns.{ns}","ksa.{ns}.default"],"ports":[{{"name":"http","port":8080,"protocol":"TCP"}}]}}}}"#,
            a = i % 50,
            n = i % 500,
            b = i >> 16,
            c = (i >> 8) & 255,
            d = i & 255
        );
        kvs.insert(
            Arc::from(format!("{PREFIX}workloadendpoints/{ns}/{name}").as_str()),
            Arc::from(v.as_bytes()),
        );
    }
    for i in 0..2_000u32 {
        let ns = format!("ns{}", i % 200);
        let v = format!(
            r#"{{"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy","metadata":{{"name":"knp.default.p{i}","namespace":"{ns}"}},"spec":{{"tier":"default","order":1000,"selector":"projectcalico.org/orchestrator == 'k8s' && app == 'app{a}'","types":["Ingress","Egress"],"ingress":[{{"action":"Allow","protocol":"TCP","source":{{"selector":"app == 'app{b}'","namespaceSelector":"team == 't{c}'"}},"destination":{{"ports":[80,443,"http"]}}}},{{"action":"Allow","source":{{"nets":["192.168.{c}.0/24"]}}}}],"egress":[{{"action":"Allow","protocol":"UDP","destination":{{"ports":[53]}}}}]}}}}"#,
            a = i % 50,
            b = (i + 1) % 50,
            c = i % 250
        );
        kvs.insert(
            Arc::from(format!("{PREFIX}networkpolicies/{ns}/knp.default.p{i}").as_str()),
            Arc::from(v.as_bytes()),
        );
    }
    Snapshot {
        revision: 123_456,
        kvs,
    }
}

fn durable_write(dir: &Path, name: &str, bytes: &[u8]) {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
    fs::rename(&tmp, dir.join(name)).unwrap();
    File::open(dir).unwrap().sync_all().unwrap();
}

#[derive(serde::Serialize, serde::Deserialize)]
struct JsonSnapshot {
    version: u32,
    revision: i64,
    /// Values kept as JSON text (they are stored verbatim, like the binary format does).
    kvs: BTreeMap<String, String>,
}

fn json_encode(s: &Snapshot) -> Vec<u8> {
    let doc = JsonSnapshot {
        version: 1,
        revision: s.revision,
        kvs: s
            .kvs
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v).into_owned()))
            .collect(),
    };
    let body = serde_json::to_vec(&doc).unwrap();
    let mut out = hex::encode(Sha256::digest(&body)).into_bytes();
    out.push(b'\n');
    out.extend_from_slice(&body);
    out
}

fn json_decode(bytes: &[u8]) -> Snapshot {
    let (digest, body) = bytes.split_at(64);
    assert_eq!(hex::encode(Sha256::digest(&body[1..])).as_bytes(), digest);
    let doc: JsonSnapshot = serde_json::from_slice(&body[1..]).unwrap();
    Snapshot {
        revision: doc.revision,
        kvs: doc
            .kvs
            .into_iter()
            .map(|(k, v)| (Arc::from(k.as_str()), Arc::from(v.into_bytes().as_slice())))
            .collect(),
    }
}

fn best(mut f: impl FnMut()) -> Duration {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap()
}

fn main() {
    let input = mk_input();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = SnapshotStore::new(dir.path());

    let mut bin_size = 0;
    let bin_write = best(|| bin_size = store.save(&input).unwrap());
    let bin_read = best(|| {
        let s = store.load().unwrap().unwrap();
        assert_eq!(s.kvs.len(), input.kvs.len());
    });

    let mut json_size = 0;
    let json_write = best(|| {
        let bytes = json_encode(&input);
        json_size = bytes.len();
        durable_write(dir.path(), "snapshot.json", &bytes);
    });
    let json_read = best(|| {
        let bytes = fs::read(dir.path().join("snapshot.json")).unwrap();
        let s = json_decode(&bytes);
        assert_eq!(s, input);
    });
    let enc = best(|| {
        std::hint::black_box(snapshot::encode(&input));
    });

    println!(
        "snapshot of {} keys (2,000 policies + 100k endpoints)",
        input.kvs.len()
    );
    println!("format  size_bytes  write_ms  read_ms");
    println!(
        "binary  {bin_size:>10}  {:>8.1}  {:>7.1}   (encode alone {:.1} ms)",
        ms(bin_write),
        ms(bin_read),
        ms(enc)
    );
    println!(
        "json    {json_size:>10}  {:>8.1}  {:>7.1}",
        ms(json_write),
        ms(json_read)
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
