//! The caches' sync and the leader's terms, as one subscriber.

use std::collections::BTreeSet;

use portwise_core::shard::{Bucket, Shards};

use crate::{pod_scopes::Interest, tenure::Terms};

use super::*;

/// How often a sharded replica looks for buckets whose term began or
/// ended. A bucket's elector hands its term out on a watch of its own and
/// the ring adds and drops electors as it goes; looking at the few terms
/// this often is simpler than following a changing set of watches, and
/// adds at most this much to a takeover (lease + retry, seconds).
const TERM_LOOK: std::time::Duration = std::time::Duration::from_millis(100);

/// Follows the caches' sync and the leader's terms: once the caches have
/// synced, every Service is asked for (nothing was asked before, see
/// [`Triggers`]); on each new term (a renewal is not one) every Service is
/// asked for again, since while following we wrote nothing and the
/// previous leader may have left work undone; and whenever we lead, our
/// slices of Services the cache does not hold are looked at (they may
/// have lost their key while we were down or following).
///
/// Sharded, the same per bucket: each bucket whose term begins has its
/// Services asked for and its slices swept.
pub(super) async fn terms(
    ctx: Arc<Context>,
    started: std::time::Instant,
    tx: Triggers,
    release_tx: tokio::sync::mpsc::UnboundedSender<Gone>,
) {
    ctx.synced.opened().await;
    // Where a cold start spends its time: the caches' lists, then the
    // first reconcile of every Service (`ColdStart`).
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
    match ctx.leader.clone() {
        Leadership::Sole => {
            tx.ask_all(&ctx.services);
            sweep_gone(&ctx, &release_tx);
        }
        Leadership::Leader(mut tenure) => loop {
            tx.ask_all(&ctx.services);
            if tenure.leads() {
                sweep_gone(&ctx, &release_tx);
            }
            // Until the next time we become leader.
            let mut held = tenure.holds_term();
            loop {
                match tenure.changed().await {
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
        },
        Leadership::Shards { shards, terms } => {
            bucket_terms(&ctx, shards, &terms, &tx, &release_tx).await;
        }
    }
}

/// A sharded replica's terms: each bucket taken has its Services asked for
/// and our slices there swept; the buckets held are reported.
async fn bucket_terms(
    ctx: &Context,
    shards: Shards,
    terms: &Terms,
    tx: &Triggers,
    release_tx: &tokio::sync::mpsc::UnboundedSender<Gone>,
) {
    let mut held: BTreeSet<Bucket> = BTreeSet::new();
    let mut look = tokio::time::interval(TERM_LOOK);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        look.tick().await;
        let now = terms.held();
        if now == held {
            continue;
        }
        let taken: BTreeSet<Bucket> = now.difference(&held).copied().collect();
        let left: BTreeSet<Bucket> = held.difference(&now).copied().collect();
        info!(taken = ?taken, left = ?left, held = ?now, "bucket terms changed");
        ctx.metrics.process.set_buckets_held(shards.count(), &now);
        if !taken.is_empty() {
            for svc in ctx.services.state() {
                let ns = svc.namespace().unwrap_or_default();
                if taken.contains(&shards.bucket(&ns)) {
                    tx.ask(ObjectRef::from_obj(svc.as_ref()));
                }
            }
            sweep_gone(ctx, release_tx);
        }
        held = now;
    }
}

/// Sharded: the buckets whose namespaces' pods this replica keeps, those it
/// holds and those it warms up for, and the task that follows them (from
/// the start, before the caches sync: a bucket taken at once is watched at
/// once).
pub(super) fn interest(
    shards: Shards,
    terms: Terms,
    warming: Option<tokio::sync::watch::Receiver<BTreeSet<Bucket>>>,
) -> (Interest, BoxFuture<'static, ()>) {
    let (tx, buckets) = tokio::sync::watch::channel(BTreeSet::new());
    let follow = async move {
        let mut look = tokio::time::interval(TERM_LOOK);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            look.tick().await;
            let mut now = terms.held();
            if let Some(w) = &warming {
                now.extend(w.borrow().iter().copied());
            }
            tx.send_if_modified(|was| {
                let changed = *was != now;
                *was = std::mem::take(&mut now);
                changed
            });
        }
    }
    .boxed();
    (Interest { shards, buckets }, follow)
}
