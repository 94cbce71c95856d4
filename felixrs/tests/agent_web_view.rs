//! The web view on the real datapath: `felixrs agent --web-view --flow-logs` with real etcd and the
//! real kernel in a network namespace the test creates, two pods (`ns1/web` the client, `ns1/db`
//! the server) behind their veths, and headless Chromium in the host namespace reaching the
//! agent's status port through a relay. One agent serves every case (CI time):
//!
//! * a connection denied by a policy with the most hostile name the validators accept (the
//!   longest `knp.default.` NetworkPolicy name, made of words JavaScript objects already hold) is
//!   a row of `/ui/#verdict=deny` within 2 s of its first packet, naming that policy and both pods;
//! * the allowed connection is a row marked allowed; the per-pod view lists each pod's policies;
//! * `/flows` carries the deciding policies for allow (after a `security` tier's Pass: pass to the
//!   next tier), deny and profile verdicts, and the hostile name byte for byte.
//!
//! Screenshots go to `target/test-artifacts/web-view/`. Root.

mod browser_support;
mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use browser_support::{Chromium, eval, screenshot, wait_for};
use felixrs::flowlog::{FlowAction, FlowRecord, Reporter};
use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;
use felixrs_test_support::node::{add_pod, connects, exec, serve};
use felixrs_test_support::relay::Relay;
use serde_json::json;
use support::{Agent, put_default_tier, put_json, put_ns1_profile, put_web_endpoint};

const DB: &str = "10.70.0.2";
const ALLOWED: u16 = 7001;
const DENIED: u16 = 7002;
const ROWS: &str = "Array.from(document.querySelectorAll('#flows-body tr')).map(tr => tr.dataset.verdict + ' | ' + tr.textContent)";

/// The longest NetworkPolicy name the validators accept (253 bytes: `knp.default.` and a DNS
/// subdomain), of words a page keeping names as object keys would trip on.
fn hostile_policy_name() -> String {
    let label = |c: char, n: usize| {
        let mut s: String = std::iter::repeat_n(c, n - 2).collect();
        s.insert(n / 2, '-');
        s.push(c);
        s
    };
    let name = format!(
        "knp.default.constructor.prototype.{}.{}.",
        label('a', 63),
        label('b', 63)
    );
    let name = name.clone() + &label('c', 253 - name.len());
    assert_eq!(name.len(), 253);
    name
}

/// Pod `ns1/db` (app=db, [`DB`]) on node-1 behind `iface`, in profile `kns.ns1`.
fn put_db_endpoint(etcd: &Etcd, iface: &str) -> i64 {
    put_json(
        etcd,
        "workloadendpoints/ns1/node--1-k8s-db-eth0",
        json!({"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint",
               "metadata":{"name":"node--1-k8s-db-eth0","namespace":"ns1",
                           "labels":{"app":"db","projectcalico.org/namespace":"ns1",
                                     "projectcalico.org/orchestrator":"k8s"}},
               "spec":{"orchestrator":"k8s","node":"node-1","pod":"db","endpoint":"eth0",
                       "interfaceName":iface,"ipNetworks":[format!("{DB}/32")],
                       "profiles":["kns.ns1"]}}),
    )
}

/// The cluster: a `security` tier passing both ports to the default tier, where `allow-db`
/// allows [`ALLOWED`] and the hostile policy denies [`DENIED`]; the namespace profile allows
/// the rest (the client's egress). Returns the last revision.
fn put_cluster(etcd: &Etcd, hostile: &str) -> i64 {
    put_default_tier(etcd);
    put_json(
        etcd,
        "tiers/security",
        json!({"apiVersion":"projectcalico.org/v3","kind":"Tier",
               "metadata":{"name":"security"},"spec":{"order":10}}),
    );
    put_json(
        etcd,
        "globalnetworkpolicies/security.pass-db",
        json!({"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkPolicy",
               "metadata":{"name":"security.pass-db"},
               "spec":{"tier":"security","order":1,"selector":"app == 'db'",
                       "types":["Ingress"],
                       "ingress":[{"action":"Pass","protocol":"TCP",
                                   "destination":{"ports":[ALLOWED, DENIED]}}]}}),
    );
    put_ns1_profile(etcd);
    put_web_endpoint(etcd, "cali0000000001", &["kns.ns1"]);
    put_db_endpoint(etcd, "cali0000000002");
    put_json(
        etcd,
        "networkpolicies/ns1/allow-db",
        json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
               "metadata":{"name":"allow-db","namespace":"ns1"},
               "spec":{"tier":"default","order":100,"selector":"app == 'db'",
                       "types":["Ingress"],
                       "ingress":[{"action":"Allow","protocol":"TCP",
                                   "destination":{"ports":[ALLOWED]}}]}}),
    );
    put_json(
        etcd,
        &format!("networkpolicies/ns1/{hostile}"),
        json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
               "metadata":{"name":hostile,"namespace":"ns1"},
               "spec":{"tier":"default","order":200,"selector":"app == 'db'",
                       "types":["Ingress"],
                       "ingress":[{"action":"Deny","protocol":"TCP",
                                   "destination":{"ports":[DENIED]}}]}}),
    )
}

