//! `publishLegacyEndpoints`: v1 Endpoints next to the slices, addresses
//! grouped by the exact set of ports they serve, at most 1000 addresses
//! with the over-capacity annotation, labelled so the mirroring controller
//! does not copy them back into slices.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Endpoints;
use portwise_tests::*;

const SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";

/// port-name set -> pod names, from an Endpoints object's subsets.
fn subsets(ep: &Endpoints) -> BTreeMap<BTreeSet<String>, BTreeSet<String>> {
    let mut out: BTreeMap<BTreeSet<String>, BTreeSet<String>> = BTreeMap::new();
    for s in ep.subsets.iter().flatten() {
        let ports: BTreeSet<String> = s
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.name.clone())
            .collect();
        let pods = s.addresses.iter().flatten().map(|a| {
            a.target_ref
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_else(|| a.ip.clone())
        });
        out.entry(ports).or_default().extend(pods);
    }
    out
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_endpoints_grouped_by_port_set() -> Result<()> {
    grouped_by_port_set_on(ControlPlane::shared().await?).await
}

// The Kubernetes matrix: v1 Endpoints (deprecated since 1.33, still served
// by every minor the chart supports) on 1.35 and 1.36 too.
on_older_minors!(legacy_endpoints_grouped_by_port_set => grouped_by_port_set_on);

async fn grouped_by_port_set_on(cp: &'static ControlPlane) -> Result<()> {
    let ns = TestNs::new(cp, "legacy").await?;
    ns.create_service(
        service("my-service")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080)
            .port("https", 8443),
    )
    .await?;
    for (name, ports) in [
        ("a", "http"),
        ("b", "http,https"),
        ("c", "http,https"),
        ("d", "https"),
    ] {
        ns.create_pod(
            pod(name)
                .annotation(GROUP_KEY, "g")
                .annotation(PORTS_KEY, ports)
                .ips(next_ips().v4()),
        )
        .await?;
    }
    let cfg = config_with(
        "{all: [podReady, {portNames: {annotation: port-mapper.example.com/ports}}]}",
        "publishLegacyEndpoints: true\n",
    );
    let _pw = Portwise::start(&ns, &cfg).await?;

    wait_for(SETTLE, || async {
        let ep = ns
            .api::<Endpoints>()
            .get_opt("my-service")
            .await?
            .context("no Endpoints")?;
        let labels = ep.metadata.labels.clone().unwrap_or_default();
        ensure!(
            labels.get(SKIP_MIRROR).map(String::as_str) == Some("true"),
            "labels {labels:?}"
        );
        expect_eq(
            subsets(&ep),
            BTreeMap::from([
                (set(&["http"]), set(&["a"])),
                (set(&["http", "https"]), set(&["b", "c"])),
                (set(&["https"]), set(&["d"])),
            ]),
        )
    })
    .await?;
    // The mirroring controller leaves them alone.
    stays_for(Duration::from_secs(5), || async {
        let mirrored = slices_managed_by(&ns, "my-service", Some(MIRROR_MANAGER)).await?;
        ensure!(mirrored.is_empty(), "mirrored slices: {mirrored:?}");
        Ok(())
    })
    .await?;

    // Membership changes reach the Endpoints too.
    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    ns.delete_pod("d").await?;
    wait_for(SETTLE, || async {
        let ep = ns.api::<Endpoints>().get("my-service").await?;
        expect_eq(
            subsets(&ep),
            BTreeMap::from([(set(&["http", "https"]), set(&["a", "b", "c"]))]),
        )
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_endpoints_capped_at_1000() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "legacy-cap").await?;
    ns.create_service(service("big").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    let names: Vec<String> = (0..1005).map(|i| format!("p{i:04}")).collect();
    ns.create_pods(
        names
            .iter()
            .map(|n| pod(n).annotation(GROUP_KEY, "g").ips(next_ips().v4()))
            .collect(),
    )
    .await?;
    let _pw = Portwise::start(
        &ns,
        &config_with("podReady", "publishLegacyEndpoints: true\n"),
    )
    .await?;

    wait_for(SETTLE * 4, || async {
        let ep = ns
            .api::<Endpoints>()
            .get_opt("big")
            .await?
            .context("no Endpoints")?;
        let n: usize = ep
            .subsets
            .iter()
            .flatten()
            .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
            .sum();
        expect_eq(n, 1000)?;
        let ann = ep.metadata.annotations.clone().unwrap_or_default();
        ensure!(
            ann.get(OVER_CAPACITY).map(String::as_str) == Some("truncated"),
            "annotations {ann:?}"
        );
        Ok(())
    })
    .await?;
    // The slices are not capped.
    let total: usize = endpoints_by_port(&ns, "big")
        .await?
        .values()
        .map(BTreeSet::len)
        .sum();
    expect_eq(total, 1005)?;
    Ok(())
}

/// An Endpoints object another manager owns is neither adopted nor deleted
/// (nor is it the native controllers' leftover to clean up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_endpoints_left_alone() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "legacy-foreign").await?;
    ns.create_service(
        service("my-service")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080),
    )
    .await?;
    let foreign: Endpoints = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "my-service", "labels": {
            "endpoints.kubernetes.io/managed-by": "someone-else.example.com",
            SKIP_MIRROR: "true",
        }},
        "subsets": [{
            "addresses": [{ "ip": next_ips().v4.to_string() }],
            "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        }],
    }))?;
    let created = ns
        .api::<Endpoints>()
        .create(&kube::api::PostParams::default(), &foreign)
        .await?;
    ns.create_pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .await?;
    let cfg = config_with(
        "podReady",
        "publishLegacyEndpoints: true\nnativeCleanup: true\n",
    );
    let _pw = Portwise::start(&ns, &cfg).await?;

    expect_endpoints(&ns, "my-service", by_port([(("http", V4), &["a"][..])])).await?;
    stays_for(Duration::from_secs(8), || async {
        let now = ns
            .api::<Endpoints>()
            .get_opt("my-service")
            .await?
            .context("foreign Endpoints deleted")?;
        expect_eq(
            now.metadata.resource_version,
            created.metadata.resource_version.clone(),
        )
    })
    .await?;
    Ok(())
}

