//! Prometheus metrics: what an operator needs to tell whether portwise is
//! publishing the truth, and where it hurts when it is not.
//!
//! The set mirrors that of the Go library portwise replaces
//! (redpanda-data/common-go `portmapper`): endpoints published per Service
//! port and family, slices managed, checks by decision, check latency,
//! native cleanup deletions, name collisions. It adds what a WebAssembly host and a
//! leader-elected controller need (guest failures, module loads, reconcile
//! errors and durations, writes, leadership, the cold start's stages).
//!
//! [`Metrics`] is a cheap-to-clone handle made of parts, one per subject,
//! each registering its own families (`ServiceLevels::register`, ...);
//! every clone updates the same series. The per-Service gauges are
//! *levels*, not events, so they must disappear with the Service: they are
//! kept as one entry per Service and encoded at every scrape
//! ([`ServiceLevels`]), so [`ServiceLevels::set`] replaces all of one
//! Service's series at once (a renamed or removed port does not linger) and
//! [`Metrics::forget_service`] drops them with one removal. The native
//! controller's totals are summed from the same levels at the same scrape.
//! Counters are never reset; Prometheus handles restarts.
//!
//! Guest failures are counted by the WebAssembly runtime itself (plain
//! atomics, so that crate needs no metrics library and this one no
//! wasmtime): `portwise_guest_failures` is a
//! [`Collector`](prometheus_client::collector::Collector) that reads them
//! through [`Guests::read_failures`] at every scrape. The caches' sizes
//! (`portwise_cache_objects`) are read from the stores the same way
//! ([`CacheSizes::read_from`]).
//!
//! The exposition is OpenMetrics text (`Metrics::encode`), which Prometheus
//! scrapes natively. Counter names gain their `_total` suffix and histograms
//! their `_seconds` unit from the encoder, so the names registered below are
//! the stems.
//!
//! One file a part: `service.rs` the per-Service levels; `checks.rs` the
//! membership checks; `reconciles.rs` reconcile durations, phases and
//! errors; `writes.rs` writes, cleanups and collisions; `guest.rs` module
//! loads and guest failures; `caches.rs` the caches' sizes; `process.rs`
//! leadership, the build and the cold start's stages; `native.rs` the series that mean what the
//! native controller's `endpoint_slice_controller_*` mean, under the same
//! names. `registry.rs` assembles them into [`Metrics`]; `labels.rs` holds
//! the label values and sets.

mod caches;
mod checks;
mod guest;
mod labels;
mod native;
mod process;
mod reconciles;
mod registry;
mod service;
#[cfg(test)]
mod tests;
mod writes;

pub use caches::CacheSizes;
pub use checks::Checks;
pub use guest::{GuestFailure, GuestFailureSource, Guests};
pub use labels::{
    CleanupKind, ColdStartStage, ModuleLoad, ReconcilePhase, WriteKind, decision_label,
};
pub use native::{Native, SliceChange, SyncResult};
pub use process::{BuildInfo, Process};
pub use reconciles::Reconciles;
pub use registry::{CONTENT_TYPE, Metrics};
pub use service::{DEFAULT_SERVICES_PER_NAMESPACE, MAX_PORT_SERIES, ServiceLevels};
pub use writes::Writes;
