//! The web view (`felixrs agent --web-view`) in a real browser: the status router with the web
//! view's routes served in-process on a real TCP port, a `FlowHub` the test publishes records
//! into, an applied view built from `examples/demo-cluster` (node-1) and kernel counters the test
//! sets; headless Chromium from Debian loads `/ui/` and the test asserts on its DOM. Screenshots
//! go to `target/test-artifacts/web-view/`.

mod browser_support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use browser_support::{Chromium, eval, screenshot, wait_for};
use calc_graph::proto::IpVersion;
use felixrs::agent::metrics::Metrics;
use felixrs::agent::status::{self, StatusHub};
use felixrs::flowlog::{
    FlowAction, FlowEnd, FlowHub, FlowPolicies, FlowRecord, PolicyHit, Reporter,
};
use iptables::model::Counters;
use iptables::stats::{Action, CounterKey, Direction, Source, Tally};
use tokio_util::sync::CancellationToken;

const NODE: &str = "node-1";

/// The agent's HTTP side as `felixrs agent --web-view` wires it, on 127.0.0.1.
struct Served {
    addr: SocketAddr,
    status: Arc<StatusHub>,
    flows: Arc<FlowHub>,
    cancel: CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn serve(web_view: bool) -> Served {
    let status = StatusHub::new(Metrics::new());
    let flows = FlowHub::new(felixrs::flowlog::hub::DEFAULT_RECENT);
    let hub = web_view.then_some(&flows);
    let routes = status::router(status.clone())
        .merge(felixrs::agent::http_routes(&status, hub, web_view, NODE));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(status::serve_routes(
        listener,
        routes,
        cancel.clone().cancelled_owned(),
    ));
    Served {
        addr,
        status,
        flows,
        cancel,
    }
}

/// The demo cluster's objects as the controller writes them to etcd, applied at revision 7.
fn apply_demo_cluster(status: &StatusHub) {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-cluster");
    let set = k8s_convert::load_manifests(&[dir], &k8s_convert::ConvertOptions::default())
        .expect("demo cluster manifests");
    let changes = (set.resources.iter())
        .map(|(k, r)| {
            (
                Arc::<str>::from(k.as_str()),
                Some(Arc::<[u8]>::from(r.to_json().into_bytes())),
            )
        })
        .collect();
    status.apply_view(7, changes);
}

fn tally(entries: &[(Source, &str, &str, Direction, Action, u64)]) -> Tally {
    let mut t = Tally::default();
    for (source, tier, name, direction, action, packets) in entries {
        t.counters.insert(
            CounterKey {
                source: *source,
                tier: (*tier).into(),
                name: (*name).into(),
                direction: *direction,
                action: *action,
            },
            Counters {
                packets: *packets,
                bytes: packets * 60,
            },
        );
    }
    t
}

fn end(ns: Option<&str>, name: Option<&str>, ip: &str, port: Option<u16>) -> FlowEnd {
    FlowEnd {
        ip: Some(ip.parse().unwrap()),
        port,
        kind: if name.is_some() { "wep" } else { "net" }.into(),
        namespace: ns.map(Into::into),
        name: name.map(Into::into),
        labels: BTreeMap::new(),
    }
}

fn hit(kind: &str, ns: Option<&str>, name: &str, action: FlowAction) -> PolicyHit {
    PolicyHit {
        kind: kind.into(),
        tier: (kind != "Profile").then(|| "default".into()),
        namespace: ns.map(Into::into),
        name: name.into(),
        action,
        rule_index: Some(0),
    }
}

fn record(source: FlowEnd, dest: FlowEnd, action: FlowAction, enforced: PolicyHit) -> FlowRecord {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    FlowRecord {
        start_time: now - 1,
        end_time: now,
        host: NODE.into(),
        reporter: Reporter::Dst,
        proto: "tcp".into(),
        source,
        dest,
        action,
        pending_action: None,
        policies: FlowPolicies {
            enforced: vec![enforced],
            pending: vec![],
        },
        num_connections_started: 1,
        num_connections_completed: 0,
        num_connections_live: 1,
        packets_in: 3,
        packets_out: 2,
        bytes_in: 180,
        bytes_out: 120,
    }
}

/// shop/web-0 allowed from monitoring/prom-0 by the web policy.
fn allowed_to_web() -> FlowRecord {
    record(
        end(
            Some("monitoring"),
            Some("prom-0"),
            "10.65.1.30",
            Some(40000),
        ),
        end(Some("shop"), Some("web-0"), "10.65.1.10", Some(8080)),
        FlowAction::Allow,
        hit(
            "NetworkPolicy",
            Some("shop"),
            "knp.default.web",
            FlowAction::Allow,
        ),
    )
}

/// shop/db-0 denied from an outside address at the end of the default tier.
fn denied_to_db() -> FlowRecord {
    let mut r = record(
        end(None, None, "192.0.2.7", Some(51000)),
        end(Some("shop"), Some("db-0"), "10.65.1.11", Some(5432)),
        FlowAction::Deny,
        PolicyHit {
            kind: "EndOfTier".into(),
            tier: Some("default".into()),
            namespace: None,
            name: "default".into(),
            action: FlowAction::Deny,
            rule_index: None,
        },
    );
    r.packets_out = 0;
    r
}

/// shop/web-0 allowed, but a staged deny-all would deny it.
fn staged_would_deny() -> FlowRecord {
    let mut r = record(
        end(Some("shop"), Some("web-0"), "10.65.1.10", Some(41000)),
        end(Some("shop"), Some("db-0"), "10.65.1.11", Some(5432)),
        FlowAction::Allow,
        hit(
            "NetworkPolicy",
            Some("shop"),
            "knp.default.db-from-web",
            FlowAction::Allow,
        ),
    );
    r.pending_action = Some(FlowAction::Deny);
    r.policies.pending = vec![hit(
        "StagedNetworkPolicy",
        Some("shop"),
        "deny-all",
        FlowAction::Deny,
    )];
    r
}

const ROWS: &str =
    "Array.from(document.querySelectorAll('#flows-body tr')).map(tr => tr.textContent)";

fn rows_are(n: usize) -> String {
    format!("document.querySelectorAll('#flows-body tr').length === {n}")
}

/// Sets an input's value as typing would and returns the page's hash.
fn type_into(id: &str, value: &str) -> String {
    format!(
        "(() => {{ const i = document.getElementById('{id}'); i.value = {v}; \
         i.dispatchEvent(new Event('input')); return location.hash; }})()",
        v = serde_json::to_string(value).unwrap()
    )
}

/// Rows appear live, filters narrow them and stick in the URL, and the policy and pod views show
/// the counters and the applied view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_flows_filters_and_the_policy_and_pod_views() {
    let s = serve(true).await;
    apply_demo_cluster(&s.status);
    s.status.metrics.policy_counters.set(vec![(
        IpVersion::V4,
        tally(&[
            (
                Source::NetworkPolicy,
                "default",
                "shop/knp.default.web",
                Direction::Ingress,
                Action::Allow,
                7,
            ),
            (
                Source::TierEnd,
                "default",
                "",
                Direction::Ingress,
                Action::Deny,
                3,
            ),
        ]),
    )]);
    // Kept before the page connects: shown from the hub's ring.
    s.flows.publish(allowed_to_web());

