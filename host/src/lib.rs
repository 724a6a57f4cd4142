//! portwise: per-port EndpointSlices for colocated, selector-less Services.
//!
//! Data flows one way: **watch → align → check → plan → apply**. The middle
//! steps (`align`, `membership`, `plan`) are pure and tested without a
//! cluster; Kubernetes (`controller`, `apply`, `migrate`) and WebAssembly
//! (`wasm`) sit at the edges.

pub mod config;
pub mod membership;
pub mod ops;
pub mod probe;
