//! The readiness flag the controller flips once its caches are synced, and
//! the operations endpoint (`/readyz`) reads.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

/// Whether the controller's caches are synced. Clones share the flag; the
/// controller keeps one to flip, the HTTP server reads another.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Not ready yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the process ready (caches synced) or not ready again (e.g. while
    /// shutting down, so no new traffic is sent to it).
    pub fn set_ready(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
