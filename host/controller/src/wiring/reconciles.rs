//! The reconcile paths: in turn (one per Service at a time, a slot each),
//! promptly (the lane), and their retries after each Service's backoff.

use super::*;

/// Retries a failed reconcile after the Service's own backoff
/// ([`crate::retry`]).
pub(super) fn error_policy(svc: Arc<Service>, err: &Error, ctx: Arc<Context>) -> Action {
    match retry_after(&svc, err, &ctx) {
        Some(delay) => Action::requeue(delay),
        None => Action::await_change(),
    }
}

/// When a failed reconcile of `svc` is tried again; `None` if the Service
/// is gone.
fn retry_after(svc: &Arc<Service>, err: &Error, ctx: &Context) -> Option<Duration> {
    let key = service_key(svc);
    if !ctx.still_cached(svc) {
        // Deleted while it failed: nothing to retry, nothing to keep.
        ctx.forget_service(svc);
        return None;
    }
    let delay = ctx.retries.failed(&key);
    warn!(service = %key, error = %err, retry_in = ?delay,
        failures = ctx.retries.failures(&key), "will retry");
    Some(delay)
}

/// A reconcile the prompt lane started (a pod changed): counted as the
/// `Controller`'s are; a failure is retried through the `Controller`
/// after the Service's backoff. Its periodic resync stays with the
/// `Controller`, which scheduled it after the Service's last reconcile
/// there.
pub(super) async fn reconcile_promptly(
    svc: ObjectRef<Service>,
    ctx: Arc<Context>,
    controller: UnboundedSender<ObjectRef<Service>>,
) {
    let Some(obj) = ctx.services.get(&svc) else {
        // Gone: its reconcile will not come to take the pod change's mark.
        ctx.asked.take(&format!(
            "{}/{}",
            svc.namespace.as_deref().unwrap_or_default(),
            svc.name
        ));
        return;
    };
    match reconcile_in_turn(obj.clone(), ctx.clone()).await {
        Ok(_) => {
            ctx.metrics.count_sync(SyncResult::Success);
            debug!(service = %svc, "reconciled");
        }
        Err(e) => {
            ctx.metrics.count_sync(SyncResult::Error);
            ctx.metrics.count_reconcile_error(e.kind());
            warn!(service = %svc, error = %e, "reconcile failed");
            if let Some(delay) = retry_after(&obj, &e, &ctx) {
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = controller.unbounded_send(svc);
                });
            }
        }
    }
}

fn service_key(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

/// A reconcile once a slot is free ([`Context::reconcile_slots`]: FIFO, so
/// no Service starves).
pub(super) async fn reconcile_in_turn(
    svc: Arc<Service>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let key = service_key(&svc);
    let asked = ctx.asked.take(&key);
    let queued = std::time::Instant::now();
    // The other path may be reconciling it ([`crate::lane`]).
    let _held = ctx.exclusive.hold(key.clone()).await;
    let slots = ctx.reconcile_slots.clone();
    let _slot = match &slots {
        Some(slots) => Some(
            slots
                .acquire()
                .await
                .expect("reconcile slots are never closed"),
        ),
        None => None,
    };
    let result = reconcile(svc.clone(), ctx.clone(), asked, queued.elapsed()).await;
    if result.is_ok() {
        ctx.retries.succeeded(&key);
    }
    // A Service deleted while this reconcile ran was forgotten by the
    // delete handler, and this reconcile may have put some of its state
    // back (verdicts, metric series, warnings). The store drops a Service
    // before the handler runs, so checking it here, after the last insert,
    // closes the race.
    if !ctx.still_cached(&svc) {
        ctx.forget_service(&svc);
    }
    result
}
