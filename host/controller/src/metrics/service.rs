//! The per-Service series: levels, not events. They are kept as one entry
//! per Service and encoded at every scrape, so a Service's series are
//! replaced as a whole when it is reconciled (a renamed or removed port
//! does not linger) and go with one removal when it is forgotten: no
//! side index emulates "delete by Service" over label sets.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
    registry::{Registry, Unit},
};

use portwise_core::align::NotJudged;

use super::labels::{
    NamespaceLabels, NotJudgedLabels, PublishedLabels, ServiceLabels, ShadowLabels,
    ShadowPortLabels, gauge_value, label,
};

/// One Service's shadow figures at its last reconcile.
#[derive(Clone, Debug, Default)]
struct Shadow {
    /// `shadow.membership` or `shadow.expressions.NAME`.
    name: String,
    /// Differing pods per port, every port listed.
    per_port: BTreeMap<String, usize>,
    verdicts: usize,
}

/// Every level of one Service; `None` where nothing was set yet.
#[derive(Clone, Debug, Default)]
pub(super) struct Levels {
    /// Endpoints per (port, family).
    published: BTreeMap<(String, String), usize>,
    slices: Option<usize>,
    /// The slices its endpoints would need with perfect packing (the
    /// native `desired_endpoint_slices`).
    pub(super) desired_slices: usize,
    not_judged: Option<BTreeMap<NotJudged, usize>>,
    abstain_longest: Option<f64>,
    synced: Option<f64>,
    shadow: Option<Shadow>,
}

impl Levels {
    pub(super) fn endpoints(&self) -> usize {
        self.published.values().sum()
    }

    pub(super) fn slices(&self) -> usize {
        self.slices.unwrap_or(0)
    }
}

/// Levels by (namespace, service), label values escaped.
pub(super) type ByService = BTreeMap<(String, String), Levels>;

/// The default of [`ServiceLevels::limit`]: the Services of one namespace
/// whose series are exposed.
pub const DEFAULT_SERVICES_PER_NAMESPACE: usize = 500;

/// The (port, family) pairs of one Service whose `endpoints_published`
/// series are exposed (and ports whose `shadow_differences` are): far more
/// than any real Service has.
pub const MAX_PORT_SERIES: usize = 64;

/// The per-Service series: `endpoints_published`, `slices_managed`,
/// `pods_not_judged`, `abstain_longest_seconds`,
/// `service_synced_timestamp_seconds`, `shadow_differences`,
/// `shadow_verdicts`, and `service_series_omitted`. Clones share the
/// levels.
///
/// Their `namespace`, `service` and `port` labels are chosen by whoever
/// may create Services: one tenant's thousands of Services (or ports)
/// would make every scrape, and the Prometheus behind it, pay. So each
/// namespace exposes the series of at most `limit` Services (the first in
/// name order) and each Service of at most [`MAX_PORT_SERIES`] ports;
/// `service_series_omitted` counts, per namespace, the Services left out.
/// The native totals still count every Service: they are summed from the
/// levels, not from the series.
#[derive(Clone, Debug)]
pub struct ServiceLevels {
    levels: Arc<Mutex<ByService>>,
    limit: Arc<AtomicUsize>,
}

impl Default for ServiceLevels {
    fn default() -> Self {
        ServiceLevels {
            levels: Arc::default(),
            limit: Arc::new(AtomicUsize::new(DEFAULT_SERVICES_PER_NAMESPACE)),
        }
    }
}

