//! The series an operator of the native EndpointSlice controller knows,
//! with the same meaning: `endpoint_slice_controller_X` is `portwise_X`
//! (k8s.io/endpointslice/metrics).
//!
//! - `endpoints_added_per_sync`, `endpoints_removed_per_sync`: histograms,
//!   one observation per planned Service sync, buckets 2 .. 32768 as
//!   upstream's;
//! - `endpoints_desired`, `num_endpoint_slices`, `desired_endpoint_slices`:
//!   cluster-wide totals over the Services portwise serves, summed from the
//!   per-Service levels at every scrape, so a Service's last figures are
//!   replaced or taken out with its levels, as upstream's metrics cache
//!   does;
//! - `changes_total{operation=create|update|delete}`: EndpointSlice writes
//!   that succeeded;
//! - `syncs_total{result=success|error}`: every Service reconcile. Upstream
//!   also counts `stale` (a sync refused because its informer had not yet
//!   seen its own last write); portwise overlays its own writes on the cache
//!   instead of refusing, so it has no such result.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        MetricType,
        counter::Counter,
        family::Family as MetricFamily,
        gauge::ConstGauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use super::{labels::gauge_value, service::ServiceLevels};

/// What one EndpointSlice write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SliceChange {
    Create,
    Update,
    Delete,
}

impl SliceChange {
    pub const ALL: [SliceChange; 3] = [
        SliceChange::Create,
        SliceChange::Update,
        SliceChange::Delete,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SliceChange::Create => "create",
            SliceChange::Update => "update",
            SliceChange::Delete => "delete",
        }
    }
}

/// How one Service reconcile ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncResult {
    Success,
    Error,
}

impl SyncResult {
    pub const ALL: [SyncResult; 2] = [SyncResult::Success, SyncResult::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            SyncResult::Success => "success",
            SyncResult::Error => "error",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// Endpoints added or removed per sync: upstream's buckets, 2 .. 32768.
fn per_sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(2.0, 2.0, 15))
}

/// The native controller's figures. Clones share the series.
#[derive(Clone, Debug)]
pub struct Native {
    endpoints_added_per_sync: Histogram,
    endpoints_removed_per_sync: Histogram,
    changes: MetricFamily<OperationLabels, Counter>,
    syncs: MetricFamily<ResultLabels, Counter>,
}

/// The totals over every Service's levels, read at each scrape.
#[derive(Debug)]
struct Totals(ServiceLevels);

impl Collector for Totals {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (mut endpoints, mut slices, mut desired) = (0, 0, 0);
        for l in self.0.read().values() {
            endpoints += l.endpoints();
            slices += l.slices();
            desired += l.desired_slices;
        }
        for (name, help, value) in [
            (
                "endpoints_desired",
                "Number of endpoints desired.",
                endpoints,
            ),
            ("num_endpoint_slices", "Number of EndpointSlices.", slices),
            (
                "desired_endpoint_slices",
                "Number of EndpointSlices that would exist with perfect endpoint allocation.",
                desired,
            ),
        ] {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(gauge_value(value)).encode(family)?;
        }
        Ok(())
    }
}

impl Native {
    /// Registers the native figures; the totals are summed from `levels`.
    pub(super) fn register(registry: &mut Registry, levels: &ServiceLevels) -> Self {
        let native = Native {
            endpoints_added_per_sync: per_sync_histogram(),
            endpoints_removed_per_sync: per_sync_histogram(),
            changes: MetricFamily::default(),
            syncs: MetricFamily::default(),
        };
        registry.register(
            "endpoints_added_per_sync",
            "Number of endpoints added on each Service sync",
            native.endpoints_added_per_sync.clone(),
        );
        registry.register(
            "endpoints_removed_per_sync",
            "Number of endpoints removed on each Service sync",
            native.endpoints_removed_per_sync.clone(),
        );
        registry.register_collector(Box::new(Totals(levels.clone())));
        registry.register(
            "changes",
            "Number of EndpointSlice changes (create|update|delete)",
            native.changes.clone(),
        );
        registry.register(
            "syncs",
            "Number of EndpointSlice syncs (success|error)",
            native.syncs.clone(),
        );
        // Every label value from the start, so 0 reads as 0, not absent.
        for change in SliceChange::ALL {
            drop(native.changes.get_or_create(&OperationLabels {
                operation: change.as_str(),
            }));
        }
        for result in SyncResult::ALL {
            drop(native.syncs.get_or_create(&ResultLabels {
                result: result.as_str(),
            }));
        }
        native
    }

    /// One planned sync of a Service: the endpoints it adds and removes.
    pub fn observe_sync_plan(&self, endpoints_added: usize, endpoints_removed: usize) {
        self.endpoints_added_per_sync
            .observe(endpoints_added as f64);
        self.endpoints_removed_per_sync
            .observe(endpoints_removed as f64);
    }

    /// Counts one EndpointSlice write that succeeded.
    pub fn count_slice_change(&self, change: SliceChange) {
        self.changes
            .get_or_create(&OperationLabels {
                operation: change.as_str(),
            })
            .inc();
    }

    /// Counts one Service reconcile by how it ended.
    pub fn count_sync(&self, result: SyncResult) {
        self.syncs
            .get_or_create(&ResultLabels {
                result: result.as_str(),
            })
            .inc();
    }
}
