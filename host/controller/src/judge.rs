//! Runs the membership checker over a Service's subjects: concurrently under
//! one global bound, each check under its own timeout, with results reused
//! until they are stale.
//!
//! Why a cache: a pod event re-reconciles the whole Service, and re-probing
//! 1000 healthy pods because one flipped would turn one change into 1000
//! probes. A verdict is reused while nothing it could depend on changed (the
//! Service's and the pod's resourceVersion, the port, the address) and it is
//! younger than the resync period; so probes still refresh every
//! `resyncPeriod`, and a changed pod is judged afresh at once.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use tracing::debug;

use portwise_checkers::Checker;
use portwise_core::{
    membership::{Decision, Subject, Verdict, algebra::bound_abstain},
    plan::Judged,
    policy::Policy,
};

use crate::{metrics::Metrics, permits::FairPermits, table::ServiceTable};

pub(crate) mod memory;

use memory::{Basis, Id, Memory, Remembered, SubjectKey};

/// The checker of each of the config file's policies (`membership` and
/// `policies.NAME`), built once at start; policy objects' checkers are the
/// [`crate::policies::Book`]'s.
pub type Checkers = BTreeMap<Policy, Arc<dyn Checker>>;

/// Judges subjects with the checker of their Service's policy.
pub struct Judge {
    checkers: Checkers,
    /// Check permits, shared fairly between namespaces.
    permits: Arc<FairPermits>,
    max_in_flight: usize,
    timeout: Duration,
    freshness: Duration,
    metrics: Metrics,
    /// Where each Service's verdicts and abstain runs are kept, under
    /// `id`.
    table: Arc<ServiceTable>,
    id: Id,
    /// `abstainLimit`.
    abstain_limit: Duration,
    /// The policy objects' checkers.
    book: Arc<crate::policies::Book>,
    /// Which of an object's checkers it judges with: the shadows' judge of
    /// policy objects reads their `spec.shadow`.
    side: crate::policies::Side,
}

impl Judge {
    pub fn new(
        checkers: Checkers,
        max_concurrent: usize,
        timeout: Duration,
        resync: Duration,
        abstain_limit: Duration,
        metrics: Metrics,
        table: Arc<ServiceTable>,
    ) -> Self {
        Self {
            checkers,
            permits: FairPermits::new(max_concurrent),
            max_in_flight: max_concurrent.max(1),
            timeout,
            // Slightly less than the resync period, so the periodic reconcile
            // always finds the previous results stale and probes again.
            freshness: resync.mul_f32(0.9),
            metrics,
            table,
            id: Id::Live,
            abstain_limit,
            book: Arc::default(),
            side: crate::policies::Side::Membership,
        }
    }

    /// Judges Services decided by policy objects with the checkers of
    /// `book`.
    pub(crate) fn with_book(mut self, book: Arc<crate::policies::Book>) -> Self {
        self.book = book;
        self
    }

    /// Judges Services decided by policy objects with the objects'
    /// `spec.shadow` checkers of `book` (a shadow's judge).
    pub(crate) fn with_shadows_of(mut self, book: Arc<crate::policies::Book>) -> Self {
        self.book = book;
        self.side = crate::policies::Side::Shadow;
        self
    }

    /// Draws its check slots from `permits` rather than a pool of its own:
    /// the shadows' judges share one (`crate::shadow`).
    pub(crate) fn sharing_permits(mut self, permits: Arc<FairPermits>) -> Self {
        self.permits = permits;
        self
    }

    /// Marks this judge as the shadow defined `at` (see `crate::shadow`):
    /// its verdicts are kept apart, and the live metrics (checks, abstain
    /// runs) do not count its work.
    pub fn for_shadow(mut self, at: &str) -> Self {
        self.id = Id::Shadow(at.into());
        self
    }

    fn is_shadow(&self) -> bool {
        matches!(self.id, Id::Shadow(_))
    }

    /// A judge of one checker, as [`Policy::Default`] (a shadow's).
    pub fn single(checker: Arc<dyn Checker>) -> Checkers {
        BTreeMap::from([(Policy::Default, checker)])
    }