    let chromium = Chromium::launch().await;
    let base = format!("http://{}", s.addr);
    let page = chromium.open(&format!("{base}/ui/")).await;
    wait_for(&page, &rows_are(1), Duration::from_secs(20), ROWS).await;
    assert_eq!(
        eval(&page, "document.getElementById('node').textContent").await,
        NODE
    );

    // Live: a denied flow published now is on the page within 2 s.
    let published = Instant::now();
    s.flows.publish(denied_to_db());
    wait_for(
        &page,
        "document.querySelector('#flows-body tr[data-verdict=deny]') !== null",
        Duration::from_secs(2),
        ROWS,
    )
    .await;
    let shown_after = published.elapsed();
    eprintln!("a published flow was on the page after {shown_after:?}");
    assert!(shown_after <= Duration::from_secs(2), "{shown_after:?}");
    s.flows.publish(staged_would_deny());
    wait_for(&page, &rows_are(3), Duration::from_secs(5), ROWS).await;
    // Newest first.
    let rows = eval(&page, ROWS).await;
    let first = rows[0].as_str().unwrap();
    assert!(
        first.contains("would deny") && first.contains("deny-all"),
        "{rows}"
    );
    assert!(rows[1].as_str().unwrap().contains("192.0.2.7"), "{rows}");
    assert!(rows[2].as_str().unwrap().contains("prom-0"), "{rows}");
    assert_eq!(
        eval(
            &page,
            "[1,2,3,4].map(i => document.querySelector('#stats .stat:nth-child(' + i + ') b').textContent)"
        )
        .await,
        serde_json::json!(["3", "2", "1", "1"]),
        "flows, allowed, denied, staged would deny"
    );
    screenshot(&page, "flows").await;

