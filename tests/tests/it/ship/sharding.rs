//! Sharding with real `portwise run --shards 4 --leader-elect` processes
//! (issue 49), each acting as its own user so that the apiserver's audit
//! log names the writer of every slice write.
//!
//! Six namespaces, each with the seed example, spread over 4 buckets:
//! - a rolling update from one leader: while a replica of `--shards 1`
//!   leads, the sharded ones hold no bucket; once it stops they take them;
//! - two replicas share the buckets 2/2, and every Service is published;
//!   each namespace's slices are written only by the holder of its bucket,
//!   and a quiet window costs no write;
//! - `kill -9` of one: only its buckets wait (until their terms end), then
//!   the other takes them, and pod changes everywhere are published, those
//!   of the dead replica's namespaces by the survivor alone;
//! - the killed one comes back: it warms up (judges without writing), the
//!   survivor hands it two buckets, and while they move no Ready member
//!   ever leaves its slice; afterwards each namespace is again written
//!   only by its bucket's holder;
//! - each replica keeps in its cache only the pods of its buckets'
//!   namespaces (none while it holds no bucket);
//! - `portwise check --live` names the replica that writes a namespace;
//! - SIGTERM of one: it drains (hands each bucket over to the other, warm,
//!   while it still writes), no Ready member leaves any slice, and exits 0;
//! - SIGTERM of the last: exit 0, every bucket Lease released.

