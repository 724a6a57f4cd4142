//! The process: whether this replica leads, and which version runs.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family as MetricFamily, gauge::Gauge},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// Clones share the series.
#[derive(Clone, Debug)]
pub struct Process {
    leader: Gauge,
}

impl Process {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let process = Process {
            leader: Gauge::default(),
        };
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease (and may write), else 0",
            process.leader.clone(),
        );
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
        process
    }

    /// Sets whether this replica currently leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }
}
