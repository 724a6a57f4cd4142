//! Chunking at `maxEndpointsPerSlice`, and placeholders for empty ports.

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use portwise_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_fifty_pods_chunked_by_100() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "chunk").await?;
    ns.create_service(
        service("big")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080)
            .port("spare", 9090),
    )
    .await?;
    let names: Vec<String> = (0..250).map(|i| format!("p{i:03}")).collect();
    ns.create_pods(
        names
            .iter()
            .map(|n| pod(n).annotation(GROUP_KEY, "g").ips(next_ips().v4()))
            .collect(),
    )
    .await?;
    // `spare` is not listed and there is no fallback: it excludes everyone.
    let cfg = config_with(
        "{perPort: {ports: {http: podReady}}}",
        "maxEndpointsPerSlice: 100\n",
    );
    let _pw = Portwise::start(&ns, &cfg).await?;

    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    wait_for(SETTLE * 2, || async {
        expect_eq(
            endpoints_by_port(&ns, "big").await?,
            by_port([(("http", V4), &all[..]), (("spare", V4), &[][..])]),
        )
    })
    .await?;
    slice_invariants(&ns, "big", 100).await?;

    let slices = slices_for(&ns, "big").await?;
    let port_of = |s: &k8s_openapi::api::discovery::v1::EndpointSlice| {
        s.ports
            .iter()
            .flatten()
            .next()
            .and_then(|p| p.name.clone())
            .unwrap_or_default()
    };
    let http: Vec<usize> = slices
        .iter()
        .filter(|s| port_of(s) == "http")
        .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
        .collect();
    // 250 endpoints need exactly three slices of at most 100.
    ensure!(http.len() == 3, "http slices sizes {http:?}");
    ensure!(
        http.iter().all(|n| *n <= 100) && http.iter().sum::<usize>() == 250,
        "{http:?}"
    );
    // The empty port is published as exactly one placeholder slice.
    let spare: Vec<_> = slices.iter().filter(|s| port_of(s) == "spare").collect();
    ensure!(
        spare.len() == 1,
        "spare: {} slices, expected one placeholder",
        spare.len()
    );
    ensure!(
        spare[0].endpoints.as_ref().is_none_or(Vec::is_empty),
        "placeholder has endpoints"
    );
    Ok(())
}

/// A placeholder is replaced, not joined by a second slice, once the port
/// gains a member; and it comes back when the last member leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_comes_and_goes() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "placeholder").await?;
    let _pw = Scenario::new(&ns)
        .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .start()
        .await?;

    let one_slice = |members: &'static [&'static str]| {
        let ns = &ns;
        move || async move {
            let slices = slices_for(ns, "web").await?;
            ensure!(slices.len() == 1, "{} slices for one port", slices.len());
            let got: BTreeSet<String> = slices[0]
                .endpoints
                .iter()
                .flatten()
                .filter_map(|e| e.target_ref.as_ref()?.name.clone())
                .collect();
            expect_eq(got, members.iter().map(|s| s.to_string()).collect())
        }
    };
    wait_for(SETTLE, one_slice(&[])).await?;
    ns.create_pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .await?;
    wait_for(SETTLE, one_slice(&["a"])).await?;
    ns.set_ready("a", false).await?;
    wait_for(SETTLE, one_slice(&[])).await?;
    Ok(())
}
