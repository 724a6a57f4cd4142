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
//! [`Metrics`] is a cheap-to-clone handle; every clone updates the same
//! series. The per-Service gauges are *levels*, not events, so they must
//! disappear with the Service: [`Metrics::set_service`] replaces all series of
//! one Service at once (a renamed or removed port does not linger) and
//! [`Metrics::forget_service`] drops them when the Service is deleted or no
//! longer managed. Counters are never reset; Prometheus handles restarts.
//!
//! Guest failures are counted by the WebAssembly runtime itself (plain
//! atomics, so that crate needs no metrics library and this one no
//! wasmtime): `portwise_guest_failures` is a
//! [`Collector`](prometheus_client::collector::Collector) that reads them
//! through [`Metrics::read_guest_failures`] at every scrape. The caches'
//! sizes (`portwise_cache_objects`) are read from the stores the same way
//! ([`Metrics::read_cache_sizes`]).
//!
//! The exposition is OpenMetrics text (`Metrics::encode`), which Prometheus
//! scrapes natively. Counter names gain their `_total` suffix and histograms
//! their `_seconds` unit from the encoder, so the names registered below are
//! the stems.
//!
//! One file a job: `registry.rs` holds [`Metrics`] (every family
//! registered, the exposition); `labels.rs` the label values and sets;
//! `service.rs` the per-Service levels (published endpoints, slices,
//! abstains, shadow); `counters.rs` the process-wide counters, latencies and
//! gauges; `guest.rs` the guest failures read from the runtime; `caches.rs` the
//! caches' sizes read from the stores; `native.rs`
//! the series that mean what the native controller's
//! `endpoint_slice_controller_*` mean, under the same names.

mod caches;
mod counters;
mod guest;
mod labels;
mod native;
mod registry;
mod service;
#[cfg(test)]
mod tests;

pub use guest::{GuestFailure, GuestFailureSource};
pub use labels::{
    CleanupKind, ColdStartStage, ModuleLoad, ReconcilePhase, WriteKind, decision_label,
};
pub use native::{SliceChange, SyncResult};
pub use registry::{CONTENT_TYPE, Metrics};
