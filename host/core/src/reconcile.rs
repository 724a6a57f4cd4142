//! The decision of one reconcile: what to do for a Service, given what the
//! caches hold.
//!
//! Why it is pure: kube-rs's model is that a reconcile is a function of
//! cached state. The controller's shell (`portwise-controller`) reads the
//! caches, calls [`decide`], and only then does I/O: judging through the
//! checkers, planning, applying, migrating, Events and metrics. Every rule
//! about *whether* a Service is portwise's to serve, and what follows from
//! it, lives here, where a unit test can reach each branch without an
//! apiserver, a runtime or a clock. The inputs are plain values and lookups
//! into the cache; nothing here awaits, and nothing here remembers: the
//! once-per-transition state of warnings belongs to the shell, which is told
//! what to do with it ([`Once`]).
//!
//! The branches, in order (the first that applies wins):
//! 1. `type: ExternalName`: never served (no endpoints). Warn once if it
//!    carries the alignment key; take back what we published.
//! 2. No alignment key: not (or no longer) managed. Take back what we
//!    published and drop its metrics.
//! 3. Otherwise served: judge the subjects of the Service's group, plan and
//!    apply. A `spec.selector` is tolerated (the native controller publishes
//!    too, so a migration is seamless) but warned about once, and native
//!    leftovers are then never cleaned up. A Service being deleted is still
//!    served; the planner only refuses it new slices.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};

use crate::{
    align,
    config::Config,
    membership::Subject,
    plan::{self, Plan},
    policy::{self, NotChosen, Policy, PolicyObject},
};

/// What [`decide`] reads.
pub struct Input<'a> {
    pub service: &'a Arc<Service>,
    pub config: &'a Config,
    /// The cached pods of a group (the alignment key's value), in the
    /// Service's namespace. Called at most once, only for a served Service.
    pub pods_in_group: &'a dyn Fn(&str) -> Vec<Arc<Pod>>,
    /// Whether a Node is in the cache ([`align::on_known_node`]).
    pub node_known: &'a dyn Fn(&str) -> bool,
    /// The live slices of this Service that may be ours (cache plus our own
    /// recent writes). Called at most once, only for a released Service;
    /// filtered with [`plan::is_ours`] here.
    pub owned: &'a dyn Fn() -> Vec<Arc<EndpointSlice>>,
    /// A v1 Endpoints object of ours exists for this Service (written with
    /// `publishLegacyEndpoints`, possibly by an earlier process).
    pub has_our_endpoints: bool,
    /// The `MembershipPolicy` objects of the Service's namespace
    /// (`membershipPolicies`; none when they are not read).
    pub objects: &'a [PolicyObject],
}

/// What to do for one Service.
#[derive(Clone, Debug)]
pub enum Decision {
    /// Not ours to serve: take back what we published, then wait for the
    /// Service to change.
    Release(Release),
    /// Ours: judge, plan, apply, then re-check after `resyncPeriod`.
    Serve(Serve),
    /// Ours, but no policy can decide it (its annotation names none, or
    /// the policy object that would cannot yet): change nothing (what is
    /// published stays), warn, and wait for the Service (or the policy) to
    /// change.
    Hold(Hold),
}

/// A Service held as it is.
#[derive(Clone, Debug)]
pub struct Hold {
    pub why: NotChosen,
    pub warnings: Warnings,
}

/// Why a Service is not served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmanaged {
    /// `type: ExternalName`: a DNS alias, it has no endpoints.
    ExternalName,
    /// It does not carry the alignment key (`serviceKey`).
    NoKey,
}

/// A warning Event that is emitted once per transition: what the shell does
/// with its "already warned" mark for this Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Once {
    /// The condition holds: set the mark, and emit the Event if it was not
    /// set yet.
    Raise,
    /// The condition is gone: clear the mark so that a recurrence warns
    /// again.
    Rearm,
    /// Not looked at on this path: leave the mark as it is.
    Keep,
}

/// The once-per-transition warnings of a Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Warnings {
    /// `ExternalNameIgnored`: a keyed ExternalName Service.
    pub external_name: Once,
    /// `SelectorIgnored`: a served Service that has a `spec.selector`.
    pub selector: Once,
    /// `PolicyUnknown` / `PolicyNotReady`: no policy can decide it.
    pub unknown_policy: Once,
}

/// Taking back what we published for a Service we do not serve.
#[derive(Clone, Debug)]
pub struct Release {
    pub why: Unmanaged,
    pub warnings: Warnings,
    /// Delete the v1 Endpoints we wrote (whatever `publishLegacyEndpoints`
    /// says now: it may have been on when we wrote it); first, before the
    /// slices.
    pub remove_legacy_endpoints: bool,
    /// Names of the slices we own for it, to delete. Sorted, as given.
    pub delete_slices: Vec<String>,
    /// Drop its per-Service metric series (not for ExternalName, as before
    /// the split: they are dropped when the Service is deleted).
    pub forget_metrics: bool,
}

