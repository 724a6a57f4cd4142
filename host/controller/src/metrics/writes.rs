//! What portwise writes, and what it finds in its way: EndpointSlice
//! writes issued, native leftovers deleted, names held by someone else.

use prometheus_client::{
    metrics::{counter::Counter, family::Family as MetricFamily},
    registry::Registry,
};

use super::labels::{CleanupKind, KindLabels, WriteKind};

/// Clones share the series.
#[derive(Clone, Debug)]
pub struct Writes {
    writes: MetricFamily<KindLabels, Counter>,
    native_cleanup_deletions: MetricFamily<KindLabels, Counter>,
    name_collisions: Counter,
}

impl Writes {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let writes = Writes {
            writes: MetricFamily::default(),
            native_cleanup_deletions: MetricFamily::default(),
            name_collisions: Counter::default(),
        };
        registry.register(
            "native_cleanup_deletions",
            "Native leftovers deleted by the migration cleanup (endpoints|endpointslice)",
            writes.native_cleanup_deletions.clone(),
        );
        registry.register(
            "name_collisions",
            "EndpointSlice names already taken by another Service or manager",
            writes.name_collisions.clone(),
        );
        registry.register(
            "writes",
            "Writes issued to the apiserver by kind (apply|delete)",
            writes.writes.clone(),
        );
        writes
    }

    /// Counts one write issued to the apiserver.
    pub fn count(&self, kind: WriteKind) {
        self.writes
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Counts one native leftover deleted by the migration cleanup.
    pub fn count_native_cleanup(&self, kind: CleanupKind) {
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
}
