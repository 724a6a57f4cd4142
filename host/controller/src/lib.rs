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
//! - `reconcile` reads the caches, lets [`portwise_core::reconcile::decide`]
//!   decide, and carries the decision out through [`apply`], [`migrate`],
//!   Events and [`metrics`].
//!
//! Only the elected leader writes.

pub mod apply;
pub mod cache;
mod foreign;
mod judge;
pub mod metrics;
pub mod migrate;
mod readiness;
mod reconcile;
mod retry;
mod shadow;
mod tenure;
mod wiring;

use std::{future::Future, sync::Arc, time::Duration};

use kube::Client;

use portwise_checkers::WasmCheckers;
use portwise_core::config::Config;

use crate::metrics::Metrics;
pub use judge::Judge;
/// One ownership rule and one spelling of the slice labels, in the core.
pub use portwise_core::plan::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL, is_ours};
pub use readiness::Readiness;
pub use tenure::Tenure;

/// Errors of one reconcile. Each is retried with backoff by the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("writing slices of {service}: {source}")]
    Apply {
        service: String,
        #[source]
        source: apply::Error,
    },
    #[error("cleaning up native leftovers of {service}: {source}")]
    Migrate {
        service: String,
        #[source]
        source: migrate::Error,
    },
    #[error("building the membership checker: {0}")]
    Build(String),
}

impl Error {
    /// A short stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Apply { .. } => "apply",
            Error::Migrate { .. } => "migrate",
            Error::Build(_) => "build",
        }
    }
}

/// How to run the controller, beyond the configuration file.
#[derive(Clone)]
pub struct RunOptions {
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Bound on one top-level check, on top of the probes' own timeouts.
    pub check_timeout: Duration,
    /// Shared metrics registry.
    pub metrics: Metrics,
    /// This replica's term as leader; it writes only within it. `None`:
    /// always (no election).
    pub leader: Option<Tenure>,
    /// Set once every cache has listed once.
    pub ready: Option<Readiness>,
    /// Name of this replica in Events (`reportingInstance`).
    pub instance: Option<String>,
    /// Resolves `wasm` checker expressions; `None` rejects them.
    pub wasm: Option<Arc<dyn WasmCheckers>>,
    /// Number of Services reconciled at once.
    pub reconcile_concurrency: u16,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            namespaces: Vec::new(),
            check_timeout: Duration::from_secs(10),
            metrics: Metrics::default(),
            leader: None,
            ready: None,
            instance: None,
            wasm: None,
            reconcile_concurrency: 8,
        }
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    opts: RunOptions,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    wiring::run(client, config, opts, shutdown).await
}
