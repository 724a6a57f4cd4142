//! The membership checks: how many ran, by policy and decision, how long
//! each took, and the abstains that outlasted `abstainLimit`.

use std::time::Duration;

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family as MetricFamily,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

use portwise_core::membership::Decision;

use super::labels::{DecisionLabels, decision_label, label};

/// Check latencies: probes time out around a second, guests in
/// milliseconds; 0.5 ms .. ~16 s.
fn check_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Clones share the series.
#[derive(Clone, Debug)]
pub struct Checks {
    checks: MetricFamily<DecisionLabels, Counter>,
    duration: MetricFamily<DecisionLabels, Histogram, fn() -> Histogram>,
    abstains_expired: Counter,
}

impl Checks {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let checks = Checks {
            checks: MetricFamily::default(),
            duration: MetricFamily::new_with_constructor(check_histogram),
            abstains_expired: Counter::default(),
        };
        registry.register(
            "checks",
            "Membership checks by decision",
            checks.checks.clone(),
        );
        registry.register_with_unit(
            "check_duration",
            "Duration of top-level membership checks by decision",
            Unit::Seconds,
            checks.duration.clone(),
        );
        registry.register(
            "abstains_expired",
            "Checks whose abstain had lasted longer than abstainLimit and so counted as exclude",
            checks.abstains_expired.clone(),
        );
        checks
    }

    /// Counts one top-level check of `policy` (`membership`,
    /// `policies.NAME`) and its duration.
    pub fn observe(&self, policy: &str, decision: Decision, duration: Duration) {
        let labels = DecisionLabels {
            decision: decision_label(decision),
            policy: label(policy),
        };
        self.checks.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    /// One abstain counted as exclude because it outlasted `abstainLimit`.
    pub fn count_abstain_expired(&self) {
        self.abstains_expired.inc();
    }
}
