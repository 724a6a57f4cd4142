//! The I/O shell of one reconcile: read the caches, let the core decide
//! ([`portwise_core::reconcile::decide`]), then carry the decision out:
//! Events, judging through the checkers, planning, server-side apply,
//! native cleanup, legacy Endpoints and metrics. Whether a Service is ours
//! to serve and what follows from it is not decided here.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use jiff::Timestamp;
use k8s_openapi::api::{
    core::v1::{Endpoints, Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Resource, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        controller::Action,
        events::{Event as KubeEvent, EventType, Recorder},
        reflector::{ObjectRef, Store},
    },
};
use tracing::{debug, info, warn};

use portwise_core::{
    config::Config,
    plan::{self, TriggerMemory, Triggers, is_ours},
    reconcile::{self as decision, Decision, Once, Release, Requeue, Serve},
};

use crate::{
    Error, Judge,
    apply::{SliceWriter, Writes},
    cache::{GroupIndex, SyncGate},
    metrics::Metrics,
    migrate,
};

/// Everything a reconcile reads: caches, indexes, the checker, writers.
pub(crate) struct Context {
    pub(crate) config: Arc<Config>,
    /// The Service cache (per-Service state is kept only for Services it
    /// still holds).
    pub(crate) services: Store<Service>,
    pub(crate) pods: Store<Pod>,
    pub(crate) slices: Store<EndpointSlice>,
    /// The legacy Endpoints objects that carry our managed-by label.
    pub(crate) our_endpoints: Store<Endpoints>,
    pub(crate) nodes: Option<Store<PartialObjectMeta<Node>>>,
    pub(crate) pod_groups: Arc<GroupIndex>,
    /// slices by the Service they belong to (owner or service-name label)
    pub(crate) slice_owners: Arc<GroupIndex>,
    pub(crate) judge: Judge,
    /// The configuration's shadow expressions, if any (`crate::shadow`).
    pub(crate) shadows: Option<crate::shadow::Shadows>,
    pub(crate) writer: SliceWriter,
    pub(crate) recorder: Recorder,
    pub(crate) metrics: Metrics,
    pub(crate) leader: Option<crate::Tenure>,
    /// Services whose selector warning was emitted (per transition).
    pub(crate) selector_warned: Mutex<HashSet<String>>,
    /// Services whose ExternalName event was emitted.
    pub(crate) external_warned: Mutex<HashSet<String>>,
    /// Consecutive failed reconciles per Service, for the retry backoff.
    pub(crate) retries: crate::retry::Retries,
    /// Per Service UID: the trigger times its last written plan saw, so
    /// the next plan knows which changed since (the trigger-time
    /// annotation, `portwise_core::plan::trigger`). Dropped when the Service
    /// is deleted or no longer served.
    pub(crate) trigger_memory: Mutex<HashMap<String, TriggerMemory>>,
    pub(crate) migration: migrate::Migrator,
    /// Every watch has listed once: the caches are complete.
    pub(crate) synced: SyncGate,
    /// Services reconciled at once (`None`: no bound). A FIFO semaphore
    /// instead of kube-runtime's own concurrency limit, which parks the
    /// Services it cannot start yet in a hash set and takes the first in
    /// hash order when a slot frees: under sustained load (probe-heavy
    /// Services due again every resync) the same Services win every time
    /// and the rest starve, so a pod change in another Service went
    /// unpublished for 10–30 s in `./bench` row 5. Here every Service waits
    /// its turn in arrival order.
    pub(crate) reconcile_slots: Option<Arc<tokio::sync::Semaphore>>,
}

impl Context {
    /// Within this replica's term (by the clock, see [`crate::Tenure`]).
    pub(crate) fn is_leader(&self) -> bool {
        self.leader.as_ref().is_none_or(crate::Tenure::leads)
    }

    fn pods_in_group(&self, ns: &str, group: &str) -> Vec<Arc<Pod>> {
        self.pod_groups
            .members(ns, group)
            .into_iter()
            .filter_map(|name| self.pods.get(&ObjectRef::new(&name).within(ns)))
            .collect()
    }

