//! Shadow rollout, the I/O half: judge a Service's subjects with its shadow
//! expression after the live reconcile has written, count where the two
//! disagree, and tell the Service's owner, without publishing anything.
//!
//! Which shadow applies and what counts as a difference are pure
//! (`portwise_core::shadow`). Here: one [`Judge`] per shadow expression
//! (its own verdict cache, `stable` state and abstain runs, so a shadow
//! never disturbs the live ones), the metric, and an Event per Service that
//! is rate-limited: sent when the set of differences changes, at most once
//! per [`EVENT_INTERVAL`].

use std::{
    collections::{BTreeMap, HashMap, hash_map::DefaultHasher},
    hash::{Hash, Hasher},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use portwise_checkers::BuildContext;
use portwise_core::{
    config::{CheckerExpr, Config, ShadowSpec},
    membership::Subject,
    plan::Judged,
    policy::Policy,
    shadow::{self, Pick},
};

use kube::runtime::reflector::{ObjectRef, Store};

use crate::{
    error::Error,
    events::{Events, Reason},
    judge::{Checkers, Judge},
    metrics::Metrics,
    policies::Book,
    table::{ServiceTable, ShadowReport},
};

/// Shortest gap between two shadow Events of one Service.
pub(crate) const EVENT_INTERVAL: Duration = Duration::from_secs(60);

/// The configured shadows, built once at start like the live checker, and
/// the policy objects' (`spec.shadow`), which the book builds as objects
/// come and change.
pub(crate) struct Shadows {
    /// The config file's `shadow`, if it has one.
    spec: Option<ShadowSpec>,
    default: Option<Judge>,
    named: BTreeMap<String, Judge>,
    /// Judges a Service with the `spec.shadow` of the policy object that
    /// decides it; `None` when the file lets no object decide.
    objects: Option<Judge>,
    book: Arc<Book>,
    /// Where each Service's verdicts, last report and warning are kept.
    table: Arc<ServiceTable>,
    /// Not Service memory but the runner's own bookkeeping, so it is
    /// here rather than in the table, and survives the Service's
    /// forgetting until the run ends: per Service UID, while a shadow run of it is in flight: the newest
    /// live verdicts that came in meanwhile, judged when the run ends (the
    /// newest says all; older ones are dropped). So each Service has at
    /// most one shadow run, and a slow one never holds up its reconciles.
    queued: Mutex<HashMap<String, Option<Queued>>>,
}

/// A shadow run waiting for the one in flight.
struct Queued {
    svc: Arc<Service>,
    live: Vec<Judged>,
}

/// What a shadow run reports through, off the reconcile.
#[derive(Clone)]
pub(crate) struct Outlets {
    pub(crate) events: Arc<Events>,
    pub(crate) metrics: Metrics,
    /// The Service cache: a run that ends after its Service left it takes
    /// back what it wrote.
    pub(crate) services: Store<Service>,
}

impl Shadows {
    /// Builds every shadow expression of the configuration; `None` when the
    /// file has no `shadow` and lets no policy object decide (an object
    /// may bring its own).
    pub(crate) async fn build(
        config: &Config,
        ctx: &BuildContext<'_>,
        (table, book): (Arc<ServiceTable>, Arc<Book>),
        judge: impl Fn(Checkers) -> Judge,
    ) -> Result<Option<Self>, Error> {
        let objects = config.membership_policies.as_ref().map(|_| {
            judge(Checkers::new())
                .with_shadows_of(book.clone())
                .for_shadow("spec.shadow")
        });
        let empty = ShadowSpec {
            membership: None,
            expressions: BTreeMap::new(),
            scopes: BTreeMap::new(),
            annotation: String::new(),
        };
        let spec = match (&config.shadow, &objects) {
            (None, None) => return Ok(None),
            (Some(spec), _) => spec,
            (None, Some(_)) => &empty,
        };
        let make = async |expr: &CheckerExpr, at: &str| -> Result<Judge, Error> {
            portwise_checkers::build_at(expr, ctx, at)
                .await
                .map(|checker| judge(Judge::single(checker)).for_shadow(at))
                .map_err(Error::Build)
        };
        let default = match &spec.membership {
            Some(m) => Some(make(m, "shadow.membership").await?),
            None => None,
        };
        let mut named = BTreeMap::new();
        for (name, expr) in &spec.expressions {
            let judge = make(expr, &format!("shadow.expressions.{name}")).await?;
            named.insert(name.clone(), judge);
        }
        Ok(Some(Shadows {
            spec: config.shadow.clone(),
            default,
            named,
            objects,
            book,
            table,
            queued: Mutex::default(),
        }))
    }

    /// The shadow `svc` gets, its judge, and the policy that judge judges
    /// as: the policy object that decides `svc`, when its `spec.shadow` is
    /// the pick.
    pub(crate) fn for_service(&self, svc: &Service) -> (Pick, Option<&Judge>, Policy) {
        let ns = svc.namespace().unwrap_or_default();
        let object = self
            .table
            .read(svc, |row| match row.and_then(|r| r.chosen.clone()) {
                Some(Policy::Object(name)) if self.book.has_shadow(&ns, &name) => Some(name),
                _ => None,
            });
        let pick = shadow::pick(svc, self.spec.as_ref(), object.as_deref());
        let (judge, policy) = match &pick {
            Pick::Default => (self.default.as_ref(), Policy::Default),
            Pick::Named(name) => (self.named.get(name), Policy::Default),
            Pick::Object(name) => (self.objects.as_ref(), Policy::Object(name.clone())),
            Pick::Off | Pick::Unknown(_) => (None, Policy::Default),
        };
        (pick, judge, policy)
    }

    /// Hands `svc`'s live verdicts to its shadow, off the reconcile: a run
    /// of its own on the runtime, or, while one runs, the next one's input.
    /// Returns at once, so a slow shadow never delays publication.
    pub(crate) fn submit(
        self: &Arc<Self>,
        outlets: &Outlets,
        svc: Arc<Service>,
        live: Vec<Judged>,
    ) {
        let uid = svc.uid().unwrap_or_default();
        {
            let mut queued = self.queued.lock().unwrap();
            if let Some(next) = queued.get_mut(&uid) {
                *next = Some(Queued { svc, live });
                return;
            }
            queued.insert(uid.clone(), None);
        }
        let (shadows, outlets) = (self.clone(), outlets.clone());
        tokio::spawn(async move {
            let mut run = Queued { svc, live };
            loop {
                shadows.observe(&outlets, &run.svc, &run.live).await;
                // The Service may have left the cache while this run judged:
                // its deletion forgot it before the run wrote its series,
                // report and latches, so take them back. The cache drops a
                // Service before its deletion is handled, so checking after
                // the writes closes the race.
                let cached = outlets
                    .services
                    .get(&ObjectRef::from_obj(run.svc.as_ref()))
                    .is_some_and(|s| s.uid() == run.svc.uid());
                if !cached {
                    shadows.table.forget(&run.svc);
                    let ns = run.svc.namespace().unwrap_or_default();
                    outlets
                        .metrics
                        .services
                        .forget_shadow(&ns, &run.svc.name_any());
                }
                let mut queued = shadows.queued.lock().unwrap();
                match queued.get_mut(&uid).and_then(Option::take) {
                    Some(next) => run = next,
                    None => {
                        queued.remove(&uid);
                        break;
                    }
                }
            }
        });
    }

    /// Judges `svc`'s subjects with its shadow and reports where it differs
    /// from `live`.
    async fn observe(&self, outlets: &Outlets, svc: &Arc<Service>, live: &[Judged]) {
        let (events, metrics) = (outlets.events.as_ref(), &outlets.metrics);
        let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
        let (pick, judge, policy) = self.for_service(svc);
        if let Pick::Unknown(wanted) = &pick {
            let first = self
                .table
                .update_existing(svc, |row| {
                    row.warned.shadow.replace(wanted.clone()).as_ref() != Some(wanted)
                })
                .unwrap_or(false);
            if first {
                // Only the shadows this namespace may pick.
                let known = self
                    .spec
                    .as_ref()
                    .map(|spec| shadow::names_for(spec, svc))
                    .unwrap_or_default();
                let annotation = self
                    .spec
                    .as_ref()
                    .map_or(portwise_core::config::DEFAULT_SHADOW_ANNOTATION, |s| {
                        s.annotation.as_str()
                    });
                events.publish(
                    svc,
                    Reason::ShadowUnknown,
                    format!(
                        "annotation {annotation} names shadow {wanted:?}, which the configuration does not have (it has: {}); no shadow is judged",
                        if known.is_empty() { "none".to_string() } else { known.join(", ") }
                    ),
                )
                .await;
            }
        }
        let Some(judge) = judge else {
            metrics.services.forget_shadow(&ns, &name);
            self.table
                .update_existing(svc, |row| row.shadow_report = None);
            return;
        };
        let subjects: Vec<Subject> = live
            .iter()
            .map(|j| Subject {
                service: svc.clone(),
                pod: j.pod.clone(),
                port: j.port.clone(),
                family: j.family,
                address: j.address,
            })
            .collect();
        let shadowed = judge.judge(svc, subjects, &policy).await;
        let diffs = shadow::differences(live, &shadowed);
        metrics.services.set_shadow(
            &ns,
            &name,
            &pick.label(),
            &shadow::per_port(live, &diffs),
            live.len(),
        );
        let digest = {
            let mut h = DefaultHasher::new();
            pick.label().hash(&mut h);
            for d in &diffs {
                (&d.port, &d.pod, d.family, d.address, d.live, d.shadow).hash(&mut h);
            }
            h.finish()
        };
        // A Service forgotten while its shadow judged reports nothing.
        let due = self.table.update_existing(svc, |row| {
            let now = Instant::now();
            let due = match &row.shadow_report {
                // Nothing to say the first time if the shadow agrees.
                None => !diffs.is_empty(),
                Some(r) => r.digest != digest && now.duration_since(r.at) >= EVENT_INTERVAL,
            };
            if due {
                row.shadow_report = Some(ShadowReport { at: now, digest });
            } else if row.shadow_report.is_none() {
                // Remember the agreeing state, so a later difference is news.
                row.shadow_report = Some(ShadowReport {
                    at: now - EVENT_INTERVAL,
                    digest,
                });
            }
            due
        });
        if due == Some(true) {
            let reason = if diffs.is_empty() {
                Reason::ShadowAgrees
            } else {
                Reason::ShadowDiffers
            };
            events
                .publish(svc, reason, shadow::note(&pick, &diffs, live.len()))
                .await;
        }
    }
}

/// A judge for a shadow: like the live one, but its checks stay out of the
/// live check metrics.
pub(crate) fn shadow_judge(
    checkers: Checkers,
    config: &Config,
    check_timeout: Duration,
    metrics: Metrics,
    permits: Arc<crate::permits::FairPermits>,
    table: Arc<ServiceTable>,
) -> Judge {
    Judge::new(
        checkers,
        config.max_concurrent_checks,
        check_timeout,
        config.resync_period,
        config.abstain_limit(),
        metrics,
        table,
    )
    .sharing_permits(permits)
}