fn flows(agent: &Agent) -> (String, Vec<FlowRecord>) {
    let (code, body) = agent.get("/flows?follow=false").unwrap();
    assert_eq!(code, 200, "{body}");
    let records = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (body, records)
}

fn find(records: &[FlowRecord], port: u16, reporter: Reporter) -> Option<FlowRecord> {
    records
        .iter()
        .find(|r| r.dest.port == Some(port) && r.reporter == reporter && r.source.name.is_some())
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_view_shows_the_live_datapath() {
    felixrs_test_support::require_root();
    let hostile = hostile_policy_name();
    let ns = Netns::new();
    let etcd = Etcd::start_in(ns.name());
    let rev = put_cluster(&etcd, &hostile);
    // Proxy ARP answers for the pods' gateway 169.254.1.1 only on a forwarding node that routes it
    // elsewhere: a default route out of a veth pair of its own (nothing is sent there).
    for argv in [
        "ip link add up0 type veth peer name up1",
        "ip addr add 10.70.254.1/24 dev up0",
        "ip link set up0 up",
        "ip link set up1 up",
        "ip route add default via 10.70.254.2",
    ] {
        exec(&ns, &argv.split(' ').collect::<Vec<_>>());
    }
    ns.sysctl("net.ipv4.ip_forward", "1").unwrap();
    ns.sysctl("net.ipv4.conf.all.rp_filter", "0").unwrap();
    ns.sysctl("net.ipv4.conf.default.rp_filter", "0").unwrap();
    let web = add_pod(&ns, "cali0000000001", "10.70.0.1", "fd70::1");
    let db = add_pod(&ns, "cali0000000002", DB, "fd70::2");
    let db_ip: IpAddr = DB.parse().unwrap();
    serve(&db.ns, db_ip, ALLOWED);
    serve(&db.ns, db_ip, DENIED);

    let state = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        ns.name(),
        &etcd.client_url(),
        &state.path().join("state"),
        &["--web-view", "--flow-logs"],
    );
    agent.wait_applied(rev);
    assert!(
        (0..5).any(|_| connects(&web.ns, db_ip, ALLOWED)),
        "{}",
        agent.log()
    );

    // The browser runs in the host namespace; the status port is inside the node's.
    let relay = Relay::start_here(
        "127.0.0.1".parse().unwrap(),
        ns.name(),
        SocketAddr::from(([127, 0, 0, 1], agent.health.port())),
    );
    let chromium = Chromium::launch().await;
    let page = chromium
        .open(&format!("{}/ui/#verdict=deny", relay.url()))
        .await;
    // The filter is restored from the URL and the allowed flow is not shown under it.
    wait_for(
        &page,
        "document.getElementById('f-verdict').value === 'deny'",
        Duration::from_secs(20),
        ROWS,
    )
    .await;
    assert_eq!(
        eval(&page, "document.querySelectorAll('#flows-body tr').length").await,
        0,
        "{}",
        eval(&page, ROWS).await
    );

    // The denied connection: its row is in the DOM within 2 s of its first packet.
    let sent = Instant::now();
    let denied = tokio::task::spawn_blocking(move || {
        let ok = connects(&web.ns, db_ip, DENIED);
        (web, ok)
    });
    let row = "document.querySelector('#flows-body tr[data-verdict=deny]') !== null";
    wait_for(&page, row, Duration::from_secs(10), ROWS).await;
    let shown_after = sent.elapsed();
    eprintln!("the denied connection was on the page {shown_after:?} after its first packet");
    let (web, ok) = denied.await.unwrap();
    assert!(!ok, "the hostile policy denies {DENIED}");
    assert!(
        shown_after <= Duration::from_secs(2),
        "shown after {shown_after:?}"
    );
    let rows = eval(&page, ROWS).await;
    let text = rows[0].as_str().unwrap();
    for want in ["web", "db", hostile.as_str()] {
        assert!(text.contains(want), "{want:?} not in {rows}");
    }
    screenshot(&page, "agent-denied").await;

    // Clearing the filter shows the allowed flow, marked allowed.
    eval(&page, "document.getElementById('f-clear').click()").await;
    wait_for(
        &page,
        &format!(
            "Array.from(document.querySelectorAll('#flows-body tr[data-verdict=allow]')).some(tr => tr.textContent.includes('{ALLOWED}'))"
        ),
        Duration::from_secs(10),
        ROWS,
    )
    .await;
    screenshot(&page, "agent-flows").await;

    // The per-pod view: both pods and the policies the live agent gives them.
    eval(
        &page,
        "document.querySelector('#tabs button[data-view=pods]').click()",
    )
    .await;
    let pods = "Array.from(document.querySelectorAll('.pod-card')).map(c => c.dataset.pod + ' | ' + c.textContent)";
    wait_for(
        &page,
        "document.querySelector('.pod-card[data-pod=\"ns1/db\"]') !== null \
         && document.querySelector('.pod-card[data-pod=\"ns1/web\"]') !== null",
        Duration::from_secs(10),
        pods,
    )
    .await;
    let db_in = eval(
        &page,
        "document.querySelector('.pod-card[data-pod=\"ns1/db\"] .dir.ingress').textContent",
    )
    .await;
    let db_in = db_in.as_str().unwrap();
    for want in [
        "security.pass-db".to_string(),
        "ns1/allow-db".to_string(),
        format!("ns1/{hostile}"),
    ] {
        assert!(db_in.contains(&want), "{want} not in {db_in}");
    }
    let web_card = eval(
        &page,
        "document.querySelector('.pod-card[data-pod=\"ns1/web\"]').textContent",
    )
    .await;
    assert!(
        !web_card.as_str().unwrap().contains("allow-db"),
        "no policy of db selects web: {web_card}"
    );
    screenshot(&page, "agent-pods").await;
    // Nothing the names carried ran or became markup.
    assert_eq!(
        eval(
            &page,
            "document.querySelectorAll('#flows-body script, .pod-card script').length"
        )
        .await,
        0
    );
    chromium.close().await;
    drop(relay);

    // `/flows`: the deciding policies for each verdict, and the hostile name byte for byte. (A
    // record made right after `/status` reports the revision may still lack the endpoints' names,
    // refreshed every 500 ms: these are the records of a connection made now.)
    assert!(connects(&web.ns, db_ip, ALLOWED));
    let deadline = Instant::now() + Duration::from_secs(20);
    let (body, records) = loop {
        let (body, records) = flows(&agent);
        if find(&records, ALLOWED, Reporter::Dst).is_some()
            && find(&records, ALLOWED, Reporter::Src).is_some()
            && find(&records, DENIED, Reporter::Dst).is_some()
        {
            break (body, records);
        }
        assert!(Instant::now() < deadline, "{records:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let hits = |r: &FlowRecord| {
        r.policies
            .enforced
            .iter()
            .map(|h| {
                (
                    h.kind.clone(),
                    h.tier.clone(),
                    h.namespace.clone(),
                    h.name.clone(),
                    h.action,
                )
            })
            .collect::<Vec<_>>()
    };
    let some = |s: &str| Some(s.to_string());
    let allowed = find(&records, ALLOWED, Reporter::Dst).unwrap();
    assert_eq!(allowed.action, FlowAction::Allow);
    assert_eq!(
        (allowed.source.name.as_deref(), allowed.dest.name.as_deref()),
        (Some("web"), Some("db"))
    );
    // Passed by the security tier, decided in the next (default) tier.
    assert_eq!(
        hits(&allowed),
        vec![
            (
                "GlobalNetworkPolicy".into(),
                some("security"),
                None,
                "security.pass-db".into(),
                FlowAction::Pass
            ),
            (
                "NetworkPolicy".into(),
                some("default"),
                some("ns1"),
                "allow-db".into(),
                FlowAction::Allow
            ),
        ],
        "{allowed:#?}"
    );
    let denied = find(&records, DENIED, Reporter::Dst).unwrap();
    assert_eq!(denied.action, FlowAction::Deny);
    assert_eq!(
        hits(&denied).last().cloned(),
        Some((
            "NetworkPolicy".into(),
            some("default"),
            some("ns1"),
            hostile.clone(),
            FlowAction::Deny
        )),
        "{denied:#?}"
    );
    // The client's egress is allowed by its namespace's profile.
    let egress = find(&records, ALLOWED, Reporter::Src).unwrap();
    assert_eq!(egress.action, FlowAction::Allow);
    let last = egress.policies.enforced.last().expect("a deciding hit");
    assert_eq!(
        (last.kind.as_str(), last.name.as_str(), last.action),
        ("Profile", "kns.ns1", FlowAction::Allow),
        "{egress:#?}"
    );
    assert!(
        body.contains(&format!("\"{hostile}\"")),
        "the name as one JSON string: {body}"
    );
}
