//! Shadow rollout: a shadow expression is judged next to the live one,
//! its differences show as a metric and an Event on the Service, and it
//! publishes nothing (EndpointSlice writes counted at the apiserver).

use std::time::Duration;

use anyhow::{Result, ensure};
use portwise_tests::*;

const SHADOW: &str = "portwise.io/shadow";

/// `portwise_shadow_differences` for one Service port, `None` when absent.
async fn differences(pw: &Portwise, ns: &TestNs, shadow: &str, port: &str) -> Result<Option<f64>> {
    pw.scrape().await?.value(
        "portwise_shadow_differences",
        &[
            ("namespace", ns.name()),
            ("service", "web"),
            ("shadow", shadow),
            ("port", port),
        ],
    )
}

async fn await_differences(
    pw: &Portwise,
    ns: &TestNs,
    shadow: &str,
    port: &str,
    want: Option<f64>,
) -> Result<()> {
    wait_for(Duration::from_secs(20), || async {
        let got = differences(pw, ns, shadow, port).await?;
        ensure!(got == want, "{shadow}/{port}: {got:?}, want {want:?}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_reports_its_differences_and_publishes_nothing() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "shadow").await?;
    ns.create_service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    // Live: every Ready pod. The default shadow: only pods that list the
    // port, as a team moving to `portNames` would try first.
    for (name, listed) in [("p0", true), ("p1", true), ("p2", false), ("p3", false)] {
        let mut p = pod(name).annotation(GROUP_KEY, "g").ips(next_ips().v4());
        if listed {
            p = p.annotation(PORTS_KEY, "http");
        }
        ns.create_pod(p).await?;
    }
    let cfg = config_with(
        "podReady",
        &format!(
            "shadow:\n  membership: {{portNames: {{annotation: {PORTS_KEY}}}}}\n  \
             expressions:\n    strict: exclude\n"
        ),
    );
    // The binary: the metrics are read from its operations port.
    let pw = Portwise::spawn_binary(&ns, &cfg).await?;
    let all = ["p0", "p1", "p2", "p3"];
    expect_endpoints(&ns, "web", by_port([(("http", V4), &all[..])])).await?;

    // p2 and p3 differ (live include, shadow exclude).
    await_differences(&pw, &ns, "shadow.membership", "http", Some(2.0)).await?;
    let verdicts = pw.scrape().await?.value(
        "portwise_shadow_verdicts",
        &[
            ("namespace", ns.name()),
            ("service", "web"),
            ("shadow", "shadow.membership"),
        ],
    )?;
    ensure!(verdicts == Some(4.0), "verdicts compared: {verdicts:?}");
    let event = newest_event_message(&ns, "web", "ShadowDiffers").await?;
    ensure!(
        event.contains("shadow.membership differs from the live membership on 2 of 4 verdicts")
            && event.contains("http p2 (IPv4): live include, shadow exclude")
            && event.contains("http p3 (IPv4): live include, shadow exclude"),
        "{event}"
    );

    // From here on only the shadow's verdicts change: no slice is written.
    let writes = WriteCounter::start(&ns).await?;
    ns.annotate_pod("p2", PORTS_KEY, Some("http")).await?;
    await_differences(&pw, &ns, "shadow.membership", "http", Some(1.0)).await?;

    // The annotation picks a named shadow; the default's series go.
    ns.patch_service(
        "web",
        serde_json::json!({"metadata": {"annotations": {SHADOW: "strict"}}}),
    )
    .await?;
    await_differences(&pw, &ns, "shadow.expressions.strict", "http", Some(4.0)).await?;
    ensure!(
        differences(&pw, &ns, "shadow.membership", "http")
            .await?
            .is_none(),
        "the default shadow's series outlived the switch"
    );

    // A name the file does not have: a Warning, and no shadow.
    ns.patch_service(
        "web",
        serde_json::json!({"metadata": {"annotations": {SHADOW: "strcit"}}}),
    )
    .await?;
    let unknown = newest_event_message(&ns, "web", "ShadowUnknown").await?;
    ensure!(
        unknown.contains("\"strcit\"") && unknown.contains("it has: strict"),
        "{unknown}"
    );
    await_differences(&pw, &ns, "shadow.expressions.strict", "http", None).await?;

    // `none` opts the Service out of the default shadow too.
    ns.patch_service(
        "web",
        serde_json::json!({"metadata": {"annotations": {SHADOW: "none"}}}),
    )
    .await?;
    stays_for(Duration::from_secs(5), || async {
        ensure!(
            differences(&pw, &ns, "shadow.membership", "http")
                .await?
                .is_none(),
            "a shadow judged for a Service that opted out"
        );
        Ok(())
    })
    .await?;

    // Through all of it the live membership held and nothing was written.
    expect_endpoints(&ns, "web", by_port([(("http", V4), &all[..])])).await?;
    writes.expect(0, "shadow changes").await?;

    // The counter can count: a live change in the same window is one write.
    let writes = WriteCounter::start(&ns).await?;
    ns.set_ready("p3", false).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &all[..3])])).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    writes.expect(1, "one live change").await?;
    Ok(())
}

