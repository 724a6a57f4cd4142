//! High availability with two real `portwise run --leader-elect` processes
//! on a short lease (3 s: renew deadline 2 s, retry 0.4 s). Each acts as its
//! own user (impersonation), so the apiserver's audit log says who wrote.
//!
//! - Exactly one leader, named by the Lease and by `portwise_leader`.
//! - While both run, only the leader writes; a quiet window costs no writes.
//! - `kill -9` of the leader: the other takes over once the term is over
//!   (not before), within lease duration + retry, and a pod change made
//!   after the kill is published. Until the takeover nobody publishes it.
//! - SIGTERM of the leader: exit 0, the Lease released, the standby takes
//!   over without waiting out the term. SIGTERM of the last: holder cleared.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use portwise_tests::*;

use super::support::*;

const LEASE_SECS: u64 = 3;
const LEASE: Duration = Duration::from_secs(LEASE_SECS);
/// What `--lease-duration 3s` derives (client-go's ratio 2/15).
const RETRY: Duration = Duration::from_millis(400);
/// Scheduling and request latency on two shared cores.
const SLACK: Duration = Duration::from_millis(2000);
const QUIET: Duration = Duration::from_secs(6);

struct Replica {
    proc: Portwise,
    user: String,
}

impl Replica {
    async fn leader_gauge(&self) -> Result<f64> {
        self.proc
            .scrape()
            .await?
            .value("portwise_leader", &[])?
            .ok_or_else(|| anyhow::anyhow!("{} has no portwise_leader", self.proc.name()))
    }

    async fn writes_total(&self) -> Result<f64> {
        Ok(self.proc.scrape().await?.sum("portwise_writes_total", &[]))
    }
}

async fn start(
    cp: &'static ControlPlane,
    ns: &TestNs,
    dir: &std::path::Path,
    id: &str,
) -> Result<Replica> {
    let user = format!("portwise-ha-{id}");
    // Admin rights, but its own name in the audit log.
    let kubeconfig = impersonating(
        cp,
        &dir.join(format!("{id}.kubeconfig")),
        &user,
        &["system:masters", "system:authenticated"],
    )?;
    let proc = Portwise::builder(cp)
        .name(id)
        .namespace(ns.name())
        .config(&config(SEED_MEMBERSHIP))
        .identity(&kubeconfig)
        .leader_elect(ns.name(), LEASE_SECS, id)
        .start()
        .await?;
    Ok(Replica { proc, user })
}

