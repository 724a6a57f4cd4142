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
    let start = Instant::now();
    let n = replicas.len() as u32;
    let (lo, hi) = (S / n, S.div_ceil(n));
    loop {
        let h = holders(replicas)?;
        let loads: BTreeMap<&str, u32> = replicas
            .iter()
            .map(|r| (r.name, h.values().filter(|n| **n == r.name).count() as u32))
            .collect();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_shared_held_once_and_moved_on_crash_and_join() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "ring").await?;

    let a = join(&ns, "a", S).await?;
    let b = join(&ns, "b", S).await?;
    let c = join(&ns, "c", S).await?;
    let three = balanced(&[&a, &b, &c], TIMINGS.lease_duration * 4 + SLACK).await?;

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

    // A join: d gets its share, and no more than ⌈S/3⌉ buckets move (the
    // graceful handover: each waits for d to be warm, then is released).
    let d = join(&ns, "d", S).await?;
    let after = balanced(&[&a, &b, &d], TIMINGS.lease_duration * 4 + SLACK).await?;
    let moved = (0..S).filter(|x| two.get(x) != after.get(x)).count();
    println!("joining d moved {moved} buckets");
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

    // Leaving gracefully: the others take over without waiting out terms.
    let left = Instant::now();
    d.warm.abort();
    d.ring.leave().await?;
    balanced(&[&a, &b], TIMINGS.lease_duration).await?;
    println!("d's buckets taken over {:?} after it left", left.elapsed());
    for r in [a, b] {
        r.warm.abort();
        r.ring.leave().await?;
    }
    Ok(())
}