    // Verdict filter: only the denied flow; the filter is in the URL.
    let hash = eval(
        &page,
        "(() => { const s = document.getElementById('f-verdict'); s.value = 'deny'; \
         s.dispatchEvent(new Event('change')); return location.hash; })()",
    )
    .await;
    assert_eq!(hash, "#verdict=deny");
    wait_for(&page, &rows_are(1), Duration::from_secs(5), ROWS).await;
    assert!(
        eval(&page, ROWS).await[0]
            .as_str()
            .unwrap()
            .contains("db-0")
    );
    // Namespace and pod filters narrow; clearing brings every row back.
    eval(&page, "document.getElementById('f-clear').click()").await;
    wait_for(&page, &rows_are(3), Duration::from_secs(5), ROWS).await;
    assert_eq!(
        eval(&page, &type_into("f-ns", "monitoring")).await,
        "#ns=monitoring"
    );
    wait_for(&page, &rows_are(1), Duration::from_secs(5), ROWS).await;
    assert!(
        eval(&page, ROWS).await[0]
            .as_str()
            .unwrap()
            .contains("prom-0")
    );
    eval(&page, &type_into("f-ns", "")).await;
    eval(&page, &type_into("f-pod", "db-0")).await;
    wait_for(&page, &rows_are(2), Duration::from_secs(5), ROWS).await;
    eval(&page, &type_into("f-pod", "")).await;
    // Policy filter: matches enforced and staged policies.
    eval(&page, &type_into("f-policy", "deny-all")).await;
    wait_for(&page, &rows_are(1), Duration::from_secs(5), ROWS).await;
    eval(&page, &type_into("f-policy", "knp.default.web")).await;
    wait_for(&page, &rows_are(1), Duration::from_secs(5), ROWS).await;
    assert!(
        eval(&page, ROWS).await[0]
            .as_str()
            .unwrap()
            .contains("prom-0")
    );
    eval(&page, &type_into("f-policy", "")).await;
    // Staged would deny.
    let hash = eval(
        &page,
        "(() => { const c = document.getElementById('f-staged'); c.click(); return location.hash; })()",
    )
    .await;
    assert_eq!(hash, "#staged=1");
    wait_for(&page, &rows_are(1), Duration::from_secs(5), ROWS).await;
    assert!(
        eval(
            &page,
            "document.querySelector('#flows-body tr').classList.contains('staged-deny-row')"
        )
        .await
            == serde_json::Value::Bool(true)
    );
    screenshot(&page, "flows-staged-would-deny").await;

    // Sticky: a fresh page at a URL with filters restores them.
    let sticky = chromium
        .open(&format!("{base}/ui/#ns=shop&verdict=deny"))
        .await;
    wait_for(&sticky, &rows_are(1), Duration::from_secs(10), ROWS).await;
    assert_eq!(
        eval(
            &sticky,
            "[document.getElementById('f-ns').value, document.getElementById('f-verdict').value]"
        )
        .await,
        serde_json::json!(["shop", "deny"])
    );

