//! Policies per Service (`policies`, picked by the `portwise.io/membership`
//! annotation): two Services with an `http` port decided differently in one
//! portwise; a Service switching policy; a name the file does not have,
//! which keeps what is published and warns, never applying the default.

use std::time::Duration;

use anyhow::{Result, ensure};
use portwise_tests::*;

pub(crate) const POLICY: &str = "portwise.io/membership";

/// Pods a, b and c of group `g` at the first three of `ips`: a and b
/// ready, c not.
pub(crate) async fn group_of_three(ns: &TestNs, ips: &[PodIps]) -> Result<()> {
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        ns.create_pod(
            pod(name)
                .annotation(GROUP_KEY, "g")
                .ready(i < 2)
                .ips(ips[i].v4()),
        )
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_with_the_same_port_name_are_decided_by_their_own_policies() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "policies").await?;
    // Two Services, each with an `http` port, over the same three pods:
    // a and b are ready, c is not; only a listens on 8080.
    let ips: Vec<_> = (0..3).map(|_| next_ips()).collect();
    let _listener = TcpListener::start(ips[0].v4, 8080).await?;
    for name in ["plain", "probed"] {
        let mut svc = service(name).annotation(GROUP_KEY, "g").port("http", 8080);
        if name == "probed" {
            svc = svc.annotation(POLICY, "dial");
        }
        ns.create_service(svc).await?;
    }
    group_of_three(&ns, &ips).await?;
    let cfg = config_with(
        "podReady",
        "policies:\n  dial: {tcpDial: {timeout: 1s}}\n  everyone: notTerminating\n",
    );
    let mut pw = Portwise::spawn_binary(&ns, &cfg).await?;
    // membership (podReady) for `plain`, the TCP dial for `probed`.
    expect_endpoints(&ns, "plain", by_port([(("http", V4), &["a", "b"][..])])).await?;
    expect_endpoints(&ns, "probed", by_port([(("http", V4), &["a"][..])])).await?;
    let m = pw.scrape().await?;
    for policy in ["membership", "policies.dial"] {
        let checks: f64 = m
            .select("portwise_checks_total", &[("policy", policy)])
            .map(|s| s.value)
            .sum();
        ensure!(checks >= 3.0, "{checks} checks labelled policy={policy}");
    }

    // `plain` switches to another policy: c (not ready, not terminating)
    // joins it at once; `probed` is untouched.
    ns.patch_service(
        "plain",
        serde_json::json!({"metadata": {"annotations": {POLICY: "everyone"}}}),
    )
    .await?;
    expect_endpoints(
        &ns,
        "plain",
        by_port([(("http", V4), &["a", "b", "c"][..])]),
    )
    .await?;
    expect_endpoints(&ns, "probed", by_port([(("http", V4), &["a"][..])])).await?;

    // A typo: nothing published changes, even when a pod changes, and a
    // Warning names the wrong name and the ones the file has.
    ns.patch_service(
        "plain",
        serde_json::json!({"metadata": {"annotations": {POLICY: "evreyone"}}}),
    )
    .await?;
    let warning = newest_event_message(&ns, "plain", "PolicyUnknown").await?;
    ensure!(
        warning.contains("\"evreyone\"") && warning.contains("dial, everyone"),
        "{warning}"
    );
    let writes = WriteCounter::start(&ns).await?;
    ns.set_ready("b", false).await?;
    stays_for(Duration::from_secs(5), || async {
        expect_eq(
            endpoints_by_port(&ns, "plain").await?,
            by_port([(("http", V4), &["a", "b", "c"][..])]),
        )
    })
    .await?;
    writes
        .expect(0, "a Service held by an unknown policy")
        .await?;

    // Fixed: judged again, by the policy it names (b left: not ready, but
    // `everyone` keeps it; back to the default, it goes).
    ns.patch_service(
        "plain",
        serde_json::json!({"metadata": {"annotations": {POLICY: null}}}),
    )
    .await?;
    expect_endpoints(&ns, "plain", by_port([(("http", V4), &["a"][..])])).await?;
    pw.check_running()?;
    Ok(())
}
