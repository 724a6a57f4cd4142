//! portwise-controller: the kube-runtime shell around the pure core:
//! watch → align → check → plan → apply.
//!
//! Why a crate of its own: this is the part that talks to the apiserver
//! (watches, server-side apply, Events, the Lease-gated writes) and runs
//! the checkers, on top of `portwise-core`, which decides. Keeping it apart
//! from the binary keeps it a library the integration suite can run
//! in-process. It may not depend on wasmtime (wasm checkers come in through
//! [`portwise_checkers::WasmCheckers`], built by `portwise-wasm`) nor on
//! binary or CLI concerns (argument parsing, logging setup, the HTTP
//! endpoints, leader election itself: those live in `portwise`, which hands
//! them in through [`RunOptions`]).
//!
//! One reconcile is a function of cached state for one Service:
//! - `wiring` feeds the caches and triggers reconciles (watches, resync,
//!   leader hand-over, readiness, the bound on concurrent reconciles);
//! - `context` holds what a reconcile reads (caches, indexes, the judges,
//!   the writers) and the reads over them;
//! - `reconcile` lets [`portwise_core::reconcile::decide`] decide from the
//!   context, and carries the decision out through [`apply`], [`migrate`],
//!   Events (`events`) and [`metrics`]; after it, `shadow` judges and
//!   reports the shadow membership.
//!
//! Only the elected leader writes.

pub mod apply;
pub mod cache;
mod context;
mod echo;
mod error;
mod events;
mod foreign;
mod judge;
pub mod metrics;
pub mod migrate;
mod options;
mod permits;
mod pod_scopes;
pub mod policies;
pub mod queue;
mod readiness;
mod reconcile;
mod retry;
mod shadow;
mod slots;
mod table;
mod tenure;
mod watches;
mod wiring;

use std::future::Future;

use kube::Client;

use portwise_core::config::Config;

pub use error::Error;
pub use events::Reason;
pub use options::{RunOptions, Warmup};
/// One ownership rule and one spelling of the slice labels, in the core.
pub use portwise_core::plan::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL, is_ours};
pub use readiness::Readiness;
pub use tenure::{Leadership, Tenure, Terms};

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    opts: RunOptions,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    wiring::run(client, config, opts, shutdown).await
}