    // The per-policy view: kernel counters and staged differences.
    eval(
        &page,
        "document.querySelector('#tabs button[data-view=policies]').click()",
    )
    .await;
    let policies = "Array.from(document.querySelectorAll('#policies-body tr')).map(tr => tr.dataset.name + ' | ' + tr.innerText.replace(/\\s+/g, ' '))";
    wait_for(
        &page,
        "document.querySelector('#policies-body tr[data-name=\"shop/deny-all\"]') !== null",
        Duration::from_secs(10),
        policies,
    )
    .await;
    assert_eq!(
        eval(&page, "location.hash").await,
        "#view=policies&staged=1"
    );
    // The staged filter shows only the policy with staged differences.
    let only = eval(&page, policies).await;
    assert_eq!(only.as_array().unwrap().len(), 1, "{only}");
    eval(&page, "document.getElementById('f-clear').click()").await;
    wait_for(
        &page,
        "document.querySelectorAll('#policies-body tr').length >= 4",
        Duration::from_secs(10),
        policies,
    )
    .await;
    let cell = |name: &str, col: usize| {
        format!(
            "document.querySelector('#policies-body tr[data-name=\"{name}\"]').children[{col}].textContent"
        )
    };
    // Columns: policy, tier, packets, bar, counters, flows allowed, flows denied, staged deny, staged allow.
    assert_eq!(eval(&page, &cell("shop/knp.default.web", 2)).await, "7");
    assert_eq!(eval(&page, &cell("shop/knp.default.web", 5)).await, "1");
    assert_eq!(eval(&page, &cell("default", 2)).await, "3");
    assert_eq!(eval(&page, &cell("default", 6)).await, "1");
    assert_eq!(eval(&page, &cell("shop/deny-all", 7)).await, "1");
    assert_eq!(eval(&page, &cell("shop/deny-all", 8)).await, "0");
    // Most packets first.
    assert_eq!(
        eval(
            &page,
            "document.querySelector('#policies-body tr').dataset.name"
        )
        .await,
        "shop/knp.default.web"
    );
    screenshot(&page, "policies").await;

    // The per-pod view: node-1's pods and the policies the applied view gives them.
    eval(
        &page,
        "document.querySelector('#tabs button[data-view=pods]').click()",
    )
    .await;
    let pods = "Array.from(document.querySelectorAll('.pod-card')).map(c => c.dataset.pod)";
    wait_for(
        &page,
        "document.querySelector('.pod-card[data-pod=\"shop/web-0\"]') !== null",
        Duration::from_secs(10),
        pods,
    )
    .await;
    let names = eval(&page, pods).await;
    assert!(
        names.as_array().unwrap().iter().all(|n| n != "shop/web-1"),
        "web-1 is on node-2: {names}"
    );
    let section = |pod: &str, dir: &str| {
        format!("document.querySelector('.pod-card[data-pod=\"{pod}\"] .dir.{dir}').textContent")
    };
    let web_in = eval(&page, &section("shop/web-0", "ingress")).await;
    assert!(
        web_in.as_str().unwrap().contains("shop/knp.default.web"),
        "{web_in}"
    );
    let web_out = eval(&page, &section("shop/web-0", "egress")).await;
    assert!(
        web_out.as_str().unwrap().contains("shop/knp.default.web"),
        "{web_out}"
    );
    let db_in = eval(&page, &section("shop/db-0", "ingress")).await;
    assert!(
        db_in
            .as_str()
            .unwrap()
            .contains("shop/knp.default.db-from-web"),
        "{db_in}"
    );
    assert!(
        !db_in.as_str().unwrap().contains("knp.default.web"),
        "the web policy does not select db: {db_in}"
    );
    let labels = eval(
        &page,
        "document.querySelector('.pod-card[data-pod=\"shop/web-0\"] .labels').textContent",
    )
    .await;
    assert!(labels.as_str().unwrap().contains("app=web"), "{labels}");
    screenshot(&page, "pods").await;

