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

/// Issue 12: an abstain keeps what was published only for `abstainLimit`.
/// `b` drops off the network: an nftables rule answers its address with
/// ICMP host-unreachable (TCP only: the ICMP error itself goes to that
/// same local address and must not be rejected too), so `tcpDial` abstains (EHOSTUNREACH is the
/// controller's doubt, not the pod's failure). It stays published while
/// the abstain is younger than the limit, then counts as exclude and
/// leaves; the metrics show how long the abstain lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abstain_that_outlasts_the_limit_excludes() -> Result<()> {
    use anyhow::ensure;
    use std::time::Instant;
    const LIMIT: Duration = Duration::from_secs(4);
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "abstain-limit").await?;
    ns.create_service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    let (a_ip, b_ip) = (next_ips(), next_ips());
    let _a = TcpListener::start(a_ip.v4, 8080).await?;
    let _b = TcpListener::start(b_ip.v4, 8080).await?;
    for (name, ip) in [("a", &a_ip), ("b", &b_ip)] {
        ns.create_pod(pod(name).annotation(GROUP_KEY, "g").ips(ip.v4()))
            .await?;
    }
    let cfg = format!(
        "managedBy: {MANAGED_BY}\n\
         serviceKey: {{annotation: {GROUP_KEY}}}\n\
         resyncPeriod: 1s\n\
         abstainLimit: 4s\n\
         membership: {{tcpDial: {{timeout: 500ms}}}}\n"
    );
    let pw = Portwise::spawn_binary(&ns, &cfg).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;

    let table = format!("portwise-unreachable-{}", ns.name());
    use portwise_tests::partition::nft;
    nft(&format!(
        "table inet {table} {{\n chain out {{\n  type filter hook output priority 0;\n  \
         ip daddr {} tcp dport 8080 reject with icmp host-unreachable\n }}\n}}\n",
        b_ip.v4
    ))
    .await?;
    let cut = Instant::now();
    let result = async {
        // Still published while the abstain is younger than the limit.
        stays_for(LIMIT - Duration::from_millis(1500), || async {
            expect_eq(
                endpoints_by_port(&ns, "web").await?,
                by_port([(("http", V4), &["a", "b"][..])]),
            )
        })
        .await?;
        let m = pw.scrape().await?;
        let longest = m
            .value(
                "portwise_abstain_longest_seconds",
                &[("namespace", ns.name()), ("service", "web")],
            )?
            .unwrap_or(0.0);
        ensure!(longest > 0.5, "abstain_longest {longest} while b abstains");
        expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;
        let left = cut.elapsed();
        println!("b left {left:?} after it became unreachable (abstainLimit {LIMIT:?})");
        ensure!(left >= LIMIT, "b left after {left:?}, before abstainLimit");
        let expired = pw
            .scrape()
            .await?
            .value("portwise_abstains_expired_total", &[])?
            .unwrap_or(0.0);
        ensure!(expired >= 1.0, "abstains_expired_total {expired}");
        Ok::<_, anyhow::Error>(())
    }
    .await;
    nft(&format!("delete table inet {table}\n")).await?;
    result
}
