//! kube-rs watchers for Namespace, ServiceAccount, Node, Pod, NetworkPolicy, the `policy.networking.k8s.io`
//! kinds (AdminNetworkPolicy, BaselineAdminNetworkPolicy, ClusterNetworkPolicy) and the staged
//! policy kinds of `projectcalico.org/v3`, feeding the [`Index`].
//!
//! One task per kind. Watcher events map onto the index exactly like kubert's `index::namespaced`:
//! `Apply` → `apply`, `Delete` → `delete`, and `Init`/`InitApply`/`InitDone` (every relist, including the
//! one forced by a `410 Gone`) → `relist_apply` per object as it arrives and `relist_done` at the end
//! (together one `reset`: whatever of the kind the listing did not bring is gone). After each change the writer is
//! notified. Watch errors are logged and retried with kube's default backoff; the stream never ends.
//! The admin and staged kinds are CRDs a cluster may not have installed (`SourceKind::OPTIONAL`): a `404 Not Found`
//! for one of them counts
//! as an empty listing (so the controller does not wait for it forever), and the watcher keeps retrying,
//! so objects appear once the CRD is installed.

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_convert::strict_k8s::StrictNetworkPolicy;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::ObjectRef;
use crate::convert::admin::{AdminNetworkPolicy, BaselineAdminNetworkPolicy, ClusterNetworkPolicy};
use crate::index::{Index, SourceKind};
use k8s_convert::staged::{
    WatchedStagedGlobalNetworkPolicy, WatchedStagedKubernetesNetworkPolicy,
    WatchedStagedNetworkPolicy,
};

/// The kinds [`spawn_all`] watches, for [`Index::new`]'s `waiting_for`.
pub const KINDS: [&str; 11] = [
    "Namespace",
    "Node",
    "ServiceAccount",
    "Pod",
    "NetworkPolicy",
    "AdminNetworkPolicy",
    "BaselineAdminNetworkPolicy",
    "ClusterNetworkPolicy",
    "StagedNetworkPolicy",
    "StagedGlobalNetworkPolicy",
    "StagedKubernetesNetworkPolicy",
];

/// Shared index handle.
pub type SharedIndex = Arc<Mutex<Index>>;

/// Spawns one watcher task per kind.
pub fn spawn_all(client: Client, index: SharedIndex, changed: Arc<Notify>) -> Vec<JoinHandle<()>> {
    vec![
        spawn::<Namespace>(client.clone(), index.clone(), changed.clone()),
        spawn::<ServiceAccount>(client.clone(), index.clone(), changed.clone()),
        spawn::<Node>(client.clone(), index.clone(), changed.clone()),
        spawn::<Pod>(client.clone(), index.clone(), changed.clone()),
        spawn::<StrictNetworkPolicy>(client.clone(), index.clone(), changed.clone()),
        spawn::<AdminNetworkPolicy>(client.clone(), index.clone(), changed.clone()),
        spawn::<BaselineAdminNetworkPolicy>(client.clone(), index.clone(), changed.clone()),
        spawn::<ClusterNetworkPolicy>(client.clone(), index.clone(), changed.clone()),
        spawn::<WatchedStagedNetworkPolicy>(client.clone(), index.clone(), changed.clone()),
        spawn::<WatchedStagedGlobalNetworkPolicy>(client.clone(), index.clone(), changed.clone()),
        spawn::<WatchedStagedKubernetesNetworkPolicy>(client, index, changed),
    ]
}

fn spawn<K>(client: Client, index: SharedIndex, changed: Arc<Notify>) -> JoinHandle<()>
where
    K: SourceKind
        + kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client);
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    tokio::spawn(
        run(index, events, changed).instrument(tracing::info_span!("watch", kind = K::KIND)),
    )
}

/// Applies a watcher event stream to the index until the stream ends.
pub async fn run<K, S>(index: SharedIndex, events: S, changed: Arc<Notify>)
where
    K: SourceKind + Clone,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    // What the relist in progress brought: its objects are applied as they arrive.
    let mut relist: HashSet<ObjectRef> = HashSet::new();
    while let Some(ev) = events.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(watcher::Error::InitialListFailed(e)) if K::OPTIONAL && is_not_found(&e) => {
                // The CRD is not installed: nothing of this kind exists. Keep retrying.
                let emptied = {
                    let mut idx = index.lock().expect("index lock poisoned");
                    let had = !idx.is_listed(K::KIND) || idx.count(K::KIND) > 0;
                    if had {
                        idx.reset::<K>(&[]);
                    }
                    had
                };
                if emptied {
                    tracing::info!("kind not served (CRD not installed?): treated as empty");
                    changed.notify_one();
                }
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, "watch failed, retrying");
                continue;
            }
        };
        let notify = {
            let mut idx = index.lock().expect("index lock poisoned");
            match ev {
                Event::Apply(o) => {
                    idx.apply(&o);
                    true
                }
                Event::Delete(o) => {
                    idx.delete(&o);
                    true
                }
                Event::Init => {
                    relist.clear();
                    false
                }
                Event::InitApply(o) => {
                    idx.relist_apply(&mut relist, &o);
                    false
                }
                Event::InitDone => {
                    tracing::info!(objects = relist.len(), "relisted");
                    idx.relist_done::<K>(&std::mem::take(&mut relist));
                    true
                }
            }
        };
        if notify {
            changed.notify_one();
        }
    }
}

/// Lists every kind once (for `sync --once`) into the index.
pub async fn list_once(client: Client, index: &SharedIndex) -> Result<(), kube::Error> {
    list_kind::<Namespace>(&client, index).await?;
    list_kind::<ServiceAccount>(&client, index).await?;
    list_kind::<Node>(&client, index).await?;
    list_kind::<Pod>(&client, index).await?;
    list_kind::<StrictNetworkPolicy>(&client, index).await?;
    list_kind::<AdminNetworkPolicy>(&client, index).await?;
    list_kind::<BaselineAdminNetworkPolicy>(&client, index).await?;
    list_kind::<ClusterNetworkPolicy>(&client, index).await?;
    list_kind::<WatchedStagedNetworkPolicy>(&client, index).await?;
    list_kind::<WatchedStagedGlobalNetworkPolicy>(&client, index).await?;
    list_kind::<WatchedStagedKubernetesNetworkPolicy>(&client, index).await
}

/// Whether a request failed because the API server does not serve the resource.
fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

async fn list_kind<K>(client: &Client, index: &SharedIndex) -> Result<(), kube::Error>
where
    K: SourceKind + kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let mut items = Vec::new();
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = match api.list(&params).await {
            Ok(p) => p,
            Err(e) if K::OPTIONAL && is_not_found(&e) && items.is_empty() => {
                tracing::info!(
                    kind = K::KIND,
                    "kind not served (CRD not installed?): treated as empty"
                );
                break;
            }
            Err(e) => return Err(e),
        };
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    index.lock().expect("index lock poisoned").reset(&items);
    Ok(())
}
