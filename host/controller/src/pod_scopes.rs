//! The pod watch when the apiserver cannot select pods: one watch per
//! namespace that holds a managed Service.
//!
//! With a label key, one pod watch selects on the label's existence, and
//! pods without it are never sent ([`crate::watches::selecting`]). An
//! annotation cannot be selected on: a cluster-wide watch would receive and
//! decode every pod of the cluster to read one annotation, and on a cluster
//! of 100,000 unmanaged pods that measured a cold sync 3× as long as the
//! native controller's. A pod backs only Services of
//! its own namespace, so only a namespace that holds a keyed Service can
//! hold a member. [`PodScopes`] opens a namespace-scoped pod watch for each
//! such namespace as the Service watch reports it, and closes it (the
//! namespace's pods leave the cache) when its last keyed Service goes.
//!
//! One watch per namespace is one connection each. When the keyed Services
//! span more namespaces at start than `--pod-watch-namespaces` allows,
//! pods are watched cluster-wide instead, with one watch, as with a label
//! key but unselected: every pod of the cluster is received. Namespaces that
//! gain a keyed Service later are still watched one by one past the limit
//! (a warning says so once): switching over while running could lose a
//! deletion between the two watches.
//!
//! Sharded (`--shards`, issue 49), pods are watched this way whatever the
//! key (a label key selects on it in each namespace), and only in the
//! namespaces of the buckets this replica holds or warms up for
//! ([`Interest`]): a namespace opens when its bucket arrives and closes
//! (its pods leave the cache) when the bucket leaves, so that each replica
//! keeps about its share of the cluster's pods rather than all of them.
//!
//! Two rules keep a reconcile from planning on a namespace whose pods are
//! not in the cache yet:
//! - the cold start's [`SyncGate`] opens only after the Service watch has
//!   listed and every namespace it reported has listed its pods;
//! - a namespace opened later is [`ListedPods::listed`] only once its first
//!   list has passed into the store; until then its Services' reconciles do
//!   nothing, and the listing asks for each of them (`on_listed`).

use std::{
    collections::{BTreeSet, HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use futures::{
    FutureExt, StreamExt,
    future::BoxFuture,
    stream::{self, BoxStream},
};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, reflector::Store, watcher},
};
use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
};
use tracing::{debug, info, warn};

use portwise_core::{
    align::key_value,
    config::KeySource,
    shard::{Bucket, Shards},
};

use crate::{
    cache::{self, SyncGate, SyncToken, WatchBackoff, flatten_relists},
    watches::{selecting, streaming_or_listing},
};

/// Which namespaces' pods the cache holds in full.
#[derive(Clone, Debug, Default)]
pub(crate) struct ListedPods(Option<Arc<Mutex<HashSet<String>>>>);

impl ListedPods {
    /// Every watched namespace's pods are listed before the caches sync
    /// (the static watches): nothing to track.
    pub(crate) fn with_the_caches() -> Self {
        Self(None)
    }

    fn tracked() -> Self {
        Self(Some(Arc::default()))
    }

    /// Whether `ns`'s pods are in the cache in full (its watch, or the
    /// cluster-wide one, has listed once since it was opened).
    pub(crate) fn listed(&self, ns: &str) -> bool {
        self.0.as_ref().is_none_or(|set| {
            let set = set.lock().unwrap();
            set.contains(ns) || set.contains(EVERY_NAMESPACE)
        })
    }

    fn set(&self, ns: &str, listed: bool) {
        if let Some(set) = &self.0 {
            let mut set = set.lock().unwrap();
            if listed {
                set.insert(ns.to_string());
            } else {
                set.remove(ns);
            }
        }
    }
}

/// The scope of the cluster-wide pod watch (no namespace name is empty).
const EVERY_NAMESPACE: &str = "";

/// What the Service watch tells [`PodScopes`]: a keyed Service is in the
/// cache, or has left it.
#[derive(Debug)]
pub(crate) enum ServiceSeen {
    Present { ns: String, name: String },
    Gone { ns: String, name: String },
}

/// What a namespace's watch task forwards.
enum Forwarded {
    /// Boxed: a pod is kilobytes, and the queue holds [`QUEUE`] of these.
    Event(Box<Result<watcher::Event<Pod>, watcher::Error>>),
    /// Its first list has been forwarded in full.
    Listed,
}