/// Waits until the Lease names one of `ids` and that replica's gauge is 1
/// while every other's is 0; returns the holder's index.
async fn one_leader(leases: &Api<Lease>, replicas: &[&Replica], within: Duration) -> Result<usize> {
    wait_for(within, || async {
        let holder = lease_holder(leases, "portwise").await?;
        let mut gauges = Vec::new();
        for r in replicas {
            gauges.push(r.leader_gauge().await?);
        }
        let Some(i) = replicas
            .iter()
            .position(|r| is_identity(holder.as_deref(), r.proc.name()))
        else {
            bail!("Lease holder {holder:?}, gauges {gauges:?}");
        };
        let expected: Vec<f64> = (0..replicas.len())
            .map(|j| if j == i { 1.0 } else { 0.0 })
            .collect();
        ensure!(
            gauges == expected,
            "Lease holder {holder:?} but portwise_leader {gauges:?}"
        );
        Ok(i)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_one_writer_failover_and_handover() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "ship-ha").await?;
    seed_scenario(&ns).create().await?;
    let leases: Api<Lease> = ns.api();
    let dir = tempfile::Builder::new().prefix("portwise-ha-").tempdir()?;
    let audit = AuditMark::now(cp)?;

    let mut a = start(cp, &ns, dir.path(), "pw-a").await?;
    let mut b = start(cp, &ns, dir.path(), "pw-b").await?;
    expect_seed(&ns, &["a", "b", "c"], &["b", "c", "d"]).await?;
    a.proc.wait_ready().await?;
    b.proc.wait_ready().await?;
    let first = one_leader(&leases, &[&a, &b], SETTLE).await?;
    let (mut leader, mut standby) = if first == 0 { (a, b) } else { (b, a) };
    println!(
        "leader {}, standby {}",
        leader.proc.name(),
        standby.proc.name()
    );

    // Both run: one writer. A quiet window (two terms, three resyncs) costs
    // no write at all, and the roles stay put.
    let quiet = AuditMark::now(cp)?;
    let until = Instant::now() + QUIET;
    while Instant::now() < until {
        expect_eq(
            (leader.leader_gauge().await?, standby.leader_gauge().await?),
            (1.0, 0.0),
        )?;
        let holder = lease_holder(&leases, "portwise").await?;
        ensure!(
            is_identity(holder.as_deref(), leader.proc.name()),
            "holder {holder:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let quiet_writes = quiet.slice_writes(ns.name())?;
    ensure!(
        quiet_writes.is_empty(),
        "writes in a quiet window with two replicas: {quiet_writes:?}"
    );
    let writes = audit.slice_writes(ns.name())?;
    let by = |user: &str| writes.iter().filter(|w| w.user == user).count();
    ensure!(by(&leader.user) >= 2, "the leader's writes: {writes:?}");
    expect_eq(
        (standby.proc.name().to_string(), by(&standby.user)),
        (standby.proc.name().to_string(), 0),
    )?;
    expect_eq(by(&leader.user), writes.len())?;
    expect_eq(standby.writes_total().await?, 0.0)?;
    ensure!(
        leader.writes_total().await? >= 2.0,
        "the leader's portwise_writes_total"
    );
    println!(
        "both running: {} slice writes, all by the leader; {:?} quiet window: 0 writes",
        writes.len(),
        QUIET
    );

    // kill -9 the leader, then change a pod: only a new leader may publish it.
    leader.proc.kill().await?;
    let killed = Instant::now();
    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    let takeover = loop {
        let holder = lease_holder(&leases, "portwise").await?;
        if is_identity(holder.as_deref(), standby.proc.name())
            && standby.leader_gauge().await? == 1.0
        {
            break killed.elapsed();
        }
        // Still the dead leader's term: the change must not be published.
        if seed_is(&ns, &["a", "b", "c"], &["a", "b", "c", "d"])
            .await
            .is_ok()
            && is_identity(
                lease_holder(&leases, "portwise").await?.as_deref(),
                leader.proc.name(),
            )
        {
            bail!("the change was published while the killed leader still held the Lease");
        }
        if killed.elapsed() > LEASE + RETRY + SLACK * 3 {
            bail!(
                "no takeover {:?} after the kill; holder {holder:?}",
                killed.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ensure!(
        takeover <= LEASE + RETRY + SLACK,
        "takeover took {takeover:?} (lease {LEASE:?} + retry {RETRY:?} + slack {SLACK:?})"
    );
    // The killed leader renewed at most one retry period before the kill.
    ensure!(
        takeover + RETRY + Duration::from_millis(300) >= LEASE,
        "took over after {takeover:?}, before the killed leader's term could have ended"
    );
    expect_seed(&ns, &["a", "b", "c"], &["a", "b", "c", "d"]).await?;
    let converged = killed.elapsed();
    println!(
        "kill -9 of the leader: takeover after {:.2}s, change published after {:.2}s",
        takeover.as_secs_f64(),
        converged.as_secs_f64()
    );
    // a moved into the slice of both ports: the slices show it after the
    // taker's write; the slice it left and the taker's finishing write
    // follow. Mark the audit log once the move is done.
    wait_for(SETTLE, || async {
        expect_eq(
            slice_shapes(&ns, "my-service").await?,
            shapes([
                (&["http", "https"][..], V4, &["a", "b", "c"][..]),
                (&["https"][..], V4, &["d"][..]),
            ]),
        )?;
        let moving: Vec<_> = slices_for(&ns, "my-service")
            .await?
            .into_iter()
            .filter(|s| {
                s.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("portwise.io/moving-in"))
            })
            .filter_map(|s| s.metadata.name)
            .collect();
        ensure!(moving.is_empty(), "a move is not finished: {moving:?}");
        Ok(())
    })
    .await?;
    // (The audit log is written after each response: let the last land.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_kill = AuditMark::now(cp)?;
    std::mem::swap(&mut leader, &mut standby);

    // The killed one comes back as the standby.
    standby.proc.start_again().await?;
    standby.proc.wait_ready().await?;
    tokio::time::sleep(RETRY * 3).await;
    expect_eq(standby.leader_gauge().await?, 0.0)?;
    let holder = lease_holder(&leases, "portwise").await?;
    ensure!(
        is_identity(holder.as_deref(), leader.proc.name()),
        "holder {holder:?}"
    );

    // SIGTERM the leader: exit 0 and release; the standby leads at its next
    // poll, long before a term would have run out.
    let stopping = Instant::now();
    let exit = leader.proc.stop().await?;
    let handover = loop {
        if is_identity(
            lease_holder(&leases, "portwise").await?.as_deref(),
            standby.proc.name(),
        ) {
            break stopping.elapsed();
        }
        if stopping.elapsed() > LEASE + SLACK * 2 {
            bail!(
                "{} did not take over after the release",
                standby.proc.name()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ensure!(
        handover < exit + RETRY * 2 + SLACK,
        "handover took {handover:?} after SIGTERM (exit after {exit:?}): was the Lease released?"
    );
    println!(
        "SIGTERM of the leader: exit 0 after {:.2}s, handover after {:.2}s",
        exit.as_secs_f64(),
        handover.as_secs_f64()
    );
    ns.annotate_pod("d", PORTS_KEY, Some("http,https")).await?;
    expect_seed(&ns, &["a", "b", "c", "d"], &["a", "b", "c", "d"]).await?;
    // Since the takeover nothing changed until the handover: every write
    // since is the new leader's (the restarted process). d moves between
    // slices (the taker, the slice it left, the taker's finish); the audit
    // log is written after each response, so the slices can show the
    // change a moment before the log does.
    let writes = wait_for(Duration::from_secs(10), || async {
        let writes = after_kill.slice_writes(ns.name())?;
        ensure!(
            !writes.is_empty(),
            "the new leader's write is not in the audit log"
        );
        Ok(writes)
    })
    .await?;
    for w in &writes {
        ensure!(
            w.user == standby.user,
            "a write not by the current leader: {w:?}"
        );
    }

    // SIGTERM of the last one: exit 0, holderIdentity cleared.
    standby.proc.stop().await?;
    expect_eq(lease_holder(&leases, "portwise").await?, None)?;
    Ok(())
}
