//! Every watch the controller runs, opened together: the caches they fill
//! ([`Caches`], what the context reads) and their streams ([`Watching`],
//! what the supervisor runs).
//! The watches themselves are `keyed.rs`'s (Services, pods) and
//! `informers.rs`'s (our slices, our Endpoints, nodes).

use super::*;

/// The caches, their indexes, and the streams that fill them.
pub(super) struct Caches {
    pub(super) services: Store<Service>,
    pub(super) pods: Store<Pod>,
    /// Which namespaces' pods are in the cache in full.
    pub(super) pods_listed: ListedPods,
    pub(super) pod_groups: Arc<GroupIndex>,
    pub(super) slices: Store<EndpointSlice>,
    pub(super) slice_owners: Arc<GroupIndex>,
    pub(super) our_endpoints: Store<Endpoints>,
    /// `None` with `disableNodeLookups`.
    pub(super) nodes: Option<Store<PartialObjectMeta<Node>>>,
    /// Our own writes, for the slice watch to tell their echoes apart.
    pub(super) echoes: Arc<Echoes>,
}

/// What the watches hand the supervisor.
pub(super) struct Watching {
    /// One stream a watch, each a task.
    pub(super) streams: Vec<BoxFuture<'static, ()>>,
    /// Services deleted or dropped from the cache, to be forgotten.
    pub(super) services_gone: UnboundedReceiver<Arc<Service>>,
}

/// Opens every watch. Streamed from the watch cache, as the native
/// controller's informers do (`watches::streaming_or_listing` falls back
/// to LIST + WATCH). `release_tx` takes the Services whose slices must be
/// released ([`release_gone`]).
pub(super) fn open(
    client: &Client,
    config: &Config,
    opts: &RunOptions,
    gate: &SyncGate,
    triggers: &Triggers,
    table: &Arc<ServiceTable>,
    release_tx: &UnboundedSender<Gone>,
) -> (Caches, Watching) {
    let (services, svc_writer) = reflector::store::<Service>();
    let list_cfg = watcher::Config::default().any_semantic().streaming_lists();
    let watches = Watches {
        client,
        namespaces: &opts.namespaces,
        cfg: &list_cfg,
        gate,
        triggers,
        services: &services,
        managed_by: &config.managed_by,
    };
    // Sharded, each replica keeps only its buckets' pods.
    let (interest, follow_interest) = match &opts.leader {
        Leadership::Shards { shards, terms } => {
            let warming = opts.warmup.as_ref().map(|w| w.warming.clone());
            let (interest, follow) = super::terms::interest(*shards, terms.clone(), warming);
            (Some(interest), follow)
        }
        _ => (None, future::pending::<()>().boxed()),
    };
    let per_namespace = keyed::per_namespace_pods(config, &opts.namespaces, interest.is_some());
    let mut keyed_services = watches.services(
        svc_writer,
        &config.service_key,
        per_namespace,
        release_tx.clone(),
    );
    let pods = watches.pods(
        config.pod_key(),
        keyed_services.seen.take(),
        interest,
        // With a list of namespaces, never the cluster-wide watch: it is
        // the list's, and may be all that is granted.
        if opts.namespaces.is_empty() {
            opts.pod_watch_namespaces
        } else {
            usize::MAX
        },
        &keyed_services,
        table.clone(),
    );
    let slice_owners = Arc::new(GroupIndex::default());
    let echoes = Arc::new(Echoes::default());
    let (slices, slice_stream) =
        watches.slices(slice_owners.clone(), echoes.clone(), release_tx.clone());
    let (our_endpoints, our_endpoints_stream) = watches.our_endpoints();
    let (nodes, node_stream) = if config.disable_node_lookups {
        (None, future::pending::<()>().boxed())
    } else {
        let (store, stream) = watches.nodes();
        (Some(store), stream)
    };
    let caches = Caches {
        services,
        pods: pods.store,
        pods_listed: pods.listed,
        pod_groups: pods.groups,
        slices,
        slice_owners,
        our_endpoints,
        nodes,
        echoes,
    };
    let watching = Watching {
        streams: vec![
            keyed_services.stream,
            pods.stream,
            slice_stream,
            our_endpoints_stream,
            node_stream,
            follow_interest,
        ],
        services_gone: keyed_services.gone,
    };
    (caches, watching)
}
