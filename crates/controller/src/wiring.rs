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
    stream::{self, BoxStream},
};
use k8s_openapi::{
    api::{
        core::v1::{Endpoints, Node, Pod, Service},
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
};

use crate::{
    Error, Judge, RunOptions,
    apply::SliceWriter,
    cache::{self, GroupIndex, SyncGate, WatchBackoff, flatten_relists},
    migrate,
    reconcile::{Context, reconcile},
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
pub(crate) async fn run(
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
            stable_spacing: BuildContext::stable_spacing_for(config.resync_period),
        },
    )
    .map_err(|e| Error::Build(e.to_string()))?;

    let gate = SyncGate::default();
    let list_cfg = watcher::Config::default().any_semantic();

    // Services
    let (svc_reader, svc_writer) = reflector::store::<Service>();
    // Services, indexed by group; deletions are reported so per-Service
    // state (verdict cache, trigger times, metrics series) is dropped with them.
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
                    svc_groups.set(&ns, &svc.name_any(), key_value(&svc.metadata, &key));
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
        )
        .modify(cache::strip_managed_fields)
        .reflect(our_endpoints_writer)
        .for_each(move |ev| {
            match ev {
                Ok(watcher::Event::Apply(ep)) | Ok(watcher::Event::InitApply(ep)) => {
                    let ns = ep.namespace().unwrap_or_default();
                    let _ = tx.unbounded_send(ObjectRef::new(&ep.name_any()).within(&ns));
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
                for svc in services.state() {
                    let _ = tx.unbounded_send(ObjectRef::from_obj(svc.as_ref()));
                }
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
    let ctx = Arc::new(Context {
        judge: Judge::new(
            checker,
            config.max_concurrent_checks,
            opts.check_timeout,
            config.resync_period,
            config.abstain_limit(),
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
        external_warned: Mutex::default(),
        retries: Default::default(),
        trigger_memory: Mutex::default(),
    });

    {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            while let Some(svc) = gone_rx.recv().await {
                let ns = svc.namespace().unwrap_or_default();
                let uid = svc.uid().unwrap_or_default();
                ctx.judge.forget(&uid);
                ctx.migration.forget(&svc);
                ctx.metrics.forget_service(&ns, &svc.name_any());
                ctx.selector_warned.lock().unwrap().remove(&uid);
                ctx.external_warned.lock().unwrap().remove(&uid);
                ctx.retries.succeeded(&format!("{ns}/{}", svc.name_any()));
                ctx.trigger_memory.lock().unwrap().remove(&uid);
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
                if holds && !held {
                    for svc in services.state() {
                        let _ = tx.unbounded_send(ObjectRef::from_obj(svc.as_ref()));
                    }
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
            while !gate.synced() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            ready.set_ready(true);
        });
    }

    let background = tokio::spawn(async move {
        tokio::join!(pod_stream, slice_stream, our_endpoints_stream, node_stream);
    });

    info!(namespaces = ?opts.namespaces, managed_by = %config.managed_by, "portwise controller starting");
    let metrics = opts.metrics.clone();
    Controller::for_stream(services, svc_reader)
        // Unbounded here: `Context::reconcile_slots` bounds reconciles
        // fairly (see there).
        .with_config(kube::runtime::controller::Config::default().concurrency(0))
        .reconcile_on(trigger_rx)
        .graceful_shutdown_on(shutdown)
        .run(reconcile_in_turn, error_policy, ctx)
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
    for g in groups {
        for svc in svc_groups.members(&ns, &g) {
            let _ = tx.unbounded_send(ObjectRef::new(&svc).within(&ns));
        }
    }
}
/// Retries a failed reconcile after the Service's own backoff
/// ([`crate::retry`]).
fn error_policy(svc: Arc<Service>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = service_key(&svc);
    let delay = ctx.retries.failed(&key);
    warn!(service = %key, error = %err, retry_in = ?delay,
        failures = ctx.retries.failures(&key), "will retry");
    Action::requeue(delay)
}

fn service_key(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

/// A reconcile once a slot is free ([`Context::reconcile_slots`]: FIFO, so
/// no Service starves).
async fn reconcile_in_turn(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, Error> {
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
    let key = service_key(&svc);
    let result = reconcile(svc, ctx.clone()).await;
    if result.is_ok() {
        ctx.retries.succeeded(&key);
    }
    result
}
