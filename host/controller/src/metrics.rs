//! Prometheus metrics: what an operator needs to tell whether portwise is
//! publishing the truth, and where it hurts when it is not.
//!
//! The set mirrors that of the Go library portwise replaces
//! (redpanda-data/common-go `portmapper`): endpoints published per Service
//! port and family, slices managed, checks by decision, check latency,
//! native cleanup deletions, name collisions. It adds what a WebAssembly host and a
//! leader-elected controller need (guest failures, module loads, reconcile
//! errors and durations, writes, leadership).
//!
//! [`Metrics`] is a cheap-to-clone handle; every clone updates the same
//! series. The per-Service gauges are *levels*, not events, so they must
//! disappear with the Service: [`Metrics::set_service`] replaces all series of
//! one Service at once (a renamed or removed port does not linger) and
//! [`Metrics::forget_service`] drops them when the Service is deleted or no
//! longer managed. Counters are never reset; Prometheus handles restarts.
//!
//! Guest failures are counted by the WebAssembly runtime itself (plain
//! atomics, so that crate needs no metrics library and this one no
//! wasmtime): `portwise_guest_failures` is a [`Collector`] that reads them
//! through [`Metrics::read_guest_failures`] at every scrape.
//!
//! The exposition is OpenMetrics text (`Metrics::encode`), which Prometheus
//! scrapes natively. Counter names gain their `_total` suffix and histograms
//! their `_seconds` unit from the encoder, so the names registered below are
//! the stems.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError, RwLock, atomic::AtomicU64},
    time::Duration,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, text::encode},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        family::Family as MetricFamily,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

use portwise_core::membership::{Decision, Family};

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Which native leftover a migration cleanup deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CleanupKind {
    /// The legacy `v1/Endpoints` object of the Service.
    Endpoints,
    /// An EndpointSlice managed by `endpointslice-controller.k8s.io`.
    EndpointSlice,
}

impl CleanupKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CleanupKind::Endpoints => "endpoints",
            CleanupKind::EndpointSlice => "endpointslice",
        }
    }
}

/// Why a WebAssembly guest's answer was replaced by `abstain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GuestFailure {
    /// The module could not be loaded or instantiated.
    Load,
    /// The guest trapped.
    Trap,
    /// The guest ran past its deadline (fuel or epoch).
    Deadline,
    /// The guest exceeded its memory limit.
    Memory,
    /// The guest returned something the host cannot use.
    Invalid,
    /// The guest asked for something it may not have (another address, ...).
    Denied,
}

impl GuestFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            GuestFailure::Load => "load",
            GuestFailure::Trap => "trap",
            GuestFailure::Deadline => "deadline",
            GuestFailure::Memory => "memory",
            GuestFailure::Invalid => "invalid",
            GuestFailure::Denied => "denied",
        }
    }
}

/// Reads guest failure counts at scrape time: `(module, kind, count)` rows,
/// each count since the process started. Rows of the same module and kind
/// are added up (the runtime has more kinds than the metric has labels).
pub type GuestFailureSource = Box<dyn Fn() -> Vec<(String, GuestFailure, u64)> + Send + Sync>;

const GUEST_FAILURES_HELP: &str = "WebAssembly guest answers replaced by abstain, by module and kind \
     (load|trap|deadline|memory|invalid|denied)";

/// `portwise_guest_failures`: a counter family whose values live in the
/// WebAssembly runtime, read from its [`GuestFailureSource`] on every scrape
/// (no copy to keep in step). Without a source the family is declared and
/// empty, as a registered family with no series would be.
#[derive(Clone, Default)]
struct GuestFailures {
    source: Arc<RwLock<Option<GuestFailureSource>>>,
}

impl std::fmt::Debug for GuestFailures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestFailures").finish_non_exhaustive()
    }
}

