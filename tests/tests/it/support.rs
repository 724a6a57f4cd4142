//! The test support library checked against the real control plane, with no
//! portwise involved: if these fail, the other tests' verdicts mean nothing.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::{core::v1::Pod, discovery::v1::EndpointSlice};
use kube::api::{Patch, PatchParams};
use portwise_tests::*;
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

fn ready_of(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_status_and_termination() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "support-pods").await?;
    let node = ns.ensure_node("n1", "zone-x").await?;
    let ips = next_ips();
    let p = ns
        .create_pod(
            pod("a")
                .container_port("http", 8080, "")
                .sidecar_port("m", 9100, "TCP")
                .node(&node)
                .held()
                .ips(ips.dual()),
        )
        .await?;
    let status = p.status.clone().unwrap_or_default();
    expect_eq(status.phase.as_deref(), Some("Running"))?;
    expect_eq(status.pod_ip.clone(), Some(ips.v4.to_string()))?;
    let all: Vec<String> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|i| i.ip.clone())
        .collect();
    expect_eq(all, vec![ips.v4.to_string(), ips.v6.to_string()])?;
    expect_eq(ready_of(&p).as_deref(), Some("True"))?;

    let p = ns.set_ready("a", false).await?;
    expect_eq(ready_of(&p).as_deref(), Some("False"))?;
    expect_eq(p.status.unwrap().pod_ip, Some(ips.v4.to_string()))?;

    ns.terminate_pod("a").await?;
    let p = ns.get_pod("a").await?;
    ensure!(p.metadata.deletion_timestamp.is_some(), "not terminating");
    ns.release_pod("a").await?;
    wait_for(SETTLE, || async {
        ensure!(ns.api::<Pod>().get_opt("a").await?.is_none(), "still there");
        Ok(())
    })
    .await?;

    // Node name is namespaced, zone label set.
    let n = kube::Api::<k8s_openapi::api::core::v1::Node>::all(ns.client())
        .get(&node)
        .await?;
    expect_eq(
        n.metadata
            .labels
            .unwrap_or_default()
            .get("topology.kubernetes.io/zone")
            .cloned(),
        Some("zone-x".into()),
    )?;

    // Terminal phases and pending pods.
    let q = ns
        .create_pod(pod("done").phase("Succeeded").ips(next_ips().v4()))
        .await?;
    expect_eq(q.status.unwrap().phase.as_deref(), Some("Succeeded"))?;
    let r = ns.create_pod(pod("pending").no_status()).await?;
    ensure!(
        r.status.and_then(|s| s.pod_ip).is_none(),
        "pending pod has an IP"
    );
    Ok(())
}

async fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_on_pod_addresses() -> Result<()> {
    // Needs only the network namespace.
    let _ = ControlPlane::shared().await?;
    let ips = next_ips();
    for ip in [IpAddr::from(ips.v4), IpAddr::from(ips.v6)] {
        let l = HttpListener::start(ip, 8080).await?;
        let addr = l.addr();
        ensure!(
            http_get(addr, "/healthz")
                .await?
                .starts_with("HTTP/1.1 200 "),
            "default 200"
        );
        l.set_status(503);
        ensure!(
            http_get(addr, "/healthz")
                .await?
                .starts_with("HTTP/1.1 503 "),
            "503"
        );
        l.set_mode(HttpMode::Redirect("/ok".into()));
        l.route("/ok", 200);
        let r = http_get(addr, "/healthz").await?;
        ensure!(
            r.starts_with("HTTP/1.1 302 ") && r.contains("Location: /ok"),
            "{r}"
        );
        ensure!(
            http_get(addr, "/ok").await?.starts_with("HTTP/1.1 200 "),
            "route"
        );
        l.set_mode(HttpMode::Hang);
        let hung =
            tokio::time::timeout(Duration::from_millis(500), http_get(addr, "/healthz")).await;
        ensure!(hung.is_err(), "hang mode answered: {hung:?}");
        expect_eq(l.requests_for("/healthz"), 4)?;
        expect_eq(l.answered(503), 1)?;
        l.stop();
        tokio::time::sleep(Duration::from_millis(100)).await;
        ensure!(
            TcpStream::connect(addr).await.is_err(),
            "stopped listener still accepts"
        );

        let t = TcpListener::start(ip, 8443).await?;
        let _c = TcpStream::connect(t.addr()).await?;
        wait_for(Duration::from_secs(2), || async {
            ensure!(t.accepted() == 1, "accepted {}", t.accepted());
            Ok(())
        })
        .await?;
        let taddr = t.addr();
        t.stop();
        tokio::time::sleep(Duration::from_millis(100)).await;
        ensure!(
            TcpStream::connect(taddr).await.is_err(),
            "stopped TCP listener still accepts"
        );
    }
    Ok(())
}