    chromium.close().await;
}

/// The hostile strings: each would run script or break out of its cell if it were parsed as HTML.
const HOSTILE: &[&str] = &[
    "<script>window.__pwned = 'script'</script>",
    "\"><img src=x onerror=\"window.__pwned='attr'\">",
    "</td></tr><tr><td>forged",
    "<img src=x onerror=window.__pwned='img'>",
];

/// Hostile pod, namespace, label and policy names and NFLOG-derived text are shown as text and
/// never run, in the flows table, the policy view and the URL-restored filters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_are_shown_as_text_never_run() {
    let s = serve(true).await;
    apply_demo_cluster(&s.status);
    for (i, h) in HOSTILE.iter().enumerate() {
        let mut src = end(Some(h), Some(h), "10.65.9.1", Some(1000 + i as u16));
        src.labels.insert("app".into(), (*h).into());
        let dst = end(Some("shop"), Some("web-0"), "10.65.1.10", Some(8080));
        let mut r = record(
            src,
            dst,
            FlowAction::Deny,
            hit("NetworkPolicy", Some("shop"), h, FlowAction::Deny),
        );
        // What a kernel prefix or an unknown protocol could carry.
        r.proto = (*h).into();
        r.host = (*h).into();
        s.flows.publish(r);
    }
    let chromium = Chromium::launch().await;
    let page = chromium.open(&format!("http://{}/ui/", s.addr)).await;
    wait_for(
        &page,
        &rows_are(HOSTILE.len()),
        Duration::from_secs(20),
        ROWS,
    )
    .await;
    // Give any injected handler (an image error) time to fire.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = eval(&page, "document.getElementById('flows-body').textContent").await;
    let text = text.as_str().unwrap();
    for h in HOSTILE {
        assert!(text.contains(h), "{h:?} shown as text in {text}");
    }
    let titles = eval(
        &page,
        "Array.from(document.querySelectorAll('#flows-body td.end')).map(td => td.title).join('\\n')",
    )
    .await;
    for h in HOSTILE {
        assert!(
            titles.as_str().unwrap().contains(h),
            "label {h:?} in {titles}"
        );
    }
    let safe = "[typeof window.__pwned, document.querySelectorAll('main img, main script, main iframe').length, \
                document.querySelectorAll('#flows-body tr').length, \
                Array.from(document.querySelectorAll('#flows-body tr')).every(tr => tr.children.length === 10)]";
    assert_eq!(
        eval(&page, safe).await,
        serde_json::json!(["undefined", 0, HOSTILE.len(), true])
    );
    screenshot(&page, "hostile-flows").await;

    // The policy view names the hostile policies as text.
    eval(
        &page,
        "document.querySelector('#tabs button[data-view=policies]').click()",
    )
    .await;
    wait_for(
        &page,
        &format!(
            "document.querySelectorAll('#policies-body tr').length >= {}",
            HOSTILE.len()
        ),
        Duration::from_secs(10),
        "document.getElementById('policies-body').textContent",
    )
    .await;
    let text = eval(
        &page,
        "document.getElementById('policies-body').textContent",
    )
    .await;
    for h in HOSTILE {
        assert!(text.as_str().unwrap().contains(h), "{h:?} in {text}");
    }

    // A hostile filter in the URL is restored as the input's value, and runs nothing.
    let hash = format!(
        "#policy={}",
        HOSTILE[3]
            .bytes()
            .map(|b| format!("%{b:02X}"))
            .collect::<String>()
    );
    let restored = chromium.open(&format!("http://{}/ui/{hash}", s.addr)).await;
    wait_for(&restored, &rows_are(1), Duration::from_secs(10), ROWS).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        eval(
            &restored,
            "[document.getElementById('f-policy').value, typeof window.__pwned, \
              document.querySelectorAll('main img, main script').length]"
        )
        .await,
        serde_json::json!([HOSTILE[3], "undefined", 0])
    );
    assert_eq!(
        eval(&page, "typeof window.__pwned").await,
        "undefined",
        "nothing ran on the first page either"
    );
    screenshot(&page, "hostile-policies").await;
    chromium.close().await;
}

