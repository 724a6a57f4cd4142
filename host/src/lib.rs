//! portwise: per-port EndpointSlices for colocated, selector-less Services.
//!
//! Data flows one way: **watch → align → check → plan → apply**. The middle
//! steps (`align`, `membership`, `plan`) are pure and tested without a
//! cluster; Kubernetes (`controller`, `apply`, `migrate`) and WebAssembly
//! (`wasm`) sit at the edges.

pub mod align;
pub mod apply;
pub mod cli;
pub mod config;
pub mod controller;
pub mod membership;
pub mod migrate;
pub mod ops;
pub mod plan;
pub mod probe;
pub mod wasm;
