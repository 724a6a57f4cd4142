//! The process: whether this replica leads, which version runs, and how
//! long its cold start took to reach each stage.

use std::{sync::atomic::AtomicU64, time::Duration};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family as MetricFamily, gauge::Gauge},
    registry::{Registry, Unit},
};

use portwise_core::shard::Bucket;

use super::labels::{ColdStartStage, StageLabels};

/// A bucket of namespaces (`portwise_core::shard`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BucketLabels {
    bucket: u32,
}

/// What `portwise_build_info` says about the running binary: its version,
/// the git revision it was built from and that commit's date. The binary
/// reads the last two in its build script (host/portwise/build.rs); a
/// library user without one passes [`BuildInfo::UNKNOWN`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildInfo {
    pub version: &'static str,
    /// The commit's full object name, or `unknown`.
    pub revision: &'static str,
    /// The commit's date (strict ISO 8601), or `unknown`.
    pub build_date: &'static str,
}

impl BuildInfo {
    /// This version, built from an unknown commit.
    pub const UNKNOWN: BuildInfo = BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        revision: "unknown",
        build_date: "unknown",
    };
}

/// Clones share the series.
#[derive(Clone, Debug)]
pub struct Process {
    leader: Gauge,
    bucket_held: MetricFamily<BucketLabels, Gauge>,
    reload_ok: Gauge,
    reload_at: Gauge<f64, AtomicU64>,
    cold_start: MetricFamily<StageLabels, Gauge<f64, AtomicU64>>,
}

impl Process {
    pub(super) fn register(registry: &mut Registry, build: BuildInfo) -> Self {
        let process = Process {
            leader: Gauge::default(),
            bucket_held: MetricFamily::default(),
            reload_ok: Gauge::default(),
            reload_at: Gauge::default(),
            cold_start: MetricFamily::default(),
        };
        // Named as Prometheus' and Alertmanager's own, so the alerts
        // written for those fit.
        process.reload_ok.set(1);
        registry.register(
            "config_last_reload_successful",
            "1 when the last change of the config file was applied (or none came since the start), 0 while it is refused and the previous config keeps running",
            process.reload_ok.clone(),
        );
        registry.register_with_unit(
            "config_last_reload_success_timestamp",
            "When the running config was loaded (the start, or the last change applied), in seconds since the Unix epoch",
            Unit::Seconds,
            process.reload_at.clone(),
        );
        // A gauge per stage, set once: how long this process took to get
        // there, which a log line alone would make every reader parse.
        registry.register_with_unit(
            "cold_start",
            "Time from the controller's start to each stage of its cold start (synced: every cache's first list; reconciled: every Service the synced caches held reconciled once); absent until reached",
            Unit::Seconds,
            process.cold_start.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease (and may write), else 0",
            process.leader.clone(),
        );
        // One series per bucket, 0 included: a bucket no replica holds is
        // one whose every series is 0 (the alert PortwiseBucketUnheld),
        // which an absent series could not tell from a scrape gap.
        registry.register(
            "bucket_held",
            "Sharded (--shards above 1): 1 for each bucket of namespaces this replica holds (and writes in), 0 for the others",
            process.bucket_held.clone(),
        );
        let build_info = MetricFamily::<BuildInfo, Gauge>::default();
        registry.register(
            "build_info",
            "Always 1; the version, git revision and commit date of the running portwise as labels",
            build_info.clone(),
        );
        build_info.get_or_create(&build).set(1);
        process
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

    /// Records a config load: applied (`true`, now) or refused.
    pub fn set_config_loaded(&self, applied: bool) {
        self.reload_ok.set(i64::from(applied));
        if applied {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            self.reload_at.set(now.as_secs_f64());
        }
    }

    /// Sharded: which of the `count` buckets this replica holds now. It
    /// leads (`portwise_leader`) while it holds any.
    pub fn set_buckets_held(&self, count: u32, held: &std::collections::BTreeSet<Bucket>) {
        for b in 0..count {
            self.bucket_held
                .get_or_create(&BucketLabels { bucket: b })
                .set(i64::from(held.contains(&b)));
        }
        self.set_leader(!held.is_empty());
    }

    /// Sets whether this replica currently leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }
}