/// Serving a Service.
#[derive(Clone, Debug)]
pub struct Serve {
    /// The pod group: the value of the alignment key.
    pub group: String,
    /// The expression that judges it.
    pub policy: Policy,
    pub has_selector: bool,
    pub warnings: Warnings,
    /// Forget what the migrator learnt about native leftovers: with a
    /// selector the native controllers serve it again, so a later hand-over
    /// must look for their leftovers afresh.
    pub forget_migration: bool,
    /// What the checker judges: every (port, family, pod of the group).
    pub subjects: Vec<Subject>,
    /// The pods of the group that are not judged at all, counted by reason.
    pub not_judged: BTreeMap<align::NotJudged, usize>,
    /// `nativeCleanup` applies: configured and no selector. Whether to run
    /// it depends on the plan: [`Serve::cleans_up_native`].
    pub native_cleanup: bool,
    /// Also write v1 Endpoints (`publishLegacyEndpoints`).
    pub publish_legacy_endpoints: bool,
    /// `publishLegacyEndpoints` is off but an Endpoints object of ours is
    /// still there: delete it, or legacy consumers keep stale addresses.
    pub remove_legacy_endpoints: bool,
}

/// When to look at the Service again after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// Only when it (or a trigger for it) changes.
    OnChange,
    /// After `resyncPeriod`, so probe results stay fresh.
    AfterResync,
}

impl Decision {
    pub fn requeue(&self) -> Requeue {
        match self {
            Decision::Release(_) | Decision::Hold(_) => Requeue::OnChange,
            Decision::Serve(_) => Requeue::AfterResync,
        }
    }

    pub fn warnings(&self) -> Warnings {
        match self {
            Decision::Release(r) => r.warnings,
            Decision::Serve(s) => s.warnings,
            Decision::Hold(h) => h.warnings,
        }
    }
}

impl Serve {
    /// Clean up the native controllers' leftovers once `plan` is applied:
    /// only when it publishes at least one endpoint, so traffic never has
    /// nowhere to go during a hand-over.
    pub fn cleans_up_native(&self, plan: &Plan) -> bool {
        self.native_cleanup && plan.summary.endpoints.values().any(|n| *n > 0)
    }
}

/// Decides what one reconcile of `input.service` does.
pub fn decide(input: &Input) -> Decision {
    let svc = input.service;
    let cfg = input.config;
    let spec = svc.spec.as_ref();
    let key = align::key_value(&svc.metadata, &cfg.service_key);

    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
        return Decision::Release(release(
            input,
            Unmanaged::ExternalName,
            Warnings {
                external_name: if key.is_some() {
                    Once::Raise
                } else {
                    Once::Keep
                },
                selector: Once::Keep,
                unknown_policy: Once::Keep,
            },
        ));
    }
    let Some(group) = key else {
        return Decision::Release(release(
            input,
            Unmanaged::NoKey,
            Warnings {
                external_name: Once::Rearm,
                selector: Once::Keep,
                unknown_policy: Once::Keep,
            },
        ));
    };

    let has_selector = spec
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|s| !s.is_empty());
    let policy = match policy::choose(svc, cfg, input.objects) {
        Ok(p) => p,
        Err(why) => {
            return Decision::Hold(Hold {
                why,
                warnings: Warnings {
                    external_name: Once::Rearm,
                    selector: Once::Keep,
                    unknown_policy: Once::Raise,
                },
            });
        }
    };
    let mut not_judged = BTreeMap::new();
    let pods: Vec<Arc<Pod>> = (input.pods_in_group)(group)
        .into_iter()
        .filter(
            |p| match align::not_judged(svc, p, input.node_known, &cfg.pod_addresses) {
                Some(why) => {
                    *not_judged.entry(why).or_default() += 1;
                    false
                }
                None => true,
            },
        )
        .collect();
    Decision::Serve(Serve {
        group: group.to_string(),
        policy,
        has_selector,
        warnings: Warnings {
            external_name: Once::Rearm,
            selector: if has_selector {
                Once::Raise
            } else {
                Once::Rearm
            },
            unknown_policy: Once::Rearm,
        },
        forget_migration: has_selector,
        subjects: align::subjects(svc, &pods, &cfg.pod_addresses),
        not_judged,
        native_cleanup: cfg.native_cleanup && !has_selector,
        publish_legacy_endpoints: cfg.publish_legacy_endpoints,
        remove_legacy_endpoints: !cfg.publish_legacy_endpoints && input.has_our_endpoints,
    })
}

fn release(input: &Input, why: Unmanaged, warnings: Warnings) -> Release {
    let delete_slices = (input.owned)()
        .iter()
        .filter(|s| plan::is_ours(s, input.service, &input.config.managed_by))
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    Release {
        why,
        warnings,
        remove_legacy_endpoints: input.has_our_endpoints,
        delete_slices,
        forget_metrics: why == Unmanaged::NoKey,
    }
}

#[cfg(test)]
mod tests;
