//! Reconciles, as the queue hands them out ([`crate::queue`]): at most
//! `--reconcile-concurrency` at once, one per Service at a time; a success
//! asks for the Service again after its resync, a failure after its own
//! backoff ([`crate::retry`]). Both are counted here, once.

use super::*;

use crate::{
    queue::{Queue, Turn},
    slots::{Slot, Slots},
};

/// Records (`portwise_cold_start_seconds{stage="reconciled"}`) and logs
/// once every Service the synced cache held has been reconciled: with the
/// caches' sync, where a cold start's time went.
pub(super) struct ColdStart {
    started: std::time::Instant,
    seen: Mutex<Option<std::collections::HashSet<ObjectRef<Service>>>>,
    reconciles: std::sync::atomic::AtomicU64,
}

impl ColdStart {
    pub(super) fn new(started: std::time::Instant) -> Self {
        ColdStart {
            started,
            seen: Mutex::new(Some(Default::default())),
            reconciles: Default::default(),
        }
    }

    fn reconciled(&self, key: &ObjectRef<Service>, ctx: &Context) {
        let reconciles = 1 + self
            .reconciles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !ctx.synced.synced() {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let Some(set) = seen.as_mut() else { return };
        set.insert(key.clone());
        if set.len() >= ctx.services.len()
            && ctx
                .services
                .state()
                .iter()
                .all(|s| set.contains(&ObjectRef::from_obj(s.as_ref())))
        {
            let after = self.started.elapsed();
            ctx.metrics
                .process
                .set_cold_start(crate::metrics::ColdStartStage::Reconciled, after);
            info!(
                after_ms = after.as_millis() as u64,
                services = set.len(),
                reconciles,
                "cold start: every Service reconciled once"
            );
            *seen = None;
        }
    }
}

/// Hands the queue's keys to reconciles, at most `concurrency` at once
/// (0: no bound), until the queue closes. A slot is taken before a key, so
/// keys wait in the queue, in its fair order, rather than in a semaphore.
pub(super) async fn serve(
    queue: Queue<ObjectRef<Service>>,
    ctx: Arc<Context>,
    concurrency: usize,
    cold: Arc<ColdStart>,
) {
    let slots = Slots::new(concurrency);
    loop {
        let mut slot = slots.take().await;
        let Some(turn) = queue.next().await else {
            return;
        };
        let (queue, ctx, cold) = (queue.clone(), ctx.clone(), cold.clone());
        tokio::spawn(async move {
            let key = turn.key.clone();
            reconcile_turn(&queue, &ctx, turn, &cold, &mut slot).await;
            queue.done(&key);
            drop(slot);
        });
    }
}

async fn reconcile_turn(
    queue: &Queue<ObjectRef<Service>>,
    ctx: &Arc<Context>,
    turn: Turn<ObjectRef<Service>>,
    cold: &ColdStart,
    slot: &mut Slot,
) {
    let Turn { key, waited } = turn;
    // The profile's trigger phase ends where its queue phase begins: when
    // the key became ready (later than the ask if a run of the Service was
    // under way then).
    let asked = ctx.table.take_asked(&key).map(|a| a.saturating_sub(waited));
    // Only Services the cache holds are reconciled here (one that left it
    // is released by `release_gone`).
    let Some(svc) = ctx.services.get(&key) else {
        return;
    };
    let span = tracing::debug_span!("reconcile", service = %key);
    let result = reconcile(svc.clone(), ctx.clone(), asked, waited, slot)
        .instrument(span)
        .await;
    finish(ctx, &svc, &result);
    match result {
        Ok(next) => {
            ctx.metrics.native.count_sync(SyncResult::Success);
            debug!(service = %key, "reconciled");
            cold.reconciled(&key, ctx);
            if let Some(resync) = next {
                queue.add_after(key, resync);
            }
        }
        Err(e) => {
            ctx.metrics.native.count_sync(SyncResult::Error);
            ctx.metrics.reconciles.count_error(e.kind());
            warn!(service = %key, error = %e, "reconcile failed");
            if let Some(delay) = retry_after(&svc, &e, ctx) {
                queue.add_after(key, delay);
            }
        }
    }
}

/// After a reconcile: its backoff starts over on success; a Service deleted
/// while it ran is forgotten again (the delete handler forgot it, and this
/// reconcile may have put some of its state back: verdicts, metric series,
/// warnings; the store drops a Service before the handler runs, so checking
/// here, after the last insert, closes the race).
fn finish(ctx: &Context, svc: &Arc<Service>, result: &Result<Option<Duration>, Error>) {
    if result.is_ok() {
        ctx.table.succeeded(svc);
    }
    if !ctx.still_cached(svc) {
        ctx.forget_service(svc);
    }
}

/// When a failed reconcile of `svc` is tried again; `None` if the Service
/// is gone.
fn retry_after(svc: &Arc<Service>, err: &Error, ctx: &Context) -> Option<Duration> {
    if !ctx.still_cached(svc) {
        // Deleted while it failed: nothing to retry, nothing to keep.
        ctx.forget_service(svc);
        return None;
    }
    let key = ObjectRef::from_obj(svc.as_ref());
    let (delay, failures) = ctx.table.failed(&key);
    warn!(service = %key, error = %err, retry_in = ?delay, failures, "will retry");
    Some(delay)
}

/// Reconciles a Service the cache does not hold (it lost its key), as the
/// key's turn: never beside a queued reconcile of it.
pub(super) async fn reconcile_outside(
    svc: Arc<Service>,
    ctx: Arc<Context>,
) -> Result<Option<Duration>, Error> {
    let key = ObjectRef::from_obj(svc.as_ref());
    let queue = ctx.queue.clone();
    queue
        .exclusive(key, async {
            let mut slot = Slot::outside();
            let result = reconcile(svc.clone(), ctx.clone(), None, Duration::ZERO, &mut slot).await;
            finish(&ctx, &svc, &result);
            result
        })
        .await
        // The controller is stopping: nothing more is written.
        .unwrap_or(Ok(None))
}
