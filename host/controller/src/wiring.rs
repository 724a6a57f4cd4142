//! Informer wiring: the watches that feed the caches, the triggers that
//! map a change to the Services it concerns, the periodic resync, leader
//! hand-over, readiness, and the bound on concurrent reconciles.
//!
//! Watches feed shared caches (Services, Pods, EndpointSlices, optionally
//! Node metadata); a pod change triggers the Services of its group through
//! [`GroupIndex`], a slice change triggers the Service that owns it, and
//! every Service is re-checked each `resyncPeriod` (the requeue of a served
//! Service) so probe results stay fresh even when no API object changes.
//! What a reconcile then does is [`crate::reconcile`]'s business.

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{
    FutureExt, StreamExt, TryStreamExt,
    channel::mpsc::{UnboundedSender, unbounded},
    future::{self, BoxFuture},
};
use k8s_openapi::{
    api::{
        core::v1::{Endpoints, Node, Pod, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::{Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tracing::{debug, info, warn};

use portwise_checkers::{BuildContext, Checker};
use portwise_core::{
    align::key_value,
    config::{Config, KeySource},
    plan::{ENDPOINTS_MANAGED_BY_LABEL, MANAGED_BY_LABEL, SERVICE_NAME_LABEL},
    policy::Policy,
};

use crate::{
    apply::SliceWriter,
    cache::{self, GroupIndex, SyncGate, WatchBackoff},
    context::Context,
    echo::Echoes,
    error::Error,
    events::Events,
    judge::Judge,
    lane::Lane,
    metrics::SyncResult,
    migrate,
    options::RunOptions,
    pod_scopes::{ListedPods, PodScopes, ServiceSeen},
    reconcile::reconcile,
    watches::{watch_all, watch_keyed},
};

fn controller_owner(slice: &EndpointSlice) -> Option<&OwnerReference> {
    slice
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Service")
}

/// The Service a slice belongs to, by controller owner or by label.
fn slice_service(slice: &EndpointSlice) -> Option<String> {
    controller_owner(slice)
        .map(|o| o.name.clone())
        .or_else(|| slice.labels().get(SERVICE_NAME_LABEL).cloned())
}
/// A Service that left the Service cache, for [`release_gone`].
enum Gone {
    /// It lost its key: the object as the watch last showed it.
    Lost(Arc<Service>),
    /// Deleted, or may have lost its key (a label-selected watch reports
    /// that as a delete; a relist cannot tell): ask the apiserver.
    Check(ObjectRef<Service>),
}

/// Takes back the slices of Services that left the Service cache but not
/// the cluster. The cache holds only keyed Services, so a Service that
/// loses its key is dropped from it, and kube's controller never
/// reconciles an object its store lacks; this reconciles it here instead,
/// which releases it like any unmanaged Service (`decide`'s branch 2). A
/// deleted Service needs nothing: its slices have it as their controller
/// owner, and the garbage collector removes them.
async fn release_gone(
    client: Client,
    ctx: Arc<Context>,
    tx: tokio::sync::mpsc::UnboundedSender<Gone>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Gone>,
) {
    while let Some(gone) = rx.recv().await {
        // Only the complete caches can tell what we own.
        while !ctx.synced.synced() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let r = match &gone {
            Gone::Lost(svc) => ObjectRef::from_obj(svc.as_ref()),
            Gone::Check(r) => r.clone(),
        };
        let ns = r.namespace.clone().unwrap_or_default();
        if ctx.services.get(&r).is_some() || ctx.slice_owners.members(&ns, &r.name).is_empty() {
            // Back in the cache (it is served), or nothing of ours to take.
            continue;
        }
        let svc = match gone {
            Gone::Lost(svc) => svc,
            Gone::Check(_) => {
                let api: Api<Service> = Api::namespaced(client.clone(), &ns);
                match api.get_opt(&r.name).await {
                    Ok(Some(svc))
                        if key_value(&svc.metadata, &ctx.config.service_key).is_none() =>
                    {
                        Arc::new(svc)
                    }
                    // Keyed: the watch delivers it. Gone: the garbage
                    // collector takes its slices.
                    Ok(_) => continue,
                    Err(e) => {
                        retry_gone(&ctx, &tx, r, &e.to_string());
                        continue;
                    }
                }
            }
        };
        info!(service = %r, "Service left the cache but not the cluster: releasing it");
        if let Err(e) = reconcile_in_turn(svc, ctx.clone()).await {
            retry_gone(&ctx, &tx, r, &e.to_string());
        }
    }
}

fn retry_gone(
    ctx: &Context,
    tx: &tokio::sync::mpsc::UnboundedSender<Gone>,
    r: ObjectRef<Service>,
    error: &str,
) {
    let key = format!("{}/{}", r.namespace.as_deref().unwrap_or_default(), r.name);
    let delay = ctx.retries.failed(&key);
    warn!(service = %key, error, retry_in = ?delay, "releasing a Service that left the cache");
    let tx = tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let _ = tx.send(Gone::Check(r));
    });
}

/// Our slices whose Service is not in the Service cache: it lost its key
/// while we were not looking (down, or following).
fn sweep_gone(ctx: &Context, tx: &tokio::sync::mpsc::UnboundedSender<Gone>) {
    let mut seen = std::collections::HashSet::new();
    for slice in ctx.slices.state() {
        let Some(svc) = slice_service(&slice) else {
            continue;
        };
        let r = ObjectRef::<Service>::new(&svc).within(&slice.namespace().unwrap_or_default());
        if ctx.services.get(&r).is_none() && seen.insert(r.clone()) {
            let _ = tx.send(Gone::Check(r));
        }
    }
}

/// Keeps `portwise_cache_objects` current.
async fn count_cached(
    metrics: crate::metrics::Metrics,
    services: Store<Service>,
    pods: Store<Pod>,
    slices: Store<EndpointSlice>,
    nodes: Option<Store<PartialObjectMeta<Node>>>,
) {
    loop {
        metrics.set_cache_objects("services", services.len());
        metrics.set_cache_objects("pods", pods.len());
        metrics.set_cache_objects("endpointslices", slices.len());
        if let Some(nodes) = &nodes {
            metrics.set_cache_objects("nodes", nodes.len());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Where events ask for reconciles.
///
/// Until every cache has listed, an ask is dropped: a reconcile then finds
/// the caches incomplete and does nothing, and worse, one that passes its
/// sync check just after the gate opens runs beside the cold start's
/// trigger of every Service, so that Service is reconciled twice. The
/// gate's opening triggers every Service the cache holds, once; what
/// changed before then is in the caches it reads.
#[derive(Clone)]
struct Triggers {
    tx: UnboundedSender<ObjectRef<Service>>,
    gate: SyncGate,
    /// The prompt lane for pod changes, once the context it runs with
    /// exists ([`crate::lane`]).
    lane: Arc<std::sync::OnceLock<Lane<ObjectRef<Service>>>>,
}

impl Triggers {
    /// Whether an ask would be heard now.
    fn open(&self) -> bool {
        self.gate.synced()
    }

    /// Asks for `svc` to be reconciled, unless the caches are still listing.
    fn ask(&self, svc: ObjectRef<Service>) {
        if self.open() {
            let _ = self.tx.unbounded_send(svc);
        }
    }

    /// Asks for `svc` to be reconciled at once, through the prompt lane
    /// (a pod changed), unless the caches are still listing.
    fn ask_now(&self, svc: ObjectRef<Service>) {
        if !self.open() {
            return;
        }
        match self.lane.get() {
            Some(lane) if lane.ask(svc.clone()) => {}
            // Draining (or not wired yet): the Controller decides.
            _ => {
                let _ = self.tx.unbounded_send(svc);
            }
        }
    }

    /// Asks for every Service in `services`.
    fn ask_all(&self, services: &Store<Service>) {
        for svc in services.state() {
            self.ask(ObjectRef::from_obj(svc.as_ref()));
        }
    }
}

/// Triggers `svc` for a slice event unless `ours` says the event is our
/// own write coming back. An event that overtook its write's response
/// waits for it off the watch task ([`Echoes::settled`]), so the watch is
/// never held up.
fn trigger_unless_echo(
    echoes: &Arc<Echoes>,
    tx: &Triggers,
    slice: EndpointSlice,
    svc: ObjectRef<Service>,
    ours: fn(&Echoes, &EndpointSlice) -> bool,
) {
    let judge = move |echoes: &Echoes, slice: &EndpointSlice, tx: &Triggers, waited| {
        let echo = ours(echoes, slice);
        debug!(slice = %slice.name_any(), resource_version = ?slice.resource_version(),
            echo, waited, "slice event");
        if !echo {
            tx.ask(svc);
        }
    };
    if !echoes.in_flight(&slice) {
        return judge(echoes, &slice, tx, false);
    }
    let (echoes, tx) = (echoes.clone(), tx.clone());
    tokio::spawn(async move {
        echoes.settled(&slice).await;
        judge(&echoes, &slice, &tx, true);
    });
}

/// Runs the controller until `shutdown` resolves.
pub(crate) async fn run(
    client: Client,
    config: Config,
    opts: RunOptions,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let started = std::time::Instant::now();
    let config = Arc::new(config);
    let build_ctx = BuildContext {
        wasm: opts.wasm.as_deref(),
        stable_ttl: BuildContext::stable_ttl_for(config.resync_period),
        stable_spacing: BuildContext::stable_spacing_for(config.resync_period),
    };
    // One checker per policy, `membership` included, built (and so
    // validated) at start.
    let mut checkers = crate::judge::Checkers::new();
    let membership: Arc<dyn Checker> = portwise_checkers::build(&config.membership, &build_ctx)
        .map_err(|e| Error::Build(e.to_string()))?;
    checkers.insert(Policy::Default, membership);
    for (name, expr) in &config.policies {
        let policy = Policy::Named(name.clone());
        let checker: Arc<dyn Checker> =
            portwise_checkers::build_at(expr, &build_ctx, &policy.label())
                .map_err(|e| Error::Build(e.to_string()))?;
        checkers.insert(policy, checker);
    }
    // maxConcurrentChecks bounds the live checks; the shadows share a pool
    // of the same size of their own, so a slow shadow never takes a live
    // check's place.
    let shadow_permits = Arc::new(tokio::sync::Semaphore::new(
        config.max_concurrent_checks.max(1),
    ));
    let shadows = crate::shadow::Shadows::build(&config, &build_ctx, |checker| {
        crate::shadow::shadow_judge(
            checker,
            &config,
            opts.check_timeout,
            opts.metrics.clone(),
            shadow_permits.clone(),
        )
    })?
    .map(Arc::new);

    let gate = SyncGate::default();
    // Streamed from the watch cache, as the native controller's informers
    // do (`watches::streaming_or_listing` falls back to LIST + WATCH).
    let list_cfg = watcher::Config::default().any_semantic().streaming_lists();

    // With an annotation key and every namespace watched, pods are watched
    // per namespace that holds a keyed Service (`crate::pod_scopes`); the
    // Service watch reports its namespaces, and has a gate of its own that
    // the pod scopes wait for before the cold start's.
    let per_namespace_pods =
        opts.namespaces.is_empty() && matches!(config.pod_key(), KeySource::Annotation(_));
    let (seen_tx, seen_rx) = tokio::sync::mpsc::unbounded_channel::<ServiceSeen>();
    let seen_tx = per_namespace_pods.then_some(seen_tx);
    let services_gate = if per_namespace_pods {
        SyncGate::default()
    } else {
        gate.clone()
    };

    // Services
    let (svc_reader, svc_writer) = reflector::store::<Service>();
    // Services, indexed by group; deletions are reported so per-Service
    // state (verdict cache, trigger times, metrics series) is dropped with them.
    let svc_groups = Arc::new(GroupIndex::default());
    let (gone_tx, mut gone_rx) = tokio::sync::mpsc::unbounded_channel::<Arc<Service>>();
    let (release_tx, release_rx) = tokio::sync::mpsc::unbounded_channel::<Gone>();
    let services = {
        let svc_groups = svc_groups.clone();
        let key = config.service_key.clone();
        let release_tx = release_tx.clone();
        watch_keyed(&client, &opts.namespaces, &list_cfg, &key, &services_gate)
            .reflect(svc_writer)
            .inspect_ok(move |ev| match ev {
                watcher::Event::Apply(svc) | watcher::Event::InitApply(svc) => {
                    let ns = svc.namespace().unwrap_or_default();
                    svc_groups.set(&ns, &svc.name_any(), key_value(&svc.metadata, &key));
                    if let Some(seen) = &seen_tx {
                        let name = svc.name_any();
                        let _ = seen.send(ServiceSeen::Present { ns, name });
                    }
                }
                watcher::Event::Delete(svc) => {
                    let ns = svc.namespace().unwrap_or_default();
                    svc_groups.set(&ns, &svc.name_any(), None);
                    if let Some(seen) = &seen_tx {
                        let (ns, name) = (ns.clone(), svc.name_any());
                        let _ = seen.send(ServiceSeen::Gone { ns, name });
                    }
                    let svc = Arc::new(svc.clone());
                    let _ = gone_tx.send(svc.clone());
                    // Deleted, or dropped from the cache for losing its
                    // key: only the latter needs its slices released.
                    let lost = svc.metadata.resource_version.is_some()
                        && key_value(&svc.metadata, &key).is_none();
                    let _ = release_tx.send(if lost {
                        Gone::Lost(svc)
                    } else {
                        Gone::Check(ObjectRef::from_obj(svc.as_ref()))
                    });
                }
                _ => {}
            })
            .applied_objects()
            // Like every other ask (`Triggers`): none before the caches
            // sync, whose opening triggers every Service.
            .try_filter({
                let gate = gate.clone();
                move |_| future::ready(gate.synced())
            })
    };

    // Pods, indexed by group; a change triggers the group's Services.
    let (trigger_tx, trigger_rx) = unbounded::<ObjectRef<Service>>();
    let trigger_tx = Triggers {
        tx: trigger_tx,
        gate: gate.clone(),
        lane: Arc::default(),
    };
    let pod_groups = Arc::new(GroupIndex::default());
    let (pod_reader, pod_writer) = reflector::store::<Pod>();
    let asked = Arc::new(crate::asked::Asked::default());
    let (pod_events, pods_listed) = if per_namespace_pods {
        let scopes = PodScopes {
            client: client.clone(),
            cfg: list_cfg.clone(),
            key: config.pod_key().clone(),
            services_listed: services_gate.clone(),
            gate: gate.clone(),
            pods: pod_reader.clone(),
            limit: opts.pod_watch_namespaces,
            on_listed: Box::new({
                let (tx, services) = (trigger_tx.clone(), svc_reader.clone());
                move |ns: &str| {
                    for svc in services.state() {
                        if svc.namespace().as_deref() == Some(ns) {
                            tx.ask(ObjectRef::from_obj(svc.as_ref()));
                        }
                    }
                }
            }),
        };
        scopes.stream(seen_rx)
    } else {
        let events = watch_keyed(
            &client,
            &opts.namespaces,
            &list_cfg,
            config.pod_key(),
            &gate,
        );
        (events, ListedPods::with_the_caches())
    };
    let pod_stream = {
        let pod_groups = pod_groups.clone();
        let svc_groups = svc_groups.clone();
        let tx = trigger_tx.clone();
        let key = config.pod_key().clone();
        let asked = asked.clone();
        pod_events.reflect(pod_writer).for_each(move |ev| {
            if let Ok(ev) = ev {
                on_pod_event(&ev, &key, &pod_groups, &svc_groups, &tx, &asked);
            } else if let Err(e) = ev {
                warn!(error = %e, "pod watch");
            }
            future::ready(())
        })
    };

    // Our slices only (selected by our managed-by label). Another
    // manager's slice under a name we want is found when the apiserver
    // refuses the apply (`crate::foreign`); native slices to clean up, by
    // a label-selected LIST (`migrate`).
    let slice_owners = Arc::new(GroupIndex::default());
    let echoes = Arc::new(Echoes::default());
    let (slice_reader, slice_writer) = reflector::store::<EndpointSlice>();
    let slice_stream = {
        let owners = slice_owners.clone();
        let echoes = echoes.clone();
        let tx = trigger_tx.clone();
        let keep = config.managed_by.clone();
        let services = svc_reader.clone();
        let gate = gate.clone();
        let release_tx = release_tx.clone();
        let ours = list_cfg
            .clone()
            .labels(&format!("{MANAGED_BY_LABEL}={}", config.managed_by));
        watch_all::<EndpointSlice>(&client, &opts.namespaces, ours, &gate, |_| true)
            // Our own managedFields entry tells the planner which labels we
            // applied before, so one the Service dropped is removed too.
            .modify(move |s: &mut EndpointSlice| cache::keep_managed_fields_of(s, &keep))
            .reflect(slice_writer)
            .for_each(move |ev| {
                match ev {
                    Ok(watcher::Event::Apply(s)) => {
                        let ns = s.namespace().unwrap_or_default();
                        let svc = slice_service(&s);
                        owners.set(&ns, &s.name_any(), svc.as_deref());
                        if let Some(svc) = svc {
                            let r = ObjectRef::new(&svc).within(&ns);
                            // A slice of ours for a Service the cache does
                            // not hold: it may have lost its key.
                            if gate.synced() && services.get(&r).is_none() {
                                let _ = release_tx.send(Gone::Check(r.clone()));
                            }
                            // Our own write coming back: nothing new to
                            // reconcile (crate::echo).
                            trigger_unless_echo(&echoes, &tx, s, r, Echoes::is_our_apply);
                        }
                    }
                    Ok(watcher::Event::Delete(s)) => {
                        let ns = s.namespace().unwrap_or_default();
                        if let Some(prev) = owners.set(&ns, &s.name_any(), None) {
                            let r = ObjectRef::new(&prev).within(&ns);
                            trigger_unless_echo(&echoes, &tx, s, r, Echoes::is_our_delete);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "endpointslice watch"),
                }
                future::ready(())
            })
    };

    // Our own legacy Endpoints only (label-selected: the cluster's others
    // are never cached), so that one written while `publishLegacyEndpoints`
    // was on, possibly by an earlier process, is removed once it is off or
    // the Service leaves, without a GET per reconcile.
    let (our_endpoints_reader, our_endpoints_writer) = reflector::store::<Endpoints>();
    let our_endpoints_stream = {
        let tx = trigger_tx.clone();
        let selector = format!("{ENDPOINTS_MANAGED_BY_LABEL}={}", config.managed_by);
        watch_all::<Endpoints>(
            &client,
            &opts.namespaces,
            list_cfg.clone().labels(&selector),
            &gate,
            |_: &Endpoints| true,
        )
        .modify(cache::strip_managed_fields)
        .reflect(our_endpoints_writer)
        .for_each(move |ev| {
            match ev {
                Ok(watcher::Event::Apply(ep)) | Ok(watcher::Event::InitApply(ep)) => {
                    let ns = ep.namespace().unwrap_or_default();
                    tx.ask(ObjectRef::new(&ep.name_any()).within(&ns));
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "endpoints watch"),
            }
            future::ready(())
        })
    };

    // Node metadata: zones only.
    let (node_store, node_stream): (
        Option<Store<PartialObjectMeta<Node>>>,
        BoxFuture<'static, ()>,
    ) = if config.disable_node_lookups {
        (None, future::pending::<()>().boxed())
    } else {
        let (reader, writer) = reflector::store::<PartialObjectMeta<Node>>();
        let mut token = Some(gate.register());
        // A Node that appears or goes changes which pods are candidates
        // (`align::on_known_node`): re-check every Service then. Node
        // updates (heartbeats) change nothing here and trigger nothing.
        let mut known: std::collections::HashSet<String> = Default::default();
        let tx = trigger_tx.clone();
        let services = svc_reader.clone();
        let stream = crate::watches::streaming_or_listing(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            list_cfg.clone(),
        )
        .backoff(WatchBackoff::default())
        .modify(cache::strip_managed_fields)
        .reflect(writer)
        .for_each(move |ev| {
            // node metadata is optional for correctness; count it as
            // synced after its first list. (Dropping a SyncToken does not
            // complete it: it must be completed explicitly.)
            let changed = match &ev {
                Ok(watcher::Event::InitApply(n)) => {
                    known.insert(n.name_any());
                    false
                }
                Ok(watcher::Event::Apply(n)) => known.insert(n.name_any()),
                Ok(watcher::Event::Delete(n)) => known.remove(&n.name_any()),
                _ => false,
            };
            if changed && token.is_none() {
                tx.ask_all(&services);
            }
            if let Ok(watcher::Event::InitDone) = ev
                && let Some(mut token) = token.take()
            {
                token.complete();
            }
            future::ready(())
        })
        .boxed();
        (Some(reader), stream)
    };

    let reporter = Reporter {
        controller: config.managed_by.clone(),
        instance: opts.instance.clone(),
    };
    let events = Arc::new(Events::new(Recorder::new(client.clone(), reporter)));
    let ctx = Arc::new(Context {
        judge: Judge::new(
            checkers,
            config.max_concurrent_checks,
            opts.check_timeout,
            config.resync_period,
            config.abstain_limit(),
            opts.metrics.clone(),
        ),
        shadows,
        writer: SliceWriter::new(client.clone(), config.managed_by.clone()).with_echoes(echoes),
        events: events.clone(),
        shadow_outlets: crate::shadow::Outlets {
            events,
            metrics: opts.metrics.clone(),
            services: svc_reader.clone(),
        },
        migration: migrate::Migrator::new(client.clone(), config.managed_by.clone()),
        synced: gate.clone(),
        pods_listed,
        reconcile_slots: (opts.reconcile_concurrency > 0).then(|| {
            Arc::new(tokio::sync::Semaphore::new(
                opts.reconcile_concurrency as usize,
            ))
        }),
        config: config.clone(),
        services: svc_reader.clone(),
        pods: pod_reader,
        slices: slice_reader,
        our_endpoints: our_endpoints_reader,
        nodes: node_store,
        pod_groups,
        slice_owners,
        metrics: opts.metrics.clone(),
        leader: opts.leader.clone(),
        selector_warned: Mutex::default(),
        policy_warned: Mutex::default(),
        external_warned: Mutex::default(),
        retries: Default::default(),
        trigger_memory: Mutex::default(),
        asked,
        exclusive: Default::default(),
    });
    let lane = trigger_tx.lane.get_or_init(|| {
        // The sender, not the `Triggers` that hold this lane: no cycle.
        let (ctx, tx) = (ctx.clone(), trigger_tx.tx.clone());
        Lane::new(move |svc: ObjectRef<Service>| {
            let (ctx, tx) = (ctx.clone(), tx.clone());
            async move { reconcile_promptly(svc, ctx, tx).await }.boxed()
        })
    });

    {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            while let Some(svc) = gone_rx.recv().await {
                ctx.forget_service(&svc);
            }
        });
    }

    // Native Endpoints, listed once so that the cold start's migration
    // cleanup does not GET one per Service; reconciles wait for it like for
    // the watches' first lists.
    if config.native_cleanup {
        let mut listed = gate.register();
        let ctx = ctx.clone();
        let namespaces = opts.namespaces.clone();
        tokio::spawn(async move {
            ctx.migration.prime(&namespaces).await;
            listed.complete();
        });
    }

    // Services that leave the cache but not the cluster are released
    // there; at start and on becoming leader, our slices of Services the
    // cache does not hold are looked at (they may have lost their key
    // while we were down or following).
    // Stopped with the controller (an in-process run must not leave a
    // writer behind).
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(release_gone(
        client.clone(),
        ctx.clone(),
        release_tx.clone(),
        release_rx,
    )));
    {
        let ctx = ctx.clone();
        let mut leader = opts.leader.clone();
        let mut synced_at = Some(started);
        let (tx, services) = (trigger_tx.clone(), svc_reader.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                ctx.synced.opened().await;
                if let Some(at) = synced_at.take() {
                    // Nothing was asked for before now (`Triggers`):
                    // start every Service, once.
                    tx.ask_all(&services);
                    // Cold-start timings (docs/benchmarks.md, row 1b).
                    info!(
                        after_ms = at.elapsed().as_millis() as u64,
                        services = ctx.services.len(),
                        pods = ctx.pods.len(),
                        slices = ctx.slices.len(),
                        "caches synced"
                    );
                }
                if ctx.is_leader() {
                    sweep_gone(&ctx, &release_tx);
                }
                let Some(rx) = leader.as_mut() else { break };
                // Until the next time we become leader (a renewal changes
                // the term too: only a new one counts).
                let mut held = rx.holds_term();
                loop {
                    match rx.changed().await {
                        None => return,
                        Some(holds) => {
                            let became = holds && !held;
                            held = holds;
                            if became {
                                break;
                            }
                        }
                    }
                }
            }
        }));
    }
    tasks.push(tokio::spawn(count_cached(
        opts.metrics.clone(),
        svc_reader.clone(),
        ctx.pods.clone(),
        ctx.slices.clone(),
        ctx.nodes.clone(),
    )));

    // Becoming leader (again) re-checks everything: while following we
    // wrote nothing, and the previous leader may have left work undone.
    // Renewals change the term too: only a new term re-checks.
    if let Some(mut tenure) = opts.leader.clone() {
        let tx = trigger_tx.clone();
        let services = svc_reader.clone();
        tokio::spawn(async move {
            let mut held = false;
            let mut holds = tenure.holds_term();
            loop {
                // Before the caches sync, their opening triggers all.
                if holds && !held {
                    tx.ask_all(&services);
                }
                held = holds;
                match tenure.changed().await {
                    Some(h) => holds = h,
                    None => break,
                }
            }
        });
    }

    // Readiness: flip once every watch has listed once.
    if let Some(ready) = opts.ready.clone() {
        let gate = gate.clone();
        tokio::spawn(async move {
            gate.opened().await;
            ready.set_ready(true);
        });
    }

    let background = tokio::spawn(async move {
        tokio::join!(pod_stream, slice_stream, our_endpoints_stream, node_stream);
    });

    info!(namespaces = ?opts.namespaces, managed_by = %config.managed_by, "portwise controller starting");
    let metrics = opts.metrics.clone();
    // Cold start: logs once every Service the synced cache held has been
    // reconciled (docs/benchmarks.md, row 1b).
    let mut cold: Option<std::collections::HashSet<ObjectRef<Service>>> = Some(Default::default());
    let (cold_gate, cold_services) = (gate.clone(), svc_reader.clone());
    let mut reconciles = 0u64;
    Controller::for_stream(services, svc_reader)
        // Unbounded here: `Context::reconcile_slots` bounds reconciles
        // fairly (see there).
        .with_config(kube::runtime::controller::Config::default().concurrency(0))
        .reconcile_on(trigger_rx)
        .graceful_shutdown_on(shutdown)
        .run(reconcile_in_turn, error_policy, ctx)
        .for_each(|res| {
            reconciles += 1;
            if let (Some(seen), Ok((obj, _))) = (cold.as_mut(), &res)
                && cold_gate.synced()
            {
                seen.insert(obj.clone());
                if seen.len() >= cold_services.len()
                    && cold_services
                        .state()
                        .iter()
                        .all(|s| seen.contains(&ObjectRef::from_obj(s.as_ref())))
                {
                    info!(
                        after_ms = started.elapsed().as_millis() as u64,
                        services = seen.len(),
                        reconciles,
                        "cold start: every Service reconciled once"
                    );
                    cold = None;
                }
            }
            match res {
                Ok((obj, _)) => {
                    metrics.count_sync(SyncResult::Success);
                    debug!(service = %obj, "reconciled")
                }
                Err(kube::runtime::controller::Error::ReconcilerFailed(e, obj)) => {
                    metrics.count_sync(SyncResult::Error);
                    metrics.count_reconcile_error(e.kind());
                    warn!(service = %obj, error = %e, "reconcile failed")
                }
                Err(e) => debug!(error = %e, "controller"),
            }
            future::ready(())
        })
        .await;
    // Prompt reconciles in flight end before the Lease can be released.
    lane.drain().await;
    background.abort();
    for task in tasks {
        task.abort();
    }
    info!("portwise controller stopped");
    Ok(())
}
fn on_pod_event(
    ev: &watcher::Event<Pod>,
    key: &KeySource,
    pod_groups: &GroupIndex,
    svc_groups: &GroupIndex,
    tx: &Triggers,
    asked: &crate::asked::Asked,
) {
    let (pod, group) = match ev {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => (p, key_value(&p.metadata, key)),
        watcher::Event::Delete(p) => (p, None),
        _ => return,
    };
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let before = pod_groups.group_of(&ns, &name);
    pod_groups.set(&ns, &name, group);
    let mut groups: Vec<String> = before.into_iter().collect();
    groups.extend(group.map(str::to_string));
    groups.dedup();
    if !tx.open() {
        return;
    }
    for g in groups {
        for svc in svc_groups.members(&ns, &g) {
            asked.mark(format!("{ns}/{svc}"));
            tx.ask_now(ObjectRef::new(&svc).within(&ns));
        }
    }
}
/// Retries a failed reconcile after the Service's own backoff
/// ([`crate::retry`]).
fn error_policy(svc: Arc<Service>, err: &Error, ctx: Arc<Context>) -> Action {
    match retry_after(&svc, err, &ctx) {
        Some(delay) => Action::requeue(delay),
        None => Action::await_change(),
    }
}

