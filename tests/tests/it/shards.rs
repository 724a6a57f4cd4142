//! The shard ring (`portwise::ops::shards`, issue 49) against the real
//! apiserver: replicas share the buckets evenly, never two hold one at
//! once, a crashed replica's buckets are taken over once its terms end,
//! a joining replica gets its share with the fewest moves, and a ring
//! made with another bucket count is refused.
//!
//! Short timings keep the test quick; the code paths are the production
//! ones. Warming is reported at once (no controller here).
#![cfg(feature = "in-process")]

use std::{
    collections::{BTreeMap, BTreeSet},
    num::NonZeroU32,
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};
use portwise::ops::{
    leader::{Timings, identity},
    shards::{Ring, RingConfig, RingError, Terms},
};
use portwise_core::shard::{Bucket, Shards};
use portwise_tests::*;

const S: u32 = 8;
const TIMINGS: Timings = Timings {
    lease_duration: Duration::from_secs(3),
    renew_deadline: Duration::from_secs(2),
    retry_period: Duration::from_millis(500),
};
/// Scheduling and request latency on two shared cores.
const SLACK: Duration = Duration::from_millis(2500);

struct Replica {
    name: &'static str,
    ring: Ring,
    terms: Terms,
    warm: tokio::task::JoinHandle<()>,
}

async fn join(ns: &TestNs, name: &'static str, shards: u32) -> Result<Replica, RingError> {
    let ring = Ring::join(
        ns.client(),
        RingConfig {
            namespace: ns.name().to_string(),
            name: "portwise".into(),
            identity: identity(Some(name)),
            shards: Shards::new(NonZeroU32::new(shards).expect("positive")),
            timings: TIMINGS,
            manager: "portwise".into(),
        },
    )
    .await?;
    // Warm at once for whatever is assigned: the handover's handshake
    // without a controller behind it.
    let mut warming = ring.warming();
    let reporter = ring.warm_reporter();
    let warm = tokio::spawn(async move {
        loop {
            let w = warming.borrow_and_update().clone();
            reporter.send_replace(w);
            if warming.changed().await.is_err() {
                break;
            }
        }
    });
    let terms = ring.terms();
    Ok(Replica {
        name,
        ring,
        terms,
        warm,
    })
}

/// Who holds each bucket now, by the replicas' own terms; an error if two
/// hold one.
fn holders(replicas: &[&Replica]) -> Result<BTreeMap<Bucket, &'static str>> {
    let mut out = BTreeMap::new();
    for r in replicas {
        for b in r.terms.held() {
            if let Some(other) = out.insert(b, r.name) {
                bail!("bucket {b} held by {other} and {} at once", r.name);
            }
        }
    }
    Ok(out)
}

/// Waits until every bucket is held and each replica holds ⌊S/N⌋ or
/// ⌈S/N⌉, checking every 20 ms that no bucket has two holders.
async fn balanced(
    replicas: &[&Replica],
    within: Duration,
) -> Result<BTreeMap<Bucket, &'static str>> {
    balanced_holding_at_most(replicas, within, S).await
}