    /// The Node exists (always, without Node lookups: nothing to go by).
    fn node_known(&self, node: &str) -> bool {
        self.nodes
            .as_ref()
            .is_none_or(|nodes| nodes.get(&ObjectRef::new(node)).is_some())
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

    /// Keeps what `svc`'s written plan saw for its next plan, if the
    /// Service still exists. Checked under the lock that its deletion takes
    /// to drop the entry, after the cache has dropped the Service: an entry
    /// kept by a reconcile that raced the deletion would never go.
    fn remember_triggers(&self, svc: &Service, memory: TriggerMemory) {
        let uid = svc.uid().unwrap_or_default();
        let mut all = self.trigger_memory.lock().unwrap();
        let current = self.services.get(&ObjectRef::from_obj(svc));
        if current.is_some_and(|s| s.uid().as_deref() == Some(uid.as_str())) {
            all.insert(uid, memory);
        }
    }

    fn zone_of(&self, node: &str) -> Option<String> {
        let nodes = self.nodes.as_ref()?;
        let meta = nodes.get(&ObjectRef::new(node))?;
        meta.labels().get("topology.kubernetes.io/zone").cloned()
    }

    pub(crate) async fn event(&self, svc: &Service, type_: EventType, reason: &str, note: String) {
        let ev = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(portwise_core::text::cut(note, 1000)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &svc.object_ref(&())).await {
            warn!(service = %svc.name_any(), error = %e, "could not publish Event {reason}");
        }
    }
}

/// Marks a once-per-transition warning for `uid` as the decision says;
/// `true` when the Event is due now (raised and not marked before).
fn latch(marks: &Mutex<HashSet<String>>, uid: &str, once: Once) -> bool {
    match once {
        Once::Raise => marks.lock().unwrap().insert(uid.to_string()),
        Once::Rearm => {
            marks.lock().unwrap().remove(uid);
            false
        }
        Once::Keep => false,
    }
}

/// Reconciles one Service: decide from the caches, then judge its pods per
/// port and family, plan the slices, write what differs, clean up native
/// leftovers; or take back what we published.
pub(crate) async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
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
    let uid = svc.uid().unwrap_or_default();

    let decided = {
        let node_known = |node: &str| ctx.node_known(node);
        let pods_in_group = |group: &str| {
            ctx.pods_in_group(&ns, group)
                .into_iter()
                .filter(|p| portwise_core::align::on_known_node(&svc, p, &node_known))
                .collect()
        };
        let owned = || ctx.owned_slices(&svc);
        decision::decide(&decision::Input {
            service: &svc,
            config: &ctx.config,
            pods_in_group: &pods_in_group,
            owned: &owned,
            has_our_endpoints: ctx
                .our_endpoints
                .get(&ObjectRef::new(&svc.name_any()).within(&ns))
                .is_some(),
        })
    };