/// When a failed reconcile of `svc` is tried again; `None` if the Service
/// is gone.
fn retry_after(svc: &Arc<Service>, err: &Error, ctx: &Context) -> Option<Duration> {
    let key = service_key(svc);
    if !ctx.still_cached(svc) {
        // Deleted while it failed: nothing to retry, nothing to keep.
        ctx.forget_service(svc);
        return None;
    }
    let delay = ctx.retries.failed(&key);
    warn!(service = %key, error = %err, retry_in = ?delay,
        failures = ctx.retries.failures(&key), "will retry");
    Some(delay)
}

/// A reconcile the prompt lane started (a pod changed): counted as the
/// `Controller`'s are; a failure is retried through the `Controller`
/// after the Service's backoff. Its periodic resync stays with the
/// `Controller`, which scheduled it after the Service's last reconcile
/// there.
async fn reconcile_promptly(
    svc: ObjectRef<Service>,
    ctx: Arc<Context>,
    controller: UnboundedSender<ObjectRef<Service>>,
) {
    let Some(obj) = ctx.services.get(&svc) else {
        // Gone: its reconcile will not come to take the pod change's mark.
        ctx.asked.take(&format!(
            "{}/{}",
            svc.namespace.as_deref().unwrap_or_default(),
            svc.name
        ));
        return;
    };
    match reconcile_in_turn(obj.clone(), ctx.clone()).await {
        Ok(_) => {
            ctx.metrics.count_sync(SyncResult::Success);
            debug!(service = %svc, "reconciled");
        }
        Err(e) => {
            ctx.metrics.count_sync(SyncResult::Error);
            ctx.metrics.count_reconcile_error(e.kind());
            warn!(service = %svc, error = %e, "reconcile failed");
            if let Some(delay) = retry_after(&obj, &e, &ctx) {
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = controller.unbounded_send(svc);
                });
            }
        }
    }
}

