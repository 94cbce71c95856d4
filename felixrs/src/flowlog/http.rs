//! `GET /flows` on the agent's status port: the flow records as JSON lines
//! (`application/x-ndjson`). First the records the hub keeps, then, unless `?follow=false`, each
//! new record as it is published, until the client goes away.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;

use super::FlowRecord;
use super::hub::FlowHub;

#[derive(Debug, Deserialize)]
struct FlowsQuery {
    follow: Option<bool>,
}

/// The flow routes, to be merged into the agent's status router.
pub fn routes(hub: Arc<FlowHub>) -> Router {
    Router::new().route("/flows", get(flows)).with_state(hub)
}

fn line(r: &FlowRecord) -> Result<String, std::convert::Infallible> {
    let mut s = r.to_json_line();
    s.push('\n');
    Ok(s)
}

async fn flows(State(hub): State<Arc<FlowHub>>, Query(q): Query<FlowsQuery>) -> Response {
    // Subscribe before copying the kept records, so nothing published in between is missed
    // (a record may then appear twice; readers key records by their fields, not their count).
    let live = hub.subscribe();
    let kept = futures::stream::iter(hub.recent().into_iter().map(|r| line(&r)));
    let body = if q.follow.unwrap_or(true) {
        let live = futures::stream::unfold((live, hub), |(mut rx, hub)| async move {
            loop {
                match rx.recv().await {
                    Ok(r) => return Some((line(&r), (rx, hub))),
                    Err(RecvError::Lagged(n)) => hub.note_lagged(n),
                    Err(RecvError::Closed) => return None,
                }
            }
        });
        Body::from_stream(kept.chain(live))
    } else {
        Body::from_stream(kept)
    };
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flowlog::{FlowAction, FlowEnd, FlowPolicies, Reporter};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn record(port: u16) -> FlowRecord {
        FlowRecord {
            start_time: 1,
            end_time: 2,
            host: "n".into(),
            reporter: Reporter::Dst,
            proto: "tcp".into(),
            source: FlowEnd {
                kind: "net".into(),
                ..FlowEnd::default()
            },
            dest: FlowEnd {
                port: Some(port),
                kind: "wep".into(),
                ..FlowEnd::default()
            },
            action: FlowAction::Deny,
            pending_action: None,
            policies: FlowPolicies::default(),
            num_connections_started: 1,
            num_connections_completed: 0,
            num_connections_live: 0,
            packets_in: 1,
            packets_out: 0,
            bytes_in: 60,
            bytes_out: 0,
        }
    }

    async fn serve(hub: Arc<FlowHub>) -> std::net::SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, routes(hub)).await });
        addr
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> tokio::net::TcpStream {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        s
    }

    #[tokio::test]
    async fn kept_records_then_live_ones_as_json_lines() {
        let hub = FlowHub::new(2);
        for p in [1, 2, 3] {
            hub.publish(record(p));
        }
        let addr = serve(hub.clone()).await;

        let mut s = get(addr, "/flows?follow=false").await;
        let mut body = String::new();
        s.read_to_string(&mut body).await.unwrap();
        assert!(body.contains("application/x-ndjson"), "{body}");
        // The hub keeps two: the oldest is gone.
        assert!(!body.contains(r#""port":1,"#), "{body}");
        assert!(
            body.contains(r#""port":2,"#) && body.contains(r#""port":3,"#),
            "{body}"
        );

        let mut s = get(addr, "/flows").await;
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        // The kept records arrive first; then one published after the reader connected.
        while !seen.contains(r#""port":3,"#) {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "stream ended early: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        hub.publish(record(4));
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while !seen.contains(r#""port":4,"#) {
            let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
                .await
                .expect("the live record within 10 s")
                .unwrap();
            assert!(n > 0, "stream ended early: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        assert_eq!(hub.published(), 4);
    }
}
