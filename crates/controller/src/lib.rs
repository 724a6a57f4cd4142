//! The kube-runtime shell around the pure core: watch → align → check →
//! plan → apply.
//!
//! One reconcile is a function of cached state for one Service. Watches feed
//! shared caches (Services, Pods, EndpointSlices, optionally Node metadata);
//! a pod change triggers the Services of its group through [`GroupIndex`],
//! a slice change triggers the Service that owns it, and every Service is
//! re-checked each `resyncPeriod` so probe results stay fresh even when no
//! API object changes. Only the elected leader writes.

pub mod apply;
pub mod cache;
mod judge;
pub mod metrics;
pub mod migrate;
mod readiness;

use std::{
    collections::{BTreeMap, HashSet},
    future::Future,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{
    FutureExt, StreamExt, TryStreamExt,
    channel::mpsc::{UnboundedSender, unbounded},
    future::{self, BoxFuture},
    stream::{self, BoxStream},
};
use k8s_openapi::{
    api::{
        core::v1::{Node, Pod, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::{Event as KubeEvent, EventType, Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use portwise_checkers::{BuildContext, Checker, WasmCheckers};
use portwise_core::{
    align,
    config::{Config, KeySource},
    plan,
};

use crate::{apply::SliceWriter, metrics::Metrics};
use cache::{GroupIndex, SyncGate, WatchBackoff, flatten_relists};
pub use judge::Judge;
pub use readiness::Readiness;

/// Label every EndpointSlice carries: which Service it serves.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label naming the controller that manages a slice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";

/// Errors of one reconcile. Each is retried with backoff by the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("writing slices of {service}: {source}")]
    Apply {
        service: String,
        #[source]
        source: apply::Error,
    },
    #[error("cleaning up native leftovers of {service}: {source}")]
    Migrate {
        service: String,
        #[source]
        source: migrate::Error,
    },
    #[error("building the membership checker: {0}")]
    Build(String),
}

impl Error {
    /// A short stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Apply { .. } => "apply",
            Error::Migrate { .. } => "migrate",
            Error::Build(_) => "build",
        }
    }
}

/// How to run the controller, beyond the configuration file.
#[derive(Clone)]
pub struct RunOptions {
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Bound on one top-level check, on top of the probes' own timeouts.
    pub check_timeout: Duration,
    /// Shared metrics registry.
    pub metrics: Metrics,
    /// `true` while this replica may write. `None`: always (no election).
    pub leader: Option<watch::Receiver<bool>>,
    /// Set once every cache has listed once.
    pub ready: Option<Readiness>,
    /// Name of this replica in Events (`reportingInstance`).
    pub instance: Option<String>,
    /// Resolves `wasm` checker expressions; `None` rejects them.
    pub wasm: Option<Arc<dyn WasmCheckers>>,
    /// Number of Services reconciled at once.
    pub reconcile_concurrency: u16,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            namespaces: Vec::new(),
            check_timeout: Duration::from_secs(10),
            metrics: Metrics::default(),
            leader: None,
            ready: None,
            instance: None,
            wasm: None,
            reconcile_concurrency: 8,
        }
    }
}

/// Everything a reconcile reads: caches, indexes, the checker, writers.
pub struct Context {
    pub config: Arc<Config>,
    pods: Store<Pod>,
    slices: Store<EndpointSlice>,
    nodes: Option<Store<PartialObjectMeta<Node>>>,
    pod_groups: Arc<GroupIndex>,
    /// slices by the Service they belong to (owner or service-name label)
    slice_owners: Arc<GroupIndex>,
    judge: Judge,
    writer: SliceWriter,
    recorder: Recorder,
    metrics: Metrics,
    leader: Option<watch::Receiver<bool>>,
    /// Services whose selector warning was emitted (per transition).
    selector_warned: Mutex<HashSet<String>>,
    /// Services whose ExternalName event was emitted.
    external_warned: Mutex<HashSet<String>>,
    migration: migrate::Migrator,
    /// Every watch has listed once: the caches are complete.
    synced: SyncGate,
    /// Services reconciled at once (`None`: no bound). A FIFO semaphore
    /// instead of kube-runtime's own concurrency limit, which parks the
    /// Services it cannot start yet in a hash set and takes the first in
    /// hash order when a slot frees: under sustained load (probe-heavy
    /// Services due again every resync) the same Services win every time
    /// and the rest starve, so a pod change in another Service went
    /// unpublished for 10–30 s in `./bench` row 5. Here every Service waits
    /// its turn in arrival order.
    reconcile_slots: Option<Arc<tokio::sync::Semaphore>>,
}

