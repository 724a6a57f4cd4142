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
//! One file a job: this one assembles the parts ([`run`]); `judges.rs`
//! builds the live judge and the shadows; `keyed.rs` builds the Service and
//! pod watches, `informers.rs` the watches of our own objects and of nodes;
//! `background.rs` starts the work beside them; `triggers.rs` is
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
    FutureExt, StreamExt,
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
    migrate::Migrator,
    options::RunOptions,
    pod_scopes::{ListedPods, PodScopes, ServiceSeen},
    queue::Queue,
    reconcile::reconcile,
    shadow::Shadows,
    table::ServiceTable,
    watches::{watch_all, watch_keyed},
};
use tokio::{
    sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel},
    task::JoinSet,
};

mod background;
mod informers;
mod judges;
mod keyed;
mod reconciles;
mod release;
mod terms;
mod triggers;

use informers::Watches;
use reconciles::{ColdStart, reconcile_outside, serve};
use release::{Gone, release_gone, slice_service, sweep_gone};
use terms::terms;
use triggers::{Triggers, on_pod_event, trigger_unless_echo};

/// Runs the controller until `shutdown` resolves: builds the judges, the
/// watches and the context, hands every task to one supervisor, and serves
/// the queue's reconciles; on shutdown, drains them before the tasks stop.
pub(crate) async fn run(
    client: Client,
    config: Config,
    opts: RunOptions,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let started = std::time::Instant::now();
    let config = Arc::new(config);
    let table = Arc::new(ServiceTable::default());
    let (judge, shadows) = judges::build(&config, &opts, &table).await?;

    let gate = SyncGate::default();
    let queue = Queue::new();
    let triggers = Triggers {
        queue: queue.clone(),
        gate: gate.clone(),
    };
    let (svc_reader, svc_writer) = reflector::store::<Service>();
    let (release_tx, release_rx) = unbounded_channel::<Gone>();
    // Streamed from the watch cache, as the native controller's informers
    // do (`watches::streaming_or_listing` falls back to LIST + WATCH).
    let list_cfg = watcher::Config::default().any_semantic().streaming_lists();
    let watches = Watches {
        client: &client,
        namespaces: &opts.namespaces,
        cfg: &list_cfg,
        gate: &gate,
        triggers: &triggers,
        services: &svc_reader,
        managed_by: &config.managed_by,
    };
    let per_namespace = keyed::per_namespace_pods(&config, &opts.namespaces);
    let mut services = watches.services(
        svc_writer,
        &config.service_key,
        per_namespace,
        release_tx.clone(),
    );
    let pods = watches.pods(
        config.pod_key(),
        services.seen.take(),
        opts.pod_watch_namespaces,
        &services,
        table.clone(),
    );
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
        judge,
        shadows,
        writer: SliceWriter::new(client.clone(), config.managed_by.clone()).with_echoes(echoes),
        events: events.clone(),
        shadow_outlets: crate::shadow::Outlets {
            events,
            metrics: opts.metrics.clone(),
            services: svc_reader.clone(),
        },
        migration: Migrator::new(client.clone(), config.managed_by.clone(), table.clone()),
        synced: gate.clone(),
        pods_listed: pods.listed,
        queue: queue.clone(),
        config: config.clone(),
        services: svc_reader,
        pods: pods.store,
        slices: slice_reader,
        our_endpoints: our_endpoints_reader,
        nodes: node_store,
        pod_groups: pods.groups,
        slice_owners,
        metrics: opts.metrics.clone(),
        leader: opts.leader.clone(),
        table,
    });

    // The supervisor: every task is stopped with the controller, so that an
    // in-process run leaves no writer (or watch) behind.
    let mut tasks = JoinSet::new();
    // First: the start-up LIST joins the sync gate before any watch can
    // open it.
    background::spawn(&mut tasks, &ctx, &opts, services.gone);
    for stream in [
        services.stream,
        pods.stream,
        slice_stream,
        our_endpoints_stream,
        node_stream,
    ] {
        tasks.spawn(stream);
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
        triggers,
        release_tx,
    ));

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
