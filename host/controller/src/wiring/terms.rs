//! The caches' sync and the leader's terms, as one subscriber.

use super::*;

/// Follows the caches' sync and the leader's terms: once the caches have
/// synced, every Service is asked for (nothing was asked before, see
/// [`Triggers`]); on each new term (a renewal is not one) every Service is
/// asked for again, since while following we wrote nothing and the
/// previous leader may have left work undone; and whenever we lead, our
/// slices of Services the cache does not hold are looked at (they may
/// have lost their key while we were down or following).
pub(super) async fn terms(
    ctx: Arc<Context>,
    mut leader: Option<crate::tenure::Tenure>,
    started: std::time::Instant,
    tx: Triggers,
    release_tx: tokio::sync::mpsc::UnboundedSender<Gone>,
) {
    let mut first = true;
    loop {
        ctx.synced.opened().await;
        tx.ask_all(&ctx.services);
        if std::mem::take(&mut first) {
            // Where a cold start spends its time: the caches' lists, then
            // the first reconcile of every Service (`ColdStart`).
            let after = started.elapsed();
            ctx.metrics
                .process
                .set_cold_start(crate::metrics::ColdStartStage::Synced, after);
            info!(
                after_ms = after.as_millis() as u64,
                services = ctx.services.len(),
                pods = ctx.pods.len(),
                slices = ctx.slices.len(),
                "caches synced"
            );
        }
        if ctx.is_leader() {
            sweep_gone(&ctx, &release_tx);
        }
        let Some(rx) = leader.as_mut() else { return };
        // Until the next time we become leader.
        let mut held = rx.holds_term();
        loop {
            match rx.changed().await {
                None => return,
                Some(holds) => {
                    let became = holds && !held;
                    held = holds;
                    if became {
                        break;
                    }
                }
            }
        }
    }
}