use std::{
    collections::{BTreeMap, BTreeSet},
    num::NonZeroU32,
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use portwise_core::shard::{Bucket, Shards};
use portwise_tests::*;

use super::support::*;

const S: u32 = 4;
const NAMESPACES: usize = 6;
const LEASE_SECS: u64 = 3;
const LEASE: Duration = Duration::from_secs(LEASE_SECS);
/// What `--lease-duration 3s` derives (client-go's ratio 2/15).
const RETRY: Duration = Duration::from_millis(400);
/// Scheduling and request latency on two shared cores.
const SLACK: Duration = Duration::from_millis(3000);
const QUIET: Duration = Duration::from_secs(5);
/// The single leader of before the update.
const OLD: &str = "pw-old";

struct Replica {
    proc: Portwise,
    user: String,
}

impl Replica {
    /// The buckets this replica says it holds (`portwise_bucket_held`).
    async fn held(&self) -> Result<BTreeSet<Bucket>> {
        let m = self.proc.scrape().await?;
        let mut held = BTreeSet::new();
        for b in 0..S {
            let label = b.to_string();
            if m.value("portwise_bucket_held", &[("bucket", &label)])? == Some(1.0) {
                held.insert(b);
            }
        }
        Ok(held)
    }
}

async fn start(
    cp: &'static ControlPlane,
    lease_ns: &str,
    namespaces: &[&str],
    dir: &std::path::Path,
    id: &str,
) -> Result<Replica> {
    let user = format!("portwise-shard-{id}");
    let kubeconfig = impersonating(
        cp,
        &dir.join(format!("{id}.kubeconfig")),
        &user,
        &["system:masters", "system:authenticated"],
    )?;
    let shards = S.to_string();
    // The replica of before the update: one leader, no --shards.
    let shards_args: &[&str] = if id == OLD {
        &[]
    } else {
        &["--shards", &shards]
    };
    let proc = Portwise::builder(cp)
        .name(id)
        .namespaces(namespaces)
        .config(&config(SEED_MEMBERSHIP))
        .identity(&kubeconfig)
        .args(shards_args)
        .leader_elect(lease_ns, LEASE_SECS, id)
        .start()
        .await?;
    Ok(Replica { proc, user })
}

/// Waits until the replicas hold every bucket between them, once each, in
/// shares of `shares` (sorted); returns who holds what.
async fn balanced(
    replicas: &[&Replica],
    shares: &[usize],
    within: Duration,
) -> Result<Vec<BTreeSet<Bucket>>> {
    wait_for(within, || async {
        let mut held = Vec::new();
        for r in replicas {
            held.push(r.held().await?);
        }
        let mut all = BTreeSet::new();
        for h in &held {
            for b in h {
                ensure!(all.insert(*b), "bucket {b} held twice: {held:?}");
            }
        }
        ensure!(all.len() == S as usize, "not every bucket held: {held:?}");
        let mut sizes: Vec<usize> = held.iter().map(BTreeSet::len).collect();
        sizes.sort();
        ensure!(
            sizes == shares,
            "shares {sizes:?}, want {shares:?}: {held:?}"
        );
        Ok(held)
    })
    .await
}

/// Every namespace's slice writes since `mark` are by the user whose
/// replica holds its bucket (`owner`); returns how many there were.
fn writes_by_holders(
    mark: &AuditMark,
    nss: &[TestNs],
    shards: Shards,
    owner: &BTreeMap<Bucket, String>,
) -> Result<usize> {
    let mut n = 0;
    for ns in nss {
        let holder = &owner[&shards.bucket(ns.name())];
        for w in mark.slice_writes(ns.name())? {
            ensure!(
                &w.user == holder,
                "{} is in bucket {} held by {holder}, but {w:?}",
                ns.name(),
                shards.bucket(ns.name())
            );
            n += 1;
        }
    }
    Ok(n)
}

/// Waits until each replica's pod cache holds exactly the seed's pods of
/// the namespaces in the buckets it holds (`held`, in the same order).
async fn pods_of_buckets(
    replicas: &[&Replica],
    held: &[BTreeSet<Bucket>],
    nss: &[TestNs],
    shards: Shards,
) -> Result<()> {
    let pods_per_namespace = 4.0;
    wait_for(SETTLE, || async {
        for (r, h) in replicas.iter().zip(held) {
            let mine = nss
                .iter()
                .filter(|n| h.contains(&shards.bucket(n.name())))
                .count();
            let cached = r.proc.cached_pods().await?;
            ensure!(
                cached == pods_per_namespace * mine as f64,
                "{} holds buckets {h:?} ({mine} namespaces) but caches {cached} pods",
                r.user
            );
        }
        Ok(())
    })
    .await
}

fn owners(replicas: &[&Replica], held: &[BTreeSet<Bucket>]) -> BTreeMap<Bucket, String> {
    let mut owner = BTreeMap::new();
    for (r, h) in replicas.iter().zip(held) {
        for b in h {
            owner.insert(*b, r.user.clone());
        }
    }
    owner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_namespaces_with_one_writer_each() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let shards = Shards::new(NonZeroU32::new(S).expect("positive"));
    // Names chosen so that every bucket has one namespace or two: each
    // replica then has Services of its own whichever buckets it holds.
    let run: String = (0..5)
        .map(|_| fastrand::alphanumeric().to_ascii_lowercase())
        .collect();
    let mut per_bucket: BTreeMap<Bucket, usize> = BTreeMap::new();
    let mut nss = Vec::new();
    for i in 0.. {
        if nss.len() == NAMESPACES {
            break;
        }
        let name = format!("shard-{run}-{i}");
        let k = shards.bucket(&name);
        let covered = per_bucket.len() == S as usize;
        let here = per_bucket.get(&k).copied().unwrap_or(0);
        if here == 0 || (covered && here < 2) {
            *per_bucket.entry(k).or_default() += 1;
            let ns = TestNs::exact(cp, &name).await?;
            seed_scenario(&ns).create().await?;
            nss.push(ns);
        }
    }
    let names: Vec<&str> = nss.iter().map(|n| n.name()).collect();
    println!(
        "namespaces by bucket: {:?}",
        names
            .iter()
            .map(|n| (n, shards.bucket(n)))
            .collect::<Vec<_>>()
    );
    let lease_ns = names[0];
    let leases: Api<Lease> = nss[0].api();
    let dir = tempfile::Builder::new()
        .prefix("portwise-shard-")
        .tempdir()?;

    // Before the update: one leader publishes everything.
    let mut old = start(cp, lease_ns, &names, dir.path(), OLD).await?;
    for ns in &nss {
        expect_seed(ns, &["a", "b", "c"], &["b", "c", "d"]).await?;
    }
    let mut a = start(cp, lease_ns, &names, dir.path(), "pw-a").await?;
    let mut b = start(cp, lease_ns, &names, dir.path(), "pw-b").await?;
    a.proc.wait_ready().await?;
    b.proc.wait_ready().await?;
    // Several of the ring's rounds: no bucket is held beside the leader.
    let until = Instant::now() + RETRY * 8;
    while Instant::now() < until {
        expect_eq(
            (a.held().await?, b.held().await?),
            (BTreeSet::new(), BTreeSet::new()),
        )?;
        // Nor any namespace's pods: a replica keeps its buckets' only.
        expect_eq(
            (a.proc.cached_pods().await?, b.proc.cached_pods().await?),
            (0.0, 0.0),
        )?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        is_identity(lease_holder(&leases, "portwise").await?.as_deref(), OLD),
        "the single leader lost its Lease"
    );
    let audit = AuditMark::now(cp)?;
    old.proc.stop().await?;
    let held = balanced(&[&a, &b], &[2, 2], SETTLE).await?;
    for ns in &nss {
        ns.annotate_pod("b", PORTS_KEY, Some("http")).await?;
    }
    for ns in &nss {
        expect_seed(ns, &["a", "b", "c"], &["c", "d"]).await?;
    }
    println!("two replicas: a holds {:?}, b holds {:?}", held[0], held[1]);
    // The memory splits: each keeps the pods of its buckets' namespaces.
    pods_of_buckets(&[&a, &b], &held, &nss, shards).await?;
    // `check --live` names the replica that writes a namespace.
    let probe_ns = names[0];
    let (writer, other) = if held[0].contains(&shards.bucket(probe_ns)) {
        ("pw-a", "pw-b")
    } else {
        ("pw-b", "pw-a")
    };
    let out = check_live_on(
        cp,
        &config(SEED_MEMBERSHIP),
        &format!("{probe_ns}/my-service"),
    )
    .await?;
    let said = format!(
        "namespace {probe_ns} is bucket {} of the {S} of the shard ring {lease_ns}/portwise, held by {writer}_",
        shards.bucket(probe_ns)
    );
    ensure!(
        out.code == Some(0) && out.stdout.contains(&said) && !out.stdout.contains(other),
        "check --live should say {said:?}; exit {:?}: {}{}",
        out.code,
        out.stdout,
        out.stderr
    );
    let owner = owners(&[&a, &b], &held);
    // (The audit log is written after each response: let the last land.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = writes_by_holders(&audit, &nss, shards, &owner)?;
    ensure!(
        writes >= NAMESPACES,
        "only {writes} slice writes for {NAMESPACES} Services"
    );

    // A quiet window: nothing changes, nothing is written, nothing moves.
    let quiet = AuditMark::now(cp)?;
    tokio::time::sleep(QUIET).await;
    expect_eq(writes_by_holders(&quiet, &nss, shards, &owner)?, 0)?;
    expect_eq(
        balanced(&[&a, &b], &[2, 2], Duration::ZERO).await?,
        held.clone(),
    )?;

    // kill -9 of a; then a pod change in every namespace. Those in b's
    // buckets are published at once; a's wait for the takeover.
    a.proc.kill().await?;
    let killed = Instant::now();
    let after_kill = AuditMark::now(cp)?;
    for ns in &nss {
        ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    }
    let b_ns: Vec<&TestNs> = nss
        .iter()
        .filter(|n| held[1].contains(&shards.bucket(n.name())))
        .collect();
    for ns in &b_ns {
        expect_seed(ns, &["a", "b", "c"], &["a", "c", "d"]).await?;
    }
    let b_done = killed.elapsed();
    ensure!(
        b_done < LEASE,
        "the survivor's own namespaces took {b_done:?}: they must not wait for the dead replica's terms"
    );
    let takeover = wait_for(LEASE + RETRY + SLACK, || async {
        let h = b.held().await?;
        ensure!(h.len() == S as usize, "b holds {h:?}");
        Ok(killed.elapsed())
    })
    .await?;
    for ns in &nss {
        expect_seed(ns, &["a", "b", "c"], &["a", "c", "d"]).await?;
    }
    // a renewed at most a retry period before the kill.
    ensure!(
        takeover + RETRY + Duration::from_millis(300) >= LEASE,
        "took a's buckets {takeover:?} after the kill, before their terms could have ended"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    pods_of_buckets(&[&b], &[(0..S).collect()], &nss, shards).await?;
    let all_b: BTreeMap<Bucket, String> = (0..S).map(|k| (k, b.user.clone())).collect();
    writes_by_holders(&after_kill, &nss, shards, &all_b)?;
    println!(
        "kill -9 of a: b's own namespaces published after {:.2}s, a's buckets taken after {:.2}s",
        b_done.as_secs_f64(),
        takeover.as_secs_f64()
    );

    // a comes back: two buckets move to it, warm. Meanwhile no Ready member
    // leaves any slice.
    a.proc.start_again().await?;
    let rejoined = Instant::now();
    let mut moved = None;
    while moved.is_none() {
        for ns in &nss {
            seed_is(ns, &["a", "b", "c"], &["a", "c", "d"])
                .await
                .map_err(|e| anyhow::anyhow!("{} during the move: {e}", ns.name()))?;
        }
        if let Ok(held) = balanced(&[&a, &b], &[2, 2], Duration::ZERO).await {
            moved = Some(held);
        } else if rejoined.elapsed() > SETTLE {
            bail!("a did not get its share back within {SETTLE:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = moved.expect("set above");
    let handover = rejoined.elapsed();
    pods_of_buckets(&[&a, &b], &held, &nss, shards).await?;
    let warmed = a.proc.logs().contains("warm for a bucket");
    ensure!(warmed, "a took buckets without warming up");
    let owner = owners(&[&a, &b], &held);
    let after_move = AuditMark::now(cp)?;
    for ns in &nss {
        ns.annotate_pod("d", PORTS_KEY, Some("http,https")).await?;
    }
    for ns in &nss {
        expect_seed(ns, &["a", "b", "c", "d"], &["a", "c", "d"]).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = writes_by_holders(&after_move, &nss, shards, &owner)?;
    ensure!(writes >= NAMESPACES, "only {writes} writes after the move");
    println!(
        "a rejoined: buckets {:?} moved to it {:.2}s after its start, no member missing meanwhile",
        held[0],
        handover.as_secs_f64()
    );

    // SIGTERM of a: it drains first. b warms up for a's buckets and a
    // hands each over while it still writes, so no Ready member leaves any
    // slice meanwhile; then a exits 0.
    let of_a = held[0].clone();
    let draining = Instant::now();
    a.proc.signal(libc::SIGTERM)?;
    while a.proc.check_running().is_ok() {
        for ns in &nss {
            seed_is(ns, &["a", "b", "c", "d"], &["a", "c", "d"])
                .await
                .map_err(|e| anyhow::anyhow!("{} while a drained: {e}", ns.name()))?;
        }
        ensure!(
            draining.elapsed() < LEASE + SLACK * 2,
            "a did not exit within {:?} of SIGTERM",
            LEASE + SLACK * 2
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.proc.stop().await?;
    ensure!(
        a.proc
            .logs()
            .contains("handing the buckets over to warm successors")
            && !a.proc.logs().contains("not every bucket was handed over"),
        "a did not drain before it stopped"
    );
    // Each of a's buckets was handed over, as an Event on its Lease says.
    let events: Api<k8s_openapi::api::events::v1::Event> = nss[0].api();
    let released: Vec<(String, String)> = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("BucketReleased"))
        .filter_map(|e| Some((e.regarding?.name?, e.note?)))
        .collect();
    for k in &of_a {
        let lease = format!("portwise-bucket-{k}");
        ensure!(
            released
                .iter()
                .any(|(l, n)| *l == lease && n.starts_with("pw-a_") && n.contains("over to pw-b_")),
            "no Event says a handed {lease} over to b: {released:?}"
        );
    }
    balanced(&[&b], &[4], SETTLE).await?;
    println!(
        "a drained on SIGTERM: buckets {of_a:?} handed over to b, exit {:.2}s after the signal",
        draining.elapsed().as_secs_f64()
    );

    // SIGTERM of b: exit 0, every bucket released.
    b.proc.stop().await?;
    for k in 0..S {
        expect_eq(
            (
                k,
                lease_holder(&leases, &format!("portwise-bucket-{k}")).await?,
            ),
            (k, None),
        )?;
    }
    Ok(())
}
