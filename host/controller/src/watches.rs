//! The watches behind the caches: one stream per resource over the chosen
//! namespaces, selected by the alignment key where the apiserver can
//! select, without managedFields, ready to reflect into a store.

use futures::{
    StreamExt,
    stream::{self, BoxStream},
};
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt, watcher},
};

use portwise_core::{align::key_value, config::KeySource};

use crate::cache::{self, SyncGate, WatchBackoff, flatten_relists};

/// What the namespaced watches here can hold.
pub(crate) trait Watched:
    Resource<Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + Default
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Default
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// Builds watch streams over the chosen namespaces, flattened so that they
/// can share one store.
pub(crate) fn watch_all<K>(
    client: &Client,
    namespaces: &[String],
    cfg: watcher::Config,
    gate: &SyncGate,
    keep: impl Fn(&K) -> bool + Clone + Send + 'static,
) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
where
    K: Watched,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let apis: Vec<Api<K>> = if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    };
    let streams = apis.into_iter().map(|api| {
        flatten_relists(
            streaming_or_listing(api, cfg.clone()).backoff(WatchBackoff::default()),
            gate.register(),
            keep.clone(),
        )
        .boxed()
    });
    // kube's controller holds reconciles until its store has seen one
    // `InitDone`. Our merged stream never relists as a whole, so mark the
    // (still empty) store ready up front; reconciles themselves wait for
    // every watch to have listed (`Context::synced`).
    stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
        .chain(stream::select_all(streams))
        .boxed()
}
/// The watch of the Services or Pods that carry `key`, without their
/// managedFields, ready to reflect into a store.
pub(crate) fn watch_keyed<K>(
    client: &Client,
    namespaces: &[String],
    list_cfg: &watcher::Config,
    key: &KeySource,
    gate: &SyncGate,
) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
where
    K: Watched,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let keep = {
        let key = key.clone();
        move |o: &K| key_value(o.meta(), &key).is_some()
    };
    watch_all::<K>(client, namespaces, selecting(list_cfg, key), gate, keep)
        .modify(cache::strip_managed_fields)
        .boxed()
}

/// The watch of objects that carry `key`: the apiserver selects on a label
/// key's existence, so objects without it are never sent; an annotation
/// cannot be selected on, so every object is sent and [`flatten_relists`]
/// drops the ones without it before they reach the cache.
pub(crate) fn selecting(cfg: &watcher::Config, key: &KeySource) -> watcher::Config {
    match key {
        KeySource::Label(k) => cfg.clone().labels(k),
        KeySource::Annotation(_) => cfg.clone(),
    }
}

/// A watcher that takes its first state from a streaming list (a watch with
/// `sendInitialEvents`, served from the apiserver's watch cache: no LIST
/// requests, no pages held in memory) and falls back to LIST + WATCH for
/// good when the apiserver refuses it.
///
/// Why a fallback: the WatchList gate is on by default in kube-apiserver
/// 1.37 (the chart's floor), but a cluster may turn it off (1.33 shipped it
/// off); such an apiserver answers the first watch with 422 Invalid
/// ("sendInitialEvents is forbidden …") and would refuse every retry.
/// client-go's reflector falls back the same way. The refusal may also come
/// at a later relist (an apiserver restarted with the gate off), so the
/// fallback stays armed until it is used. Any other error
/// (apiserver down, 403, 429) is the watcher's to retry, not a reason to
/// stop streaming.
pub(crate) fn streaming_or_listing<K>(
    api: Api<K>,
    cfg: watcher::Config,
) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    if cfg.initial_list_strategy != watcher::InitialListStrategy::StreamingList {
        return watcher(api, cfg).boxed();
    }
    let listing = watcher::Config {
        initial_list_strategy: watcher::InitialListStrategy::ListWatch,
        ..cfg.clone()
    };
    let mut fallback = Some((api.clone(), listing));
    let mut inner = watcher(api, cfg).boxed();
    stream::poll_fn(move |cx| {
        loop {
            let item = futures::ready!(inner.poll_next_unpin(cx));
            if let Some(Err(watcher::Error::WatchStartFailed(kube::Error::Api(status)))) = &item
                && status.code == 422
                && let Some((api, listing)) = fallback.take()
            {
                tracing::warn!(
                    resource = %K::plural(&Default::default()),
                    code = status.code,
                    message = %status.message,
                    "the apiserver refuses streaming lists (WatchList); listing instead"
                );
                inner = watcher(api, listing).boxed();
                continue;
            }
            return std::task::Poll::Ready(item);
        }
    })
    .boxed()
}