/// `GET path` over HTTP/1.1: (status, headers lower-cased, body).
fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, head.to_ascii_lowercase(), body.to_string())
}

/// Without the web view none of its routes (nor `/flows`) exist; with it, every page and API
/// carries the strict Content-Security-Policy, and the page holds no inline script or style.
/// The agent takes the one flag, off by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routes_exist_only_with_the_web_view_and_carry_a_strict_csp() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_felixrs"))
        .args(["agent", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--web-view") && help.contains("FELIXRS_WEB_VIEW"),
        "{help}"
    );
    let off = serve(false).await;
    for path in [
        "/ui/",
        "/ui/app.js",
        "/api/pods",
        "/api/policies",
        "/flows?follow=false",
    ] {
        let addr = off.addr;
        let (code, _, _) = tokio::task::spawn_blocking(move || get(addr, path))
            .await
            .unwrap();
        assert_eq!(code, 404, "{path} without --web-view");
    }
    let addr = off.addr;
    let (code, _, _) = tokio::task::spawn_blocking(move || get(addr, "/status"))
        .await
        .unwrap();
    assert_eq!(code, 200);

    let on = serve(true).await;
    let addr = on.addr;
    let (code, _, body) = tokio::task::spawn_blocking(move || get(addr, "/api/pods"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        doc,
        serde_json::json!({"node": NODE, "revision": null, "pods": []})
    );
    apply_demo_cluster(&on.status);
    for path in [
        "/ui/",
        "/ui/app.js",
        "/ui/app.css",
        "/api/pods",
        "/api/policies",
    ] {
        let (code, head, body) = tokio::task::spawn_blocking(move || get(addr, path))
            .await
            .unwrap();
        assert_eq!(code, 200, "{path}");
        assert!(
            head.contains("content-security-policy: default-src 'self'; script-src 'self'"),
            "{path}: {head}"
        );
        assert!(
            head.contains("x-content-type-options: nosniff"),
            "{path}: {head}"
        );
        if path == "/ui/" {
            let lower = body.to_ascii_lowercase();
            assert_eq!(
                lower.matches("<script").count(),
                lower.matches("<script src=\"/ui/app.js\"").count(),
                "no inline script: {body}"
            );
            assert!(!lower.contains(" style="), "no inline style: {body}");
            let handler = lower.split(" on").skip(1).any(|rest| {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphabetic())
                    .collect();
                !name.is_empty() && rest[name.len()..].starts_with('=')
            });
            assert!(!handler, "no inline handler: {body}");
            assert!(
                !lower.contains("http://") && !lower.contains("https://"),
                "nothing external"
            );
        }
        if path == "/api/pods" {
            let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(doc["revision"], 7);
            let pods: Vec<String> = (doc["pods"].as_array().unwrap().iter())
                .map(|p| {
                    format!(
                        "{}/{}",
                        p["namespace"].as_str().unwrap(),
                        p["pod"].as_str().unwrap()
                    )
                })
                .collect();
            assert!(pods.contains(&"shop/web-0".to_string()), "{pods:?}");
            assert!(!pods.contains(&"shop/web-1".to_string()), "{pods:?}");
        }
    }
    // `/ui` leads to the page.
    let (code, head, _) = tokio::task::spawn_blocking(move || get(addr, "/ui"))
        .await
        .unwrap();
    assert_eq!(code, 308);
    assert!(head.contains("location: /ui/"), "{head}");
    // The app script never builds HTML from strings.
    let (_, _, js) = tokio::task::spawn_blocking(move || get(addr, "/ui/app.js"))
        .await
        .unwrap();
    for banned in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!js.contains(banned), "app.js uses {banned}");
    }
}