fn service_key(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

/// A reconcile once a slot is free ([`Context::reconcile_slots`]: FIFO, so
/// no Service starves).
async fn reconcile_in_turn(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = service_key(&svc);
    let asked = ctx.asked.take(&key);
    let queued = std::time::Instant::now();
    // The other path may be reconciling it ([`crate::lane`]).
    let _held = ctx.exclusive.hold(key.clone()).await;
    let slots = ctx.reconcile_slots.clone();
    let _slot = match &slots {
        Some(slots) => Some(
            slots
                .acquire()
                .await
                .expect("reconcile slots are never closed"),
        ),
        None => None,
    };
    let result = reconcile(svc.clone(), ctx.clone(), asked, queued.elapsed()).await;
    if result.is_ok() {
        ctx.retries.succeeded(&key);
    }
    // A Service deleted while this reconcile ran was forgotten by the
    // delete handler, and this reconcile may have put some of its state
    // back (verdicts, metric series, warnings). The store drops a Service
    // before the handler runs, so checking it here, after the last insert,
    // closes the race.
    if !ctx.still_cached(&svc) {
        ctx.forget_service(&svc);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asks before the caches sync are dropped (the gate's opening asks
    /// for every Service instead); once open, every ask is heard.
    #[test]
    fn asks_before_the_caches_sync_are_dropped_and_heard_after() {
        let gate = SyncGate::default();
        let mut listing = gate.register();
        let (tx, mut rx) = unbounded::<ObjectRef<Service>>();
        let triggers = Triggers {
            tx,
            gate: gate.clone(),
            lane: Arc::default(),
        };
        let web = ObjectRef::<Service>::new("web").within("ns");
        triggers.ask(web.clone());
        assert!(!triggers.open());
        assert!(rx.try_recv().is_err(), "an ask before sync was sent");
        listing.complete();
        assert!(triggers.open());
        triggers.ask(web.clone());
        assert_eq!(rx.try_recv().ok(), Some(web));
    }
}
