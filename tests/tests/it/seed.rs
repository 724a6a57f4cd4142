//! The seed's own example (issue 2, item 6): one selector-less Service whose
//! two ports are served by overlapping subsets of one pod group, chosen by a
//! per-pod annotation.

use anyhow::Result;
use portwise_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_example() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "seed").await?;
    let _pw = seed_scenario(&ns)
        .expect(
            "my-service",
            seed_slices(&["a", "b", "c"], &["b", "c", "d"]),
        )
        .start()
        .await?;
    // One slice per Service port (both far below maxEndpointsPerSlice).
    expect_eq(slices_for(&ns, "my-service").await?.len(), 2)?;
    slice_invariants(&ns, "my-service", 100).await?;

    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    expect_seed(&ns, &["a", "b", "c"], &["a", "b", "c", "d"]).await?;

    ns.delete_pod("d").await?;
    expect_seed(&ns, &["a", "b", "c"], &["a", "b", "c"]).await?;
    slice_invariants(&ns, "my-service", 100).await?;
    Ok(())
}

/// Issue 2's "done when": `portwise run --config FILE` (the real binary, with
/// KUBECONFIG) publishes the seed example's slices, survives SIGKILL, and
/// picks up changes made while it was down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_example_via_binary() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "seed-bin").await?;
    let mut pw = seed_scenario(&ns)
        .binary()
        .expect(
            "my-service",
            seed_slices(&["a", "b", "c"], &["b", "c", "d"]),
        )
        .start()
        .await?;
    pw.check_running()?;
    let names: Vec<_> = slices_for(&ns, "my-service")
        .await?
        .into_iter()
        .map(|s| s.metadata.name)
        .collect();

    pw.kill().await?;
    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    ns.delete_pod("d").await?;
    pw.start_again().await?;

    expect_seed(&ns, &["a", "b", "c"], &["a", "b", "c"]).await?;
    // Deterministic names: the restarted process kept the slices it found.
    let after: Vec<_> = slices_for(&ns, "my-service")
        .await?
        .into_iter()
        .map(|s| s.metadata.name)
        .collect();
    expect_eq(after, names)?;
    pw.stop().await?; // SIGTERM: must exit 0 within 30s
    Ok(())
}
