//! The seed's own example (issue 2, item 6): one selector-less Service whose
//! two ports are served by overlapping subsets of one pod group, chosen by a
//! per-pod annotation.

use anyhow::Result;
use portwise_tests::*;

const MEMBERSHIP: &str =
    "{all: [podReady, {portNames: {annotation: port-mapper.example.com/ports}}]}";

async fn seed_objects(ns: &TestNs) -> Result<()> {
    ns.create_service(
        service("my-service")
            .annotation(GROUP_KEY, "my-group")
            .port("http", 8080)
            .port("https", 8443),
    )
    .await?;
    for (name, ports) in [
        ("a", "http"),
        ("b", "http,https"),
        ("c", "http,https"),
        ("d", "https"),
    ] {
        ns.create_pod(
            pod(name)
                .annotation(GROUP_KEY, "my-group")
                .annotation(PORTS_KEY, ports)
                .container_port("http", 8080, "TCP")
                .container_port("https", 8443, "TCP")
                .ips(next_ips().v4()),
        )
        .await?;
    }
    Ok(())
}

async fn expect(ns: &TestNs, http: &[&str], https: &[&str]) -> Result<()> {
    wait_for(SETTLE, || async {
        expect_eq(
            endpoints_by_port(ns, "my-service").await?,
            by_port([(("http", V4), http), (("https", V4), https)]),
        )
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_example() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "seed").await?;
    seed_objects(&ns).await?;
    let _pw = Portwise::start(&ns, &config(MEMBERSHIP)).await?;

    expect(&ns, &["a", "b", "c"], &["b", "c", "d"]).await?;
    // One slice per Service port (both far below maxEndpointsPerSlice).
    expect_eq(slices_for(&ns, "my-service").await?.len(), 2)?;
    slice_invariants(&ns, "my-service", 100).await?;

    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    expect(&ns, &["a", "b", "c"], &["a", "b", "c", "d"]).await?;

    ns.delete_pod("d").await?;
    expect(&ns, &["a", "b", "c"], &["a", "b", "c"]).await?;
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
    seed_objects(&ns).await?;
    let mut pw = Portwise::spawn_binary(&ns, &config(MEMBERSHIP)).await?;

    expect(&ns, &["a", "b", "c"], &["b", "c", "d"]).await?;
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

    expect(&ns, &["a", "b", "c"], &["a", "b", "c"]).await?;
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
