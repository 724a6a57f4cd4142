//! The I/O shell of one reconcile: read the caches, let the core decide
//! ([`portwise_core::reconcile::decide`]), then carry the decision out:
//! Events, judging through the checkers, planning, server-side apply,
//! native cleanup, legacy Endpoints and metrics. Whether a Service is ours
//! to serve and what follows from it is not decided here.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Service;
use kube::{ResourceExt, runtime::reflector::ObjectRef};
use tracing::{debug, info, warn};

use portwise_core::{
    plan::{self, Triggers},
    policy::{NotChosen, Policy},
    reconcile::{self as decision, Decision, Once, Release, Requeue, Serve},
};

use crate::{
    apply::Writes, context::Context, error::Error, events::Reason, metrics::ReconcilePhase,
    migrate, slots::Slot,
};

/// Marks a once-per-transition warning for `uid` as the decision says;
/// `true` when the Event is due now (raised and not marked before).
fn latch(mark: &mut bool, once: Once) -> bool {
    match once {
        Once::Raise => !std::mem::replace(mark, true),
        Once::Rearm => {
            *mark = false;
            false
        }
        Once::Keep => false,
    }
}

/// Reconciles one Service: decide from the caches, then judge its pods per
/// port and family, plan the slices, write what differs, clean up native
/// leftovers; or take back what we published.
///
/// For its profile: `asked`, how long ago a pod change asked for it (if
/// one did), and `queued`, how long it then waited in the queue for its
/// turn. Returns when to reconcile it again if nothing changes (its
/// resync), if ever.
pub(crate) async fn reconcile(
    svc: Arc<Service>,
    ctx: Arc<Context>,
    asked: Option<Duration>,
    queued: Duration,
    slot: &mut Slot,
) -> Result<Option<Duration>, Error> {
    let started = Instant::now();
    debug!("reconcile started");
    let ns = svc.namespace().unwrap_or_default();
    if !ctx.leads(&ns) {
        debug!(namespace = %ns, "not writing here now (no term for its bucket): nothing to do");
        return Ok(None);
    }
    // Never plan from a partial cache: a Service seen before its pods would
    // publish empty slices. Events ask for nothing before the caches sync
    // (`wiring::Triggers`) and their opening triggers every Service, so
    // this is reached only through leadership's trigger; nothing needs
    // requeueing here.
    if !ctx.synced.synced() {
        debug!(pending = ctx.synced.pending(), "caches not synced yet");
        return Ok(None);
    }
    // A namespace whose pod watch opened after the cold start
    // (`crate::pod_scopes`): its first list asks for this Service again.
    if !ctx.pods_listed.listed(&ns) {
        debug!(namespace = %ns, "pods of the namespace not listed yet");
        return Ok(None);
    }
    let decided = decide(&ctx, &svc, &ns);

    let warnings = decided.warnings();
    let (external_name, selector) = ctx.table.update(&svc, |row| {
        if warnings.unknown_policy == Once::Rearm {
            row.warned.policy = None;
        }
        (
            latch(&mut row.warned.external_name, warnings.external_name),
            latch(&mut row.warned.selector, warnings.selector),
        )
    });
    if external_name {
        ctx.events
            .publish(
                &svc,
                Reason::ExternalNameIgnored,
                "portwise ignores ExternalName Services: they have no endpoints".into(),
            )
            .await;
    }
    if let Decision::Serve(s) = &decided
        && s.forget_migration
    {
        ctx.migration.forget(&svc);
    }
    if selector {
        ctx.events.publish(
            &svc,
            Reason::SelectorIgnored,
            "Service has a spec.selector: the native EndpointSlice controller also publishes for it. \
             portwise serves it too so a migration is seamless; remove the selector to hand it over."
                .into(),
        )
        .await;
    }

    let requeue = match decided.requeue() {
        Requeue::OnChange => None,
        Requeue::AfterResync => Some(ctx.config.resync_period),
    };
    match decided {
        Decision::Release(release) => {
            ctx.table
                .update(&svc, |row| row.triggers = Default::default());
            self::release(&ctx, &svc, &release).await?;
            if release.forget_metrics {
                ctx.metrics.forget_service(&ns, &svc.name_any());
            }
            Ok(requeue)
        }
        Decision::Hold(hold) => {
            // Nothing is judged, written or released: a typo, or a policy
            // object that cannot decide yet, must not change what the
            // Service publishes. Warned once per name and cause.
            let said = hold.why.to_string();
            let fresh = ctx.table.update(&svc, |row| {
                row.chosen = None;
                row.warned.policy.replace(said.clone()).as_ref() != Some(&said)
            });
            if fresh {
                let reason = match &hold.why {
                    NotChosen::Unknown(_) => Reason::PolicyUnknown,
                    NotChosen::NotReady { .. } => Reason::PolicyNotReady,
                };
                warn!(namespace = %ns, service = %svc.name_any(), policy = %hold.why.name(), "{said}");
                ctx.events.publish(&svc, reason, said).await;
            }
            Ok(requeue)
        }
        Decision::Serve(serve) => {
            // Said once per change of policy; `membership` from the start
            // is not news.
            let policy = serve.policy.clone();
            let changed = ctx.table.update(&svc, |row| {
                let before = row.chosen.replace(policy.clone());
                before.as_ref() != Some(&policy) && (before.is_some() || policy != Policy::Default)
            });
            if changed {
                ctx.events
                    .publish(
                        &svc,
                        Reason::PolicyChosen,
                        format!("decided by {}", policy.label()),
                    )
                    .await;
            }
            let mut profile = Profile::new(started, asked, queued);
            if !self::serve(&ctx, &svc, serve, &mut profile, slot).await? {
                return Ok(None);
            }
            ctx.metrics.reconciles.observe(started.elapsed());
            profile.report(&ctx, &ns, &svc.name_any());
            Ok(requeue)
        }
    }
}

