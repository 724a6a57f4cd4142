//! The seed's own example (issue 2, item 6): one selector-less Service whose
//! two ports are served by overlapping subsets of one pod group, chosen by a
//! per-pod annotation.

use anyhow::{Result, ensure};
use portwise_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_example() -> Result<()> {
    seed_example_on(ControlPlane::shared().await?).await
}

// The Kubernetes matrix: the seed on 1.35 and 1.36 too.
on_older_minors!(seed_example => seed_example_on);

async fn seed_example_on(cp: &'static ControlPlane) -> Result<()> {
    let ns = TestNs::new(cp, "seed").await?;
    let _pw = seed_scenario(&ns)
        .expect(
            "my-service",
            seed_slices(&["a", "b", "c"], &["b", "c", "d"]),
        )
        .start()
        .await?;
    // Each pod in one slice, listing every port it backs, as the native
    // controller lays slices out (issue 44): a backs http alone, b and c
    // both, d https alone.
    expect_eq(
        slice_shapes(&ns, "my-service").await?,
        shapes([
            (&["http"][..], V4, &["a"][..]),
            (&["http", "https"][..], V4, &["b", "c"][..]),
            (&["https"][..], V4, &["d"][..]),
        ]),
    )?;
    slice_invariants(&ns, "my-service", 100).await?;

    // a joins https: it moves to the slice of both ports.
    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    expect_seed(&ns, &["a", "b", "c"], &["a", "b", "c", "d"]).await?;
    wait_for(SETTLE, || async {
        expect_eq(
            slice_shapes(&ns, "my-service").await?,
            shapes([
                (&["http", "https"][..], V4, &["a", "b", "c"][..]),
                (&["https"][..], V4, &["d"][..]),
            ]),
        )
    })
    .await?;

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
    // Deterministic names: the restarted process kept the slice it found
    // for pods of both ports (now all of them) and deleted the others.
    wait_for(SETTLE, || async {
        let after: Vec<_> = slices_for(&ns, "my-service")
            .await?
            .into_iter()
            .map(|s| s.metadata.name)
            .collect();
        expect_eq(after, vec![Some("my-service-http.https".to_string())])
    })
    .await?;
    ensure!(
        names.contains(&Some("my-service-http.https".to_string())),
        "the first run published {names:?}"
    );
    pw.stop().await?; // SIGTERM: must exit 0 within 30s
    Ok(())
}
