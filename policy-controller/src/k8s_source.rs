//! kube-rs watchers for Namespace, ServiceAccount, Pod and NetworkPolicy, feeding the [`Index`].
//!
//! One task per kind. Watcher events map onto the index exactly like kubert's `index::namespaced`:
//! `Apply` → `apply`, `Delete` → `delete`, and `Init`/`InitApply`/`InitDone` (every relist, including the
//! one forced by a `410 Gone`) → one `reset` with the complete listing. After each change the writer is
//! notified. Watch errors are logged and retried with kube's default backoff; the stream never ends.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use crate::strict_k8s::StrictNetworkPolicy;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::index::{Index, SourceKind};

/// The kinds [`spawn_all`] watches, for [`Index::new`]'s `waiting_for`.
pub const KINDS: [&str; 4] = ["Namespace", "ServiceAccount", "Pod", "NetworkPolicy"];

/// Shared index handle.
pub type SharedIndex = Arc<Mutex<Index>>;

/// Spawns one watcher task per kind.
pub fn spawn_all(client: Client, index: SharedIndex, changed: Arc<Notify>) -> Vec<JoinHandle<()>> {
    vec![
        spawn::<Namespace>(client.clone(), index.clone(), changed.clone()),
        spawn::<ServiceAccount>(client.clone(), index.clone(), changed.clone()),
        spawn::<Pod>(client.clone(), index.clone(), changed.clone()),
        spawn::<StrictNetworkPolicy>(client, index, changed),
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
    let mut relist: Vec<K> = Vec::new();
    while let Some(ev) = events.next().await {
        let ev = match ev {
            Ok(ev) => ev,
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
                    relist.push(o);
                    false
                }
                Event::InitDone => {
                    tracing::info!(objects = relist.len(), "relisted");
                    idx.reset(&std::mem::take(&mut relist));
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
    list_kind::<Pod>(&client, index).await?;
    list_kind::<StrictNetworkPolicy>(&client, index).await
}

async fn list_kind<K>(client: &Client, index: &SharedIndex) -> Result<(), kube::Error>
where
    K: SourceKind + kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let mut items = Vec::new();
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    index.lock().expect("index lock poisoned").reset(&items);
    Ok(())
}
