//! The process-wide series: counters of what happened (checks, writes,
//! cleanups, collisions, module loads, reconcile errors), latencies, and
//! the cache and leadership gauges.

use std::time::Duration;

use portwise_core::membership::Decision;

use super::{
    guest::GuestFailure,
    labels::{
        CleanupKind, ColdStartStage, DecisionLabels, ErrorLabels, KindLabels, ModuleLoad,
        ModuleLoadLabels, PhaseLabels, ReconcilePhase, StageLabels, WriteKind, decision_label,
        label,
    },
    registry::Metrics,
};

impl Metrics {
    /// One abstain counted as exclude because it outlasted `abstainLimit`.
    pub fn count_abstain_expired(&self) {
        self.abstains_expired.inc();
    }

    /// Counts one top-level membership check and records how long it took.
    /// Counts one top-level check of `policy` (`membership`,
    /// `policies.NAME`) and its duration.
    pub fn observe_check(&self, policy: &str, decision: Decision, duration: Duration) {
        let labels = DecisionLabels {
            decision: decision_label(decision),
            policy: label(policy),
        };
        self.checks.get_or_create(&labels).inc();
        self.check_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    /// Counts one native leftover deleted by the migration cleanup.
    pub fn count_native_cleanup_deletion(&self, kind: CleanupKind) {
        self.native_cleanup_deletions
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Counts one EndpointSlice name collision.
    pub fn count_name_collision(&self) {
        self.name_collisions.inc();
    }

    /// Makes `portwise_guest_failures` report what `source` says at every
    /// scrape (`module` is the file name in the modules directory); replaces
    /// any earlier source.
    pub fn read_guest_failures(
        &self,
        source: impl Fn() -> Vec<(String, GuestFailure, u64)> + Send + Sync + 'static,
    ) {
        self.guest_failures.read_from(Box::new(source));
    }

    /// Counts one module load.
    pub fn count_module_load(&self, module: &str, result: ModuleLoad) {
        self.module_loads
            .get_or_create(&ModuleLoadLabels {
                module: label(module),
                result: result.as_str(),
            })
            .inc();
    }

    /// Counts one failed reconcile; `kind` is a short, bounded name of the
    /// error variant (e.g. `apply`, `collision`, `kube`), never a message.
    pub fn count_reconcile_error(&self, kind: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels { kind: label(kind) })
            .inc();
    }

    /// Records how long one reconcile took (successful or not).
    pub fn observe_reconcile(&self, duration: Duration) {
        self.reconcile_duration.observe(duration.as_secs_f64());
    }

    /// Records the time one reconcile spent in `phase`.
    pub fn observe_reconcile_phase(&self, phase: ReconcilePhase, duration: Duration) {
        self.reconcile_phase_duration
            .get_or_create(&PhaseLabels {
                phase: phase.as_str(),
            })
            .observe(duration.as_secs_f64());
    }

    /// Records that the cold start reached `stage`, `after` the
    /// controller's start.
    pub fn set_cold_start(&self, stage: ColdStartStage, after: Duration) {
        self.cold_start
            .get_or_create(&StageLabels {
                stage: stage.as_str(),
            })
            .set(after.as_secs_f64());
    }

    /// Counts one write issued to the apiserver.
    pub fn count_write(&self, kind: WriteKind) {
        self.writes
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Makes `portwise_cache_objects` report what `source` says (the
    /// informer caches' sizes) at every scrape.
    pub fn read_cache_sizes(
        &self,
        source: impl Fn() -> Vec<(&'static str, usize)> + Send + Sync + 'static,
    ) {
        self.cache_objects.read_from(Box::new(source));
    }

    /// Sets whether this replica currently leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }
}
