//! Endpoint conditions: terminating members, and publishNotReadyAddresses.

use anyhow::{Result, ensure};
use portwise_tests::*;

fn conditions(e: &EndpointView) -> (Option<bool>, Option<bool>, Option<bool>) {
    (e.ready, e.serving, e.terminating)
}

/// A member that starts terminating stays published as
/// `ready: false, serving: true, terminating: true` while it is Ready, and a
/// `notTerminating` checker takes it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_pod() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "terminating").await?;
    let node = ns.ensure_node("n1", "zone-a").await?;
    let mut pw = Scenario::new(&ns)
        .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        // nodeName + finalizer: a delete leaves the pod terminating.
        .pods(["a", "b"].map(|name| {
            pod(name)
                .annotation(GROUP_KEY, "g")
                .node(&node)
                .held()
                .ips(next_ips().v4())
        }))
        .start()
        .await?;

    wait_for(SETTLE, || async {
        // Upstream sets all three conditions explicitly.
        let b = endpoint_of(&ns, "web", "http", V4, "b").await?;
        expect_eq(conditions(&b), (Some(true), Some(true), Some(false)))
    })
    .await?;

    ns.terminate_pod("b").await?;
    ensure!(
        ns.get_pod("b").await?.metadata.deletion_timestamp.is_some(),
        "b is not terminating"
    );
    wait_for(SETTLE, || async {
        let b = endpoint_of(&ns, "web", "http", V4, "b").await?;
        expect_eq(conditions(&b), (Some(false), Some(true), Some(true)))?;
        let a = endpoint_of(&ns, "web", "http", V4, "a").await?;
        expect_eq(conditions(&a), (Some(true), Some(true), Some(false)))
    })
    .await?;

    // notTerminating: the terminating pod leaves.
    pw.restart_with(&config("{all: [podReady, notTerminating]}"))
        .await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;

    // With podReady alone again, a terminating pod that is no longer Ready
    // fails the checker and is not published either.
    pw.restart_with(&config("podReady")).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;
    ns.set_ready("b", false).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;

    // Finally gone for good.
    ns.release_pod("b").await?;
    wait_for(SETTLE, || async {
        ensure!(
            ns.api::<k8s_openapi::api::core::v1::Pod>()
                .get_opt("b")
                .await?
                .is_none(),
            "b still exists"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// Two Services on one group. Conditions follow membership, as
/// semantics.md words them: a member is ready and serving; a terminating
/// member is `ready: false, serving: true, terminating: true`; and
/// `publishNotReadyAddresses` makes every member ready, with `serving` the
/// pod's own Ready condition. The pod's own Ready
/// condition matters only through the checker (here `portNames`, which
/// ignores it), so an unready pod the checker includes is published ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_not_ready_addresses() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "pnra").await?;
    let node = ns.ensure_node("n1", "zone-a").await?;
    ns.create_service(
        service("plain")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080),
    )
    .await?;
    ns.create_service(
        service("pnra")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080)
            .publish_not_ready(),
    )
    .await?;
    let g = |name: &str| {
        pod(name)
            .annotation(GROUP_KEY, "g")
            .annotation(PORTS_KEY, "http")
            .node(&node)
            .held()
            .ips(next_ips().v4())
    };
    ns.create_pod(g("ready")).await?;
    ns.create_pod(g("unready").ready(false)).await?;
    ns.create_pod(g("leaving")).await?;
    ns.terminate_pod("leaving").await?;
    ns.create_pod(g("leaving-unready").ready(false)).await?;
    ns.terminate_pod("leaving-unready").await?;
    let _pw = Portwise::start(
        &ns,
        &config("{portNames: {annotation: port-mapper.example.com/ports}}"),
    )
    .await?;

    let (t, f) = (Some(true), Some(false));
    wait_for(SETTLE, || async {
        let got = |views: Vec<EndpointView>| {
            views
                .iter()
                .map(|e| (e.pod.clone(), conditions(e)))
                .collect::<Vec<_>>()
        };
        expect_eq(
            got(endpoint_views(&ns, "plain").await?),
            vec![
                ("leaving".into(), (f, t, t)),
                ("leaving-unready".into(), (f, t, t)),
                ("ready".into(), (t, t, f)),
                ("unready".into(), (t, t, f)),
            ],
        )?;
        expect_eq(
            got(endpoint_views(&ns, "pnra").await?),
            // Every member ready; serving is the pod's own Ready condition
            // there, as from the native controller.
            vec![
                ("leaving".into(), (t, t, t)),
                ("leaving-unready".into(), (t, f, t)),
                ("ready".into(), (t, t, f)),
                ("unready".into(), (t, f, f)),
            ],
        )
    })
    .await?;
    Ok(())
}
