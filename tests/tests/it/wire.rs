//! What portwise sends is what the apiserver stores, on every Kubernetes
//! minor the chart supports (issue 47, item 2): portwise is compiled
//! against the newest API, and a field an older apiserver does not have
//! would be dropped (or, behind a gate that is off, cleared) without an
//! error, or refused. The audit log holds both bodies of each write in
//! the namespace `portwise-wire` (tests/src/wire.rs); every field portwise
//! sends must come back as sent, and the apiserver must have sent
//! portwise's client no warning of an unknown field.
//!
//! The Services between them make portwise send every field it can:
//! both address families, hints for zones and nodes (trafficDistribution
//! PreferSameNode), zone and nodeName, appProtocol, hostname (a headless
//! Service the pods name as their subdomain), not-ready endpoints
//! (publishNotReadyAddresses), legacy Endpoints, a warning Event (a
//! Service with a selector), and a Lease (portwise's leader election).
//! Creates, then updates (a readiness flip, the Lease's renewals).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use portwise::ops::leader::{LeaderElector, Timings, identity};
use portwise_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_portwise_sends_is_stored_as_sent() -> Result<()> {
    stored_as_sent_on(ControlPlane::shared().await?).await
}

on_older_minors!(what_portwise_sends_is_stored_as_sent => stored_as_sent_on);

async fn stored_as_sent_on(cp: &'static ControlPlane) -> Result<()> {
    let ns = wire_namespace(cp).await?;
    let n1 = ns.ensure_node("wire-n1", "zone-a").await?;
    let n2 = ns.ensure_node("wire-n2", "zone-b").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .dual_stack()
            .traffic_distribution("PreferSameNode")
            .port_app("http", 8080, "kubernetes.io/h2c")
            .port("metrics", 9090),
    )
    .await?;
    ns.create_service(
        service("peers")
            .annotation(GROUP_KEY, "g")
            .headless()
            .family(V4)
            .publish_not_ready()
            .port("peer", 7000),
    )
    .await?;
    // Served despite its selector, with a warning Event (events.k8s.io).
    ns.create_service(
        service("selected")
            .annotation(GROUP_KEY, "g")
            .selector("app", "nothing-matches")
            .port("http", 8080),
    )
    .await?;
    for (name, node, ready) in [("a", &n1, true), ("b", &n2, true), ("c", &n1, false)] {
        ns.create_pod(
            pod(name)
                .annotation(GROUP_KEY, "g")
                .node(node)
                .hostname(name)
                .subdomain("peers")
                .ready(ready)
                .ips(next_ips().dual()),
        )
        .await?;
    }
    // `podReady` honours the Service's publishNotReadyAddresses, as the
    // native rules do: c is published on peers while not ready.
    let cfg = config_with("podReady", "publishLegacyEndpoints: true\n");
    let _pw = Portwise::start(&ns, &cfg).await?;
    // The user agent of the portwise Portwise::start runs here.
    let agent = format!("portwise/{WIRE_NS}");
    web_serves(&ns, &["a", "b"]).await?;
    // Updates: b leaves, c joins.
    ns.set_ready("b", false).await?;
    ns.set_ready("c", true).await?;
    web_serves(&ns, &["a", "c"]).await?;
    wait_for(SETTLE, || async {
        ensure!(
            !events_for(&ns, "selected", None).await?.is_empty(),
            "no Event for the Service with a selector yet"
        );
        Ok(())
    })
    .await?;
    // Leases: portwise's leader election, as `portwise run --leader-elect`
    // makes it, with portwise's user agent: a create, renewals (updates),
    // and the release.
    let elector = LeaderElector::start(
        cp.client_with_agent(&agent).await?,
        ns.name(),
        "portwise",
        &identity(Some("wire")),
        Timings {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(500),
        },
    )?;
    tokio::time::timeout(SETTLE, elector.subscribe().wait_for(|l| *l))
        .await
        .context("the leader elector did not lead")??;
    // A few renewals, and a few resyncs (2 s each) for anything still in
    // flight to land.
    tokio::time::sleep(Duration::from_secs(5)).await;
    elector.release().await?;

    let writes = wire_writes(cp, &agent)?;
    let count = |resource: &str, verbs: &[&str]| {
        writes
            .iter()
            .filter(|w| w.resource == resource && verbs.contains(&w.verb.as_str()))
            .count()
    };
    // The check must have had writes of each kind to look at.
    let seen = [
        (
            "endpointslices created",
            count("endpointslices", &["create"]),
        ),
        (
            "endpointslices updated",
            count("endpointslices", &["update", "patch"]),
        ),
        (
            "endpoints written",
            count("endpoints", &["create", "update", "patch"]),
        ),
        (
            "events written",
            count("events", &["create", "update", "patch"]),
        ),
        ("leases created", count("leases", &["create"])),
        ("leases updated", count("leases", &["update", "patch"])),
    ];
    for (what, n) in seen {
        ensure!(
            n > 0,
            "no {what} by portwise in the audit log of {} ({} writes in all: {:?})",
            WIRE_NS,
            writes.len(),
            writes
                .iter()
                .map(|w| format!("{} {} {}", w.verb, w.resource, w.name))
                .collect::<Vec<_>>()
        );
    }
    // A field the server does not know never reaches the audit log's
    // request body (it is logged as decoded): the server's warning to
    // portwise's client names it.
    let dropped = field_warnings(&warnings_to(&agent));
    ensure!(
        dropped.is_empty(),
        "the apiserver dropped fields portwise sent:\n  {}",
        dropped.join("\n  ")
    );
    let bad = wire_differences(&writes);
    ensure!(
        bad.is_empty(),
        "the apiserver did not store what portwise sent ({} of {} writes):\n  {}",
        bad.len(),
        writes.len(),
        bad.join("\n  ")
    );
    eprintln!(
        "wire: {} writes, every field stored as sent: {seen:?}",
        writes.len()
    );
    Ok(())
}

/// `web` publishes `pods` on both ports, in both families.
async fn web_serves(ns: &TestNs, pods: &[&str]) -> Result<()> {
    let each = [("http", V4), ("http", V6), ("metrics", V4), ("metrics", V6)];
    expect_endpoints(ns, "web", by_port(each.map(|key| (key, pods)))).await
}
