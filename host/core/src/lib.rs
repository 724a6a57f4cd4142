//! portwise-core: the pure policy of portwise.
//!
//! Everything here is a function of its inputs: the configuration model and
//! its validation ([`config`]), which pods back which Service port
//! ([`align`]), the verdict algebra and the pod-object facts
//! ([`membership`]), the slice planner ([`plan`]), the decision of one
//! reconcile ([`reconcile`]), and text cut to a byte budget ([`text`]).
//!
//! Why a crate of its own: the data flow is watch → align → check → plan →
//! apply, and the middle is where the rules users rely on live. Keeping it
//! pure makes every rule unit-testable without a cluster and lets the
//! compiler, not a convention, keep I/O out. This crate may not depend on an
//! async runtime, a Kubernetes client, sockets, wasmtime, or the clock (time
//! is passed in); `k8s-openapi` types are fine. `cargo tree -p
//! portwise-core` is the proof.

pub mod align;
pub mod config;
pub mod membership;
pub mod plan;
pub mod policy;
pub mod reconcile;
pub mod shadow;
pub mod shard;
pub mod text;