    let warnings = decided.warnings();
    if latch(&ctx.external_warned, &uid, warnings.external_name) {
        ctx.event(
            &svc,
            EventType::Warning,
            "ExternalNameIgnored",
            "portwise ignores ExternalName Services: they have no endpoints".into(),
        )
        .await;
    }
    if let Decision::Serve(s) = &decided
        && s.forget_migration
    {
        ctx.migration.forget(&svc);
    }
    if latch(&ctx.selector_warned, &uid, warnings.selector) {
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

    let requeue = match decided.requeue() {
        Requeue::OnChange => Action::await_change(),
        Requeue::AfterResync => Action::requeue(ctx.config.resync_period),
    };
    match decided {
        Decision::Release(release) => {
            ctx.trigger_memory.lock().unwrap().remove(&uid);
            self::release(&ctx, &svc, &release).await?;
            if release.forget_metrics {
                ctx.metrics.forget_service(&ns, &svc.name_any());
            }
            Ok(requeue)
        }
        Decision::Serve(serve) => {
            if !self::serve(&ctx, &svc, serve).await? {
                return Ok(Action::await_change());
            }
            ctx.metrics.observe_reconcile(started.elapsed());
            Ok(requeue)
        }
    }
}

/// Judges, plans and writes a served Service. `false`: the Lease was lost
/// while judging, nothing was written.
async fn serve(ctx: &Context, svc: &Arc<Service>, mut serve: Serve) -> Result<bool, Error> {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    // Dates the changes this reconcile publishes that carry no time of
    // their own (probe results, annotations, guests' verdicts, ...): when
    // portwise began to look, before judging.
    let observed = Timestamp::now();
    let judged = ctx
        .judge
        .judge(svc, std::mem::take(&mut serve.subjects))
        .await;

    // The planner's inputs borrow non-Send closures; keep them out of the
    // awaits below.
    let mut plan = {
        let previous = ctx
            .trigger_memory
            .lock()
            .unwrap()
            .get(&svc.uid().unwrap_or_default())
            .cloned()
            .unwrap_or_default();
        let owned = ctx.owned_slices(svc);
        let zones = |node: &str| ctx.zone_of(node);
        let lookup = |n: &str| ctx.slice_by_name(&ns, n);
        plan::plan(&plan::PlanInput {
            service: svc,
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
            triggers: Triggers {
                previous: &previous,
                observed: Some(observed),
            },
        })
    };

    for c in &plan.collisions {
        ctx.metrics.count_name_collision();
        ctx.event(
            svc,
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
        return Ok(false);
    }
    let writes = Writes::new(&plan.applies, &plan.deletes, |n| ctx.slice_by_name(&ns, n));
    let written = ctx.writer.execute(&ns, &writes, &ctx.metrics).await;
    // A change held back by a failed write stays new for the retry, so it
    // keeps its date.
    if written.is_ok() {
        ctx.remember_triggers(svc, std::mem::take(&mut plan.trigger_memory));
    }
    written.map_err(|source| Error::Apply {
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

    if serve.cleans_up_native(&plan) {
        let cleaned = ctx
            .migration
            .cleanup(svc, &ctx.metrics)
            .await
            .map_err(|source| Error::Migrate {
                service: format!("{ns}/{name}"),
                source,
            })?;
        if cleaned.deleted_anything() {
            ctx.event(
                svc,
                EventType::Normal,
                "NativeEndpointsCleanedUp",
                cleaned.describe(),
            )
            .await;
        }
    }

    if serve.remove_legacy_endpoints {
        remove_our_endpoints(ctx, svc).await?;
    }
    if serve.publish_legacy_endpoints {
        let desired = plan::plan_endpoints(svc, &plan.members, &ctx.config.managed_by);
        if let Err(e) = ctx.migration.publish_endpoints(svc, desired).await {
            match e {
                migrate::Error::NotOurs(holder) => {
                    ctx.event(
                        svc,
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
    // Last, so that the shadow's probes never delay what is published.
    if let Some(shadows) = &ctx.shadows {
        shadows.observe(ctx, svc, &judged).await;
    }
    Ok(true)
}

/// Takes back what we published for a Service that left our management:
/// our legacy Endpoints, then every slice we own.
async fn release(ctx: &Context, svc: &Service, release: &Release) -> Result<(), Error> {
    let ns = svc.namespace().unwrap_or_default();
    if release.remove_legacy_endpoints {
        remove_our_endpoints(ctx, svc).await?;
    }
    let owned = &release.delete_slices;
    if owned.is_empty() {
        return Ok(());
    }
    info!(service = %svc.name_any(), slices = owned.len(), "Service no longer managed: removing its slices");
    let writes = Writes::new(&[], owned, |n| ctx.slice_by_name(&ns, n));
    ctx.writer
        .execute(&ns, &writes, &ctx.metrics)
        .await
        .map_err(|source| Error::Apply {
            service: format!("{ns}/{}", svc.name_any()),
            source,
        })
}

/// Deletes the legacy Endpoints object we wrote for `svc`.
async fn remove_our_endpoints(ctx: &Context, svc: &Service) -> Result<(), Error> {
    let removed = ctx
        .migration
        .remove_our_endpoints(svc)
        .await
        .map_err(|source| Error::Migrate {
            service: service_name(svc),
            source,
        })?;
    if removed {
        info!(service = %service_name(svc), "deleted the legacy Endpoints portwise had written");
    }
    Ok(())
}

fn service_name(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}