/// What the core decides for `svc` from the caches now.
fn decide(ctx: &Context, svc: &Arc<Service>, ns: &str) -> Decision {
    let objects = ctx.book.objects(svc);
    let node_known = |node: &str| ctx.node_known(node);
    let pods_in_group = |group: &str| ctx.pods_in_group(ns, group);
    let owned = || ctx.candidate_slices(svc);
    decision::decide(&decision::Input {
        service: svc,
        config: &ctx.config,
        pods_in_group: &pods_in_group,
        node_known: &node_known,
        owned: &owned,
        has_our_endpoints: ctx
            .our_endpoints
            .get(&ObjectRef::new(&svc.name_any()).within(ns))
            .is_some(),
        objects: &objects,
    })
}

/// Warms a Service up for a bucket this replica is about to take over
/// (issue 49): judges its pods as a reconcile would, keeping the verdicts
/// for the first reconcile of the term, and writes nothing, Events
/// included (the holder still publishes). `false` when it cannot be judged
/// yet: the caches have not listed its pods.
pub(crate) async fn warm(svc: &Arc<Service>, ctx: &Context) -> bool {
    let ns = svc.namespace().unwrap_or_default();
    if !ctx.synced.synced() || !ctx.pods_listed.listed(&ns) {
        return false;
    }
    if let Decision::Serve(mut serve) = decide(ctx, svc, &ns) {
        let judging = ctx
            .judge
            .judge(svc, std::mem::take(&mut serve.subjects), &serve.policy);
        tokio::select! {
            biased;
            () = ctx.stopping.wait() => return false,
            _ = judging => {}
        }
    }
    true
}

