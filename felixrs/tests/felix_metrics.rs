//! Calico's own Felix Grafana dashboard against felixrs: the real agent (real etcd, the real
//! kernel in a network namespace the test creates) scraped by a real Prometheus server in the same
//! namespace; every PromQL expression of the dashboard (`testdata/felix-dashboard/queries.txt`)
//! is evaluated through Prometheus's HTTP API and must return series, except the panels of parts
//! felixrs does not have (Go runtime, BPF dataplane, flow-log collector), which must return none.
//! A few values are checked against what the test put in etcd. Root.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::{Netns, in_netns};
use felixrs_test_support::{free_port, http};
use felixrs_test_support::{require_root, require_tools};
use serde_json::{Value, json};
use support::{Agent, put_default_tier, put_json, put_ns1_profile, put_web_endpoint};

/// Prefixes of the series of parts felixrs does not have: the Go runtime (felixrs is not a Go
/// program), the BPF dataplane and Felix's flow-log collector (NFLOG reader). Felix's iptables
/// dataplane serves no `felix_bpf_*` either.
const NOT_SERVED: [&str; 4] = ["go_", "felix_bpf_", "felix_nflog_", "felix_collector_"];

/// A `prometheus` server in a network namespace, scraping one target every second; its config
/// and storage live in a temp dir. Killed (and the dir removed) on drop, also on panic.
struct Prometheus {
    child: Option<Child>,
    netns: String,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(netns: &str, target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: felixrs\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", netns, "prometheus"])
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let p = Prometheus {
            child: Some(child),
            netns: netns.to_string(),
            addr,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(p.get("/-/ready"), Ok((200, _))) {
            assert!(
                Instant::now() < deadline,
                "prometheus did not get ready:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let (addr, path) = (self.addr, path.to_string());
        in_netns(&self.netns, move || {
            http::get_with_timeout(addr, &path, Duration::from_secs(10))
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The result vector of an instant query (panics on an API error: a query that does not
    /// parse is a test failure).
    fn query(&self, q: &str) -> Vec<Value> {
        let (code, body) = self
            .get(&format!("/api/v1/query?query={}", urlencode(q)))
            .expect("query prometheus");
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert!(
            code == 200 && v["status"] == "success",
            "query {q}: {code} {body}"
        );
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The value of a query that returns one series (NaN if it returns none).
    fn value(&self, q: &str) -> f64 {
        let r = self.query(q);
        r.first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// Polls `q` until `ok` holds for its value; returns it.
    fn wait_value(&self, q: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = self.value(q);
            if ok(v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{q} stayed at {v}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The dashboard's expressions (comment lines are its header).
fn dashboard_queries() -> Vec<String> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/felix-dashboard/queries.txt");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

/// Grafana's template variables as the dashboard's defaults set them (`$top_n`), and its rate
/// interval for a 1 s scrape (several samples per window).
fn substitute(q: &str) -> String {
    q.replace("$top_n", "50")
        .replace("$__rate_interval", "10s")
        .trim()
        .to_string()
}

fn policy(name: &str, selector: &str, port: u16) -> Value {
    json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
           "metadata":{"name":name,"namespace":"ns1"},
           "spec":{"tier":"default","order":1000,"selector":selector,"types":["Ingress"],
                   "ingress":[{"action":"Allow","protocol":"TCP",
                               "source":{"selector":"role == 'client'"},
                               "destination":{"ports":[port]}}]}})
}

#[test]
fn calicos_felix_dashboard_queries_return_series_from_felixrs() {
    require_root();
    require_tools(&["prometheus"]);
    let started = Instant::now();
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    put_default_tier(&etcd);
    put_ns1_profile(&etcd);
    // One pod on this node (node-1), one on node-2, and node-3 known only as a Node: 3 hosts.
    put_web_endpoint(&etcd, "cali0000000001", &["kns.ns1"]);
    put_json(
        &etcd,
        "workloadendpoints/ns1/node--2-k8s-client-eth0",
        json!({"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint",
               "metadata":{"name":"node--2-k8s-client-eth0","namespace":"ns1",
                           "labels":{"role":"client","projectcalico.org/namespace":"ns1",
                                     "projectcalico.org/orchestrator":"k8s"}},
               "spec":{"orchestrator":"k8s","node":"node-2","pod":"client","endpoint":"eth0",
                       "interfaceName":"cali0000000002","ipNetworks":["10.70.1.1/32"],
                       "profiles":["kns.ns1"]}}),
    );
    put_json(
        &etcd,
        "nodes/node-3",
        json!({"apiVersion":"projectcalico.org/v3","kind":"Node",
               "metadata":{"name":"node-3"},"spec":{}}),
    );
    let rev = put_json(
        &etcd,
        "networkpolicies/ns1/web-7001",
        policy("web-7001", "app == 'web'", 7001),
    );
    let state = tempfile::tempdir().unwrap();
    let agent = Agent::start(ns.name(), &etcd.client_url(), &state.path().join("state"));
    agent.wait_applied(rev);
    let prom = Prometheus::start(ns.name(), agent.health);
    // A few scrapes of the programmed agent.
    prom.wait_value("count_over_time(up[1m])", |v| v >= 3.0);
    assert_eq!(prom.value("up"), 1.0, "{}", prom.log());

    // A policy change is an apply after the first: iptables-restore runs again and the apply
    // time summary (which, as Felix's, leaves the initial resync out) gets an observation.
    let restores = prom.value("felix_iptables_restore_calls");
    assert!(restores >= 1.0, "restore calls at start: {restores}");
    let rev = put_json(
        &etcd,
        "networkpolicies/ns1/web-7002",
        policy("web-7002", "app == 'web'", 7002),
    );
    agent.wait_applied(rev);
    prom.wait_value("felix_iptables_restore_calls", |v| v > restores);
    prom.wait_value("felix_int_dataplane_apply_time_seconds_count", |v| v >= 1.0);
    prom.wait_value("count_over_time(felix_active_local_policies[1m])", |v| {
        v >= 5.0
    });

    let (mut checked, mut not_served) = (0, 0);
    for q in dashboard_queries() {
        let expr = substitute(&q);
        let result = prom.query(&expr);
        if NOT_SERVED.iter().any(|p| expr.contains(p)) {
            assert!(result.is_empty(), "{expr} (not served) returned {result:?}");
            not_served += 1;
            continue;
        }
        // The restart and resync panels show only instances whose count changed within the
        // hour (`… > 0`): the series under the filter must exist.
        let shown = match expr.strip_suffix("> 0") {
            Some(inner) => prom.query(inner),
            None => result,
        };
        assert!(
            !shown.is_empty(),
            "the dashboard's `{q}` returned no series\n/metrics:\n{}",
            agent.get("/metrics").map(|(_, m)| m).unwrap_or_default()
        );
        checked += 1;
    }
    // The dashboard's 36 expressions: 23 with series, 13 of parts felixrs does not have.
    assert_eq!((checked, not_served), (23, 13));

    // Values that could be wrong.
    let v = |q: &str| prom.value(q);
    assert_eq!(v("felix_active_local_endpoints"), 1.0, "pods on node-1");
    assert_eq!(v("felix_active_local_policies"), 2.0);
    assert_eq!(v("felix_active_local_selectors"), 1.0, "role == 'client'");
    assert_eq!(v("felix_cluster_num_hosts"), 3.0);
    assert_eq!(v("felix_cluster_num_workload_endpoints"), 2.0);
    assert_eq!(v("felix_cluster_num_host_endpoints"), 0.0);
    assert_eq!(v("felix_cluster_num_policies"), 2.0);
    assert_eq!(v("felix_cluster_num_profiles"), 1.0);
    assert_eq!(v("felix_cluster_num_tiers"), 1.0);
    assert_eq!(v("felix_resync_state"), 3.0, "in sync");
    assert_eq!(v("felix_resyncs_started"), 1.0);
    assert!(v("felix_iptables_save_calls") >= 1.0);
    assert_eq!(v("felix_iptables_restore_errors"), 0.0);
    assert_eq!(v("felix_ipset_errors"), 0.0);
    assert!(v("felix_ipset_calls") >= 1.0);
    assert_eq!(v("felix_int_dataplane_failures"), 0.0);
    assert!(v("felix_int_dataplane_initial_resync_time_seconds") > 0.0);
    assert!(v("felix_calc_graph_update_time_seconds_count") >= 7.0);
    assert!(v(r#"felix_iptables_rules{ip_version="4",table="filter"}"#) > 0.0);
    assert!(v(r#"felix_iptables_chains{ip_version="6",table="filter"}"#) > 0.0);
    assert!(v(r#"felix_iptables_lines_executed{ip_version="4",table="filter"}"#) > 0.0);
    assert!(v("felix_ipset_lines_executed") > 0.0);
    assert_eq!(
        v("felix_ipsets_calico"),
        prom.value("felixrs_ip_sets"),
        "the same quantity"
    );
    // The types Prometheus recorded from the scrape are Felix's (its counters: see the module
    // docs of `agent/metrics/felix.rs`).
    for (metric, kind) in [
        ("felix_int_dataplane_apply_time_seconds", "summary"),
        ("felix_calc_graph_update_time_seconds", "summary"),
        ("felix_active_local_endpoints", "gauge"),
        ("felix_iptables_rules", "gauge"),
        ("felix_iptables_restore_calls", "unknown"),
    ] {
        let (_, body) = prom
            .get(&format!("/api/v1/metadata?metric={metric}"))
            .expect("metadata");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["data"][metric][0]["type"], kind, "{metric}: {body}");
    }
    let elapsed = started.elapsed();
    eprintln!("felix dashboard test: {checked} queries with series, {elapsed:?}");
}
