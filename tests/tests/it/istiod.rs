//! A real istiod (pilot-discovery, sidecar mode; tests/src/istiod.rs)
//! consuming portwise's slices: for every Service port, the endpoints istiod
//! holds (its `/debug/endpointShardz`, what it would send sidecars over EDS)
//! must be exactly that port's members, by pod address and target port, and
//! follow readiness and termination.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, ensure};
use portwise_tests::{
    istiod::{Health, IstioEndpoint, Istiod},
    *,
};
use serde_json::json;

/// The test is to return at once: ./test deferred istiod's build.
fn skipped(test: &str) -> bool {
    deferred::skip(&["istiod"], &format!("istiod::{test}"))
}

/// Each pod's IPv4 address.
async fn pod_ips(ns: &TestNs, pods: &[&str]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for p in pods {
        let pod = ns.get_pod(p).await?;
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .with_context(|| format!("pod {p} has no IP"))?;
        out.insert(p.to_string(), ip);
    }
    Ok(out)
}

/// What istiod must hold: per port (name, target port), its member pods,
/// each Healthy unless listed in `terminating`.
fn expected(
    ips: &BTreeMap<String, String>,
    ports: &[(&str, u32, &[&str])],
    terminating: &[&str],
) -> Vec<IstioEndpoint> {
    let mut out: Vec<IstioEndpoint> = ports
        .iter()
        .flat_map(|(name, port, pods)| {
            pods.iter().map(|pod| IstioEndpoint {
                port_name: name.to_string(),
                address: ips[*pod].clone(),
                port: *port,
                health: if terminating.contains(pod) {
                    Health::Terminating
                } else {
                    Health::Healthy
                },
            })
        })
        .collect();
    out.sort();
    out
}

/// Waits until istiod holds exactly `want` for `svc`, and checks that it is
/// also what the slices say, endpoint by endpoint (one per address, Service
/// port name and slice port; health from the slice's conditions).
async fn expect_istiod(
    istiod: &Istiod,
    ns: &TestNs,
    svc: &str,
    want: Vec<IstioEndpoint>,
) -> Result<()> {
    let got = wait_for(SETTLE, || async {
        let got = istiod.endpoints(ns.name(), svc).await?;
        expect_eq(&got, &want)?;
        Ok(got)
    })
    .await
    .with_context(|| {
        format!(
            "istiod's endpoints of {svc}; istiod log:\n{}",
            istiod.log_tail()
        )
    })?;
    let mut from_slices: Vec<IstioEndpoint> = endpoint_views(ns, svc)
        .await?
        .into_iter()
        .flat_map(|v| {
            let health = match (v.ready, v.terminating) {
                (Some(false), Some(true)) => Health::Terminating,
                (Some(false), _) => Health::Unhealthy,
                _ => Health::Healthy,
            };
            v.addresses.into_iter().map(move |address| IstioEndpoint {
                port_name: v.port_name.clone(),
                address,
                port: v.port.unwrap_or_default() as u32,
                health,
            })
        })
        .collect();
    from_slices.sort();
    expect_eq(&got, &from_slices).context("istiod against the slices")
}

fn figure(what: &str, took: std::time::Duration) {
    eprintln!("figure: {what}: {} ms", took.as_millis());
}

