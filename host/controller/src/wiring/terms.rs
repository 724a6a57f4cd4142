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

/// How long a bucket that left keeps its namespaces' pods. A term lost to
/// renewals that came too late (an overloaded apiserver or node) is
/// usually retaken a retry period or two later; closing its pod watches at
/// once meant listing every pod of its namespaces again on the retake,
/// which fed the very overload that lost it (bench row 14 at 100,000 pods
/// saw replicas step down every 10 s for two minutes).
const KEEP_LEFT: std::time::Duration = std::time::Duration::from_secs(10);

/// Sharded: the buckets whose namespaces' pods this replica keeps, those it
/// holds and those it warms up for (and, for [`KEEP_LEFT`], those that
/// left), and the task that follows them (from the start, before the
/// caches sync: a bucket taken at once is watched at once).
pub(super) fn interest(
    shards: Shards,
    terms: Terms,
    warming: Option<tokio::sync::watch::Receiver<BTreeSet<Bucket>>>,
) -> (Interest, BoxFuture<'static, ()>) {
    interest_keeping(shards, terms, warming, KEEP_LEFT)
}

fn interest_keeping(
    shards: Shards,
    terms: Terms,
    warming: Option<tokio::sync::watch::Receiver<BTreeSet<Bucket>>>,
    keep: std::time::Duration,
) -> (Interest, BoxFuture<'static, ()>) {
    let (tx, buckets) = tokio::sync::watch::channel(BTreeSet::new());
    let follow = async move {
        let mut look = tokio::time::interval(TERM_LOOK);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut wanted: BTreeSet<Bucket> = BTreeSet::new();
        let mut left: std::collections::BTreeMap<Bucket, std::time::Instant> = Default::default();
        loop {
            look.tick().await;
            let mut now = terms.held();
            if let Some(w) = &warming {
                now.extend(w.borrow().iter().copied());
            }
            let at = std::time::Instant::now();
            for b in wanted.difference(&now) {
                left.entry(*b).or_insert(at);
            }
            left.retain(|b, since| !now.contains(b) && at.duration_since(*since) < keep);
            wanted = now.clone();
            now.extend(left.keys().copied());
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

#[cfg(test)]
mod tests {
    use std::{num::NonZeroU32, time::Instant};

    use super::*;

    /// A bucket that leaves keeps its pods a while, so a term lost and
    /// retaken at once does not list them again; then they go.
    #[tokio::test]
    async fn a_bucket_that_left_keeps_its_pods_a_while() {
        let shards = Shards::new(NonZeroU32::new(4).expect("positive"));
        let terms = Terms::default();
        let keep = std::time::Duration::from_millis(600);
        let (interest, follow) = interest_keeping(shards, terms.clone(), None, keep);
        tokio::spawn(follow);
        let mut buckets = interest.buckets.clone();
        let (term_tx, term) =
            tokio::sync::watch::channel(Some(Instant::now() + std::time::Duration::from_secs(60)));
        terms.set(1, Some(term));
        buckets
            .wait_for(|b| b.contains(&1))
            .await
            .expect("followed");
        terms.set(1, None);
        drop(term_tx);
        let left = Instant::now();
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        assert!(
            buckets.borrow().contains(&1),
            "bucket 1's pods were dropped {:?} after it left",
            left.elapsed()
        );
        buckets.wait_for(|b| b.is_empty()).await.expect("followed");
        assert!(left.elapsed() >= keep, "dropped after {:?}", left.elapsed());
    }
}