/// Judges, plans and writes a served Service. `false`: the Lease was lost
/// or the controller began to stop while judging; nothing was written.
async fn serve(
    ctx: &Context,
    svc: &Arc<Service>,
    mut serve: Serve,
    profile: &mut Profile,
    slot: &mut Slot,
) -> Result<bool, Error> {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    // Dates the changes this reconcile publishes that carry no time of
    // their own (probe results, annotations, guests' verdicts, ...): when
    // portwise began to look, before judging.
    let observed = Timestamp::now();
    ctx.metrics
        .services
        .set_not_judged(&ns, &name, &serve.not_judged);
    // Without the slot while the checks run (`crate::slots`): the judge
    // phase includes taking one again. A stop does not wait for the checks
    // (`Stopping`): nothing is written, the next leader judges afresh.
    let judging = slot.released_while(ctx.judge.judge(
        svc,
        std::mem::take(&mut serve.subjects),
        &serve.policy,
    ));
    let judged = tokio::select! {
        biased;
        () = ctx.stopping.wait() => {
            debug!("stopping: judging abandoned, nothing written");
            return Ok(false);
        }
        judged = judging => judged,
    };
    profile.subjects = judged.len();
    profile.judge = profile.lap();

    // The planner's inputs borrow non-Send closures; keep them out of the
    // awaits below.
    let mut plan = {
        let previous = ctx.table.read(svc, |row| {
            row.map(|r| r.triggers.clone()).unwrap_or_default()
        });
        let owned = ctx.candidate_slices(svc);
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

    // Counted as planned, as the native controller does: a sync whose
    // writes fail counts again when it is retried.
    ctx.metrics
        .native
        .observe_sync_plan(plan.summary.endpoints_added, plan.summary.endpoints_removed);
    for c in &plan.collisions {
        ctx.metrics.writes.count_name_collision();
        ctx.events.publish(
            svc,
            Reason::EndpointSliceNameCollision,
            format!(
                "EndpointSlice {} already exists and belongs to {}; portwise will not overwrite it",
                c.name, c.holder
            ),
        )
        .await;
    }

    // Judging can take a while; if we lost the Lease meanwhile, another
    // replica may already be writing.
    if !ctx.leads(&ns) {
        debug!(namespace = %ns, "the term ended while judging: nothing written");
        return Ok(false);
    }
    let writes = Writes::new(&plan.applies, &plan.deletes, |n| ctx.slice_by_name(&ns, n))
        .finishing(&plan.finishes);
    profile.writes = plan.applies.len() + plan.deletes.len() + plan.finishes.len();
    profile.plan = profile.lap();
    let written = ctx.writer.execute(&ns, &writes, &ctx.metrics).await;
    profile.write = profile.lap();
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
    ctx.metrics.services.set(
        &ns,
        &name,
        &published,
        plan.summary.slices,
        plan.summary.desired_slices,
    );

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
            ctx.events
                .publish(svc, Reason::NativeEndpointsCleanedUp, cleaned.describe())
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
                    ctx.events
                        .publish(
                            svc,
                            Reason::EndpointsOwnedByOther,
                            format!(
                                "Endpoints {name} belongs to {holder}; portwise does not adopt it"
                            ),
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
    // Off the reconcile, so that the shadow's probes never delay what is
    // published, now or at the Service's next change.
    if let Some(shadows) = &ctx.shadows {
        shadows.submit(&ctx.shadow_outlets, svc.clone(), judged);
    }
    ctx.metrics
        .services
        .set_synced(&ns, &name, std::time::SystemTime::now());
    profile.finish = profile.lap();
    Ok(true)
}

/// Where one served reconcile's time went: each phase's duration, for
/// `portwise_reconcile_phase_duration_seconds` and a debug event under the
/// target `portwise::profile` (one line per reconcile, with its Service, for
/// when the histograms' buckets are too coarse or one Service's reconciles
/// matter: `--log-level info,portwise::profile=debug`).
struct Profile {
    /// When the current phase began.
    since: Instant,
    /// From the pod change to the Service being ready in the queue
    /// (`ReconcilePhase::Trigger`), if a pod change asked for this
    /// reconcile.
    asked: Option<Duration>,
    queue: Duration,
    judge: Duration,
    plan: Duration,
    write: Duration,
    finish: Duration,
    /// (pod, port, family) verdicts judged.
    subjects: usize,
    /// Slice writes planned (applies, deletes and finishes).
    writes: usize,
}

impl Profile {
    fn new(started: Instant, asked: Option<Duration>, queued: Duration) -> Self {
        Profile {
            since: started,
            asked,
            queue: queued,
            judge: Duration::ZERO,
            plan: Duration::ZERO,
            write: Duration::ZERO,
            finish: Duration::ZERO,
            subjects: 0,
            writes: 0,
        }
    }

    /// The time since the last lap (or the start): the phase that ends now.
    fn lap(&mut self) -> Duration {
        let now = Instant::now();
        let took = now - self.since;
        self.since = now;
        took
    }

    fn report(&self, ctx: &Context, ns: &str, name: &str) {
        use ReconcilePhase::*;
        let timed = [
            (Queue, self.queue),
            (Judge, self.judge),
            (Plan, self.plan),
            (Write, self.write),
            (Finish, self.finish),
        ];
        for (phase, took) in self.asked.map(|t| (Trigger, t)).into_iter().chain(timed) {
            ctx.metrics.reconciles.observe_phase(phase, took);
        }
        let us = |d: Duration| d.as_micros() as u64;
        debug!(
            target: "portwise::profile",
            namespace = ns,
            service = name,
            subjects = self.subjects,
            writes = self.writes,
            trigger_us = self.asked.map(us),
            queue_us = us(self.queue),
            judge_us = us(self.judge),
            plan_us = us(self.plan),
            write_us = us(self.write),
            finish_us = us(self.finish),
            total_us = us(self.judge + self.plan + self.write + self.finish),
            "reconcile profile"
        );
    }
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