/// One namespace's open watch.
struct Scope {
    /// Tells this opening's messages from an earlier one's still queued.
    epoch: u64,
    abort: tokio::task::AbortHandle,
    listed: bool,
}

/// Sharded: the buckets whose namespaces' pods this replica keeps (those
/// it holds and those it warms up for), as they change.
#[derive(Clone, Debug)]
pub(crate) struct Interest {
    pub(crate) shards: Shards,
    pub(crate) buckets: watch::Receiver<BTreeSet<Bucket>>,
}

impl Interest {
    fn wants(&self, ns: &str) -> bool {
        self.buckets.borrow().contains(&self.shards.bucket(ns))
    }
}

/// How [`PodScopes`] is built; see the module docs.
pub(crate) struct PodScopes {
    pub(crate) client: Client,
    /// The watch settings (streaming lists) each namespace's watch uses.
    pub(crate) cfg: watcher::Config,
    /// The pod key: pods without it never reach the cache (a label is
    /// selected on, an annotation filtered).
    pub(crate) key: KeySource,
    /// Sharded: only these buckets' namespaces are watched.
    pub(crate) interest: Option<Interest>,
    /// The Service watch's own gate: when it opens, every namespace it
    /// holds has been reported.
    pub(crate) services_listed: SyncGate,
    /// The cold start's gate, held until every first namespace has listed.
    pub(crate) gate: SyncGate,
    /// The pod cache, to forget a closed namespace's pods.
    pub(crate) pods: Store<Pod>,
    /// The most namespaces watched one by one at start; beyond it, one
    /// cluster-wide watch (`--pod-watch-namespaces`).
    pub(crate) limit: usize,
    /// Called once a namespace opened after the cold start has listed:
    /// asks for its Services.
    pub(crate) on_listed: Box<dyn FnMut(&str) + Send>,
}

/// How many forwarded events may wait for the store: each namespace's
/// watch task blocks beyond it, so a slow consumer holds back decoding
/// rather than piling it up in memory.
const QUEUE: usize = 256;

impl PodScopes {
    /// The pod events of every namespace that holds a keyed Service, as one
    /// stream for one store, and what says which namespaces have listed.
    /// The namespace watches run as tasks owned by the stream: dropping it
    /// stops them.
    pub(crate) fn stream(
        self,
        services: mpsc::UnboundedReceiver<ServiceSeen>,
    ) -> (
        BoxStream<'static, Result<watcher::Event<Pod>, watcher::Error>>,
        ListedPods,
    ) {
        let listed = ListedPods::tracked();
        let (tx, rx) = mpsc::channel(QUEUE);
        let services_listed = {
            let g = self.services_listed.clone();
            async move { g.opened().await }.boxed()
        };
        // Wakes the state when the buckets of interest change.
        let interest_changed = match &self.interest {
            Some(i) => stream::unfold(i.buckets.clone(), |mut rx| async move {
                rx.changed().await.ok()?;
                Some(((), rx))
            })
            .boxed(),
            None => stream::pending().boxed(),
        };
        let mut state = State {
            cold: Some(self.gate.register()),
            services_listed: Some(services_listed),
            interest_changed,
            cluster_wide: false,
            warned: false,
            services,
            members: HashMap::new(),
            scopes: HashMap::new(),
            tasks: JoinSet::new(),
            tx,
            rx,
            next_epoch: 0,
            out: VecDeque::new(),
            listed: listed.clone(),
            spec: self,
        };
        // As `watches::watch_all`: the store is ready up front; reconciles
        // wait for the gate.
        let events = stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
            .chain(stream::poll_fn(move |cx| state.poll(cx)))
            .boxed();
        (events, listed)
    }
}

