//! The `--reconcile-concurrency` slots: how many reconciles may read the
//! caches, plan and write at once.
//!
//! A reconcile gives its slot back while its checks run, and takes one
//! again to plan and write. Why: a Service whose probes never answer would
//! otherwise hold its slot for as long as its checks take (minutes, for a
//! tenant whose traffic a NetworkPolicy drops), and 8 such Services stall
//! every other namespace's reconciles, a readiness flip with them. What
//! bounds checks is the check permits ([`crate::permits`]), shared fairly
//! between namespaces; the slots bound the work on the apiserver.

use std::{future::Future, sync::Arc};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The pool of slots; `None`: no bound (`--reconcile-concurrency=0`).
#[derive(Clone, Debug)]
pub(crate) struct Slots(Option<Arc<Semaphore>>);

/// One reconcile's slot (none without a bound).
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Slots,
    permit: Option<OwnedSemaphorePermit>,
}

impl Slots {
    /// `n` slots; 0: no bound.
    pub(crate) fn new(n: usize) -> Self {
        Slots((n > 0).then(|| Arc::new(Semaphore::new(n))))
    }

    /// A slot, once one is free.
    pub(crate) async fn take(&self) -> Slot {
        let permit = match &self.0 {
            Some(s) => Some(
                s.clone()
                    .acquire_owned()
                    .await
                    .expect("reconcile slots are never closed"),
            ),
            None => None,
        };
        Slot {
            slots: self.clone(),
            permit,
        }
    }
}

impl Slot {
    /// A reconcile outside the slots (a Service released outside the
    /// cache, as its key's exclusive turn).
    pub(crate) fn outside() -> Self {
        Slot {
            slots: Slots(None),
            permit: None,
        }
    }

    /// Runs `work` without the slot, then takes one again.
    pub(crate) async fn released_while<F: Future>(&mut self, work: F) -> F::Output {
        self.permit = None;
        let out = work.await;
        *self = self.slots.take().await;
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// While one reconcile's checks run, its slot serves another; it takes
    /// one again when they end.
    #[tokio::test]
    async fn a_slot_is_free_while_its_reconcile_checks() {
        let slots = Slots::new(1);
        let mut checking = slots.take().await;
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let slow = tokio::spawn(async move {
            checking
                .released_while(async {
                    released.await.ok();
                })
                .await;
            checking
        });
        let other = tokio::time::timeout(Duration::from_secs(5), slots.take())
            .await
            .expect("the checking reconcile held its slot");
        release.send(()).unwrap();
        // It waits for the slot back before it goes on.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!slow.is_finished(), "went on without a slot");
        drop(other);
        let back = slow.await.unwrap();
        assert!(back.permit.is_some());
    }
}
