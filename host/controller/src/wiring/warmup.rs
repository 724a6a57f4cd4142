//! The controller's side of a graceful bucket move (issue 49).
//!
//! The ring assigns a bucket to this replica while another still holds it.
//! Before the holder lets go, this replica judges every Service of the
//! bucket once without writing ([`crate::reconcile::warm`]): the pods are
//! probed and the verdicts kept, so that the first reconcile of its term
//! reuses them and publishes at once, rather than the bucket's Services
//! waiting a probe round with nobody writing. Then it says the bucket is
//! warm, and the ring hands it over.

use std::{collections::BTreeSet, time::Duration};

use futures::stream;
use portwise_core::shard::{Bucket, Shards};

use crate::options::Warmup;

use super::*;

/// How often a bucket that could not be warmed yet (its pods not listed)
/// is tried again, when nothing else changes. A try that finds the pods
/// unlisted costs a lookup, and the pods of a small namespace list in
/// milliseconds: a second here was most of a drain's hand-over (bench row
/// 15), which a lease duration bounds.
const AGAIN: Duration = Duration::from_millis(100);

/// Warms up for each bucket the ring says, and says which are warm.
pub(super) async fn warm_up(
    ctx: Arc<Context>,
    shards: Shards,
    mut warmup: Warmup,
    concurrency: usize,
) {
    ctx.synced.opened().await;
    loop {
        let warming: BTreeSet<Bucket> = warmup.warming.borrow_and_update().clone();
        // A bucket no longer warming (taken, or assigned elsewhere) is no
        // longer warm: its verdicts age from here.
        warmup.warm.send_if_modified(|warm| {
            let before = warm.len();
            warm.retain(|b| warming.contains(b));
            warm.len() != before
        });
        let cold: Vec<Bucket> = {
            let warm = warmup.warm.borrow();
            warming.difference(&warm).copied().collect()
        };
        for bucket in cold {
            let started = std::time::Instant::now();
            let services: Vec<Arc<Service>> = ctx
                .services
                .state()
                .into_iter()
                .filter(|s| shards.bucket(&s.namespace().unwrap_or_default()) == bucket)
                .collect();
            let count = services.len();
            let judged = stream::iter(services)
                .map(|svc| {
                    let ctx = ctx.clone();
                    async move { crate::reconcile::warm(&svc, &ctx).await }
                })
                .buffer_unordered(concurrency.max(1))
                .fold(true, |all, one| async move { all && one })
                .await;
            if judged && warmup.warming.borrow().contains(&bucket) {
                info!(
                    bucket,
                    services = count,
                    took_ms = started.elapsed().as_millis() as u64,
                    "warm for a bucket: its Services judged once, nothing written"
                );
                warmup.warm.send_modify(|warm| {
                    warm.insert(bucket);
                });
            }
        }
        tokio::select! {
            changed = warmup.warming.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(AGAIN) => {}
        }
    }
}
