//! The node the agent benches load into etcd (`agent_latency`, `pod_churn`; `agent_scale` uses the helpers): 250 local endpoints
//! (`wep`) and 2,000 policies (`policy`, each selecting the endpoints of one `app` label and
//! allowing from the next), with the default tier and one namespace profile each; and the
//! helpers both time with (etcd puts from inside the netns, percentiles, a bare restore).
#![allow(dead_code)]

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use felixrs_test_support::netns::{Netns, in_netns};
use serde_json::json;

use crate::support::PREFIX;

pub const ENDPOINTS: usize = 250;
pub const POLICIES: usize = 2000;

/// Distinct `app` labels, so distinct policy combinations on the node: 50, or
/// `AGENT_BENCH_COMBOS` (a divisor of 50, e.g. 25: issue 13's node). Namespaces: a fifth of it
/// (policies select within their namespace, so every combination stays in one).
pub fn combos() -> usize {
    std::env::var("AGENT_BENCH_COMBOS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

pub fn namespaces() -> usize {
    combos() / 5
}

/// Local endpoint `i` (pod `pod<i>` on node-1, `10.80.<i/200>.<i%200+1>`): its key and value.
pub fn wep(i: usize) -> (String, String) {
    let ns = format!("ns{}", i % namespaces());
    let name = format!("node--1-k8s-pod{i}-eth0");
    let v = json!({"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint",
        "metadata":{"name":name,"namespace":ns,
            "labels":{"app":format!("app{}", i % combos()),"projectcalico.org/namespace":ns,
                      "projectcalico.org/orchestrator":"k8s"}},
        "spec":{"orchestrator":"k8s","node":"node-1","pod":format!("pod{i}"),"endpoint":"eth0",
            "interfaceName":format!("cali{i:011x}"),
            "ipNetworks":[format!("10.80.{}.{}/32", i / 200, i % 200 + 1)],
            "profiles":[format!("kns.{ns}")]}});
    (
        format!("{PREFIX}workloadendpoints/{ns}/{name}"),
        v.to_string(),
    )
}

/// Policy `i`: selects `app<i % combos>`, allows TCP to `port` from `app<i+1 % combos>`.
pub fn policy(i: usize, port: u16) -> (String, String) {
    let ns = format!("ns{}", i % namespaces());
    let v = json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
        "metadata":{"name":format!("p{i}"),"namespace":ns},
        "spec":{"tier":"default","order":1000,"selector":format!("app == 'app{}'", i % combos()),
            "types":["Ingress"],
            "ingress":[{"action":"Allow","protocol":"TCP",
                "source":{"selector":format!("app == 'app{}'", (i + 1) % combos())},
                "destination":{"ports":[port]}}]}});
    (format!("{PREFIX}networkpolicies/{ns}/p{i}"), v.to_string())
}

/// The whole node: default tier, namespace profiles, [`ENDPOINTS`] endpoints, [`POLICIES`]
/// policies (port 8000).
pub fn seed() -> Vec<(String, String)> {
    let mut seed = vec![(
        format!("{PREFIX}tiers/default"),
        json!({"apiVersion":"projectcalico.org/v3","kind":"Tier","metadata":{"name":"default"},
               "spec":{"order":1000000}})
        .to_string(),
    )];
    for n in 0..namespaces() {
        seed.push((
            format!("{PREFIX}profiles/kns.ns{n}"),
            json!({"apiVersion":"projectcalico.org/v3","kind":"Profile",
                   "metadata":{"name":format!("kns.ns{n}")},
                   "spec":{"ingress":[{"action":"Allow"}],"egress":[{"action":"Allow"}]}})
            .to_string(),
        ));
    }
    seed.extend((0..ENDPOINTS).map(wep));
    seed.extend((0..POLICIES).map(|i| policy(i, 8000)));
    seed
}

/// Runs `f` with an etcd client connected to `url`, on a current-thread runtime in a thread
/// inside the netns `ns` (every etcd write of the benches goes through here).
pub fn with_etcd<T, F, Fut>(ns: &str, url: &str, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce(etcd_client::Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    let url = url.to_string();
    in_netns(ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let c = etcd_client::Client::connect([url], None).await.unwrap();
            f(c).await
        })
    })
}

/// Puts through etcd-client from a thread inside the netns; returns each put's revision.
pub fn put_all(ns: &str, url: &str, kvs: Vec<(String, String)>) -> Vec<i64> {
    with_etcd(ns, url, |mut c| async move {
        let mut revs = Vec::new();
        for (k, v) in kvs {
            let r = c.put(k, v, None).await.unwrap();
            revs.push(r.header().unwrap().revision());
        }
        revs
    })
}

/// Puts `kvs` in transactions of 128 (etcd's default `--max-txn-ops`) from a thread inside the
/// netns; the last revision (for a whole cluster, where one put each would take minutes).
pub fn put_all_batched(ns: &str, url: &str, kvs: Vec<(String, String)>) -> i64 {
    with_etcd(ns, url, |mut c| async move {
        let mut rev = 0;
        for chunk in kvs.chunks(128) {
            let ops: Vec<etcd_client::TxnOp> = chunk
                .iter()
                .map(|(k, v)| etcd_client::TxnOp::put(k.as_str(), v.as_str(), None))
                .collect();
            let r = c.txn(etcd_client::Txn::new().and_then(ops)).await.unwrap();
            rev = r.header().unwrap().revision();
        }
        rev
    })
}

/// One change timed end to end: the put of `kv` from inside the netns, then the agent's `/status`
/// long-poll until `applied_revision` reaches the put's revision.
pub struct Applied {
    /// Put start → the long-poll's answer, ms.
    pub ms: f64,
    /// When the put started and when the answer came, UNIX µs (to line up with the agent's log).
    pub put_at_us: u128,
    pub answered_at_us: u128,
}

/// Puts `kv` and waits for the agent at `health` to report it applied (the long-poll blocks the
/// runtime's only thread, which has nothing else to do).
pub fn put_and_wait_applied(
    ns: &str,
    url: &str,
    health: std::net::SocketAddr,
    kv: (String, String),
) -> Applied {
    with_etcd(ns, url, move |mut client| async move {
        let put_at_us = unix_us();
        let t = Instant::now();
        let r = client.put(kv.0, kv.1, None).await.unwrap();
        let rev = r.header().unwrap().revision();
        let (_, body) = felixrs_test_support::http::get(
            health,
            &format!("/status?min_revision={rev}&timeout_ms=30000"),
        )
        .unwrap();
        let s: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(s["applied_revision"].as_i64().unwrap() >= rev, "{s}");
        Applied {
            ms: t.elapsed().as_secs_f64() * 1000.0,
            put_at_us,
            answered_at_us: unix_us(),
        }
    })
}

/// Now, UNIX µs.
pub fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// The `p` quantile (0..=1) of `v` (sorted in place).
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Runs `prog args` in `ns` with `payload` on stdin; how long it took (it must succeed).
pub fn run_stdin(ns: &Netns, prog: &str, args: &[&str], payload: &str) -> Duration {
    let t = Instant::now();
    let mut c = ns
        .command(prog)
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(payload.as_bytes())
        .unwrap();
    assert!(c.wait().unwrap().success(), "{prog} failed on:\n{payload}");
    t.elapsed()
}

/// A bare `<prog> --noflush --wait 10` of `payload`.
pub fn restore(ns: &Netns, prog: &str, payload: &str) -> Duration {
    run_stdin(ns, prog, &["--noflush", "--wait", "10"], payload)
}
