//! The writer against a real etcd: create, update, delete, orphans, idempotence, ownership, batching,
//! fencing.

mod support;

use std::collections::BTreeMap;

use etcd_client::GetOptions;
use felixrs_test_support::etcd::Etcd;
use policy_controller::convert::RESOURCE_PREFIX;
use policy_controller::writer::{Desired, Fence, OWNER_MARKER_PREFIX, Writer, WriterError};
use support::etcd::EtcdClientExt;

fn key(rest: &str) -> String {
    format!("{RESOURCE_PREFIX}{rest}")
}

fn mk_desired(items: &[(&str, &str)]) -> Desired {
    Desired {
        resources: items.iter().map(|(k, v)| (key(k), v.to_string())).collect(),
        ..Desired::default()
    }
}

async fn dump(c: &mut etcd_client::Client) -> BTreeMap<String, String> {
    let resp = c
        .get("/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn revision(c: &mut etcd_client::Client) -> i64 {
    c.get("/", None).await.unwrap().header().unwrap().revision()
}

#[tokio::test]
async fn sync_change_delete_and_idempotence() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    // Keys the controller does not own must survive everything.
    c.put(key("globalnetworkpolicies/admin"), r#"{"x":1}"#, None)
        .await
        .unwrap();
    c.put(key("profiles/projectcalico-default-allow"), "{}", None)
        .await
        .unwrap();
    c.put(key("networkpolicies/prod/handwritten"), "{}", None)
        .await
        .unwrap();
    // An orphan the controller owns (by pattern) from an earlier run.
    c.put(key("profiles/kns.gone"), "{}", None).await.unwrap();

    let mut w = Writer::new(c.clone());
    let d1 = mk_desired(&[
        ("profiles/kns.prod", r#"{"a":1}"#),
        ("networkpolicies/prod/knp.default.db", r#"{"b":1}"#),
        ("globalnetworkpolicies/from-manifest", r#"{"g":1}"#),
    ]);
    let s = w.sync(&d1).await.unwrap();
    assert_eq!((s.created, s.updated, s.deleted), (3, 0, 1));
    assert_eq!(s.revision, revision(&mut c).await);
    let all = dump(&mut c).await;
    assert_eq!(all[&key("profiles/kns.prod")], r#"{"a":1}"#);
    assert!(!all.contains_key(&key("profiles/kns.gone")));
    assert!(all.contains_key(&key("globalnetworkpolicies/admin")));
    assert!(all.contains_key(&key("networkpolicies/prod/handwritten")));
    assert!(all.contains_key(&format!(
        "{OWNER_MARKER_PREFIX}{}",
        key("globalnetworkpolicies/from-manifest")
    )));

    // Second pass, nothing changed: nothing written, revision unchanged.
    let rev = revision(&mut c).await;
    let s = w.sync(&d1).await.unwrap();
    assert_eq!((s.created, s.updated, s.deleted), (0, 0, 0));
    assert_eq!(s.revision, rev);
    assert_eq!(revision(&mut c).await, rev);

    // Same JSON, different formatting: still nothing to write.
    let d1b = mk_desired(&[
        ("profiles/kns.prod", r#"{ "a" : 1 }"#),
        ("networkpolicies/prod/knp.default.db", r#"{"b":1}"#),
        ("globalnetworkpolicies/from-manifest", r#"{"g":1}"#),
    ]);
    assert_eq!(w.sync(&d1b).await.unwrap().updated, 0);

    // Change one, drop the manifest resource: update + delete (marker removed too).
    let d2 = mk_desired(&[
        ("profiles/kns.prod", r#"{"a":2}"#),
        ("networkpolicies/prod/knp.default.db", r#"{"b":1}"#),
    ]);
    let s = w.sync(&d2).await.unwrap();
    assert_eq!((s.created, s.updated, s.deleted), (0, 1, 1));
    let all = dump(&mut c).await;
    assert_eq!(all[&key("profiles/kns.prod")], r#"{"a":2}"#);
    assert!(!all.contains_key(&key("globalnetworkpolicies/from-manifest")));
    assert!(!all.keys().any(|k| k.starts_with(OWNER_MARKER_PREFIX)));
    assert!(
        all.contains_key(&key("globalnetworkpolicies/admin")),
        "unowned key deleted"
    );

    // Retained keys (objects that failed validation) are kept although not desired.
    let mut d3 = mk_desired(&[("profiles/kns.prod", r#"{"a":2}"#)]);
    d3.retain.insert(key("networkpolicies/prod/knp.default.db"));
    assert_eq!(w.sync(&d3).await.unwrap().deleted, 0);
    assert!(
        dump(&mut c)
            .await
            .contains_key(&key("networkpolicies/prod/knp.default.db"))
    );
}

#[tokio::test]
async fn large_syncs_are_batched_within_txn_limits() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let mut w = Writer::new(c.clone());
    let items: Vec<(String, String)> = (0..300)
        .map(|i| {
            (
                format!("workloadendpoints/ns/n-k8s-p{i}-eth0"),
                format!(r#"{{"i":{i}}}"#),
            )
        })
        .collect();
    let d = Desired {
        resources: items.iter().map(|(k, v)| (key(k), v.clone())).collect(),
        ..Desired::default()
    };
    let s = w.sync(&d).await.unwrap();
    assert_eq!(s.created, 300);
    // One revision per transaction: 300 creates need at least 3 transactions of <=128.
    let first = c
        .get(key("workloadendpoints/ns/n-k8s-p0-eth0"), None)
        .await
        .unwrap();
    let rev0 = first.kvs()[0].mod_revision();
    assert!(
        s.revision - rev0 >= 2,
        "expected several transactions, revisions {rev0}..{}",
        s.revision
    );
    let s = w.sync(&Desired::default()).await.unwrap();
    assert_eq!(s.deleted, 300);
    assert!(dump(&mut c).await.is_empty());
}

#[tokio::test]
async fn a_fenced_writer_cannot_write() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let put = c.put("/leader/x", "me", None).await.unwrap();
    let rev = put.header().unwrap().revision();
    let mut w = Writer::new(c.clone());
    w.set_fence(Some(Fence {
        key: b"/leader/x".to_vec(),
        create_revision: rev,
    }));
    let d = mk_desired(&[("profiles/kns.a", "{}")]);
    assert_eq!(w.sync(&d).await.unwrap().created, 1);
    // Leadership gone: the fence key disappears.
    c.delete("/leader/x", None).await.unwrap();
    let d = mk_desired(&[("profiles/kns.b", "{}")]);
    match w.sync(&d).await {
        Err(WriterError::Fenced(k)) => assert_eq!(k, "/leader/x"),
        other => panic!("expected fenced error, got {other:?}"),
    }
    assert!(!dump(&mut c).await.contains_key(&key("profiles/kns.b")));
}

#[tokio::test]
async fn a_tampered_owned_key_is_restored() {
    let etcd = Etcd::start();
    let mut c = etcd.client().await;
    let mut w = Writer::new(c.clone());
    w.sync(&mk_desired(&[("profiles/kns.a", r#"{"v":1}"#)]))
        .await
        .unwrap();
    // Someone else edits an owned key; the next pass puts the desired value back.
    c.put(key("profiles/kns.a"), r#"{"v":"tampered"}"#, None)
        .await
        .unwrap();
    let s = w
        .sync(&mk_desired(&[("profiles/kns.a", r#"{"v":1}"#)]))
        .await
        .unwrap();
    assert_eq!(s.updated, 1);
    assert_eq!(dump(&mut c).await[&key("profiles/kns.a")], r#"{"v":1}"#);
}
