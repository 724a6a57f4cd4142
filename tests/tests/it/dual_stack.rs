//! Address families: one slice set per family in `spec.ipFamilies`, each
//! holding only the pods that have an address of that family.

use anyhow::Result;
use portwise_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_service_gets_a_slice_set_per_family() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "dual").await?;
    let a = next_ips();
    let b = next_ips();
    let c = next_ips();
    let d = next_ips();
    let _pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .dual_stack()
                .port("http", 8080),
        )
        .pods(
            [
                ("a", a.dual(), true),
                ("b", b.v4(), true),
                ("c", c.v6(), true),
                ("d", d.dual(), false),
            ]
            .map(|(name, ips, ready)| pod(name).annotation(GROUP_KEY, "g").ips(ips).ready(ready)),
        )
        .expect(
            "web",
            by_port([
                (("http", V4), &["a", "b"][..]),
                (("http", V6), &["a", "c"][..]),
            ]),
        )
        .start()
        .await?;
    // Each family's slice carries that family's address of the pod.
    expect_eq(
        endpoint_of(&ns, "web", "http", V4, "a").await?.addresses,
        vec![a.v4.to_string()],
    )?;
    expect_eq(
        endpoint_of(&ns, "web", "http", V6, "a").await?.addresses,
        vec![a.v6.to_string()],
    )?;
    expect_eq(
        endpoint_of(&ns, "web", "http", V6, "c").await?.addresses,
        vec![c.v6.to_string()],
    )?;
    slice_invariants(&ns, "web", 100).await?;

    // d becomes ready: it joins both families at once.
    ns.set_ready("d", true).await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([
            (("http", V4), &["a", "b", "d"][..]),
            (("http", V6), &["a", "c", "d"][..]),
        ]),
    )
    .await?;
    Ok(())
}

/// A single-stack IPv6 Service publishes only IPv6 slices, even though the
/// pods also have IPv4 addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_only_service_publishes_only_ipv6() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "v6only").await?;
    let _pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .family("IPv6")
                .port("http", 8080),
        )
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().dual()))
        .pod(pod("b").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .expect("web", by_port([(("http", V6), &["a"][..])]))
        .start()
        .await?;
    Ok(())
}