impl ServiceLevels {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let levels = ServiceLevels::default();
        registry.register_collector(Box::new(levels.clone()));
        levels
    }

    /// Sets how many Services of one namespace expose their series (at
    /// least one).
    pub fn limit(&self, per_namespace: usize) {
        self.limit.store(per_namespace.max(1), Ordering::Relaxed);
    }

    /// The levels, for the native totals read at the same scrape.
    pub(super) fn read(&self) -> MutexGuard<'_, ByService> {
        // Levels only mirror what reconciles set; a panic elsewhere cannot
        // leave them worse than a stale figure.
        self.levels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with<R>(&self, namespace: &str, service: &str, f: impl FnOnce(&mut Levels) -> R) -> R {
        f(self
            .read()
            .entry((label(namespace), label(service)))
            .or_default())
    }

    /// Replaces a Service's published figures: `published` maps (Service
    /// port name or number, `IPv4`/`IPv6`) to the endpoints published, for
    /// every port and family the Service has now (as
    /// `plan::Summary::endpoints`); pairs not listed are dropped.
    pub fn set(
        &self,
        namespace: &str,
        service: &str,
        published: &BTreeMap<(String, String), usize>,
        slices: usize,
        desired_slices: usize,
    ) {
        self.with(namespace, service, |l| {
            l.published = published
                .iter()
                .map(|((port, family), n)| ((label(port), label(family)), *n))
                .collect();
            l.slices = Some(slices);
            l.desired_slices = desired_slices;
        });
    }

    /// Marks a complete sync of a Service (everything planned was written)
    /// at `at`: the series a staleness alert watches.
    pub fn set_synced(&self, namespace: &str, service: &str, at: std::time::SystemTime) {
        let unix = at
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.with(namespace, service, |l| l.synced = Some(unix));
    }

    /// Sets the pods of a Service's group that are not judged, every reason
    /// listed (zeros included, so a cleared reason reads 0, not stale).
    pub fn set_not_judged(
        &self,
        namespace: &str,
        service: &str,
        counts: &BTreeMap<NotJudged, usize>,
    ) {
        self.with(namespace, service, |l| l.not_judged = Some(counts.clone()));
    }

    /// The longest ongoing abstain of a Service (zero when none).
    pub fn set_abstain_longest(&self, namespace: &str, service: &str, longest: Duration) {
        self.with(namespace, service, |l| {
            l.abstain_longest = Some(longest.as_secs_f64())
        });
    }

    /// Replaces a Service's shadow figures: differing pods per port (every
    /// port listed, zeros included) and the verdicts compared.
    pub fn set_shadow(
        &self,
        namespace: &str,
        service: &str,
        shadow: &str,
        per_port: &BTreeMap<String, usize>,
        verdicts: usize,
    ) {
        let shadow = Shadow {
            name: label(shadow),
            per_port: per_port.iter().map(|(p, n)| (label(p), *n)).collect(),
            verdicts,
        };
        self.with(namespace, service, |l| l.shadow = Some(shadow));
    }

    /// Drops a Service's shadow series (no shadow applies any more).
    pub fn forget_shadow(&self, namespace: &str, service: &str) {
        if let Some(l) = self.read().get_mut(&(label(namespace), label(service))) {
            l.shadow = None;
        }
    }

    /// Drops every series of a Service that was deleted or is no longer
    /// managed, so dashboards do not show ghosts.
    pub fn forget(&self, namespace: &str, service: &str) {
        self.read().remove(&(label(namespace), label(service)));
    }
}

fn service_labels(key: &(String, String)) -> ServiceLabels {
    ServiceLabels {
        namespace: key.0.clone(),
        service: key.1.clone(),
    }
}

impl Collector for ServiceLevels {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A copy of what is exposed, so the lock is not held while the
        // scrape is written.
        let (all, omitted) = exposed(&self.read(), self.limit.load(Ordering::Relaxed));
        let gauge = MetricType::Gauge;

        let mut family = encoder.encode_descriptor(
            "endpoints_published",
            "Endpoints published per Service port and address family.",
            None,
            gauge,
        )?;
        for (key, l) in &all {
            for ((port, family_name), n) in &l.published {
                let labels = PublishedLabels {
                    namespace: key.0.clone(),
                    service: key.1.clone(),
                    port: port.clone(),
                    family: family_name.clone(),
                };
                ConstGauge::new(gauge_value(*n)).encode(family.encode_family(&labels)?)?;
            }
        }

        let mut family = encoder.encode_descriptor(
            "slices_managed",
            "EndpointSlices portwise manages per Service.",
            None,
            gauge,
        )?;
        for (key, l) in &all {
            if let Some(n) = l.slices {
                ConstGauge::new(gauge_value(n))
                    .encode(family.encode_family(&service_labels(key))?)?;
            }
        }