struct State {
    spec: PodScopes,
    /// Held until the Service watch and every namespace it reported first
    /// have listed.
    cold: Option<SyncToken>,
    services_listed: Option<BoxFuture<'static, ()>>,
    /// Yields when [`PodScopes::interest`] changes.
    interest_changed: BoxStream<'static, ()>,
    /// Pods are watched by one cluster-wide watch (decided at start).
    cluster_wide: bool,
    /// Warned that more namespaces than the limit are watched.
    warned: bool,
    services: mpsc::UnboundedReceiver<ServiceSeen>,
    /// The keyed Services of each namespace that holds one.
    members: HashMap<String, HashSet<String>>,
    scopes: HashMap<String, Scope>,
    tasks: JoinSet<()>,
    tx: mpsc::Sender<(String, u64, Forwarded)>,
    rx: mpsc::Receiver<(String, u64, Forwarded)>,
    next_epoch: u64,
    /// Deletes for a closed namespace's pods, yielded before anything else.
    out: VecDeque<watcher::Event<Pod>>,
    listed: ListedPods,
}

impl State {
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<watcher::Event<Pod>, watcher::Error>>> {
        loop {
            if let Some(ev) = self.out.pop_front() {
                return Poll::Ready(Some(Ok(ev)));
            }
            // Reaped so the set does not grow; a task ends only when aborted.
            while let Poll::Ready(Some(_)) = self.tasks.poll_join_next(cx) {}
            while let Poll::Ready(Some(seen)) = self.services.poll_recv(cx) {
                self.saw(seen);
            }
            let mut rescope = false;
            while let Poll::Ready(Some(())) = self.interest_changed.poll_next_unpin(cx) {
                rescope = true;
            }
            // Until the Service watch has listed, `open_first` decides.
            if rescope && self.services_listed.is_none() {
                self.rescope();
            }
            if let Some(f) = self.services_listed.as_mut()
                && f.poll_unpin(cx).is_ready()
            {
                // Every report of the first list precedes the gate's
                // opening: take them all (still only noted), then decide.
                while let Poll::Ready(Some(seen)) = self.services.poll_recv(cx) {
                    self.saw(seen);
                }
                self.services_listed = None;
                self.open_first();
            }
            if self.services_listed.is_none()
                && let Some(mut cold) = self
                    .cold
                    .take_if(|_| self.scopes.values().all(|s| s.listed))
            {
                if self.cluster_wide {
                    info!(
                        namespaces = self.members.len(),
                        limit = self.spec.limit,
                        "pods watched cluster-wide: the managed Services span more namespaces than --pod-watch-namespaces"
                    );
                } else if self.spec.interest.is_some() {
                    info!(
                        namespaces = self.scopes.len(),
                        "pods watched in each namespace of this replica's buckets that holds a managed Service (sharded)"
                    );
                } else {
                    info!(
                        namespaces = self.scopes.len(),
                        "pods watched in each namespace that holds a managed Service (annotation key, cluster-wide)"
                    );
                }
                cold.complete();
            }
            if !self.out.is_empty() {
                continue;
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some((ns, epoch, forwarded))) => {
                    let Some(scope) = self.scopes.get_mut(&ns).filter(|s| s.epoch == epoch) else {
                        // From a watch since closed.
                        continue;
                    };
                    match forwarded {
                        Forwarded::Event(ev) => return Poll::Ready(Some(*ev)),
                        Forwarded::Listed => {
                            // Everything this watch listed has passed into
                            // the store by now: the stream is pulled one
                            // event at a time.
                            scope.listed = true;
                            self.listed.set(&ns, true);
                            debug!(namespace = %ns, "pods listed");
                            (self.spec.on_listed)(&ns);
                        }
                    }
                }
                // We hold a sender: never closed.
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Once the Service watch has listed: one watch for each namespace it
    /// reported, or one for the cluster if they are too many.
    fn open_first(&mut self) {
        let mut namespaces: Vec<String> = self
            .members
            .keys()
            .filter(|ns| self.wants(ns))
            .cloned()
            .collect();
        if self.spec.limit == 0 || namespaces.len() > self.spec.limit {
            self.cluster_wide = true;
            self.open(EVERY_NAMESPACE.to_string());
            return;
        }
        namespaces.sort();
        for ns in namespaces {
            self.open(ns);
        }
    }

    /// Whether `ns`'s pods are this replica's to keep (always, unsharded).
    fn wants(&self, ns: &str) -> bool {
        self.spec.interest.as_ref().is_none_or(|i| i.wants(ns))
    }

    /// The buckets of interest changed: opens the namespaces that arrived,
    /// closes those that left. A cluster-wide watch keeps every pod.
    fn rescope(&mut self) {
        if self.cluster_wide {
            return;
        }
        let mut arrived: Vec<String> = self
            .members
            .keys()
            .filter(|ns| !self.scopes.contains_key(*ns) && self.wants(ns))
            .cloned()
            .collect();
        arrived.sort();
        let left: Vec<String> = self
            .scopes
            .keys()
            .filter(|ns| !self.wants(ns))
            .cloned()
            .collect();
        if !arrived.is_empty() || !left.is_empty() {
            debug!(arrived = ?arrived, left = ?left, "pod watches follow the buckets");
        }
        for ns in left {
            self.close(&ns);
        }
        for ns in arrived {
            self.open(ns);
        }
    }

    fn saw(&mut self, seen: ServiceSeen) {
        match seen {
            ServiceSeen::Present { ns, name } => {
                self.members.entry(ns.clone()).or_default().insert(name);
                // Until the Service watch has listed, `open_first` decides.
                if self.services_listed.is_none()
                    && !self.cluster_wide
                    && !self.scopes.contains_key(&ns)
                    && self.wants(&ns)
                {
                    self.open(ns);
                    if self.scopes.len() > self.spec.limit && !self.warned {
                        self.warned = true;
                        warn!(
                            namespaces = self.scopes.len(),
                            limit = self.spec.limit,
                            "pods are watched in more namespaces than --pod-watch-namespaces, one \
                             connection each; a restart watches them cluster-wide, a label key \
                             with one selected watch"
                        );
                    }
                }
            }
            ServiceSeen::Gone { ns, name } => {
                let Some(names) = self.members.get_mut(&ns) else {
                    return;
                };
                names.remove(&name);
                if names.is_empty() {
                    self.members.remove(&ns);
                    if !self.cluster_wide {
                        self.close(&ns);
                    }
                }
            }
        }
    }

    fn open(&mut self, ns: String) {
        self.next_epoch += 1;
        let epoch = self.next_epoch;
        debug!(namespace = %ns, "watching pods");
        let api: Api<Pod> = if ns == EVERY_NAMESPACE {
            Api::all(self.spec.client.clone())
        } else {
            Api::namespaced(self.spec.client.clone(), &ns)
        };
        let abort = self.tasks.spawn(forward(
            api,
            selecting(&self.spec.cfg, &self.spec.key),
            self.spec.key.clone(),
            ns.clone(),
            epoch,
            self.tx.clone(),
        ));
        self.scopes.insert(
            ns,
            Scope {
                epoch,
                abort,
                listed: false,
            },
        );
    }

    /// Stops `ns`'s watch and forgets its pods: no Service there can use
    /// them, or (sharded) its bucket is another replica's.
    fn close(&mut self, ns: &str) {
        let Some(scope) = self.scopes.remove(ns) else {
            return;
        };
        scope.abort.abort();
        self.listed.set(ns, false);
        debug!(namespace = %ns, "pods no longer watched");
        self.out.extend(
            self.spec
                .pods
                .state()
                .into_iter()
                .filter(|p| p.namespace().as_deref() == Some(ns))
                .map(|p| watcher::Event::Delete(p.as_ref().clone())),
        );
    }
}

/// One namespace's pod watch, forwarded with its namespace and epoch, and
/// a [`Forwarded::Listed`] once its first list has been forwarded.
async fn forward(
    api: Api<Pod>,
    cfg: watcher::Config,
    key: KeySource,
    ns: String,
    epoch: u64,
    tx: mpsc::Sender<(String, u64, Forwarded)>,
) {
    let first_list = SyncGate::default();
    let keep = move |p: &Pod| key_value(&p.metadata, &key).is_some();
    let mut events = flatten_relists(
        streaming_or_listing(api, cfg).backoff(WatchBackoff::default()),
        first_list.register(),
        keep,
    )
    .modify(cache::strip_managed_fields)
    .boxed();
    let mut listed = false;
    loop {
        let forwarded = tokio::select! {
            // The list's end is seen while pulling the event after the
            // list's last one, which was forwarded already.
            biased;
            () = first_list.opened(), if !listed => {
                listed = true;
                Forwarded::Listed
            }
            ev = events.next() => match ev {
                Some(ev) => Forwarded::Event(Box::new(ev)),
                None => return,
            },
        };
        if tx.send((ns.clone(), epoch, forwarded)).await.is_err() {
            return;
        }
    }
}
