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
    membership::{Decision, Family, Subject, Verdict},
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
}

impl Judge {
    pub fn new(
        checker: Arc<dyn Checker>,
        max_concurrent: usize,
        timeout: Duration,
        resync: Duration,
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
        }
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
        for (key, subject, verdict, at) in results {
            fresh.insert(key, (verdict.clone(), at));
            judged.push(Judged {
                port: subject.port,
                family: subject.family,
                pod: subject.pod,
                address: subject.address,
                decision: verdict.decision,
            });
        }
        self.cache.lock().unwrap().insert(svc_uid, fresh);
        judged
    }

    /// Forgets a deleted Service's verdicts.
    pub fn forget(&self, svc_uid: &str) {
        self.cache.lock().unwrap().remove(svc_uid);
    }

    async fn check_one(&self, subject: &Subject) -> Verdict {
        let _permit = self.permits.acquire().await.expect("semaphore closed");
        let started = Instant::now();
        let verdict = match tokio::time::timeout(self.timeout, self.checker.check(subject)).await {
            Ok(v) => v,
            Err(_) => Verdict::abstain()
                .because(format!("check did not finish within {:?}", self.timeout)),
        };
        self.metrics
            .observe_check(verdict.decision, started.elapsed());
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
