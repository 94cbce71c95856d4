//! A fake Kubernetes API server speaking real HTTP on 127.0.0.1, for the kube-rs watch path.
//!
//! Serves list and watch for namespaces, pods, serviceaccounts (`/api/v1/<res>`), networkpolicies
//! (`/apis/networking.k8s.io/v1/networkpolicies`) and the admin-policy CRDs
//! (`/apis/policy.networking.k8s.io/{v1alpha1,v1alpha2}/<res>`, or 404 when "not installed"),
//! cluster-wide. Objects carry resourceVersions from
//! one counter; a watch replays logged events newer than its resourceVersion, sends a BOOKMARK, then
//! streams live events. [`FakeApiServer::disconnect_and`] ends every open watch, applies a change
//! without telling anyone and compacts the event log, so a reconnecting watcher gets the in-stream
//! `410 Gone` error and must relist. Lists are paged when the client asks (`limit`, `continue`).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::broadcast;

#[derive(Clone, Debug)]
enum Msg {
    Event { res: String, line: String },
    CloseAll,
}

#[derive(Default)]
pub struct Inner {
    rv: u64,
    objects: BTreeMap<(String, String, String), Value>,
    log: Vec<(u64, String, String)>,
    compacted: u64,
    /// Count of list requests per resource.
    pub lists: HashMap<String, usize>,
    /// Count of watches answered with 410 Gone.
    pub gone: usize,
    /// Count of bookmarks sent.
    pub bookmarks: usize,
    /// The admin-policy CRDs are "not installed": their paths answer 404.
    crds_missing: bool,
    /// Count of 404 answers.
    not_found: usize,
}

pub struct FakeApiServer {
    inner: Arc<Mutex<Inner>>,
    tx: broadcast::Sender<Msg>,
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

type Shared = (Arc<Mutex<Inner>>, broadcast::Sender<Msg>);

fn resource_of(obj: &Value) -> String {
    match obj["kind"].as_str().unwrap_or("") {
        "Namespace" => "namespaces",
        "Node" => "nodes",
        "Pod" => "pods",
        "ServiceAccount" => "serviceaccounts",
        "NetworkPolicy" => "networkpolicies",
        "AdminNetworkPolicy" => "adminnetworkpolicies",
        "BaselineAdminNetworkPolicy" => "baselineadminnetworkpolicies",
        "ClusterNetworkPolicy" => "clusternetworkpolicies",
        "StagedNetworkPolicy" => "stagednetworkpolicies",
        "StagedGlobalNetworkPolicy" => "stagedglobalnetworkpolicies",
        "StagedKubernetesNetworkPolicy" => "stagedkubernetesnetworkpolicies",
        k => panic!("fake API server does not serve kind {k}"),
    }
    .to_string()
}

fn list_kind(res: &str) -> (&'static str, &'static str) {
    match res {
        "namespaces" => ("NamespaceList", "v1"),
        "nodes" => ("NodeList", "v1"),
        "pods" => ("PodList", "v1"),
        "serviceaccounts" => ("ServiceAccountList", "v1"),
        "adminnetworkpolicies" => (
            "AdminNetworkPolicyList",
            "policy.networking.k8s.io/v1alpha1",
        ),
        "baselineadminnetworkpolicies" => (
            "BaselineAdminNetworkPolicyList",
            "policy.networking.k8s.io/v1alpha1",
        ),
        "clusternetworkpolicies" => (
            "ClusterNetworkPolicyList",
            "policy.networking.k8s.io/v1alpha2",
        ),
        "stagednetworkpolicies" => ("StagedNetworkPolicyList", "projectcalico.org/v3"),
        "stagedglobalnetworkpolicies" => ("StagedGlobalNetworkPolicyList", "projectcalico.org/v3"),
        "stagedkubernetesnetworkpolicies" => {
            ("StagedKubernetesNetworkPolicyList", "projectcalico.org/v3")
        }
        _ => ("NetworkPolicyList", "networking.k8s.io/v1"),
    }
}

impl Inner {
    /// Stores an object (bumping the resourceVersion) and logs the event; returns the watch line.
    fn record(&mut self, typ: &str, mut obj: Value) -> (String, String) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let res = resource_of(&obj);
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let key = (res.clone(), ns, name);
        if typ == "DELETED" {
            self.objects.remove(&key);
        } else {
            self.objects.insert(key, obj.clone());
        }
        let line = json!({"type": typ, "object": obj}).to_string() + "\n";
        self.log.push((self.rv, res.clone(), line.clone()));
        (res, line)
    }
}

impl FakeApiServer {
    pub async fn start() -> FakeApiServer {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let (tx, _) = broadcast::channel(1024);
        let state: Shared = (inner.clone(), tx.clone());
        let app = axum::Router::new()
            .route("/api/v1/{res}", axum::routing::get(handle))
            .route(
                "/apis/networking.k8s.io/v1/{res}",
                axum::routing::get(handle),
            )
            .route(
                "/apis/policy.networking.k8s.io/{version}/{res}",
                axum::routing::get(handle_crd),
            )
            .route(
                "/apis/projectcalico.org/{version}/{res}",
                axum::routing::get(handle_crd),
            )
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeApiServer {
            inner,
            tx,
            url,
            task,
        }
    }