    /// Judges every subject with `policy`'s checker, reusing fresh verdicts.
    pub async fn judge(
        &self,
        svc: &Service,
        subjects: Vec<Subject>,
        policy: &Policy,
    ) -> Vec<Judged> {
        // A policy object's checker is rebuilt on every edit of its spec:
        // its revision is part of what a verdict is based on, so that no
        // verdict of an older build is reused.
        let (checker, revision) = match policy {
            Policy::Object(name) => self
                .book
                .checker(&svc.namespace().unwrap_or_default(), name, self.side)
                .map_or((None, 0), |(c, r)| (Some(c), r)),
            _ => (self.checkers.get(policy).cloned(), 0),
        };
        let label = policy.label();
        let svc_rv = svc.resource_version().unwrap_or_default();
        // Take what the last judgement left. If the Service is forgotten
        // meanwhile, its row goes, and what this judgement learns is
        // dropped instead of outliving the Service.
        // A shadow judges off the reconcile, perhaps after its Service was
        // deleted and made again under its name: it reads only a row the
        // live judgement made for this very object, never resetting
        // another's.
        let take = |row: &mut crate::table::Row| row.verdicts.remove(&self.id).unwrap_or_default();
        let previous = if self.is_shadow() {
            self.table.update_existing(svc, take).unwrap_or_default()
        } else {
            self.table.update(svc, take)
        };
        let now = Instant::now();

        let results: Vec<(SubjectKey, Basis, Subject, Verdict, Instant)> = stream::iter(subjects)
            .map(|subject| {
                let key = SubjectKey {
                    policy: policy.clone(),
                    pod_uid: subject.pod.uid().unwrap_or_default(),
                    port: subject.port.name.clone(),
                    family: subject.family,
                    address: subject.address,
                };
                let basis = Basis {
                    service_rv: svc_rv.clone(),
                    pod_rv: subject.pod.resource_version().unwrap_or_default(),
                    target: subject.port.target,
                    revision,
                };
                let cached = previous
                    .get(&key)
                    .filter(|r| r.basis == basis && now.duration_since(r.at) < self.freshness)
                    .map(|r| (r.verdict.clone(), r.at));
                let (checker, label) = (checker.clone(), &label);
                async move {
                    if let Some((verdict, at)) = cached {
                        return (key, basis, subject, verdict, at);
                    }
                    let verdict = match checker {
                        Some(c) => self.check_one(c.as_ref(), label, &subject).await,
                        // decide() only names policies of the file the
                        // checkers were built from, and objects the book
                        // holds a build of (one removed since abstains).
                        None => Verdict::abstain().because(format!("no checker for {label}")),
                    };
                    (key, basis, subject, verdict, Instant::now())
                }
            })
            .buffer_unordered(self.max_in_flight)
            .collect()
            .await;

        // Subjects gone from the Service are forgotten with it.
        let mut memory = Memory::with_capacity(results.len());
        let mut judged = Vec::with_capacity(results.len());
        let mut longest = Duration::ZERO;
        for (key, basis, subject, verdict, at) in results {
            let (decision, since) = bound_abstain(
                verdict.decision,
                previous.get(&key).and_then(|r| r.abstaining_since),
                now,
                self.abstain_limit,
            );
            if let Some(since) = since {
                longest = longest.max(now.saturating_duration_since(since));
            }
            if decision != verdict.decision && !self.is_shadow() {
                self.metrics.checks.count_abstain_expired();
                debug!(pod = %subject.pod.name_any(), port = %subject.port.name,
                    limit = ?self.abstain_limit, "abstained for longer than abstainLimit: excluded");
            }
            judged.push(Judged {
                port: subject.port,
                family: subject.family,
                pod: subject.pod,
                address: subject.address,
                decision,
            });
            memory.insert(
                key,
                Remembered {
                    verdict,
                    basis,
                    at,
                    abstaining_since: since,
                },
            );
        }
        // Under the table's lock, which forgetting takes: a Service
        // forgotten meanwhile gets neither its memory nor its metric series
        // back (callers drop the series after the row).
        self.table.update_existing(svc, |row| {
            row.verdicts.insert(self.id.clone(), memory);
            if !self.is_shadow() {
                let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
                self.metrics
                    .services
                    .set_abstain_longest(&ns, &name, longest);
            }
        });
        judged
    }

