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
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use tokio::sync::Semaphore;
use tracing::debug;

use portwise_checkers::Checker;
use portwise_core::{
    membership::{Decision, Family, Subject, Verdict, algebra::bound_abstain},
    plan::Judged,
};

use crate::metrics::Metrics;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct CheckKey {
    service_rv: String,
    pod_uid: String,
    pod_rv: String,
    port: String,
    target: u16,
    family: Family,
    address: IpAddr,
}

/// One Service's verdicts and when each was reached.
type Verdicts = HashMap<CheckKey, (Verdict, Instant)>;

/// What an abstain run is kept for: the pod address under one port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AbstainKey {
    pod_uid: String,
    port: String,
    family: Family,
    address: IpAddr,
}

/// One Service's unbroken abstain runs, by when each began.
type Abstains = HashMap<AbstainKey, Instant>;

/// Judges subjects with the configured checker.
pub struct Judge {
    checker: Arc<dyn Checker>,
    permits: Arc<Semaphore>,
    max_in_flight: usize,
    timeout: Duration,
    freshness: Duration,
    metrics: Metrics,
    /// Per Service UID: the verdicts of its last reconcile.
    cache: Mutex<HashMap<String, Verdicts>>,
    /// `abstainLimit`.
    abstain_limit: Duration,
    /// Per Service UID: its subjects that have abstained since when.
    abstains: Mutex<HashMap<String, Abstains>>,
    /// A shadow's judge: its checks are kept out of the live metrics.
    shadow: bool,
}

impl Judge {
    pub fn new(
        checker: Arc<dyn Checker>,
        max_concurrent: usize,
        timeout: Duration,
        resync: Duration,
        abstain_limit: Duration,
        metrics: Metrics,
    ) -> Self {
        Self {
            checker,
            permits: Arc::new(Semaphore::new(max_concurrent.max(1))),
            max_in_flight: max_concurrent.max(1),
            timeout,
            // Slightly less than the resync period, so the periodic reconcile
            // always finds the previous results stale and probes again.
            freshness: resync.mul_f32(0.9),
            metrics,
            cache: Mutex::default(),
            abstain_limit,
            abstains: Mutex::default(),
            shadow: false,
        }
    }

    /// Marks this judge as a shadow's (see `crate::shadow`): the live
    /// metrics (checks, abstain runs) do not count its work.
    pub fn as_shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// Judges every subject, reusing fresh verdicts.
    pub async fn judge(&self, svc: &Service, subjects: Vec<Subject>) -> Vec<Judged> {
        let svc_uid = svc.uid().unwrap_or_default();
        let svc_rv = svc.resource_version().unwrap_or_default();
        let previous = self
            .cache
            .lock()
            .unwrap()
            .remove(&svc_uid)
            .unwrap_or_default();
        let now = Instant::now();

        let results: Vec<(CheckKey, Subject, Verdict, Instant)> = stream::iter(subjects)
            .map(|subject| {
                let key = CheckKey {
                    service_rv: svc_rv.clone(),
                    pod_uid: subject.pod.uid().unwrap_or_default(),
                    pod_rv: subject.pod.resource_version().unwrap_or_default(),
                    port: subject.port.name.clone(),
                    target: subject.port.target,
                    family: subject.family,
                    address: subject.address,
                };
                let cached = previous
                    .get(&key)
                    .filter(|(_, at)| now.duration_since(*at) < self.freshness)
                    .cloned();
                async move {
                    if let Some((verdict, at)) = cached {
                        return (key, subject, verdict, at);
                    }
                    let verdict = self.check_one(&subject).await;
                    (key, subject, verdict, Instant::now())
                }
            })
            .buffer_unordered(self.max_in_flight)
            .collect()
            .await;

        let mut fresh = HashMap::with_capacity(results.len());
        let mut judged = Vec::with_capacity(results.len());
        let before = self
            .abstains
            .lock()
            .unwrap()
            .remove(&svc_uid)
            .unwrap_or_default();
        // Subjects gone from the Service end their runs with it.
        let mut abstains = Abstains::new();
        let mut longest = Duration::ZERO;
        for (key, subject, verdict, at) in results {
            let run = AbstainKey {
                pod_uid: key.pod_uid.clone(),
                port: key.port.clone(),
                family: key.family,
                address: key.address,
            };
            let (decision, since) = bound_abstain(
                verdict.decision,
                before.get(&run).copied(),
                now,
                self.abstain_limit,
            );
            if let Some(since) = since {
                longest = longest.max(now.saturating_duration_since(since));
                abstains.insert(run, since);
            }
            if decision != verdict.decision && !self.shadow {
                self.metrics.count_abstain_expired();
                debug!(pod = %subject.pod.name_any(), port = %subject.port.name,
                    limit = ?self.abstain_limit, "abstained for longer than abstainLimit: excluded");
            }
            fresh.insert(key, (verdict, at));
            judged.push(Judged {
                port: subject.port,
                family: subject.family,
                pod: subject.pod,
                address: subject.address,
                decision,
            });
        }
        let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
        if !self.shadow {
            self.metrics.set_abstain_longest(&ns, &name, longest);
        }
        if !abstains.is_empty() {
            self.abstains
                .lock()
                .unwrap()
                .insert(svc_uid.clone(), abstains);
        }
        self.cache.lock().unwrap().insert(svc_uid, fresh);
        judged
    }

    /// Forgets a deleted Service's verdicts and abstain runs.
    pub fn forget(&self, svc_uid: &str) {
        self.cache.lock().unwrap().remove(svc_uid);
        self.abstains.lock().unwrap().remove(svc_uid);
    }

    async fn check_one(&self, subject: &Subject) -> Verdict {
        let _permit = self.permits.acquire().await.expect("semaphore closed");
        let started = Instant::now();
        let verdict = match tokio::time::timeout(self.timeout, self.checker.check(subject)).await {
            Ok(v) => v,
            Err(_) => Verdict::abstain()
                .because(format!("check did not finish within {:?}", self.timeout)),
        };
        if !self.shadow {
            self.metrics
                .observe_check(verdict.decision, started.elapsed());
        }
        debug!(
            pod = %subject.pod.name_any(),
            port = %subject.port.name,
            family = ?subject.family,
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
