//! portwise-checkers: the runnable membership checker tree.
//!
//! A [`Checker`] answers include / exclude / abstain for one
//! [`Subject`](portwise_core::membership::Subject). [`build()`] turns a
//! configuration expression into a tree of checkers: the pod-object facts
//! from `portwise-core`, the probes (`tcpDial`, `httpGet`) through
//! `portwise-probe`, the combinators, and WebAssembly checkers supplied by a
//! [`WasmCheckers`] provider (implemented by `portwise-wasm`, so this crate
//! does not depend on wasmtime and every other checker is tested without it).
//!
//! Why a crate of its own: the rules that combine verdicts are pure and live
//! in the core; running a tree means futures, probes and a clock (`stable`),
//! which the core may not have. This crate may not depend on a Kubernetes
//! client or wasmtime.

pub mod builtin;
pub mod from_config;

use std::{future::Future, pin::Pin};

pub use from_config::{
    BuildContext, BuildError, BuildErrorKind, ProviderError, WasmCheckers, build, build_at,
};
use portwise_core::membership::{Subject, Verdict};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A membership checker. Implementations must be cheap to call repeatedly and
/// must bound their own time (probes carry timeouts; the controller also
/// wraps every top-level check in a timeout).
pub trait Checker: Send + Sync + std::fmt::Debug {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict>;

    /// Whether a check may open a connection (a probe, a guest's probe
    /// host functions). Only such checks take one of `maxConcurrentChecks`'
    /// permits: a check that reads the pod object alone (`podReady`,
    /// `portNames`, ...) answers at once and must not wait behind another
    /// Service's probes that never answer. Unknown checkers say yes.
    fn probes(&self) -> bool {
        true
    }
}