    /// A kube client whose Config points at this server.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    /// Writes a kubeconfig pointing at this server into `dir`; returns its path.
    pub fn write_kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"{}\"}}}}]\n\
             users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: fake, user: u}}}}]\n\
             current-context: c\n",
            self.url
        );
        std::fs::write(&path, config).unwrap();
        path
    }

    /// Adds or replaces an object and tells the open watches.
    pub fn apply(&self, obj: Value) {
        let mut g = self.inner.lock().unwrap();
        let exists = {
            let res = resource_of(&obj);
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let name = obj["metadata"]["name"].as_str().unwrap().to_string();
            g.objects.contains_key(&(res, ns, name))
        };
        let (res, line) = g.record(if exists { "MODIFIED" } else { "ADDED" }, obj);
        let _ = self.tx.send(Msg::Event { res, line });
    }

    /// Deletes an object and tells the open watches.
    pub fn delete(&self, obj: Value) {
        let mut g = self.inner.lock().unwrap();
        let (res, line) = g.record("DELETED", obj);
        let _ = self.tx.send(Msg::Event { res, line });
    }

    /// Ends every open watch, then deletes `obj` without an event anyone can see: the log is
    /// compacted past it, so resuming from an older resourceVersion gets 410 Gone.
    pub fn disconnect_and_delete(&self, obj: Value) {
        let mut g = self.inner.lock().unwrap();
        let _ = self.tx.send(Msg::CloseAll);
        g.record("DELETED", obj);
        g.compacted = g.rv;
        g.log.clear();
    }

    /// Whether the admin-policy CRDs are served (they are by default).
    pub fn set_crds_installed(&self, installed: bool) {
        self.inner.lock().unwrap().crds_missing = !installed;
    }

    /// How many requests got 404 Not Found.
    pub fn not_found(&self) -> usize {
        self.inner.lock().unwrap().not_found
    }

    pub fn stats(&self) -> (HashMap<String, usize>, usize, usize) {
        let g = self.inner.lock().unwrap();
        (g.lists.clone(), g.gone, g.bookmarks)
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `policy.networking.k8s.io` CRDs: 404 while "not installed" (see
/// [`FakeApiServer::set_crds_installed`]), or for a version that does not serve the resource.
async fn handle_crd(
    state: State<Shared>,
    Path((version, res)): Path<(String, String)>,
    query: Query<HashMap<String, String>>,
) -> Response {
    let served = match res.as_str() {
        "adminnetworkpolicies" | "baselineadminnetworkpolicies" => version == "v1alpha1",
        "clusternetworkpolicies" => version == "v1alpha2",
        "stagednetworkpolicies"
        | "stagedglobalnetworkpolicies"
        | "stagedkubernetesnetworkpolicies" => version == "v3",
        _ => false,
    };
    let installed = !state.0.0.lock().unwrap().crds_missing;
    if !served || !installed {
        state.0.0.lock().unwrap().not_found += 1;
        let body = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "the server could not find the requested resource",
            "reason": "NotFound", "code": 404,
        });
        return Response::builder()
            .status(404)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
    }
    handle(state, Path(res), query).await
}

async fn handle(
    State((inner, tx)): State<Shared>,
    Path(res): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let (kind, api) = list_kind(&res);
    if !watch {
        let mut g = inner.lock().unwrap();
        *g.lists.entry(res.clone()).or_default() += 1;
        // Paged like the real server when asked (`limit`, `continue`: here the last key returned).
        let limit: usize = (q.get("limit").and_then(|l| l.parse().ok())).unwrap_or(usize::MAX);
        let after = q.get("continue").and_then(|c| c.split_once('/'));
        use std::ops::Bound;
        let start = match after {
            Some((ns, name)) => Bound::Excluded((res.clone(), ns.to_string(), name.to_string())),
            None => Bound::Included((res.clone(), String::new(), String::new())),
        };
        let mut items: Vec<Value> = Vec::new();
        let mut last = None;
        let mut more = false;
        for ((r, ns, name), v) in g.objects.range((start, Bound::Unbounded)) {
            if *r != res {
                break;
            }
            if items.len() == limit {
                more = true;
                break;
            }
            items.push(v.clone());
            last = Some(format!("{ns}/{name}"));
        }
        let mut metadata = json!({"resourceVersion": g.rv.to_string()});
        if more {
            metadata["continue"] = json!(last);
        }
        let body = json!({
            "kind": kind, "apiVersion": api,
            "metadata": metadata,
            "items": items,
        });
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
    }
    let since: u64 = q
        .get("resourceVersion")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let bookmarks = q.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let mut g = inner.lock().unwrap();
    let mut first: Vec<String> = Vec::new();
    let rx = if since < g.compacted {
        g.gone += 1;
        first.push(
            json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {since} ({})", g.compacted),
                "reason": "Expired", "code": 410,
            }})
            .to_string()
                + "\n",
        );
        None
    } else {
        first.extend(
            g.log
                .iter()
                .filter(|(rv, r, _)| *rv > since && *r == res)
                .map(|(_, _, l)| l.clone()),
        );
        if bookmarks {
            g.bookmarks += 1;
            let obj_kind = kind.trim_end_matches("List");
            first.push(
                json!({"type": "BOOKMARK", "object": {
                    "kind": obj_kind, "apiVersion": api,
                    "metadata": {"resourceVersion": g.rv.to_string()},
                }})
                .to_string()
                    + "\n",
            );
        }
        Some(tx.subscribe())
    };
    drop(g);
    let head = futures::stream::iter(
        first
            .into_iter()
            .map(|l| Ok::<_, Infallible>(Bytes::from(l))),
    );
    let live = futures::stream::unfold((rx, res), |(rx, res)| async move {
        let mut rx = rx?;
        loop {
            match rx.recv().await {
                Ok(Msg::Event { res: r, line }) if r == res => {
                    return Some((Ok::<_, Infallible>(Bytes::from(line)), (Some(rx), res)));
                }
                Ok(Msg::Event { .. }) => continue,
                Ok(Msg::CloseAll) | Err(_) => return None,
            }
        }
    });
    use futures::StreamExt;
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(head.chain(live)))
        .unwrap()
}
