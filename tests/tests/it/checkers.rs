//! Every built-in checker and combinator, declared in the config file, on
//! one Service: each port routes to a different expression.

use anyhow::Result;
use portwise_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_in_checkers_from_config() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "checkers").await?;
    let node = ns.ensure_node("n1", "zone-a").await?;
    let mut svc = service("web").annotation(GROUP_KEY, "g");
    for i in 1..=9 {
        svc = svc.port(&format!("p{i}"), 8000 + i);
    }
    ns.create_service(svc).await?;
    let g = |name: &str| {
        pod(name)
            .annotation(GROUP_KEY, "g")
            .node(&node)
            .held()
            .ips(next_ips().v4())
    };
    ns.create_pod(g("ready")).await?;
    ns.create_pod(g("unready").ready(false)).await?;
    ns.create_pod(g("leaving")).await?;
    ns.terminate_pod("leaving").await?;
    ns.create_pod(g("listed").annotation(PORTS_KEY, " p3 , p4 "))
        .await?;

    let membership = "{perPort: {ports: {\
        p1: include, \
        p2: exclude, \
        p3: {portNames: {annotation: port-mapper.example.com/ports}}, \
        p4: {any: [{not: podReady}, {portNames: {annotation: port-mapper.example.com/ports}}]}, \
        p5: {not: podReady}, \
        p6: {all: [podReady, notTerminating]}, \
        p7: {not: abstain}, \
        p8: {all: []}}}}";
    // p9 is not listed and there is no fallback: exclude.
    let _pw = Portwise::start(&ns, &config(membership)).await?;

    let everyone = &["leaving", "listed", "ready", "unready"][..];
    expect_endpoints(
        &ns,
        "web",
        by_port([
            (("p1", V4), everyone),
            (("p2", V4), &[][..]),
            (("p3", V4), &["listed"][..]),
            (("p4", V4), &["listed", "unready"][..]),
            (("p5", V4), &["unready"][..]),
            (("p6", V4), &["listed", "ready"][..]),
            (("p7", V4), &[][..]),
            (("p8", V4), everyone),
            (("p9", V4), &[][..]),
        ]),
    )
    .await?;
    slice_invariants(&ns, "web", 100).await?;
    Ok(())
}

/// `perPort` with a fallback routes unlisted ports to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_port_fallback() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "fallback").await?;
    let _pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .port("http", 80)
                .port("admin", 81)
                .port("metrics", 82),
        )
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .pod(
            pod("b")
                .annotation(GROUP_KEY, "g")
                .ready(false)
                .ips(next_ips().v4()),
        )
        .config(&config(
            "{perPort: {ports: {admin: exclude}, fallback: include}}",
        ))
        .start()
        .await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([
            (("http", V4), &["a", "b"][..]),
            (("admin", V4), &[][..]),
            (("metrics", V4), &["a", "b"][..]),
        ]),
    )
    .await?;
    Ok(())
}
