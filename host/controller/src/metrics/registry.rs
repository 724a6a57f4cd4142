//! The registry: [`Metrics`], every family registered under `portwise_`,
//! and the exposition.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, atomic::AtomicU64},
};

use prometheus_client::{
    encoding::text::encode,
    metrics::{
        counter::Counter,
        family::Family as MetricFamily,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

use super::{
    caches::CacheSizes,
    guest::GuestFailures,
    labels::{
        DecisionLabels, ErrorLabels, KindLabels, ModuleLoadLabels, NotJudgedLabels, PhaseLabels,
        PublishedLabels, ReconcilePhase, ServiceLabels, ShadowLabels, ShadowPortLabels,
        StageLabels,
    },
    native::{OperationLabels, ResultLabels, SliceChange, SyncResult, Totals},
};

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type HistogramFamily<L> = MetricFamily<L, Histogram, fn() -> Histogram>;

/// Check latencies: probes time out around a second, guests in milliseconds;
/// 0.5 ms .. ~16 s.
fn check_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Endpoints added or removed per sync: upstream's buckets, 2 .. 32768.
fn per_sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(2.0, 2.0, 15))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// Reconcile latencies: dominated by apiserver round trips; 1 ms .. ~33 s.
fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Reconcile phases: planning takes microseconds, writes milliseconds;
/// 0.1 ms .. ~26 s.
fn phase_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 19))
}

/// The shadow series of each (namespace, service): its shadow's name and
/// ports, so they can be replaced or dropped as a whole.
pub(super) type ShadowIndex = HashMap<(String, String), (String, HashSet<String>)>;

/// (port, family) pairs with a live `endpoints_published` series, per
/// (namespace, service). Families cannot be filtered by a label subset, so
/// this index is what lets a whole Service's series be replaced or dropped.
pub(super) type PublishedIndex = HashMap<(String, String), HashSet<(String, String)>>;