/// The helpers that read slices, and the write counter, against slices the
/// test writes itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slice_readers_and_write_counter() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "support-slices").await?;
    let svc = ns.create_service(service("web").port("http", 8080)).await?;
    let counter = WriteCounter::start(&ns).await?;
    eprintln!(
        "counting writes from {}",
        cp.audit_log()
            .map_or("metrics".into(), |p| p.display().to_string())
    );
    let ip = next_ips();
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "web-http",
            "labels": { SERVICE_NAME_LABEL: "web", MANAGED_BY_LABEL: MANAGED_BY },
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Service", "name": "web",
                "uid": svc.metadata.uid.clone().context("uid")?, "controller": true,
            }],
        },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        "endpoints": [{
            "addresses": [ip.v4.to_string()],
            "conditions": { "ready": true, "serving": true, "terminating": false },
            "targetRef": { "kind": "Pod", "name": "a", "namespace": ns.name() },
        }],
    });
    let api = ns.api::<EndpointSlice>();
    api.patch(
        "web-http",
        &PatchParams::apply(TEST_MANAGER),
        &Patch::Apply(&slice),
    )
    .await?;
    expect_eq(
        endpoints_by_port(&ns, "web").await?,
        by_port([(("http", V4), &["a"][..])]),
    )?;
    slice_invariants(&ns, "web", 100).await?;
    let e = endpoint_of(&ns, "web", "http", V4, "a").await?;
    expect_eq(
        (e.ready, e.serving, e.terminating, e.port),
        (Some(true), Some(true), Some(false), Some(8080)),
    )?;

    // An identical apply is still a write request to the apiserver.
    api.patch(
        "web-http",
        &PatchParams::apply(TEST_MANAGER),
        &Patch::Apply(&slice),
    )
    .await?;
    wait_for(Duration::from_secs(5), || async {
        let n = counter.count().await?;
        ensure!(
            n == 2,
            "{n} writes counted, expected 2 ({})",
            counter.source()
        );
        Ok(())
    })
    .await?;
    if cp.audit_log().is_some() {
        let w = counter.writes()?;
        ensure!(
            w.iter().all(|w| w.verb == "patch" && w.name == "web-http"),
            "{w:?}"
        );
    }
    // A slice for another manager is not portwise's.
    let mut other = slice.clone();
    other["metadata"]["name"] = json!("web-other");
    other["metadata"]["labels"][MANAGED_BY_LABEL] = json!("other");
    api.patch(
        "web-other",
        &PatchParams::apply(TEST_MANAGER),
        &Patch::Apply(&other),
    )
    .await?;
    expect_eq(slices_for(&ns, "web").await?.len(), 1)?;
    expect_eq(slices_managed_by(&ns, "web", None).await?.len(), 2)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_unique_across_tasks() -> Result<()> {
    let handles: Vec<_> = (0..8)
        .map(|_| tokio::spawn(async { (0..500).map(|_| next_ips().v4).collect::<Vec<_>>() }))
        .collect();
    let mut all = std::collections::HashSet::new();
    for h in handles {
        for ip in h.await? {
            ensure!(all.insert(ip), "{ip} handed out twice");
        }
    }
    Ok(())
}

/// Two servers started a moment apart (Traefik's two entry points) must
/// never be given the same port: a port stays free until its server binds.
#[test]
fn free_ports_are_never_handed_out_twice() -> Result<()> {
    // 1000 draws of 12000 ports repeat one with odds of 1 - e^-41 by
    // chance alone: the old draw failed this at once.
    let mut all = std::collections::HashSet::new();
    for _ in 0..1000 {
        let port = free_port()?;
        ensure!(all.insert(port), "port {port} handed out twice");
    }
    Ok(())
}