impl Context {
    fn is_leader(&self) -> bool {
        self.leader.as_ref().is_none_or(|rx| *rx.borrow())
    }

    fn pods_in_group(&self, ns: &str, group: &str) -> Vec<Arc<Pod>> {
        self.pod_groups
            .members(ns, group)
            .into_iter()
            .filter_map(|name| self.pods.get(&ObjectRef::new(&name).within(ns)))
            .collect()
    }

    fn slice_by_name(&self, ns: &str, name: &str) -> Option<Arc<EndpointSlice>> {
        self.writer
            .overlay(ns, name, self.slices.get(&ObjectRef::new(name).within(ns)))
    }

    /// Live slices this manager owns for `svc`, read through our own recent
    /// writes so a reconcile that races the watch does not write twice.
    fn owned_slices(&self, svc: &Service) -> Vec<Arc<EndpointSlice>> {
        let ns = svc.namespace().unwrap_or_default();
        let mut names: Vec<String> = self.slice_owners.members(&ns, &svc.name_any());
        names.extend(self.writer.recent_names(&ns));
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter_map(|n| self.slice_by_name(&ns, &n))
            .filter(|s| is_ours(s, svc, &self.config.managed_by))
            .collect()
    }

    fn zone_of(&self, node: &str) -> Option<String> {
        let nodes = self.nodes.as_ref()?;
        let meta = nodes.get(&ObjectRef::new(node))?;
        meta.labels().get("topology.kubernetes.io/zone").cloned()
    }

    async fn event(&self, svc: &Service, type_: EventType, reason: &str, note: String) {
        let ev = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(truncate(note, 1000)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &svc.object_ref(&())).await {
            warn!(service = %svc.name_any(), error = %e, "could not publish Event {reason}");
        }
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// A slice is ours for `svc` when the Service is its controller owner and
/// its managed-by label is ours, or was stripped (then we reclaim it).
pub fn is_ours(slice: &EndpointSlice, svc: &Service, managed_by: &str) -> bool {
    let owner_is_svc = controller_owner(slice).is_some_and(|o| Some(&o.uid) == svc.uid().as_ref());
    match slice.labels().get(MANAGED_BY_LABEL) {
        Some(m) => m == managed_by && owner_is_svc,
        None => owner_is_svc,
    }
}

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

fn key_of<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &KeySource,
) -> Option<&'a str> {
    align::key_value(meta, key)
}

