//! The registry: [`Metrics`], the parts that each register their families
//! under `portwise_`, and the exposition.

use std::sync::Arc;

use prometheus_client::{encoding::text::encode, registry::Registry};

use super::{
    caches::CacheSizes,
    checks::Checks,
    guest::Guests,
    native::Native,
    process::{BuildInfo, Process},
    reconciles::Reconciles,
    service::ServiceLevels,
    writes::Writes,
};

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// All of portwise's metrics, a part per subject. Clone it freely; clones
/// share the series.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// The per-Service levels (endpoints published, slices, abstains,
    /// shadow, last sync).
    pub services: ServiceLevels,
    pub checks: Checks,
    pub reconciles: Reconciles,
    pub writes: Writes,
    /// The native controller's figures, under its names.
    pub native: Native,
    pub guests: Guests,
    pub caches: CacheSizes,
    pub process: Process,
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
    /// A fresh set of metrics, every part registered under the `portwise_`
    /// prefix; `portwise_build_info` names this version and no revision
    /// (the binary uses [`Metrics::with_build`]).
    pub fn new() -> Self {
        Self::with_build(BuildInfo::UNKNOWN)
    }

    /// A fresh set of metrics whose `portwise_build_info` says `build`.
    pub fn with_build(build: BuildInfo) -> Self {
        let mut registry = Registry::with_prefix("portwise");
        let services = ServiceLevels::register(&mut registry);
        let native = Native::register(&mut registry, &services);
        Self {
            checks: Checks::register(&mut registry),
            reconciles: Reconciles::register(&mut registry),
            writes: Writes::register(&mut registry),
            guests: Guests::register(&mut registry),
            caches: CacheSizes::register(&mut registry),
            process: Process::register(&mut registry, build),
            services,
            native,
            registry: Arc::new(registry),
        }
    }

    /// Drops every per-Service series of a Service that was deleted or is
    /// no longer managed (its share of the native totals with them).
    pub fn forget_service(&self, namespace: &str, service: &str) {
        self.services.forget(namespace, service);
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