/// `portwise check --live` prints both verdicts per pod and port, and
/// writes nothing (it needs only get and list).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_live_prints_live_and_shadow_side_by_side() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "shadow-live").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .annotation(SHADOW, "strict")
            .port("http", 8080),
    )
    .await?;
    ns.create_pod(pod("ready").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .await?;
    ns.create_pod(
        pod("unready")
            .annotation(GROUP_KEY, "g")
            .ready(false)
            .ips(next_ips().v4()),
    )
    .await?;
    // Pods of the group that are not judged are named, with the reason.
    ns.create_pods(vec![
        pod("finished")
            .annotation(GROUP_KEY, "g")
            .phase("Succeeded")
            .ips(next_ips().v4()),
        pod("orphan")
            .annotation(GROUP_KEY, "g")
            .node("a-node-that-is-gone")
            .ips(next_ips().v4()),
        pod("pending").annotation(GROUP_KEY, "g").no_status(),
    ])
    .await?;
    // Another group's pod is not the Service's.
    ns.create_pod(pod("other").annotation(GROUP_KEY, "h").ips(next_ips().v4()))
        .await?;
    let cfg = config_with(
        "podReady",
        "shadow:\n  expressions:\n    strict: {not: podReady}\n",
    );
    let writes = WriteCounter::start(&ns).await?;
    let target = format!("{}/web", ns.name());
    let out = check_live_on(cp, &cfg, &target).await?;
    ensure!(
        out.code == Some(0),
        "exit {:?}: {}{}",
        out.code,
        out.stdout,
        out.stderr
    );
    let rows: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("http "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let row = |pod: &str| rows.iter().find(|r| r[2] == pod).cloned();
    ensure!(rows.len() == 2, "{}", out.stdout);
    ensure!(
        row("ready").is_some_and(|r| r[4] == "include" && r[5] == "exclude" && r[6] == "yes"),
        "{}",
        out.stdout
    );
    ensure!(
        row("unready").is_some_and(|r| r[4] == "exclude" && r[5] == "include" && r[6] == "yes"),
        "{}",
        out.stdout
    );
    ensure!(
        out.stdout.contains("against shadow.expressions.strict")
            && out
                .stdout
                .contains("2 of 2 verdicts differ; nothing was written"),
        "{}",
        out.stdout
    );
    for (pod, reason) in [
        ("finished", "terminal"),
        ("orphan", "node-gone"),
        ("pending", "no-address"),
    ] {
        ensure!(
            out.stdout
                .contains(&format!("pod {pod} is not judged ({reason}): ")),
            "check --live does not say why {pod} is not judged:\n{}",
            out.stdout
        );
    }
    writes.expect(0, "check --live").await?;
    Ok(())
}

/// Issue 24: a shadow whose probes hang never delays what is published.
/// Two Services in one portwise, one with a shadow whose `httpGet` hangs
/// (12 s timeout), one without; a readiness flip in each reaches its slice
/// equally fast. Before shadows ran off the live path, the shadowed
/// Service's flip waited for the hanging shadow to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_shadow_does_not_delay_live_changes() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "shadow-hang").await?;
    let (a, b) = (next_ips(), next_ips());
    let hung = HttpListener::start(a.v4, 8080).await?;
    hung.set_mode(HttpMode::Hang);
    ns.create_service(
        service("shadowed")
            .annotation(GROUP_KEY, "g")
            .annotation(SHADOW, "hangs")
            .port("http", 8080),
    )
    .await?;
    ns.create_service(
        service("plain")
            .annotation(GROUP_KEY, "h")
            .port("http", 8080),
    )
    .await?;
    ns.create_pod(pod("a").annotation(GROUP_KEY, "g").ips(a.v4()))
        .await?;
    ns.create_pod(pod("b").annotation(GROUP_KEY, "h").ips(b.v4()))
        .await?;
    let cfg = config_with(
        "podReady",
        "shadow:\n  expressions:\n    hangs: {httpGet: {path: /healthz, timeout: 12s}}\n",
    );
    let _pw = Portwise::start(&ns, &cfg).await?;
    expect_endpoints(&ns, "shadowed", by_port([(("http", V4), &["a"][..])])).await?;
    expect_endpoints(&ns, "plain", by_port([(("http", V4), &["b"][..])])).await?;
    // The shadow's probe of a is in flight now (it hangs for 12 s).
    wait_for(SETTLE, || async {
        ensure!(hung.request_count() > 0, "the shadow has not probed a yet");
        Ok(())
    })
    .await?;

    let flip = |pod: &'static str, svc: &'static str| {
        let ns = &ns;
        async move {
            let started = std::time::Instant::now();
            ns.set_ready(pod, false).await?;
            expect_endpoints(ns, svc, by_port([(("http", V4), &[][..])])).await?;
            anyhow::Ok(started.elapsed())
        }
    };
    let shadowed = flip("a", "shadowed").await?;
    let plain = flip("b", "plain").await?;
    println!(
        "figure: readiness flip to slice, with a hanging shadow: {} ms; without: {} ms",
        shadowed.as_millis(),
        plain.as_millis()
    );
    // SETTLE-bounded waits poll; a flip held behind the hanging shadow
    // takes most of its 12 s.
    ensure!(
        shadowed < plain + Duration::from_secs(3),
        "the hanging shadow delayed publication: {shadowed:?} against {plain:?} without it"
    );
    Ok(())
}
