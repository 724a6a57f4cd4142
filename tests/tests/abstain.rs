//! `abstain`: keep what was last published for that (pod, port, family),
//! read back from the live slices, so a restart does not forget; a pod never
//! published stays out.

use anyhow::Result;
use portwise_tests::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abstain_keeps_last_published_across_restart() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "abstain").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080)
            .port("https", 8443),
    )
    .await?;
    for (name, ready) in [("a", true), ("b", true), ("c", false)] {
        ns.create_pod(
            pod(name)
                .annotation(GROUP_KEY, "g")
                .ready(ready)
                .ips(next_ips().v4()),
        )
        .await?;
    }
    // The real binary: a new process has nothing but the live slices to go by.
    let mut pw = Portwise::spawn_binary(&ns, &config("podReady")).await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([
            (("http", V4), &["a", "b"][..]),
            (("https", V4), &["a", "b"][..]),
        ]),
    )
    .await?;

    // While portwise is down: a turns unready, c turns ready, d appears.
    pw.kill().await?;
    ns.set_ready("a", false).await?;
    ns.set_ready("c", true).await?;
    ns.create_pod(pod("d").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .await?;

    // Back up with http abstaining: http keeps exactly what it had (a stays
    // although unready; c and d were never published there, so stay out),
    // while https follows readiness.
    pw.restart_with(&config(
        "{perPort: {ports: {http: abstain}, fallback: podReady}}",
    ))
    .await?;
    let expected = by_port([
        (("http", V4), &["a", "b"][..]),
        (("https", V4), &["b", "c", "d"][..]),
    ]);
    wait_for(SETTLE, || async {
        expect_eq(endpoints_by_port(&ns, "web").await?, expected.clone())
    })
    .await?;
    // ...and keeps it across resyncs (resyncPeriod is 2s).
    stays_for(Duration::from_secs(8), || async {
        expect_eq(endpoints_by_port(&ns, "web").await?, expected.clone())
    })
    .await?;

    // A second restart, still abstaining: the slices are the only memory.
    pw.restart().await?;
    stays_for(Duration::from_secs(8), || async {
        expect_eq(endpoints_by_port(&ns, "web").await?, expected.clone())
    })
    .await?;

    // A deleted pod is no candidate: abstain cannot keep it.
    ns.delete_pod("b").await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([(("http", V4), &["a"][..]), (("https", V4), &["c", "d"][..])]),
    )
    .await?;

    // Decisive again: http follows readiness.
    pw.restart_with(&config("podReady")).await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([
            (("http", V4), &["c", "d"][..]),
            (("https", V4), &["c", "d"][..]),
        ]),
    )
    .await?;
    pw.stop().await?;
    Ok(())
}

/// Abstain composes: `any: [podReady, abstain]` includes ready pods, and
/// for unready ones keeps the last published answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abstain_inside_combinators() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "abstain-any").await?;
    let _pw = Scenario::new(&ns)
        .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .pod(
            pod("b")
                .annotation(GROUP_KEY, "g")
                .ready(false)
                .ips(next_ips().v4()),
        )
        .config(&config("{any: [podReady, abstain]}"))
        .start()
        .await?;

    // b: any(exclude, abstain) = abstain and never published: stays out.
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;
    // a turns unready: abstain, it was published, so it stays.
    ns.set_ready("a", false).await?;
    stays_for(Duration::from_secs(8), || async {
        expect_eq(
            endpoints_by_port(&ns, "web").await?,
            by_port([(("http", V4), &["a"][..])]),
        )
    })
    .await?;
    // b turns ready: include.
    ns.set_ready("b", true).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;
    Ok(())
}