impl Collector for GuestFailures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = match &*self.source.read().unwrap_or_else(PoisonError::into_inner) {
            Some(source) => source(),
            None => Vec::new(),
        };
        let mut totals = BTreeMap::<(String, &'static str), u64>::new();
        for (module, kind, count) in rows {
            *totals.entry((label(&module), kind.as_str())).or_default() += count;
        }
        // `Registry::register` appends the full stop to help texts; a
        // collector writes its own.
        let help = format!("{GUEST_FAILURES_HELP}.");
        let mut family =
            encoder.encode_descriptor("guest_failures", &help, None, MetricType::Counter)?;
        for ((module, kind), count) in totals {
            let labels = GuestFailureLabels { module, kind };
            ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// How loading a module from the modules directory went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModuleLoad {
    /// Compiled from the `.wasm` file.
    Compiled,
    /// Taken from the compiled-code cache (no compilation).
    Cached,
    /// Failed; the previous version (if any) stays in service.
    Failed,
}

impl ModuleLoad {
    pub fn as_str(self) -> &'static str {
        match self {
            ModuleLoad::Compiled => "compiled",
            ModuleLoad::Cached => "cached",
            ModuleLoad::Failed => "failed",
        }
    }
}

/// A write portwise issued to the apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteKind {
    /// A server-side apply (create or update).
    Apply,
    /// A delete.
    Delete,
}

impl WriteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteKind::Apply => "apply",
            WriteKind::Delete => "delete",
        }
    }
}

/// The label value for an address family, spelled as in `spec.ipFamilies`.
pub fn family_label(family: Family) -> &'static str {
    match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// The label value for a decision.
