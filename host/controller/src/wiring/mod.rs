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
//!
//! One file a job: this one assembles the parts ([`run`]); `informers.rs`
//! builds the watches of our own objects and of nodes; `triggers.rs` is
//! where events ask for reconciles; `terms.rs` follows the caches' sync and
//! the leader's terms; `release.rs` takes back the slices of Services that
//! left the cache; `reconciles.rs` runs reconciles in turn and retries
//! them. Every task is the supervisor's (a `JoinSet`, shut down with the
//! controller).

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{
    FutureExt, StreamExt, TryStreamExt,
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
        WatchStreamExt,
        events::{Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tracing::{Instrument, debug, info, warn};

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
    metrics::SyncResult,
    migrate,
    options::RunOptions,
    pod_scopes::{ListedPods, PodScopes, ServiceSeen},
    queue::Queue,
    reconcile::reconcile,
    watches::{watch_all, watch_keyed},
};

mod informers;
mod reconciles;
mod release;
mod terms;
mod triggers;

use reconciles::{ColdStart, reconcile_outside, serve};
use release::{Gone, release_gone, slice_service, sweep_gone};
use terms::terms;
use triggers::{Triggers, on_pod_event, trigger_unless_echo};

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
        .await
        .map_err(|e| Error::Build(e.to_string()))?;
    checkers.insert(Policy::Default, membership);
    for (name, expr) in &config.policies {
        let policy = Policy::Named(name.clone());
        let checker: Arc<dyn Checker> =
            portwise_checkers::build_at(expr, &build_ctx, &policy.label())
                .await
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
    })
    .await?
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
    let queue = Queue::new();
    let trigger_tx = Triggers {
        queue: queue.clone(),
        gate: gate.clone(),
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

    // Our slices, our legacy Endpoints, node zones ([`informers`]).
    let watches = informers::Watches {
        client: &client,
        namespaces: &opts.namespaces,
        cfg: &list_cfg,
        gate: &gate,
        triggers: &trigger_tx,
        services: &svc_reader,
        managed_by: &config.managed_by,
    };
    let slice_owners = Arc::new(GroupIndex::default());
    let echoes = Arc::new(Echoes::default());
    let (slice_reader, slice_stream) =
        watches.slices(slice_owners.clone(), echoes.clone(), release_tx.clone());
    let (our_endpoints_reader, our_endpoints_stream) = watches.our_endpoints();
    let (node_store, node_stream) = if config.disable_node_lookups {
        (None, future::pending::<()>().boxed())
    } else {
        let (store, stream) = watches.nodes();
        (Some(store), stream)
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
        queue: queue.clone(),
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
    });
    // Every task below is the supervisor's: stopped with the controller,
    // so that an in-process run leaves no writer (or watch) behind.
    let mut tasks = tokio::task::JoinSet::new();
    {
        let ctx = ctx.clone();
        tasks.spawn(async move {
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
        tasks.spawn(async move {
            ctx.migration.prime(&namespaces).await;
            listed.complete();
        });
    }

    // Services that leave the cache but not the cluster are released
    // there ([`release_gone`]).
    tasks.spawn(release_gone(
        client.clone(),
        ctx.clone(),
        release_tx.clone(),
        release_rx,
    ));
    tasks.spawn(terms(
        ctx.clone(),
        opts.leader.clone(),
        started,
        trigger_tx.clone(),
        release_tx.clone(),
    ));
    {
        let (services, pods, slices, nodes) = (
            svc_reader.clone(),
            ctx.pods.clone(),
            ctx.slices.clone(),
            ctx.nodes.clone(),
        );
        opts.metrics.read_cache_sizes(move || {
            let mut rows = vec![
                ("services", services.len()),
                ("pods", pods.len()),
                ("endpointslices", slices.len()),
            ];
            rows.extend(nodes.as_ref().map(|n| ("nodes", n.len())));
            rows
        });
    }

    // Readiness: flip once every watch has listed once.
    if let Some(ready) = opts.ready.clone() {
        let gate = gate.clone();
        tasks.spawn(async move {
            gate.opened().await;
            ready.set_ready(true);
        });
    }

    tasks.spawn(pod_stream);
    tasks.spawn(slice_stream);
    tasks.spawn(our_endpoints_stream);
    tasks.spawn(node_stream);

    // A Service's own changes ask for it too (after the caches sync, like
    // every other ask, see `Triggers`).
    {
        let tx = trigger_tx.clone();
        tasks.spawn(services.for_each(move |svc| {
            match svc {
                Ok(svc) => tx.ask(ObjectRef::from_obj(&svc)),
                Err(e) => warn!(error = %e, "service watch"),
            }
            future::ready(())
        }));
    }

    info!(namespaces = ?opts.namespaces, managed_by = %config.managed_by, "portwise controller starting");
    let cold = Arc::new(ColdStart::new(started));
    let serving = serve(
        queue.clone(),
        ctx,
        opts.reconcile_concurrency as usize,
        cold,
    );
    tokio::select! {
        () = shutdown => {}
        () = serving => {}
    }
    // Reconciles in flight end before the Lease can be released; nothing
    // new starts.
    queue.close();
    queue.idle().await;
    tasks.shutdown().await;
    info!("portwise controller stopped");
    Ok(())
}