/// Builds watch streams over the chosen namespaces, flattened so that they
/// can share one store.
fn watch_all<K>(
    client: &Client,
    namespaces: &[String],
    cfg: watcher::Config,
    gate: &SyncGate,
) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Default
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
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
            watcher(api, cfg.clone()).backoff(WatchBackoff::default()),
            gate.register(),
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

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    opts: RunOptions,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let config = Arc::new(config);
    let checker: Arc<dyn Checker> = portwise_checkers::build(
        &config.membership,
        &BuildContext {
            wasm: opts.wasm.as_deref(),
            stable_ttl: BuildContext::stable_ttl_for(config.resync_period),
        },
    )
    .map_err(|e| Error::Build(e.to_string()))?;

    let gate = SyncGate::default();
    let list_cfg = watcher::Config::default().any_semantic();

    // Services
    let (svc_reader, svc_writer) = reflector::store::<Service>();
    // Services, indexed by group; deletions are reported so per-Service
    // state (verdict cache, metrics series) is dropped with them.
    let svc_groups = Arc::new(GroupIndex::default());
    let (gone_tx, mut gone_rx) = tokio::sync::mpsc::unbounded_channel::<Arc<Service>>();
    let services = {
        let svc_groups = svc_groups.clone();
        let key = config.service_key.clone();
        watch_all::<Service>(&client, &opts.namespaces, list_cfg.clone(), &gate)
            .modify(cache::strip_managed_fields)
            .reflect(svc_writer)
            .inspect_ok(move |ev| match ev {
                watcher::Event::Apply(svc) | watcher::Event::InitApply(svc) => {
                    let ns = svc.namespace().unwrap_or_default();
                    svc_groups.set(&ns, &svc.name_any(), key_of(&svc.metadata, &key));
                }
                watcher::Event::Delete(svc) => {
                    let ns = svc.namespace().unwrap_or_default();
                    svc_groups.set(&ns, &svc.name_any(), None);
                    let _ = gone_tx.send(Arc::new(svc.clone()));
                }
                _ => {}
            })
            .applied_objects()
    };

    // Pods, indexed by group; a change triggers the group's Services.
    let (trigger_tx, trigger_rx) = unbounded::<ObjectRef<Service>>();
    let pod_groups = Arc::new(GroupIndex::default());
    let (pod_reader, pod_writer) = reflector::store::<Pod>();
    let pod_stream = {
        let pod_groups = pod_groups.clone();
        let svc_groups = svc_groups.clone();
        let tx = trigger_tx.clone();
        let key = config.pod_key().clone();
        watch_all::<Pod>(&client, &opts.namespaces, list_cfg.clone(), &gate)
            .modify(cache::strip_managed_fields)
            .reflect(pod_writer)
            .for_each(move |ev| {
                if let Ok(ev) = ev {
                    on_pod_event(&ev, &key, &pod_groups, &svc_groups, &tx);
                } else if let Err(e) = ev {
                    warn!(error = %e, "pod watch");
                }
                future::ready(())
            })
    };

    // Our slices (and anyone's, to detect name collisions).
    let slice_owners = Arc::new(GroupIndex::default());
    let (slice_reader, slice_writer) = reflector::store::<EndpointSlice>();
    let slice_stream = {
        let owners = slice_owners.clone();
        let tx = trigger_tx.clone();
        let managed_by = config.managed_by.clone();
        let keep = config.managed_by.clone();
        watch_all::<EndpointSlice>(&client, &opts.namespaces, list_cfg.clone(), &gate)
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
                            let relevant = s
                                .labels()
                                .get(MANAGED_BY_LABEL)
                                .is_none_or(|m| m == &managed_by || m == migrate::NATIVE_MANAGER);
                            if relevant {
                                let _ = tx.unbounded_send(ObjectRef::new(&svc).within(&ns));
                            }
                        }
                    }
                    Ok(watcher::Event::Delete(s)) => {
                        let ns = s.namespace().unwrap_or_default();
                        if let Some(prev) = owners.set(&ns, &s.name_any(), None) {
                            let _ = tx.unbounded_send(ObjectRef::new(&prev).within(&ns));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "endpointslice watch"),
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
        let stream = watcher(
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
    let ctx = Arc::new(Context {
        judge: Judge::new(
            checker,
            config.max_concurrent_checks,
            opts.check_timeout,
            config.resync_period,
            opts.metrics.clone(),
        ),
        writer: SliceWriter::new(client.clone(), config.managed_by.clone()),
        recorder: Recorder::new(client.clone(), reporter),
        migration: migrate::Migrator::new(client.clone(), config.managed_by.clone()),
        synced: gate.clone(),
        reconcile_slots: (opts.reconcile_concurrency > 0).then(|| {
            Arc::new(tokio::sync::Semaphore::new(
                opts.reconcile_concurrency as usize,
            ))
        }),
        config: config.clone(),
        pods: pod_reader,
        slices: slice_reader,
        nodes: node_store,
        pod_groups,
        slice_owners,
        metrics: opts.metrics.clone(),
        leader: opts.leader.clone(),
        selector_warned: Mutex::default(),
        external_warned: Mutex::default(),
    });

    {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            while let Some(svc) = gone_rx.recv().await {
                let ns = svc.namespace().unwrap_or_default();
                let uid = svc.uid().unwrap_or_default();
                ctx.judge.forget(&uid);
                ctx.migration.forget(&uid);
                ctx.metrics.forget_service(&ns, &svc.name_any());
                ctx.selector_warned.lock().unwrap().remove(&uid);
                ctx.external_warned.lock().unwrap().remove(&uid);
            }
        });
    }

    // Becoming leader (again) re-checks everything: while following we
    // wrote nothing, and the previous leader may have left work undone.
    if let Some(mut rx) = opts.leader.clone() {
        let tx = trigger_tx.clone();
        let services = svc_reader.clone();
        tokio::spawn(async move {
            loop {
                if *rx.borrow_and_update() {
                    for svc in services.state() {
                        let _ = tx.unbounded_send(ObjectRef::from_obj(svc.as_ref()));
                    }
                }
                if rx.changed().await.is_err() {
                    break;
                }
            }
        });
    }

    // Readiness: flip once every watch has listed once.
    if let Some(ready) = opts.ready.clone() {
        let gate = gate.clone();
        tokio::spawn(async move {
            while !gate.synced() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            ready.set_ready(true);
        });
    }

    let background = tokio::spawn(async move {
        tokio::join!(pod_stream, slice_stream, node_stream);
    });

    info!(namespaces = ?opts.namespaces, managed_by = %config.managed_by, "portwise controller starting");
    let metrics = opts.metrics.clone();
    Controller::for_stream(services, svc_reader)
        // Unbounded here: `Context::reconcile_slots` bounds reconciles
        // fairly (see there).
        .with_config(kube::runtime::controller::Config::default().concurrency(0))
        .reconcile_on(trigger_rx)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            match res {
                Ok((obj, _)) => debug!(service = %obj, "reconciled"),
                Err(kube::runtime::controller::Error::ReconcilerFailed(e, obj)) => {
                    metrics.count_reconcile_error(e.kind());
                    warn!(service = %obj, error = %e, "reconcile failed")
                }
                Err(e) => debug!(error = %e, "controller"),
            }
            future::ready(())
        })
        .await;
    background.abort();
    info!("portwise controller stopped");
    Ok(())
}