pub fn decision_label(decision: Decision) -> &'static str {
    match decision {
        Decision::Include => "include",
        Decision::Exclude => "exclude",
        Decision::Abstain => "abstain",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    namespace: String,
    service: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowLabels {
    namespace: String,
    service: String,
    shadow: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowPortLabels {
    namespace: String,
    service: String,
    shadow: String,
    port: String,
}

/// The shadow series of each (namespace, service): its shadow's name and
/// ports, so they can be replaced or dropped as a whole.
type ShadowIndex = HashMap<(String, String), (String, HashSet<String>)>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PublishedLabels {
    namespace: String,
    service: String,
    port: String,
    family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GuestFailureLabels {
    module: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModuleLoadLabels {
    module: String,
    result: &'static str,
}

type HistogramFamily<L> = MetricFamily<L, Histogram, fn() -> Histogram>;

/// Check latencies: probes time out around a second, guests in milliseconds;
/// 0.5 ms .. ~16 s.
fn check_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Reconcile latencies: dominated by apiserver round trips; 1 ms .. ~33 s.
fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// (port, family) pairs with a live `endpoints_published` series, per
/// (namespace, service). Families cannot be filtered by a label subset, so
/// this index is what lets a whole Service's series be replaced or dropped.
type PublishedIndex = HashMap<(String, String), HashSet<(String, String)>>;

/// All of portwise's metrics. Clone it freely; clones share the series.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    endpoints_published: MetricFamily<PublishedLabels, Gauge>,
    published_index: Arc<Mutex<PublishedIndex>>,
    slices_managed: MetricFamily<ServiceLabels, Gauge>,
    checks: MetricFamily<DecisionLabels, Counter>,
    check_duration: HistogramFamily<DecisionLabels>,
    native_cleanup_deletions: MetricFamily<KindLabels, Counter>,
    name_collisions: Counter,
    guest_failures: GuestFailures,
    module_loads: MetricFamily<ModuleLoadLabels, Counter>,
    reconcile_errors: MetricFamily<ErrorLabels, Counter>,
    reconcile_duration: Histogram,
    writes: MetricFamily<KindLabels, Counter>,
    leader: Gauge,
    cache_objects: MetricFamily<KindLabels, Gauge>,
    abstain_longest: MetricFamily<ServiceLabels, Gauge<f64, AtomicU64>>,
    abstains_expired: Counter,
    shadow_differences: MetricFamily<ShadowPortLabels, Gauge>,
    shadow_verdicts: MetricFamily<ShadowLabels, Gauge>,
    shadow_index: Arc<Mutex<ShadowIndex>>,
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

        let cache_objects = MetricFamily::<KindLabels, Gauge>::default();
        registry.register(
            "cache_objects",
            "Objects held in the informer caches by kind (services|pods|endpointslices|nodes)",
            cache_objects.clone(),
        );
        let abstain_longest = MetricFamily::<ServiceLabels, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "abstain_longest",
            "How long the longest unbroken abstain of a Service's (pod, port, family) has lasted; past abstainLimit it counts as exclude",
            Unit::Seconds,
            abstain_longest.clone(),
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

        Self {
            shadow_differences,
            shadow_verdicts,
            shadow_index: Arc::default(),
            abstain_longest,
            abstains_expired,
            registry: Arc::new(registry),
            endpoints_published,
            published_index: Arc::default(),
            slices_managed,
            checks,
            check_duration,
            native_cleanup_deletions,
            name_collisions,
            guest_failures,
            module_loads,
            reconcile_errors,
            reconcile_duration,
            writes,
            leader,
            cache_objects,
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, PublishedIndex> {
        // The index only mirrors series; a panic elsewhere cannot leave it
        // inconsistent in a way worse than a stale series.
        self.published_index
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the number of endpoints published for one Service port (its name,
    /// or its number when unnamed) and address family.
    pub fn set_published(
        &self,
        namespace: &str,
        service: &str,
        port: &str,
        family: Family,
        endpoints: usize,
    ) {
        let mut index = self.index();
        let family = family_label(family).to_owned();
        index
            .entry((label(namespace), label(service)))
            .or_default()
            .insert((label(port), family.clone()));
        self.endpoints_published
            .get_or_create(&PublishedLabels {
                namespace: label(namespace),
                service: label(service),
                port: label(port),
                family,
            })
            .set(gauge_value(endpoints));
    }

    /// Sets the number of EndpointSlices portwise manages for one Service.
    pub fn set_slices_managed(&self, namespace: &str, service: &str, slices: usize) {
        self.slices_managed
            .get_or_create(&ServiceLabels {
                namespace: label(namespace),
                service: label(service),
            })
            .set(gauge_value(slices));
    }

    /// Replaces every per-Service series of one Service. `published` maps
    /// (Service port name or number, `IPv4`/`IPv6`) to the endpoints
    /// published, for every port and family the Service has now (as
    /// `plan::Summary::endpoints`); series of pairs not listed are dropped.
    pub fn set_service(
        &self,
        namespace: &str,
        service: &str,
        published: &BTreeMap<(String, String), usize>,
        slices: usize,
    ) {
        let mut index = self.index();
        let key = (label(namespace), label(service));
        let mut now = HashSet::new();
        for ((port, family), endpoints) in published {
            let labels = PublishedLabels {
                namespace: label(namespace),
                service: label(service),
                port: label(port),
                family: label(family),
            };
            self.endpoints_published
                .get_or_create(&labels)
                .set(gauge_value(*endpoints));
            now.insert((labels.port, labels.family));
        }
        if let Some(before) = index.get(&key) {
            for (port, family) in before.difference(&now) {
                self.endpoints_published.remove(&PublishedLabels {
                    namespace: label(namespace),
                    service: label(service),
                    port: port.clone(),
                    family: family.clone(),
                });
            }
        }
        if now.is_empty() {
            index.remove(&key);
        } else {
            index.insert(key, now);
        }
        drop(index);
        self.set_slices_managed(namespace, service, slices);
    }

    /// Drops every per-Service series of a Service that was deleted or is no
    /// longer managed, so dashboards do not show ghosts.
    pub fn forget_service(&self, namespace: &str, service: &str) {
        let mut index = self.index();
        if let Some(ports) = index.remove(&(label(namespace), label(service))) {
            for (port, family) in ports {
                self.endpoints_published.remove(&PublishedLabels {
                    namespace: label(namespace),
                    service: label(service),
                    port,
                    family,
                });
            }
        }
        let labels = ServiceLabels {
            namespace: label(namespace),
            service: label(service),
        };
        self.slices_managed.remove(&labels);
        self.abstain_longest.remove(&labels);
        drop(index);
        self.forget_shadow(namespace, service);
    }

    /// Replaces a Service's shadow series: differing pods per port (every
    /// port listed, zeros included) and the verdicts compared.
    pub fn set_shadow(
        &self,
        namespace: &str,
        service: &str,
        shadow: &str,
        per_port: &BTreeMap<String, usize>,
        verdicts: usize,
    ) {
        let mut index = self
            .shadow_index
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (label(namespace), label(service));
        let ports: HashSet<String> = per_port.keys().map(|p| label(p)).collect();
        if let Some((old_shadow, old_ports)) = index.get(&key) {
            for port in old_ports {
                if old_shadow != shadow || !ports.contains(port) {
                    self.shadow_differences.remove(&ShadowPortLabels {
                        namespace: key.0.clone(),
                        service: key.1.clone(),
                        shadow: old_shadow.clone(),
                        port: port.clone(),
                    });
                }
            }
            if old_shadow != shadow {
                self.shadow_verdicts.remove(&ShadowLabels {
                    namespace: key.0.clone(),
                    service: key.1.clone(),
                    shadow: old_shadow.clone(),
                });
            }
        }
        for (port, n) in per_port {
            self.shadow_differences
                .get_or_create(&ShadowPortLabels {
                    namespace: key.0.clone(),
                    service: key.1.clone(),
                    shadow: label(shadow),
                    port: label(port),
                })
                .set(gauge_value(*n));
        }
        self.shadow_verdicts
            .get_or_create(&ShadowLabels {
                namespace: key.0.clone(),
                service: key.1.clone(),
                shadow: label(shadow),
            })
            .set(gauge_value(verdicts));
        index.insert(key, (label(shadow), ports));
    }

    /// Drops a Service's shadow series (no shadow applies any more).
    pub fn forget_shadow(&self, namespace: &str, service: &str) {
        let mut index = self
            .shadow_index
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((shadow, ports)) = index.remove(&(label(namespace), label(service))) {
            for port in ports {
                self.shadow_differences.remove(&ShadowPortLabels {
                    namespace: label(namespace),
                    service: label(service),
                    shadow: shadow.clone(),
                    port,
                });
            }
            self.shadow_verdicts.remove(&ShadowLabels {
                namespace: label(namespace),
                service: label(service),
                shadow,
            });
        }
    }

    /// The longest ongoing abstain of a Service (zero when none).
    pub fn set_abstain_longest(&self, namespace: &str, service: &str, longest: Duration) {
        self.abstain_longest
            .get_or_create(&ServiceLabels {
                namespace: label(namespace),
                service: label(service),
            })
            .set(longest.as_secs_f64());
    }

    /// One abstain counted as exclude because it outlasted `abstainLimit`.
    pub fn count_abstain_expired(&self) {
        self.abstains_expired.inc();
    }

    /// Counts one top-level membership check and records how long it took.
    pub fn observe_check(&self, decision: Decision, duration: Duration) {
        let labels = DecisionLabels {
            decision: decision_label(decision),
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
        *self
            .guest_failures
            .source
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Box::new(source));
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

    /// Counts one write issued to the apiserver.
    pub fn count_write(&self, kind: WriteKind) {
        self.writes
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Sets how many objects of `kind` the informer caches hold.
    pub fn set_cache_objects(&self, kind: &'static str, objects: usize) {
        self.cache_objects
            .get_or_create(&KindLabels { kind })
            .set(gauge_value(objects));
    }

    /// Sets whether this replica currently leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
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

/// A label value escaped for the text exposition. prometheus-client 0.23
/// writes label values verbatim, and module file names (or a future error
/// kind) could hold a quote or a newline that would corrupt the whole scrape.
fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample line `name{labels} value` (labels exactly as
    /// encoded, in declaration order), or None when the series is absent.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(series)?;
            rest.strip_prefix(' ')?.parse().ok()
        })
    }

    #[test]
    fn every_family_is_declared_with_its_final_name() {
        let text = Metrics::new().encode();
        for (name, kind) in [
            ("portwise_endpoints_published", "gauge"),
            ("portwise_slices_managed", "gauge"),
            ("portwise_checks", "counter"),
            ("portwise_check_duration_seconds", "histogram"),
            ("portwise_native_cleanup_deletions", "counter"),
            ("portwise_name_collisions", "counter"),
            ("portwise_guest_failures", "counter"),
            ("portwise_module_loads", "counter"),
            ("portwise_reconcile_errors", "counter"),
            ("portwise_reconcile_duration_seconds", "histogram"),
            ("portwise_writes", "counter"),
            ("portwise_leader", "gauge"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} {kind} missing in\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"));
        // Unlabelled series exist from the start, so a scrape can tell 0 from absent.
        assert_eq!(sample(&text, "portwise_name_collisions_total"), Some(0.0));
        assert_eq!(sample(&text, "portwise_leader"), Some(0.0));
        assert_eq!(
            sample(&text, "portwise_reconcile_duration_seconds_count"),
            Some(0.0)
        );
    }

    #[test]
    fn published_endpoints_and_slices_are_gauges_per_service_port_family() {
        let m = Metrics::new();
        m.set_published("shop", "web", "http", Family::V4, 3);
        m.set_published("shop", "web", "http", Family::V6, 2);
        m.set_published("shop", "web", "http", Family::V4, 4);
        m.set_slices_managed("shop", "web", 2);
        let text = m.encode();
        assert_eq!(
            sample(
                &text,
                r#"portwise_endpoints_published{namespace="shop",service="web",port="http",family="IPv4"}"#
            ),
            Some(4.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"portwise_endpoints_published{namespace="shop",service="web",port="http",family="IPv6"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"portwise_slices_managed{namespace="shop",service="web"}"#
            ),
            Some(2.0)
        );
    }

    #[test]
    fn set_service_replaces_ports_and_forget_service_drops_everything() {
        let m = Metrics::new();
        let figures = |pairs: &[(&str, &str, usize)]| -> BTreeMap<(String, String), usize> {
            pairs
                .iter()
                .map(|(p, f, n)| ((p.to_string(), f.to_string()), *n))
                .collect()
        };
        m.set_service(
            "shop",
            "web",
            &figures(&[("http", "IPv4", 3), ("admin", "IPv4", 1)]),
            2,
        );
        m.set_service("shop", "api", &figures(&[("grpc", "IPv6", 5)]), 1);
        m.set_service("shop", "web", &figures(&[("http", "IPv4", 2)]), 1);
        let text = m.encode();
        let web_http = r#"portwise_endpoints_published{namespace="shop",service="web",port="http",family="IPv4"}"#;
        let web_admin = r#"portwise_endpoints_published{namespace="shop",service="web",port="admin",family="IPv4"}"#;
        let api_grpc = r#"portwise_endpoints_published{namespace="shop",service="api",port="grpc",family="IPv6"}"#;
        assert_eq!(sample(&text, web_http), Some(2.0));
        assert_eq!(
            sample(&text, web_admin),
            None,
            "removed port lingers:\n{text}"
        );
        assert_eq!(
            sample(
                &text,
                r#"portwise_slices_managed{namespace="shop",service="web"}"#
            ),
            Some(1.0)
        );

        m.forget_service("shop", "web");
        let text = m.encode();
        assert_eq!(sample(&text, web_http), None);
        assert_eq!(
            sample(
                &text,
                r#"portwise_slices_managed{namespace="shop",service="web"}"#
            ),
            None
        );
        assert_eq!(
            sample(&text, api_grpc),
            Some(5.0),
            "another Service was dropped"
        );
        assert_eq!(
            sample(
                &text,
                r#"portwise_slices_managed{namespace="shop",service="api"}"#
            ),
            Some(1.0)
        );

        // Forgetting twice, or an unknown Service, is harmless.
        m.forget_service("shop", "web");
        m.forget_service("nowhere", "nothing");
        // And a forgotten Service comes back cleanly.
        m.set_published("shop", "web", "http", Family::V4, 1);
        assert_eq!(sample(&m.encode(), web_http), Some(1.0));
    }

    #[test]
    fn checks_are_counted_by_decision_with_latency() {
        let m = Metrics::new();
        m.observe_check(Decision::Include, Duration::from_millis(2));
        m.observe_check(Decision::Include, Duration::from_millis(3));
        m.observe_check(Decision::Abstain, Duration::from_secs(2));
        let text = m.encode();
        assert_eq!(
            sample(&text, r#"portwise_checks_total{decision="include"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, r#"portwise_checks_total{decision="abstain"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"portwise_checks_total{decision="exclude"}"#),
            None
        );
        assert_eq!(
            sample(
                &text,
                r#"portwise_check_duration_seconds_count{decision="include"}"#
            ),
            Some(2.0)
        );
        let sum = sample(
            &text,
            r#"portwise_check_duration_seconds_sum{decision="include"}"#,
        )
        .unwrap();
        assert!((sum - 0.005).abs() < 1e-9, "sum {sum}");
        // 2 s lands above the 1.024 s bucket and within the 2.048 s one.
        assert_eq!(
            sample(
                &text,
                r#"portwise_check_duration_seconds_bucket{le="1.024",decision="abstain"}"#
            ),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"portwise_check_duration_seconds_bucket{le="2.048",decision="abstain"}"#
            ),
            Some(1.0)
        );
    }

    #[test]
    fn event_counters_carry_their_labels() {
        let m = Metrics::new();
        m.count_native_cleanup_deletion(CleanupKind::Endpoints);
        m.count_native_cleanup_deletion(CleanupKind::EndpointSlice);
        m.count_native_cleanup_deletion(CleanupKind::EndpointSlice);
        m.count_name_collision();
        m.read_guest_failures(|| {
            vec![
                ("admin-check.wasm".into(), GuestFailure::Deadline, 1),
                ("admin-check.wasm".into(), GuestFailure::Denied, 1),
            ]
        });
        m.count_module_load("admin-check.wasm", ModuleLoad::Cached);
        m.count_reconcile_error("apply");
        m.count_write(WriteKind::Apply);
        m.count_write(WriteKind::Apply);
        m.count_write(WriteKind::Delete);
        m.observe_reconcile(Duration::from_millis(20));
        m.set_leader(true);
        let text = m.encode();
        for (series, value) in [
            (
                r#"portwise_native_cleanup_deletions_total{kind="endpoints"}"#,
                1.0,
            ),
            (
                r#"portwise_native_cleanup_deletions_total{kind="endpointslice"}"#,
                2.0,
            ),
            ("portwise_name_collisions_total", 1.0),
            (
                r#"portwise_guest_failures_total{module="admin-check.wasm",kind="deadline"}"#,
                1.0,
            ),
            (
                r#"portwise_guest_failures_total{module="admin-check.wasm",kind="denied"}"#,
                1.0,
            ),
            (
                r#"portwise_module_loads_total{module="admin-check.wasm",result="cached"}"#,
                1.0,
            ),
            (r#"portwise_reconcile_errors_total{kind="apply"}"#, 1.0),
            (r#"portwise_writes_total{kind="apply"}"#, 2.0),
            (r#"portwise_writes_total{kind="delete"}"#, 1.0),
            ("portwise_reconcile_duration_seconds_count", 1.0),
            ("portwise_leader", 1.0),
        ] {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
    }

    #[test]
    fn guest_failures_are_read_at_scrape_time_and_summed_per_label() {
        let m = Metrics::new();
        let counted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let source = counted.clone();
        m.read_guest_failures(move || {
            let n = source.load(std::sync::atomic::Ordering::Relaxed);
            // Two runtime kinds that share the `load` label.
            vec![
                ("a\"b.wasm".into(), GuestFailure::Load, n),
                ("a\"b.wasm".into(), GuestFailure::Load, 1),
            ]
        });
        let series = r#"portwise_guest_failures_total{module="a\"b.wasm",kind="load"}"#;
        assert_eq!(sample(&m.encode(), series), Some(1.0));
        counted.store(2, std::sync::atomic::Ordering::Relaxed);
        let text = m.encode();
        assert_eq!(sample(&text, series), Some(3.0), "{text}");
        assert!(
            text.contains(
                "# HELP portwise_guest_failures WebAssembly guest answers replaced by abstain, \
                 by module and kind (load|trap|deadline|memory|invalid|denied).\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new();
        m.count_reconcile_error("a\"b\\c\nd");
        let text = m.encode();
        assert!(
            text.contains(r#"portwise_reconcile_errors_total{kind="a\"b\\c\nd"} 1"#),
            "{text}"
        );
    }
}
