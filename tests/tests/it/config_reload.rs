//! The config file changes while portwise runs (issue 48), the way the
//! kubelet updates a mounted ConfigMap (`Portwise::swap_config`): a valid
//! new file applies without a restart and without dropping what is
//! published; an invalid one is refused (the log, the
//! `portwise_config_last_reload_successful` gauge, a Warning Event on
//! portwise's Pod) and the running config keeps working.

use anyhow::{Result, ensure};
use portwise_tests::*;

async fn reload_gauge(pw: &Portwise) -> Result<Option<f64>> {
    pw.scrape()
        .await?
        .value("portwise_config_last_reload_successful", &[])
}

/// Fails when a changed file needs a restart (the first swap would not
/// apply), when a broken file stops the running config (b would not join
/// after it), or when the refusal is not reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_swap_applies_and_a_broken_one_is_refused_while_the_old_keeps_working()
-> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "reload").await?;
    // a, b ready; only a listens on 8080 until later.
    let ips: Vec<_> = (0..2).map(|_| next_ips()).collect();
    let _a = TcpListener::start(ips[0].v4, 8080).await?;
    ns.create_service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    for (i, name) in ["a", "b"].iter().enumerate() {
        ns.create_pod(pod(name).annotation(GROUP_KEY, "g").ips(ips[i].v4()))
            .await?;
    }
    // portwise's own Pod, for its Events.
    ns.create_pod(pod("portwise-self")).await?;
    let mut pw = Portwise::builder(cp)
        .namespace(ns.name())
        .config(&config_with("podReady", ""))
        .env("POD_NAME", "portwise-self")
        .env("POD_NAMESPACE", ns.name())
        .binary()
        .start()
        .await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;
    ensure!(reload_gauge(&pw).await? == Some(1.0));

    // A valid change: applied, no restart.
    pw.swap_config(&config_with("{tcpDial: {timeout: 1s}}", ""))?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;
    pw.wait_for_log("the config file changed: applying it", SETTLE)
        .await?;

    // A broken file: refused, reported, the running config kept.
    pw.swap_config(&config_with("{tcpDial: {timeout: 0s}}", ""))?;
    wait_for(SETTLE, || async {
        ensure!(reload_gauge(&pw).await? == Some(0.0), "not refused yet");
        Ok(())
    })
    .await?;
    let said = newest_event_message(&ns, "portwise-self", "ConfigReloadFailed").await?;
    ensure!(
        said.contains("membership.tcpDial.timeout")
            && said.contains("running configuration is kept"),
        "{said}"
    );
    // ... and it still judges: b starts listening and joins.
    let _b = TcpListener::start(ips[1].v4, 8080).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;

    // Fixed: applied, the gauge says so.
    pw.swap_config(&config_with(
        "{all: [podReady, {tcpDial: {timeout: 1s}}]}",
        "",
    ))?;
    wait_for(SETTLE, || async {
        ensure!(reload_gauge(&pw).await? == Some(1.0), "not applied yet");
        Ok(())
    })
    .await?;
    ns.set_ready("b", false).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;
    // One process all along.
    pw.check_running()?;
    Ok(())
}