        let mut family = encoder.encode_descriptor(
            "pods_not_judged",
            "Pods of a Service's group that no port can include, by reason (terminal|node-gone|host-network|no-address|outside-cidrs).",
            None,
            gauge,
        )?;
        for (key, l) in &all {
            let Some(counts) = &l.not_judged else {
                continue;
            };
            for why in NotJudged::ALL {
                let labels = NotJudgedLabels {
                    namespace: key.0.clone(),
                    service: key.1.clone(),
                    reason: why.as_str().to_string(),
                };
                let n = counts.get(&why).copied().unwrap_or(0);
                ConstGauge::new(gauge_value(n)).encode(family.encode_family(&labels)?)?;
            }
        }

        let mut family = encoder.encode_descriptor(
            "abstain_longest",
            "How long the longest unbroken abstain of a Service's (pod, port, family) has lasted; past abstainLimit it counts as exclude.",
            Some(&Unit::Seconds),
            gauge,
        )?;
        for (key, l) in &all {
            if let Some(s) = l.abstain_longest {
                ConstGauge::new(s).encode(family.encode_family(&service_labels(key))?)?;
            }
        }

        let mut family = encoder.encode_descriptor(
            "service_synced_timestamp",
            "Unix time of the Service's last complete sync (judged, planned, written); the leader syncs every served Service at least once per resyncPeriod.",
            Some(&Unit::Seconds),
            gauge,
        )?;
        for (key, l) in &all {
            if let Some(t) = l.synced {
                ConstGauge::new(t).encode(family.encode_family(&service_labels(key))?)?;
            }
        }

        let mut family = encoder.encode_descriptor(
            "shadow_differences",
            "Pods whose shadow verdict differs from the live one, per Service port (nothing of the shadow is published).",
            None,
            gauge,
        )?;
        for (key, l) in &all {
            let Some(s) = &l.shadow else { continue };
            for (port, n) in &s.per_port {
                let labels = ShadowPortLabels {
                    namespace: key.0.clone(),
                    service: key.1.clone(),
                    shadow: s.name.clone(),
                    port: port.clone(),
                };
                ConstGauge::new(gauge_value(*n)).encode(family.encode_family(&labels)?)?;
            }
        }

        let mut family = encoder.encode_descriptor(
            "shadow_verdicts",
            "Verdicts the shadow was compared on at the Service's last reconcile.",
            None,
            gauge,
        )?;
        for (key, l) in &all {
            let Some(s) = &l.shadow else { continue };
            let labels = ShadowLabels {
                namespace: key.0.clone(),
                service: key.1.clone(),
                shadow: s.name.clone(),
            };
            ConstGauge::new(gauge_value(s.verdicts)).encode(family.encode_family(&labels)?)?;
        }

        let mut family = encoder.encode_descriptor(
            "service_series_omitted",
            "Managed Services of a namespace whose per-Service series are not exposed: past --max-service-series-per-namespace.",
            None,
            gauge,
        )?;
        for (namespace, n) in &omitted {
            let labels = NamespaceLabels {
                namespace: namespace.clone(),
            };
            ConstGauge::new(gauge_value(*n)).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The levels whose series are exposed: per namespace the first
/// `per_namespace` Services, each with at most [`MAX_PORT_SERIES`] ports;
/// and per namespace the Services left out.
fn exposed(all: &ByService, per_namespace: usize) -> (ByService, BTreeMap<String, usize>) {
    let mut shown = ByService::new();
    let mut omitted: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (key, levels) in all {
        let n = seen.entry(key.0.as_str()).or_default();
        *n += 1;
        if *n > per_namespace {
            *omitted.entry(key.0.clone()).or_default() += 1;
            continue;
        }
        let mut levels = levels.clone();
        if levels.published.len() > MAX_PORT_SERIES {
            levels.published = levels.published.into_iter().take(MAX_PORT_SERIES).collect();
        }
        if let Some(s) = &mut levels.shadow
            && s.per_port.len() > MAX_PORT_SERIES
        {
            s.per_port = std::mem::take(&mut s.per_port)
                .into_iter()
                .take(MAX_PORT_SERIES)
                .collect();
        }
        shown.insert(key.clone(), levels);
    }
    (shown, omitted)
}