/// All of portwise's metrics. Clone it freely; clones share the series.
#[derive(Clone)]
pub struct Metrics {
    pub(super) registry: Arc<Registry>,
    pub(super) endpoints_published: MetricFamily<PublishedLabels, Gauge>,
    pub(super) published_index: Arc<Mutex<PublishedIndex>>,
    pub(super) slices_managed: MetricFamily<ServiceLabels, Gauge>,
    pub(super) pods_not_judged: MetricFamily<NotJudgedLabels, Gauge>,
    pub(super) checks: MetricFamily<DecisionLabels, Counter>,
    pub(super) check_duration: HistogramFamily<DecisionLabels>,
    pub(super) native_cleanup_deletions: MetricFamily<KindLabels, Counter>,
    pub(super) name_collisions: Counter,
    pub(super) guest_failures: GuestFailures,
    pub(super) module_loads: MetricFamily<ModuleLoadLabels, Counter>,
    pub(super) reconcile_errors: MetricFamily<ErrorLabels, Counter>,
    pub(super) reconcile_duration: Histogram,
    pub(super) reconcile_phase_duration: HistogramFamily<PhaseLabels>,
    pub(super) cold_start: MetricFamily<StageLabels, Gauge<f64, AtomicU64>>,
    pub(super) writes: MetricFamily<KindLabels, Counter>,
    pub(super) leader: Gauge,
    pub(super) cache_objects: CacheSizes,
    pub(super) abstain_longest: MetricFamily<ServiceLabels, Gauge<f64, AtomicU64>>,
    pub(super) abstains_expired: Counter,
    pub(super) service_synced: MetricFamily<ServiceLabels, Gauge<f64, AtomicU64>>,
    pub(super) shadow_differences: MetricFamily<ShadowPortLabels, Gauge>,
    pub(super) shadow_verdicts: MetricFamily<ShadowLabels, Gauge>,
    pub(super) shadow_index: Arc<Mutex<ShadowIndex>>,
    // The native controller's figures (native.rs).
    pub(super) endpoints_added_per_sync: Histogram,
    pub(super) endpoints_removed_per_sync: Histogram,
    pub(super) endpoints_desired: Gauge,
    pub(super) num_endpoint_slices: Gauge,
    pub(super) desired_endpoint_slices: Gauge,
    pub(super) changes: MetricFamily<OperationLabels, Counter>,
    pub(super) syncs: MetricFamily<ResultLabels, Counter>,
    pub(super) native_totals: Arc<Mutex<Totals>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of metrics, all registered under the `portwise_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("portwise");

        let endpoints_published = MetricFamily::<PublishedLabels, Gauge>::default();
        registry.register(
            "endpoints_published",
            "Endpoints published per Service port and address family",
            endpoints_published.clone(),
        );
        let slices_managed = MetricFamily::<ServiceLabels, Gauge>::default();
        registry.register(
            "slices_managed",
            "EndpointSlices portwise manages per Service",
            slices_managed.clone(),
        );
        let checks = MetricFamily::<DecisionLabels, Counter>::default();
        registry.register("checks", "Membership checks by decision", checks.clone());
        let check_duration: HistogramFamily<DecisionLabels> =
            MetricFamily::new_with_constructor(check_histogram);
        registry.register_with_unit(
            "check_duration",
            "Duration of top-level membership checks by decision",
            Unit::Seconds,
            check_duration.clone(),
        );
        let native_cleanup_deletions = MetricFamily::<KindLabels, Counter>::default();
        registry.register(
            "native_cleanup_deletions",
            "Native leftovers deleted by the migration cleanup (endpoints|endpointslice)",
            native_cleanup_deletions.clone(),
        );
        let name_collisions = Counter::default();
        registry.register(
            "name_collisions",
            "EndpointSlice names already taken by another Service or manager",
            name_collisions.clone(),
        );
        let guest_failures = GuestFailures::default();
        registry.register_collector(Box::new(guest_failures.clone()));
        let module_loads = MetricFamily::<ModuleLoadLabels, Counter>::default();
        registry.register(
            "module_loads",
            "WebAssembly module loads by module and result (compiled|cached|failed)",
            module_loads.clone(),
        );
        let reconcile_errors = MetricFamily::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed Service reconciles by error kind",
            reconcile_errors.clone(),
        );
        let reconcile_duration = reconcile_histogram();
        registry.register_with_unit(
            "reconcile_duration",
            "Duration of Service reconciles",
            Unit::Seconds,
            reconcile_duration.clone(),
        );
        let reconcile_phase_duration: HistogramFamily<PhaseLabels> =
            MetricFamily::new_with_constructor(phase_histogram);
        registry.register_with_unit(
            "reconcile_phase_duration",
            "Time a reconcile spends per phase (trigger|queue|judge|plan|write|finish)",
            Unit::Seconds,
            reconcile_phase_duration.clone(),
        );
        for phase in ReconcilePhase::ALL {
            drop(reconcile_phase_duration.get_or_create(&PhaseLabels {
                phase: phase.as_str(),
            }));
        }
        // A gauge per stage, set once: how long this process took to get
        // there, which a log line alone would make every reader parse.
        let cold_start = MetricFamily::<StageLabels, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "cold_start",
            "Time from the controller's start to each stage of its cold start (synced: every cache's first list; reconciled: every Service the synced caches held reconciled once); absent until reached",
            Unit::Seconds,
            cold_start.clone(),
        );
        let writes = MetricFamily::<KindLabels, Counter>::default();
        registry.register(
            "writes",
            "Writes issued to the apiserver by kind (apply|delete)",
            writes.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease (and may write), else 0",
            leader.clone(),
        );

        let cache_objects = CacheSizes::default();
        registry.register_collector(Box::new(cache_objects.clone()));
        let pods_not_judged = MetricFamily::<NotJudgedLabels, Gauge>::default();
        registry.register(
            "pods_not_judged",
            "Pods of a Service's group that no port can include, by reason (terminal|node-gone|no-address)",
            pods_not_judged.clone(),
        );
        let abstain_longest = MetricFamily::<ServiceLabels, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "abstain_longest",
            "How long the longest unbroken abstain of a Service's (pod, port, family) has lasted; past abstainLimit it counts as exclude",
            Unit::Seconds,
            abstain_longest.clone(),
        );
        let service_synced = MetricFamily::<ServiceLabels, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "service_synced_timestamp",
            "Unix time of the Service's last complete sync (judged, planned, written); the leader syncs every served Service at least once per resyncPeriod",
            Unit::Seconds,
            service_synced.clone(),
        );
        let abstains_expired = Counter::default();
        registry.register(
            "abstains_expired",
            "Checks whose abstain had lasted longer than abstainLimit and so counted as exclude",
            abstains_expired.clone(),
        );

        let shadow_differences = MetricFamily::<ShadowPortLabels, Gauge>::default();
        registry.register(
            "shadow_differences",
            "Pods whose shadow verdict differs from the live one, per Service port (nothing of the shadow is published)",
            shadow_differences.clone(),
        );
        let shadow_verdicts = MetricFamily::<ShadowLabels, Gauge>::default();
        registry.register(
            "shadow_verdicts",
            "Verdicts the shadow was compared on at the Service's last reconcile",
            shadow_verdicts.clone(),
        );

        // The native controller's figures, under its names (native.rs).
        let endpoints_added_per_sync = per_sync_histogram();
        registry.register(
            "endpoints_added_per_sync",
            "Number of endpoints added on each Service sync",
            endpoints_added_per_sync.clone(),
        );
        let endpoints_removed_per_sync = per_sync_histogram();
        registry.register(
            "endpoints_removed_per_sync",
            "Number of endpoints removed on each Service sync",
            endpoints_removed_per_sync.clone(),
        );
        let endpoints_desired = Gauge::default();
        registry.register(
            "endpoints_desired",
            "Number of endpoints desired",
            endpoints_desired.clone(),
        );
        let num_endpoint_slices = Gauge::default();
        registry.register(
            "num_endpoint_slices",
            "Number of EndpointSlices",
            num_endpoint_slices.clone(),
        );
        let desired_endpoint_slices = Gauge::default();
        registry.register(
            "desired_endpoint_slices",
            "Number of EndpointSlices that would exist with perfect endpoint allocation",
            desired_endpoint_slices.clone(),
        );
        let changes = MetricFamily::<OperationLabels, Counter>::default();
        registry.register(
            "changes",
            "Number of EndpointSlice changes (create|update|delete)",
            changes.clone(),
        );
        let syncs = MetricFamily::<ResultLabels, Counter>::default();
        registry.register(
            "syncs",
            "Number of EndpointSlice syncs (success|error)",
            syncs.clone(),
        );
        // Every label value from the start, so 0 reads as 0, not absent.
        for change in SliceChange::ALL {
            drop(changes.get_or_create(&OperationLabels {
                operation: change.as_str(),
            }));
        }
        for result in SyncResult::ALL {
            drop(syncs.get_or_create(&ResultLabels {
                result: result.as_str(),
            }));
        }
        let build_info = MetricFamily::<BuildLabels, Gauge>::default();
        registry.register(
            "build_info",
            "Always 1; the version of the running portwise as a label",
            build_info.clone(),
        );
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);

        Self {
            endpoints_added_per_sync,
            endpoints_removed_per_sync,
            endpoints_desired,
            num_endpoint_slices,
            desired_endpoint_slices,
            changes,
            syncs,
            native_totals: Arc::default(),
            shadow_differences,
            shadow_verdicts,
            shadow_index: Arc::default(),
            abstain_longest,
            abstains_expired,
            service_synced,
            registry: Arc::new(registry),
            endpoints_published,
            published_index: Arc::default(),
            slices_managed,
            pods_not_judged,
            checks,
            check_duration,
            native_cleanup_deletions,
            name_collisions,
            guest_failures,
            module_loads,
            reconcile_errors,
            reconcile_duration,
            reconcile_phase_duration,
            cold_start,
            writes,
            leader,
            cache_objects,
        }
    }

    /// The OpenMetrics text exposition of every series (see [`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would be a bug
        // in a label value, and a partial scrape is still better than none.
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}
