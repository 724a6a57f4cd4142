//! How to run the controller, beyond the configuration file: what the
//! binary hands in (metrics, the leader's term, readiness, the WebAssembly
//! checkers).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use portwise_checkers::WasmCheckers;
use portwise_core::shard::Bucket;
use tokio::sync::watch;

use crate::{metrics::Metrics, readiness::Readiness, tenure::Leadership};

/// How to run the controller, beyond the configuration file.
#[derive(Clone)]
pub struct RunOptions {
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Bound on one top-level check, on top of the probes' own timeouts.
    pub check_timeout: Duration,
    /// Shared metrics registry.
    pub metrics: Metrics,
    /// Where and until when this replica writes ([`Leadership`]).
    pub leader: Leadership,
    /// Sharded: the buckets assigned here and still held elsewhere, to warm
    /// up for, and where to say which are warm (`portwise::ops::shards`).
    pub warmup: Option<Warmup>,
    /// Set once every cache has listed once.
    pub ready: Option<Readiness>,
    /// Name of this replica in Events (`reportingInstance`).
    pub instance: Option<String>,
    /// Resolves `wasm` checker expressions; `None` rejects them.
    pub wasm: Option<Arc<dyn WasmCheckers>>,
    /// Number of Services reconciled at once.
    pub reconcile_concurrency: u16,
    /// With an annotation key and every namespace watched: the most
    /// namespaces whose pods are watched one by one at start
    /// ([`crate::pod_scopes`]); beyond it, or at 0, one cluster-wide watch.
    pub pod_watch_namespaces: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            namespaces: Vec::new(),
            check_timeout: Duration::from_secs(10),
            metrics: Metrics::default(),
            leader: Leadership::Sole,
            warmup: None,
            ready: None,
            instance: None,
            wasm: None,
            reconcile_concurrency: 8,
            pod_watch_namespaces: 256,
        }
    }
}

/// The controller's side of a graceful bucket move (issue 49): the ring
/// says which buckets to warm up for; the controller judges their Services
/// once without writing (their pods are probed, the verdicts kept), then
/// says they are warm, and the ring hands them over.
#[derive(Clone, Debug)]
pub struct Warmup {
    pub warming: watch::Receiver<BTreeSet<Bucket>>,
    pub warm: Arc<watch::Sender<BTreeSet<Bucket>>>,
}
