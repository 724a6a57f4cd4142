//! portwise: per-port EndpointSlices for colocated, selector-less Services.
//!
//! This crate is the binary and what only the binary needs: the commands
//! ([`cli`]: `run`, `check`) and operating the process ([`ops`]: the
//! metrics/health endpoint, leader election, logging). It wires the crates
//! below together and holds no policy of its own:
//!
//! - `portwise-core`: configuration, align, the verdict algebra, the
//!   planner (pure);
//! - `portwise-probe`: HTTP GET and TCP dial;
//! - `portwise-checkers`: the runnable checker tree built from configuration;
//! - `portwise-wasm`: WebAssembly checkers (wasmtime);
//! - `portwise-supply`: where modules come from (the modules directory,
//!   `oci://` pulls, signatures, the compiled-code cache);
//! - `portwise-controller`: watches, reconcile, apply, migration.
//!
//! Kept as a library next to the binary so the integration tests drive the
//! same commands the binary runs.

pub mod build;
pub mod cli;
pub mod ops;