async fn our_endpoints_published(ns: &TestNs, name: &str, pods: &[&str]) -> Result<()> {
    wait_for(SETTLE, || async {
        let ep = ns
            .api::<Endpoints>()
            .get_opt(name)
            .await?
            .context("no Endpoints")?;
        let all: BTreeSet<String> = subsets(&ep).into_values().flatten().collect();
        expect_eq(all, set(pods))
    })
    .await
}

async fn endpoints_gone(ns: &TestNs, name: &str) -> Result<()> {
    wait_for(SETTLE, || async {
        let ep = ns.api::<Endpoints>().get_opt(name).await?;
        ensure!(ep.is_none(), "Endpoints {name} still there: {ep:?}");
        Ok(())
    })
    .await
}

/// Issue 12: turning `publishLegacyEndpoints` off removes the Endpoints
/// portwise wrote, also across a restart (the new process never wrote it),
/// while the slices stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_legacy_endpoints_off_removes_ours() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "legacy-off").await?;
    ns.create_service(
        service("my-service")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080),
    )
    .await?;
    ns.create_pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .await?;
    let mut pw = Portwise::start(
        &ns,
        &config_with("podReady", "publishLegacyEndpoints: true\n"),
    )
    .await?;
    our_endpoints_published(&ns, "my-service", &["a"]).await?;

    pw.restart_with(&config("podReady")).await?;
    endpoints_gone(&ns, "my-service").await?;
    expect_endpoints(&ns, "my-service", by_port([(("http", V4), &["a"][..])])).await?;
    Ok(())
}

/// Issue 12: a Service that leaves portwise's management (loses its key,
/// or turns ExternalName) loses portwise's slices and its legacy Endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_that_leave_lose_slices_and_legacy_endpoints() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "legacy-leave").await?;
    for name in ["loses-key", "turns-external"] {
        ns.create_service(service(name).annotation(GROUP_KEY, "g").port("http", 8080))
            .await?;
    }
    ns.create_pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .await?;
    let _pw = Portwise::start(
        &ns,
        &config_with("podReady", "publishLegacyEndpoints: true\n"),
    )
    .await?;
    for name in ["loses-key", "turns-external"] {
        our_endpoints_published(&ns, name, &["a"]).await?;
        expect_endpoints(&ns, name, by_port([(("http", V4), &["a"][..])])).await?;
    }

    ns.patch_service(
        "loses-key",
        serde_json::json!({"metadata": {"annotations": {GROUP_KEY: null}}}),
    )
    .await?;
    ns.patch_service(
        "turns-external",
        serde_json::json!({"spec": {"type": "ExternalName", "externalName": "example.com",
            "clusterIP": null, "clusterIPs": null, "ipFamilies": null, "ipFamilyPolicy": null}}),
    )
    .await?;
    for name in ["loses-key", "turns-external"] {
        endpoints_gone(&ns, name).await?;
        wait_for(SETTLE, || async {
            let left = slices_for(&ns, name).await?;
            ensure!(left.is_empty(), "{name} still has {} slices", left.len());
            Ok(())
        })
        .await?;
    }
    Ok(())
}
