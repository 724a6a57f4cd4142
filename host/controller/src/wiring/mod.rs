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
//! builds the live judge and the shadows; `caches.rs` opens every watch:
//! `keyed.rs`'s Service and pod watches, `informers.rs`'s of our own
//! objects and of nodes;
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
    context::{Context, Stopping},
    echo::Echoes,
    error::Error,
    events::Events,
    judge::Judge,
    metrics::SyncResult,
    migrate::Migrator,
    options::RunOptions,
    pod_scopes::{Interest, ListedPods, PodScopes, ServiceSeen},
    queue::Queue,
    reconcile::reconcile,
    shadow::Shadows,
    table::ServiceTable,
    tenure::Leadership,
    watches::{watch_all, watch_keyed},
};
use tokio::{
    sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel},
    task::JoinSet,
};

mod background;
mod caches;
mod informers;
mod judges;
mod keyed;
mod policies;
mod reconciles;
mod release;
mod terms;
mod triggers;
mod warmup;

use caches::Caches;
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
    let book = Arc::new(crate::policies::Book::default());
    let (judge, shadows) = judges::build(&config, &opts, &table, &book).await?;

    let gate = SyncGate::default();
    // Registered before any watch can open the gate: reconciles wait for
    // the policy objects too (`policies::keep`).
    let policies_read = config.membership_policies.as_ref().map(|_| gate.register());
    let queue = Queue::new();
    let triggers = Triggers {
        queue: queue.clone(),
        gate: gate.clone(),
    };
    let (release_tx, release_rx) = unbounded_channel::<Gone>();
    let (caches, watching) = caches::open(
        &client,
        &config,
        &opts,
        &gate,
        &triggers,
        &table,
        &release_tx,
    );
    let policy_watch = policies_read.as_ref().map(|_| {
        let list_cfg = watcher::Config::default().any_semantic().streaming_lists();
        policies::watch(&client, &opts.namespaces, &list_cfg)
    });
    let (stop, stopping) = Stopping::new();
    let ctx = context(
        &client,
        &config,
        &opts,
        (judge, shadows),
        caches,
        &triggers,
        (table, book, stopping),
    );

    // The supervisor: every task is stopped with the controller, so that an
    // in-process run leaves no writer (or watch) behind.
    let mut tasks = JoinSet::new();
    // First: the start-up LIST joins the sync gate before any watch can
    // open it.
    background::spawn(&mut tasks, &ctx, &opts, watching.services_gone);
    for stream in watching.streams {
        tasks.spawn(stream);
    }
    if let (Some(mut watch), Some(token), Some(limits)) = (
        policy_watch,
        policies_read,
        config.membership_policies.clone(),
    ) {
        tasks.spawn(std::mem::replace(
            &mut watch.stream,
            future::pending().boxed(),
        ));
        tasks.spawn(policies::keep(
            ctx.clone(),
            watch,
            policies::Keeper {
                client: client.clone(),
                limits,
                wasm: opts.wasm.clone(),
                triggers: triggers.clone(),
                token,
            },
        ));
    }
    // Services that leave the cache but not the cluster are released
    // there ([`release_gone`]).
    tasks.spawn(release_gone(
        client.clone(),
        ctx.clone(),
        release_tx.clone(),
        release_rx,
    ));
    if let (Some(warmup), Leadership::Shards { shards, .. }) = (&opts.warmup, &opts.leader) {
        tasks.spawn(warmup::warm_up(
            ctx.clone(),
            *shards,
            warmup.clone(),
            opts.reconcile_concurrency as usize,
        ));
    }
    tasks.spawn(terms(ctx.clone(), started, triggers, release_tx));

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
    // new starts. Those still judging give up at once; those writing
    // finish their writes.
    let _ = stop.send(true);
    queue.close();
    queue.idle().await;
    tasks.shutdown().await;
    info!("portwise controller stopped");
    Ok(())
}

/// The context every reconcile shares: the judges, the caches, the queue
/// and sync gate (`triggers`'), and what writes (slices, Events, migration
/// cleanup) under portwise's name.
fn context(
    client: &Client,
    config: &Arc<Config>,
    opts: &RunOptions,
    (judge, shadows): (Judge, Option<Arc<Shadows>>),
    caches: Caches,
    triggers: &Triggers,
    (table, book, stopping): (Arc<ServiceTable>, Arc<crate::policies::Book>, Stopping),
) -> Arc<Context> {
    let reporter = Reporter {
        controller: config.managed_by.clone(),
        instance: opts.instance.clone(),
    };
    let events = Arc::new(Events::new(Recorder::new(client.clone(), reporter)));
    Arc::new(Context {
        judge,
        shadows,
        writer: SliceWriter::new(client.clone(), config.managed_by.clone())
            .with_echoes(caches.echoes),
        events: events.clone(),
        shadow_outlets: crate::shadow::Outlets {
            events,
            metrics: opts.metrics.clone(),
            services: caches.services.clone(),
        },
        migration: Migrator::new(client.clone(), config.managed_by.clone(), table.clone()),
        synced: triggers.gate.clone(),
        pods_listed: caches.pods_listed,
        queue: triggers.queue.clone(),
        config: config.clone(),
        services: caches.services,
        pods: caches.pods,
        slices: caches.slices,
        our_endpoints: caches.our_endpoints,
        nodes: caches.nodes,
        pod_groups: caches.pod_groups,
        slice_owners: caches.slice_owners,
        metrics: opts.metrics.clone(),
        leader: opts.leader.clone(),
        table,
        book,
        stopping,
    })
}
