//! The web view (`felixrs agent --web-view`): a page on the agent's status port showing the
//! node's live flows, its policies' hits and staged differences, and which policies apply to
//! each pod. Off by default: without the flag none of these routes exist.
//!
//! Routes (merged into the status router, beside `/flows` of [`crate::flowlog::http`]):
//! * `GET /ui/`: the page; `/ui/app.js`, `/ui/app.css` its script and style, embedded in the
//!   binary (`include_str!`): the page loads nothing from anywhere else. `/ui` redirects.
//! * `GET /api/pods`: [`pods`], the node's pods and the policies that apply, per direction and
//!   tier, from the agent's applied view.
//! * `GET /api/policies`: [`policies`], per-policy hits from the kernel counters and staged
//!   differences from the flow records.
//!
//! Every response carries a strict Content-Security-Policy (`default-src 'self'`: no inline
//! script, no inline style attribute, no other origin, no framing). The page's script puts text
//! into the DOM only through `textContent` and `createElement`, never as HTML, so a pod, policy,
//! label or kernel-derived name is shown as the text it is.

pub mod pods;
pub mod policies;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Json, Redirect, Response};
use axum::routing::get;

use crate::agent::status::StatusHub;
use crate::flowlog::FlowHub;
use pods::PodsDoc;

/// The page's Content-Security-Policy: everything from this origin only, no inline script or
/// style, no plugins, no `<base>`, no forms, never inside a frame.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// What the web view's handlers read.
pub struct WebView {
    status: Arc<StatusHub>,
    flows: Arc<FlowHub>,
    node: String,
    /// The last `/api/pods` document, by applied revision: the graph runs once per revision.
    pods: Mutex<Option<Arc<PodsDoc>>>,
}

impl WebView {
    pub fn new(status: Arc<StatusHub>, flows: Arc<FlowHub>, node: &str) -> Arc<Self> {
        Arc::new(WebView {
            status,
            flows,
            node: node.to_string(),
            pods: Mutex::new(None),
        })
    }
}

/// The web view's routes, to be merged into the agent's status router.
pub fn routes(view: Arc<WebView>) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/ui/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route("/api/pods", get(api_pods))
        .route("/api/policies", get(api_policies))
        .with_state(view)
        .layer(axum::middleware::map_response(security_headers))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    res
}

async fn api_pods(State(view): State<Arc<WebView>>) -> Response {
    let revision = view.status.applied_view_revision();
    let cached = view.pods.lock().expect("web pods lock").clone();
    if let Some(doc) = cached
        && doc.revision == revision
    {
        return Json(doc.as_ref()).into_response();
    }
    // Running the graph over the view costs milliseconds to a few hundred at 2,000 policies:
    // off the async workers.
    let v = view.clone();
    let built = tokio::task::spawn_blocking(move || {
        let applied = v.status.applied_view();
        Arc::new(pods::pods_of(&v.node, applied.as_ref()))
    })
    .await;
    match built {
        Ok(doc) => {
            *view.pods.lock().expect("web pods lock") = Some(doc.clone());
            Json(doc.as_ref()).into_response()
        }
        Err(e) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("pods view: {e}"),
        )
            .into_response(),
    }
}

async fn api_policies(State(view): State<Arc<WebView>>) -> Json<policies::PoliciesDoc> {
    let tallies = view.status.metrics.policy_counters.tallies();
    let records = view.flows.recent();
    Json(policies::policies_of(&view.node, &tallies, &records))
}