/// [`balanced`], and no replica ever holds more than `most` meanwhile.
async fn balanced_holding_at_most(
    replicas: &[&Replica],
    within: Duration,
    most: u32,
) -> Result<BTreeMap<Bucket, &'static str>> {
    let start = Instant::now();
    let n = replicas.len() as u32;
    let (lo, hi) = (S / n, S.div_ceil(n));
    loop {
        let h = holders(replicas)?;
        let loads: BTreeMap<&str, u32> = replicas
            .iter()
            .map(|r| (r.name, h.values().filter(|n| **n == r.name).count() as u32))
            .collect();
        if let Some((r, l)) = loads.iter().find(|(_, l)| **l > most) {
            bail!("{r} held {l} buckets on the way, more than {most}: {loads:?}");
        }
        if h.len() == S as usize && loads.values().all(|l| (lo..=hi).contains(l)) {
            println!("balanced after {:?}: {loads:?}", start.elapsed());
            return Ok(h);
        }
        if start.elapsed() > within {
            bail!(
                "not balanced within {within:?}: {} of {S} held, loads {loads:?}",
                h.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `ns` has, for each `(bucket, replica)`, a `reason` Event on
/// the bucket's Lease whose note names the replica first and contains
/// `says`.
async fn bucket_events(
    ns: &TestNs,
    reason: &str,
    says: &str,
    of: impl IntoIterator<Item = (Bucket, &'static str)>,
) -> Result<()> {
    let want: Vec<(Bucket, &str)> = of.into_iter().collect();
    let api: kube::Api<k8s_openapi::api::events::v1::Event> = ns.api();
    wait_for(Duration::from_secs(10), || async {
        let events = api.list(&Default::default()).await?.items;
        for (b, who) in &want {
            let lease = format!("portwise-bucket-{b}");
            ensure!(
                events.iter().any(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&lease)
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.starts_with(&format!("{who}_")) && n.contains(says))
                }),
                "no {reason} Event on {lease} by {who} saying {says:?}"
            );
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_shared_held_once_and_moved_on_crash_and_join() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "ring").await?;

    // Started together (a Deployment's replicas): none takes more than its
    // share on the way, as the first to list the ring would without the
    // settling rounds (and cache every namespace's pods for nothing).
    let a = join(&ns, "a", S).await?;
    let b = join(&ns, "b", S).await?;
    let c = join(&ns, "c", S).await?;
    let three = balanced_holding_at_most(
        &[&a, &b, &c],
        TIMINGS.lease_duration * 4 + SLACK,
        S.div_ceil(3),
    )
    .await?;
    // Each holder says so on the bucket's Lease.
    bucket_events(&ns, "BucketAcquired", "holds bucket", three.clone()).await?;

    // A crash: c stops renewing anything. Only its buckets move, once its
    // terms end as the others see them.
    let crashed = Instant::now();
    let of_c: BTreeSet<Bucket> = three
        .iter()
        .filter(|(_, h)| **h == "c")
        .map(|(b, _)| *b)
        .collect();
    c.warm.abort();
    drop(c.ring);
    let two = balanced(
        &[&a, &b],
        TIMINGS.lease_duration + TIMINGS.retry_period * 3 + SLACK,
    )
    .await?;
    println!(
        "c's buckets {of_c:?} taken over {:?} after the crash",
        crashed.elapsed()
    );
    for (bucket, holder) in &three {
        if *holder != "c" {
            expect_eq(two.get(bucket), Some(holder))?;
        }
    }
    bucket_events(
        &ns,
        "BucketAcquired",
        "from c_",
        of_c.iter().map(|x| (*x, two[x])),
    )
    .await?;

    // A join: d gets its share, and no more than ⌈S/3⌉ buckets move (the
    // graceful handover: each waits for d to be warm, then is released).
    let d = join(&ns, "d", S).await?;
    let after = balanced(&[&a, &b, &d], TIMINGS.lease_duration * 4 + SLACK).await?;
    let moved = (0..S).filter(|x| two.get(x) != after.get(x)).count();
    println!("joining d moved {moved} buckets");
    // Those moves are handovers, told by the giver and the taker.
    let moves: Vec<(Bucket, &str, &str)> = (0..S)
        .filter(|x| two.get(x) != after.get(x))
        .map(|x| (x, two[&x], after[&x]))
        .collect();
    bucket_events(
        &ns,
        "BucketReleased",
        "over to d_",
        moves.iter().map(|(x, from, _)| (*x, *from)),
    )
    .await?;
    bucket_events(
        &ns,
        "BucketAcquired",
        "holds bucket",
        moves.iter().map(|(x, _, to)| (*x, *to)),
    )
    .await?;
    ensure!(
        moved <= S.div_ceil(3) as usize,
        "joining d moved {moved} buckets, more than ⌈{S}/3⌉"
    );

    // Another bucket count is refused, naming both.
    match join(&ns, "e", 4).await {
        Err(RingError::Mismatch { recorded, ours, .. }) => {
            expect_eq((recorded.as_str(), ours), ("8", 4))?;
        }
        Err(e) => bail!("a ring of 8 refused 4 buckets with {e}"),
        Ok(_) => bail!("a ring of 8 let a replica of 4 buckets join"),
    }

    // Draining (what a SIGTERM does first): d hands each bucket over to a
    // warm successor while it still holds it, then leaves holding nothing.
    let left = Instant::now();
    ensure!(
        d.ring.drain().run(TIMINGS.lease_duration * 2).await,
        "d did not hand its buckets over within two leases"
    );
    ensure!(
        d.terms.held().is_empty(),
        "d drained but holds {:?}",
        d.terms.held()
    );
    let drained = balanced(&[&a, &b], TIMINGS.retry_period * 2 + SLACK).await?;
    println!(
        "d's buckets handed over {:?} after it began to drain",
        left.elapsed()
    );
    let of_d: Vec<(Bucket, &str, &str)> = after
        .iter()
        .filter(|(_, h)| **h == "d")
        .map(|(x, _)| (*x, "d", drained[x]))
        .collect();
    bucket_events(
        &ns,
        "BucketReleased",
        "over to ",
        of_d.iter().map(|(x, from, _)| (*x, *from)),
    )
    .await?;
    d.warm.abort();
    d.ring.leave().await?;

    // Leaving without a drain: the buckets are released at once, and the
    // others take them without waiting out terms.
    let left = Instant::now();
    b.warm.abort();
    b.ring.leave().await?;
    balanced(&[&a], TIMINGS.lease_duration).await?;
    println!("b's buckets taken over {:?} after it left", left.elapsed());
    bucket_events(
        &ns,
        "BucketReleased",
        "it left the ring",
        drained
            .iter()
            .filter(|(_, h)| **h == "b")
            .map(|(x, h)| (*x, *h)),
    )
    .await?;
    a.warm.abort();
    a.ring.leave().await?;
    Ok(())
}
