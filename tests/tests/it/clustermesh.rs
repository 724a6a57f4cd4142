//! Cilium ClusterMesh's export (clustermesh-apiserver v1.20.2,
//! tests/src/clustermesh.rs) of portwise's slices: what the other clusters
//! of a mesh are told about a global colocated Service. Each backend
//! address is exported once, with the Service ports it serves, so a pod
//! that backs several ports must be exported with all of them.
//!
//! ClusterMesh builds a backend's ports from the one slice that lists it
//! (`Backends[addr]` is overwritten per slice): portwise's native-shaped
//! layout, one slice per address and family listing every port the pod
//! backs, is what makes that right. [`old_layout_loses_ports`] is the
//! negative control: slices in portwise's former per-port layout, written
//! by hand, fail the same check.

use std::net::IpAddr;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::{core::v1::Pod, discovery::v1::EndpointSlice};
use kube::{Api, api::PostParams};
use portwise_tests::{
    clustermesh::{ClusterMeshApiserver, ClusterService, GLOBAL, check_backends},
    *,
};
use serde_json::json;

/// The test is to return at once: ./test deferred Cilium's builds.
fn skipped(test: &str) -> bool {
    deferred::skip(&["cilium", "clustermesh"], &format!("clustermesh::{test}"))
}

async fn pod_ip(ns: &TestNs, name: &str) -> Result<String> {
    let pod: Pod = ns.get_pod(name).await?;
    let ip = pod
        .status
        .and_then(|s| s.pod_ip)
        .with_context(|| format!("pod {name} has no IP"))?;
    Ok(ip)
}

/// Waits until `ns/my-service` is exported and passes [`check_backends`]
/// against `want` (pod, address, ports); the last failure otherwise.
async fn expect_exported(
    mesh: &ClusterMeshApiserver,
    ns: &str,
    want: &[(&str, String, &[&str])],
) -> Result<ClusterService> {
    let checked = wait_for(SETTLE, || async {
        let Some(cs) = mesh.exported(ns, "my-service").await? else {
            bail!("{} is not in etcd", mesh.service_key(ns, "my-service"));
        };
        check_backends(&cs, want)?;
        Ok(cs)
    })
    .await;
    checked.map_err(|e| {
        anyhow::anyhow!(
            "{e:#}\n(clustermesh-apiserver log, last lines:\n{})",
            mesh.log_tail()
        )
    })
}

/// The seed example (http {a,b,c}, https {b,c,d}) as a global Service:
/// ClusterMesh exports b and c with http and https, a with http only, d
/// with https only. Then a joins https (it moves to b and c's slice) and
/// d leaves: the export follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_every_port_a_pod_backs() -> Result<()> {
    if skipped("exports_every_port_a_pod_backs") {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "mesh-seed").await?;
    let _pw = seed_scenario_with(
        &ns,
        service("my-service")
            .annotation(GROUP_KEY, "my-group")
            .annotation(GLOBAL, "true")
            .port("http", 8080)
            .port("https", 8443),
        |_, pod| pod.ips(next_ips().v4()),
    )
    .expect(
        "my-service",
        seed_slices(&["a", "b", "c"], &["b", "c", "d"]),
    )
    .start()
    .await?;
    let mesh = ClusterMeshApiserver::start(cp, "pw-mesh-seed", 11).await?;
    let (a, b, c, d) = (
        pod_ip(&ns, "a").await?,
        pod_ip(&ns, "b").await?,
        pod_ip(&ns, "c").await?,
        pod_ip(&ns, "d").await?,
    );
    let both: &[&str] = &["http", "https"];

    let cs = expect_exported(
        &mesh,
        ns.name(),
        &[
            ("a", a.clone(), &["http"]),
            ("b", b.clone(), both),
            ("c", c.clone(), both),
            ("d", d.clone(), &["https"]),
        ],
    )
    .await?;
    // The target ports travel with the names.
    for ports in cs.backends.values() {
        for (name, l4) in ports {
            let want = if name == "http" { 8080 } else { 8443 };
            ensure!(
                l4.port == want && l4.protocol == "TCP",
                "{name} exported as {l4:?}"
            );
        }
    }

    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    expect_exported(
        &mesh,
        ns.name(),
        &[
            ("a", a.clone(), both),
            ("b", b.clone(), both),
            ("c", c.clone(), both),
            ("d", d.clone(), &["https"]),
        ],
    )
    .await?;

    ns.delete_pod("d").await?;
    expect_exported(
        &mesh,
        ns.name(),
        &[("a", a, both), ("b", b, both), ("c", c, both)],
    )
    .await?;
    Ok(())
}

/// The negative control: the seed's slices in portwise's former per-port
/// layout (`my-service-http` {a,b,c}, `my-service-https` {b,c,d}), written
/// by hand with no portwise running. ClusterMesh exports b and c with one
/// port each, so [`check_backends`] must fail, naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_layout_loses_ports() -> Result<()> {
    if skipped("old_layout_loses_ports") {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "mesh-old").await?;
    ns.create_service(
        service("my-service")
            .annotation(GLOBAL, "true")
            .port("http", 8080)
            .port("https", 8443),
    )
    .await?;
    let ip = || IpAddr::from(next_ips().v4).to_string();
    let (a, b, c, d) = (ip(), ip(), ip(), ip());
    let slices: Api<EndpointSlice> = ns.api();
    for (port, number, members) in [("http", 8080, [&a, &b, &c]), ("https", 8443, [&b, &c, &d])] {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": { "name": format!("my-service-{port}"), "labels": {
                "kubernetes.io/service-name": "my-service",
                "endpointslice.kubernetes.io/managed-by": TEST_MANAGER,
            }},
            "addressType": "IPv4",
            "ports": [{ "name": port, "port": number, "protocol": "TCP" }],
            "endpoints": members.iter().map(|m| json!({
                "addresses": [m], "conditions": { "ready": true },
            })).collect::<Vec<_>>(),
        }))?;
        slices.create(&PostParams::default(), &slice).await?;
    }
    let mesh = ClusterMeshApiserver::start(cp, "pw-mesh-old", 12).await?;
    let both: &[&str] = &["http", "https"];
    let want = [
        ("a", a, &["http"][..]),
        ("b", b, both),
        ("c", c, both),
        ("d", d, &["https"][..]),
    ];
    // Once all four addresses are exported (both slices were read), the
    // check must fail for b and c.
    let cs = wait_for(SETTLE, || async {
        match mesh.exported(ns.name(), "my-service").await? {
            Some(cs) if cs.backends.len() == 4 => Ok(cs),
            other => bail!("not all four backends exported yet: {other:?}"),
        }
    })
    .await?;
    let Err(e) = check_backends(&cs, &want) else {
        bail!(
            "the per-port layout was exported with every port (ClusterMesh fixed upstream?): {:?}",
            cs.backends
        );
    };
    let text = format!("{e:#}");
    eprintln!("clustermesh::old_layout_loses_ports: the check fails as it must:\n{text}");
    let off: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().split_once(" (").map(|(pod, _)| pod))
        .filter(|pod| ["a", "b", "c", "d"].contains(pod))
        .collect();
    ensure!(
        off == ["b", "c"],
        "the check failed, but not for b and c alone: {text}"
    );
    Ok(())
}
