//! Reconciles: how long they take, where the time goes, and why they fail.

use std::time::Duration;

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family as MetricFamily,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

use super::labels::{ErrorLabels, PhaseLabels, ReconcilePhase, label};

/// Reconcile latencies: dominated by apiserver round trips; 1 ms .. ~33 s.
fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Reconcile phases: planning takes microseconds, writes milliseconds;
/// 0.1 ms .. ~26 s.
fn phase_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 19))
}

/// Clones share the series.
#[derive(Clone, Debug)]
pub struct Reconciles {
    errors: MetricFamily<ErrorLabels, Counter>,
    duration: Histogram,
    phase_duration: MetricFamily<PhaseLabels, Histogram, fn() -> Histogram>,
}

impl Reconciles {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let reconciles = Reconciles {
            errors: MetricFamily::default(),
            duration: reconcile_histogram(),
            phase_duration: MetricFamily::new_with_constructor(phase_histogram),
        };
        registry.register(
            "reconcile_errors",
            "Failed Service reconciles by error kind",
            reconciles.errors.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Duration of Service reconciles",
            Unit::Seconds,
            reconciles.duration.clone(),
        );
        registry.register_with_unit(
            "reconcile_phase_duration",
            "Time a reconcile spends per phase (trigger|queue|judge|plan|write|finish)",
            Unit::Seconds,
            reconciles.phase_duration.clone(),
        );
        // Every phase from the start, so an empty one reads 0, not absent.
        for phase in ReconcilePhase::ALL {
            drop(reconciles.phase_duration.get_or_create(&PhaseLabels {
                phase: phase.as_str(),
            }));
        }
        reconciles
    }

    /// Counts one failed reconcile; `kind` is a short, bounded name of the
    /// error variant (e.g. `apply`, `migrate`, `kube`), never a message.
    pub fn count_error(&self, kind: &str) {
        self.errors
            .get_or_create(&ErrorLabels { kind: label(kind) })
            .inc();
    }

    /// Records how long one complete reconcile took.
    pub fn observe(&self, duration: Duration) {
        self.duration.observe(duration.as_secs_f64());
    }

    /// Records the time one reconcile spent in `phase`.
    pub fn observe_phase(&self, phase: ReconcilePhase, duration: Duration) {
        self.phase_duration
            .get_or_create(&PhaseLabels {
                phase: phase.as_str(),
            })
            .observe(duration.as_secs_f64());
    }
}