    async fn check_one(&self, checker: &dyn Checker, policy: &str, subject: &Subject) -> Verdict {
        // Only a check that may open a connection waits for a permit
        // (`Checker::probes`), in its namespace's turn.
        let _permit = if checker.probes() {
            let ns = subject.service.namespace().unwrap_or_default();
            Some(self.permits.acquire(&ns).await)
        } else {
            None
        };
        let started = Instant::now();
        let verdict = match tokio::time::timeout(self.timeout, checker.check(subject)).await {
            Ok(v) => v,
            Err(_) => Verdict::abstain()
                .because(format!("check did not finish within {:?}", self.timeout)),
        };
        if !self.is_shadow() {
            self.metrics
                .checks
                .observe(policy, verdict.decision, started.elapsed());
        }
        debug!(
            policy,
            pod = %subject.pod.name_any(),
            port = %subject.port.name,
            family = %subject.family,
            address = %subject.address,
            decision = ?verdict.decision,
            reason = verdict.reason.as_deref().unwrap_or(""),
            "membership verdict"
        );
        if verdict.decision == Decision::Abstain {
            debug!(pod = %subject.pod.name_any(), "abstained: keeping what was published");
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta};
    use portwise_checkers::BoxFuture;
    use portwise_core::membership::{Family, ResolvedPort};
    use tokio::sync::Notify;

    use super::*;

    /// Abstains, but only once released: a judgement held in flight.
    #[derive(Debug, Default)]
    struct Held {
        started: Notify,
        release: Notify,
    }

    impl Checker for Held {
        fn check<'a>(&'a self, _: &'a Subject) -> BoxFuture<'a, Verdict> {
            Box::pin(async move {
                self.started.notify_one();
                self.release.notified().await;
                Verdict::abstain().because("held")
            })
        }
    }

    fn subject(svc: &Arc<Service>) -> Subject {
        let meta = |name: &str| ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            ..Default::default()
        };
        Subject {
            service: svc.clone(),
            pod: Arc::new(Pod {
                metadata: meta("a"),
                ..Default::default()
            }),
            port: ResolvedPort {
                name: "http".into(),
                port: 80,
                protocol: "TCP".into(),
                target: 8080,
            },
            family: Family::V4,
            address: IpAddr::V4(Ipv4Addr::new(10, 244, 0, 1)),
        }
    }

    fn service() -> Arc<Service> {
        Arc::new(Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("uid-web".into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn judge(checker: Arc<dyn Checker>, metrics: Metrics) -> Judge {
        Judge::new(
            Judge::single(checker),
            4,
            Duration::from_secs(30),
            Duration::from_secs(30),
            Duration::from_secs(300),
            metrics,
            Arc::default(),
        )
    }

    /// A judgement of Service `web`'s one subject, started and held.
    fn judging() -> (
        Arc<Held>,
        Metrics,
        Arc<Judge>,
        tokio::task::JoinHandle<Vec<Judged>>,
    ) {
        let held = Arc::new(Held::default());
        let metrics = Metrics::new();
        let judge = Arc::new(judge(held.clone(), metrics.clone()));
        let svc = service();
        let running = tokio::spawn({
            let judge = judge.clone();
            async move {
                judge
                    .judge(&svc, vec![subject(&svc)], &Policy::Default)
                    .await
            }
        });
        (held, metrics, judge, running)
    }

    /// Issue 24: a Service deleted while its judgement is in flight leaves
    /// nothing behind, neither verdicts and abstain runs nor the abstain
    /// gauge, once the judgement ends.
    #[tokio::test]
    async fn a_service_forgotten_mid_judgement_leaves_nothing_behind() {
        let (held, metrics, judge, running) = judging();
        held.started.notified().await;
        judge.table.forget(&service());
        metrics.forget_service("shop", "web");
        held.release.notify_one();
        let judged = running.await.unwrap();
        assert_eq!(judged.len(), 1, "the judgement itself still answers");
        assert_eq!(judge.table.len(), 0, "the forgotten Service came back");
        let text = metrics.encode();
        assert!(
            !text.contains("service=\"web\""),
            "a series of the forgotten Service came back:\n{text}"
        );
    }

    /// Issue 45: a check that opens no connection does not wait for a
    /// permit, so another Service's probes that never answer (holding every
    /// permit) do not hold back its `podReady`. Fails when every check
    /// takes a permit.
    #[tokio::test]
    async fn checks_without_a_probe_take_no_permit() {
        let permits = FairPermits::new(1);
        let held = Arc::new(Held::default());
        let probing =
            Arc::new(judge(held.clone(), Metrics::new()).sharing_permits(permits.clone()));
        let svc = service();
        let stuck = tokio::spawn({
            let (probing, svc) = (probing.clone(), svc.clone());
            async move {
                probing
                    .judge(&svc, vec![subject(&svc)], &Policy::Default)
                    .await
            }
        });
        held.started.notified().await;
        assert_eq!(permits.available(), 0, "the probe holds the permit");
        let ready = judge(
            Arc::new(portwise_checkers::builtin::PodReady),
            Metrics::new(),
        )
        .sharing_permits(permits.clone());
        let judged = tokio::time::timeout(
            Duration::from_secs(5),
            ready.judge(&svc, vec![subject(&svc)], &Policy::Default),
        )
        .await
        .expect("podReady waited behind a probe's permit");
        assert_eq!(judged.len(), 1);
        held.release.notify_one();
        stuck.await.unwrap();
    }

    /// The control: without the deletion, the same judgement is remembered
    /// (its abstain run and its gauge), so the test above can fail.
    #[tokio::test]
    async fn a_judgement_is_remembered_with_its_abstain_gauge() {
        let (held, metrics, judge, running) = judging();
        held.started.notified().await;
        held.release.notify_one();
        running.await.unwrap();
        assert_eq!(judge.table.len(), 1);
        assert!(metrics.encode().contains("service=\"web\""));
    }
}