/// The seed example (http {a,b,c}, https {b,c,d}) as istiod sees it: each
/// port's endpoints are that port's members; a pod turning unready leaves
/// both ports, and comes back; a terminating member (still Ready, so still
/// a member, published `ready: false, terminating: true`) is held as
/// Terminating on both its ports, not sent as healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_endpoints_are_each_ports_members() -> Result<()> {
    const TEST: &str = "istiod_endpoints_are_each_ports_members";
    if skipped(TEST) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "istiod-seed").await?;
    let _pw = seed_scenario_with(
        &ns,
        service("my-service")
            .annotation(GROUP_KEY, "my-group")
            .port("http", 8080)
            .port("https", 8443),
        |_, pod| pod.ips(next_ips().v4()).held(),
    )
    .expect(
        "my-service",
        seed_slices(&["a", "b", "c"], &["b", "c", "d"]),
    )
    .start()
    .await?;
    let istiod = Istiod::start(cp).await?;
    figure("istiod ready after start", istiod.ready_after);
    let ips = pod_ips(&ns, &["a", "b", "c", "d"]).await?;
    // What istiod must hold for the seed's two ports.
    let seed = |http: &[&str], https: &[&str], terminating: &[&str]| {
        expected(
            &ips,
            &[("http", 8080, http), ("https", 8443, https)],
            terminating,
        )
    };
    let all: (&[&str], &[&str]) = (&["a", "b", "c"], &["b", "c", "d"]);

    expect_istiod(&istiod, &ns, "my-service", seed(all.0, all.1, &[])).await?;
    let shardz = istiod.endpoint_shardz().await?;
    let host = format!("my-service.{}.svc.cluster.local", ns.name());
    eprintln!(
        "endpointShardz[{host}]: {}",
        serde_json::to_string(&shardz[&host]).unwrap_or_default()
    );

    // Readiness: b is no member while unready, on either port.
    let t0 = std::time::Instant::now();
    ns.set_ready("b", false).await?;
    let without_b = seed(&["a", "c"], &["c", "d"], &[]);
    expect_istiod(&istiod, &ns, "my-service", without_b).await?;
    figure("readiness flip to istiod's endpoints", t0.elapsed());
    ns.set_ready("b", true).await?;
    expect_istiod(&istiod, &ns, "my-service", seed(all.0, all.1, &[])).await?;

    // Termination: c stays Ready, so stays a member of both ports, as
    // terminating; istiod keeps it, marked Terminating (no new traffic).
    ns.terminate_pod("c").await?;
    expect_istiod(&istiod, &ns, "my-service", seed(all.0, all.1, &["c"])).await?;
    // Gone for good: gone from istiod.
    ns.release_pod("c").await?;
    let without_c = seed(&["a", "b"], &["b", "d"], &[]);
    expect_istiod(&istiod, &ns, "my-service", without_c).await?;
    for p in ["a", "b", "d"] {
        ns.release_pod(p).await?;
    }
    Ok(())
}

/// Two Service ports on one target port (80 and 81 -> 8080): a pod backing
/// both is published once, in a slice listing both ports; istiod, which
/// keys endpoints by (address, Service port name), must still give each
/// port exactly its members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_splits_a_shared_target_port_by_service_port() -> Result<()> {
    const TEST: &str = "istiod_splits_a_shared_target_port_by_service_port";
    if skipped(TEST) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "istiod-shared").await?;
    let mk = |name: &str, ports: &str| {
        pod(name)
            .annotation(GROUP_KEY, "g")
            .annotation(PORTS_KEY, ports)
            .container_port("web", 8080, "TCP")
            .ips(next_ips().v4())
    };
    let _pw = Scenario::new(&ns)
        .service(
            service("shared")
                .annotation(GROUP_KEY, "g")
                .port_to("http", 80, json!(8080))
                .port_to("alt", 81, json!(8080)),
        )
        .pods([mk("both", "http,alt"), mk("h", "http"), mk("x", "alt")])
        .config(&config(SEED_MEMBERSHIP))
        .expect(
            "shared",
            by_port([
                (("http", V4), &["both", "h"][..]),
                (("alt", V4), &["both", "x"][..]),
            ]),
        )
        .start()
        .await?;
    // The case this test is about: `both` is in one slice with both ports.
    let shared: BTreeSet<String> = endpoint_views(&ns, "shared")
        .await?
        .into_iter()
        .filter(|v| v.pod == "both")
        .map(|v| v.slice)
        .collect();
    ensure!(
        shared.len() == 1,
        "`both` should be published once, in one slice listing both ports: {shared:?}"
    );
    let istiod = Istiod::start(cp).await?;
    let ips = pod_ips(&ns, &["both", "h", "x"]).await?;
    expect_istiod(
        &istiod,
        &ns,
        "shared",
        expected(
            &ips,
            &[
                ("alt", 8080, &["both", "x"]),
                ("http", 8080, &["both", "h"]),
            ],
            &[],
        ),
    )
    .await?;
    // `both` leaves `alt` only: it moves to the http-only slice.
    ns.annotate_pod("both", PORTS_KEY, Some("http")).await?;
    expect_istiod(
        &istiod,
        &ns,
        "shared",
        expected(
            &ips,
            &[("alt", 8080, &["x"]), ("http", 8080, &["both", "h"])],
            &[],
        ),
    )
    .await?;
    Ok(())
}