fn on_pod_event(
    ev: &watcher::Event<Pod>,
    key: &KeySource,
    pod_groups: &GroupIndex,
    svc_groups: &GroupIndex,
    tx: &UnboundedSender<ObjectRef<Service>>,
) {
    let (pod, group) = match ev {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => (p, key_of(&p.metadata, key)),
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
    for g in groups {
        for svc in svc_groups.members(&ns, &g) {
            let _ = tx.unbounded_send(ObjectRef::new(&svc).within(&ns));
        }
    }
}

fn error_policy(svc: Arc<Service>, err: &Error, _ctx: Arc<Context>) -> Action {
    warn!(service = %svc.name_any(), error = %err, "will retry");
    Action::requeue(Duration::from_secs(5))
}

/// Reconciles one Service: judge its pods per port and family, plan the
/// slices, write what differs, clean up native leftovers.
async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _slot = match &ctx.reconcile_slots {
        Some(slots) => Some(
            slots
                .acquire()
                .await
                .expect("reconcile slots are never closed"),
        ),
        None => None,
    };
    let started = Instant::now();
    let resync = Action::requeue(ctx.config.resync_period);
    if !ctx.is_leader() {
        return Ok(Action::await_change());
    }
    // Never plan from a partial cache: a Service seen before its pods would
    // publish empty slices.
    if !ctx.synced.synced() {
        debug!(pending = ctx.synced.pending(), "caches not synced yet");
        return Ok(Action::requeue(Duration::from_millis(250)));
    }
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let uid = svc.uid().unwrap_or_default();
    let spec = svc.spec.clone().unwrap_or_default();

    if spec.type_.as_deref() == Some("ExternalName") {
        if key_of(&svc.metadata, &ctx.config.service_key).is_some()
            && ctx.external_warned.lock().unwrap().insert(uid.clone())
        {
            ctx.event(
                &svc,
                EventType::Warning,
                "ExternalNameIgnored",
                "portwise ignores ExternalName Services: they have no endpoints".into(),
            )
            .await;
        }
        remove_all(&ctx, &svc).await?;
        return Ok(Action::await_change());
    }
    ctx.external_warned.lock().unwrap().remove(&uid);

    let Some(group) = key_of(&svc.metadata, &ctx.config.service_key).map(str::to_string) else {
        // Not (or no longer) managed: take back what we published.
        remove_all(&ctx, &svc).await?;
        ctx.metrics.forget_service(&ns, &name);
        return Ok(Action::await_change());
    };

    let has_selector = spec.selector.as_ref().is_some_and(|s| !s.is_empty());
    if has_selector {
        // The native controllers serve it again: a later hand-over must
        // look for their leftovers afresh.
        ctx.migration.forget(&uid);
        if ctx.selector_warned.lock().unwrap().insert(uid.clone()) {
            ctx.event(
                &svc,
                EventType::Warning,
                "SelectorIgnored",
                "Service has a spec.selector: the native EndpointSlice controller also publishes for it. \
                 portwise serves it too so a migration is seamless; remove the selector to hand it over."
                    .into(),
            )
            .await;
        }
    } else {
        ctx.selector_warned.lock().unwrap().remove(&uid);
    }

    let pods = ctx.pods_in_group(&ns, &group);
    let subjects = align::subjects(&svc, &pods);
    let judged = ctx.judge.judge(&svc, subjects).await;

    // The planner's inputs borrow non-Send closures; keep them out of the
    // awaits below.
    let plan = {
        let owned = ctx.owned_slices(&svc);
        let zones = |node: &str| ctx.zone_of(node);
        let lookup = |n: &str| ctx.slice_by_name(&ns, n);
        plan::plan(&plan::PlanInput {
            service: &svc,
            managed_by: &ctx.config.managed_by,
            max_endpoints_per_slice: ctx.config.max_endpoints_per_slice,
            judged: &judged,
            zones: if ctx.nodes.is_some() {
                Some(&zones)
            } else {
                None
            },
            owned: &owned,
            lookup: &lookup,
        })
    };

    for c in &plan.collisions {
        ctx.metrics.count_name_collision();
        ctx.event(
            &svc,
            EventType::Warning,
            "EndpointSliceNameCollision",
            format!(
                "EndpointSlice {} already exists and belongs to {}; portwise will not overwrite it",
                c.name, c.holder
            ),
        )
        .await;
    }

    // Judging can take a while; if we lost the Lease meanwhile, another
    // replica may already be writing.
    if !ctx.is_leader() {
        return Ok(Action::await_change());
    }
    ctx.writer
        .execute(&ns, &plan.applies, &plan.deletes, &ctx.metrics)
        .await
        .map_err(|source| Error::Apply {
            service: format!("{ns}/{name}"),
            source,
        })?;

    // Metrics: what is published now.
    let mut published: BTreeMap<(String, String), usize> = BTreeMap::new();
    for ((port, family), n) in &plan.summary.endpoints {
        published.insert((port.clone(), family.clone()), *n);
    }
    ctx.metrics
        .set_service(&ns, &name, &published, plan.summary.slices);

    let publishes_any = plan.summary.endpoints.values().any(|n| *n > 0);
    if ctx.config.native_cleanup && !has_selector && publishes_any {
        let native: Vec<Arc<EndpointSlice>> = ctx
            .slice_owners
            .members(&ns, &name)
            .into_iter()
            .filter_map(|n| ctx.slices.get(&ObjectRef::new(&n).within(&ns)))
            .filter(|s| {
                s.labels().get(MANAGED_BY_LABEL).map(String::as_str)
                    == Some(migrate::NATIVE_MANAGER)
            })
            .collect();
        let cleaned = ctx
            .migration
            .cleanup(&svc, &native, &ctx.metrics)
            .await
            .map_err(|source| Error::Migrate {
                service: format!("{ns}/{name}"),
                source,
            })?;
        if cleaned.deleted_anything() {
            ctx.event(
                &svc,
                EventType::Normal,
                "NativeEndpointsCleanedUp",
                cleaned.describe(),
            )
            .await;
        }
    }

    if ctx.config.publish_legacy_endpoints {
        let desired = plan::plan_endpoints(&svc, &judged_after_plan(&plan), &ctx.config.managed_by);
        if let Err(e) = ctx.migration.publish_endpoints(&svc, desired).await {
            match e {
                migrate::Error::NotOurs(holder) => {
                    ctx.event(
                        &svc,
                        EventType::Warning,
                        "EndpointsOwnedByOther",
                        format!("Endpoints {name} belongs to {holder}; portwise does not adopt it"),
                    )
                    .await
                }
                other => {
                    return Err(Error::Migrate {
                        service: format!("{ns}/{name}"),
                        source: other,
                    });
                }
            }
        }
    }

    ctx.metrics.observe_reconcile(started.elapsed());
    Ok(resync)
}

fn judged_after_plan(plan: &plan::Plan) -> Vec<plan::Member> {
    plan.members.clone()
}

/// Deletes every slice we own for `svc` (it left our management).
async fn remove_all(ctx: &Context, svc: &Service) -> Result<(), Error> {
    let ns = svc.namespace().unwrap_or_default();
    if ctx.config.publish_legacy_endpoints {
        ctx.migration
            .remove_our_endpoints(svc)
            .await
            .map_err(|source| Error::Migrate {
                service: format!("{ns}/{}", svc.name_any()),
                source,
            })?;
    }
    let owned: Vec<String> = ctx.owned_slices(svc).iter().map(|s| s.name_any()).collect();
    if owned.is_empty() {
        return Ok(());
    }
    info!(service = %svc.name_any(), slices = owned.len(), "Service no longer managed: removing its slices");
    ctx.writer
        .execute(&ns, &[], &owned, &ctx.metrics)
        .await
        .map_err(|source| Error::Apply {
            service: format!("{ns}/{}", svc.name_any()),
            source,
        })
}
