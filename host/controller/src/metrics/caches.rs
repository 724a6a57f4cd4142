//! `portwise_cache_objects`: the informer caches' sizes, read from the
//! stores at every scrape, so the figure is never older than the scrape
//! and no task has to keep a copy in step.

use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
    registry::Registry,
};

use super::labels::KindLabels;

/// Reads the caches' sizes at scrape time: `(kind, objects)` rows.
type CacheSource = Box<dyn Fn() -> Vec<(&'static str, usize)> + Send + Sync>;

const HELP: &str =
    "Objects held in the informer caches by kind (services|pods|endpointslices|nodes).";

/// A gauge family whose values are the stores' lengths. Without a source
/// (before the controller runs) the family is declared and empty.
#[derive(Clone, Default)]
pub struct CacheSizes {
    source: Arc<RwLock<Option<CacheSource>>>,
}

impl std::fmt::Debug for CacheSizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheSizes").finish_non_exhaustive()
    }
}

impl Collector for CacheSizes {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = match &*self.source.read().unwrap_or_else(PoisonError::into_inner) {
            Some(source) => source(),
            None => Vec::new(),
        };
        let mut family =
            encoder.encode_descriptor("cache_objects", HELP, None, MetricType::Gauge)?;
        for (kind, objects) in rows {
            let value = i64::try_from(objects).unwrap_or(i64::MAX);
            ConstGauge::new(value).encode(family.encode_family(&KindLabels { kind })?)?;
        }
        Ok(())
    }
}

impl CacheSizes {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let sizes = CacheSizes::default();
        registry.register_collector(Box::new(sizes.clone()));
        sizes
    }

    /// Makes `portwise_cache_objects` report what `source` says (the
    /// informer caches' sizes) at every scrape from now on.
    pub fn read_from(
        &self,
        source: impl Fn() -> Vec<(&'static str, usize)> + Send + Sync + 'static,
    ) {
        *self.source.write().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(source));
    }
}
