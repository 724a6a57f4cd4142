//! Living beside the native controllers (`endpointslice` and
//! `endpointslicemirroring` run in the local control plane): a selector
//! Service is moved to portwise, its selector removed, and the native
//! leftovers disappear while the Service never has zero ready endpoints.

use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::{core::v1::Endpoints, discovery::v1::EndpointSlice};
use kube::api::PostParams;
use portwise_tests::*;
use serde_json::json;

const CLEANED: &str = "NativeEndpointsCleanedUp";
const OTHER: &str = "someone-else.example.com";

struct Fixture {
    ns: TestNs,
    ips: Vec<String>,
}

/// Service `web` with a selector, three ready pods the native controller
/// publishes, the legacy Endpoints the endpoints controller would have
/// written, and another manager's slice that nobody may touch.
async fn fixture(prefix: &str) -> Result<Fixture> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, prefix).await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .selector("app", "web")
            .port("http", 8080),
    )
    .await?;
    // The native controller skips pods whose Node it cannot find.
    let node = ns.ensure_node("n1", "zone-a").await?;
    let mut ips = Vec::new();
    for name in ["p1", "p2", "p3"] {
        let ip = next_ips();
        ips.push(ip.v4.to_string());
        ns.create_pod(
            pod(name)
                .label("app", "web")
                .annotation(GROUP_KEY, "g")
                .node(&node)
                .ips(ip.v4()),
        )
        .await?;
    }
    wait_for(SETTLE, || async {
        let native = slices_managed_by(&ns, "web", Some(NATIVE_MANAGER)).await?;
        let n: usize = native
            .iter()
            .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
            .sum();
        ensure!(
            n == 3,
            "native slices hold {n} endpoints; is the endpointslice controller running \
             (tests/control-plane/start --controllers endpointslice,...)?"
        );
        Ok(())
    })
    .await?;
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": { "name": "web", "labels": { "endpoints.kubernetes.io/managed-by": "endpoint-controller" } },
        "subsets": [{
            "addresses": ips.iter().map(|ip| json!({ "ip": ip })).collect::<Vec<_>>(),
            "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        }],
    }))?;
    ns.api::<Endpoints>()
        .create(&PostParams::default(), &endpoints)
        .await?;
    let foreign: EndpointSlice = serde_json::from_value(json!({
        "metadata": { "name": "web-foreign", "labels": { SERVICE_NAME_LABEL: "web", MANAGED_BY_LABEL: OTHER } },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        "endpoints": [],
    }))?;
    ns.api::<EndpointSlice>()
        .create(&PostParams::default(), &foreign)
        .await?;
    Ok(Fixture { ns, ips })
}

/// Samples every slice of the Service (any manager) and records the fewest
/// distinct ready addresses for port http ever seen.
struct Monitor {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<()>>,
    log: Arc<Mutex<Vec<(Duration, usize)>>>,
}

impl Monitor {
    fn start(ns: &TestNs) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let api = ns.api::<EndpointSlice>();
        let (s, l) = (stop.clone(), log.clone());
        let task = tokio::spawn(async move {
            let t0 = Instant::now();
            let lp = kube::api::ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}=web"));
            while !s.load(Ordering::SeqCst) {
                let slices = api.list(&lp).await?.items;
                let ready: BTreeSet<String> = slices
                    .iter()
                    .filter(|s| {
                        s.ports
                            .iter()
                            .flatten()
                            .any(|p| p.name.as_deref() == Some("http"))
                    })
                    .flat_map(|s| s.endpoints.iter().flatten())
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
                    .flat_map(|e| e.addresses.clone())
                    .collect();
                l.lock().unwrap().push((t0.elapsed(), ready.len()));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok::<(), anyhow::Error>(())
        });
        Self { stop, task, log }
    }

    async fn finish(self) -> Result<Vec<(Duration, usize)>> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await??;
        Ok(self.log.lock().unwrap().clone())
    }
}

async fn endpoints_object(ns: &TestNs) -> Result<Option<Endpoints>> {
    Ok(ns.api::<Endpoints>().get_opt("web").await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_migration_from_native_controller() -> Result<()> {
    let Fixture { ns, ips } = fixture("migrate").await?;
    let _pw = Portwise::start(&ns, &config_with("podReady", "nativeCleanup: true\n")).await?;

    // Served by both while the selector is there; nothing native is removed
    // yet.
    expect_endpoints(
        &ns,
        "web",
        by_port([(("http", V4), &["p1", "p2", "p3"][..])]),
    )
    .await?;
    stays_for(Duration::from_secs(5), || async {
        ensure!(
            !slices_managed_by(&ns, "web", Some(NATIVE_MANAGER))
                .await?
                .is_empty(),
            "native slices removed early"
        );
        ensure!(
            endpoints_object(&ns).await?.is_some(),
            "Endpoints removed while the selector is still set"
        );
        Ok(())
    })
    .await?;

    let monitor = Monitor::start(&ns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    ns.patch_service("web", json!({ "spec": { "selector": null } }))
        .await?;

    wait_for(SETTLE * 2, || async {
        ensure!(
            endpoints_object(&ns).await?.is_none(),
            "legacy Endpoints still there"
        );
        let native = slices_managed_by(&ns, "web", Some(NATIVE_MANAGER)).await?;
        ensure!(native.is_empty(), "{} native slices left", native.len());
        let mirrored = slices_managed_by(&ns, "web", Some(MIRROR_MANAGER)).await?;
        ensure!(
            mirrored.is_empty(),
            "{} mirrored slices left",
            mirrored.len()
        );
        ensure!(
            !events_for(&ns, "web", Some(CLEANED)).await?.is_empty(),
            "no {CLEANED} Event"
        );
        Ok(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let samples = monitor.finish().await?;

    ensure!(samples.len() > 20, "only {} samples", samples.len());
    if let Some((at, _)) = samples.iter().find(|(_, n)| *n == 0) {
        bail!("the Service had zero ready endpoints {at:?} into the migration");
    }
    // Still served by portwise, with the pods' addresses, and the other
    // manager's slice untouched.
    expect_eq(
        endpoints_by_port(&ns, "web").await?,
        by_port([(("http", V4), &["p1", "p2", "p3"][..])]),
    )?;
    let addrs: BTreeSet<String> = endpoint_views(&ns, "web")
        .await?
        .into_iter()
        .flat_map(|e| e.addresses)
        .collect();
    expect_eq(addrs, ips.into_iter().collect())?;
    expect_eq(slices_managed_by(&ns, "web", Some(OTHER)).await?.len(), 1)?;
    Ok(())
}

/// Cleanup waits until portwise publishes at least one endpoint, and
/// happens after a restart once it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_waits_for_portwise_endpoints() -> Result<()> {
    let Fixture { ns, .. } = fixture("migrate-wait").await?;
    let mut pw = Portwise::start(&ns, &config_with("exclude", "nativeCleanup: true\n")).await?;
    ns.patch_service("web", json!({ "spec": { "selector": null } }))
        .await?;
    // portwise publishes only a placeholder: the native leftovers must stay.
    expect_endpoints(&ns, "web", by_port([(("http", V4), &[][..])])).await?;
    stays_for(Duration::from_secs(8), || async {
        ensure!(
            !slices_managed_by(&ns, "web", Some(NATIVE_MANAGER))
                .await?
                .is_empty(),
            "native slices removed"
        );
        Ok(())
    })
    .await?;

    pw.restart_with(&config_with("podReady", "nativeCleanup: true\n"))
        .await?;
    wait_for(SETTLE, || async {
        expect_eq(
            endpoints_by_port(&ns, "web").await?,
            by_port([(("http", V4), &["p1", "p2", "p3"][..])]),
        )?;
        ensure!(
            endpoints_object(&ns).await?.is_none(),
            "legacy Endpoints still there"
        );
        ensure!(
            slices_managed_by(&ns, "web", Some(NATIVE_MANAGER))
                .await?
                .is_empty(),
            "native slices left"
        );
        Ok(())
    })
    .await?;
    expect_eq(slices_managed_by(&ns, "web", Some(OTHER)).await?.len(), 1)?;
    Ok(())
}

/// `nativeCleanup: false` leaves the native objects alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_can_be_disabled() -> Result<()> {
    let Fixture { ns, .. } = fixture("migrate-off").await?;
    let _pw = Portwise::start(&ns, &config_with("podReady", "nativeCleanup: false\n")).await?;
    ns.patch_service("web", json!({ "spec": { "selector": null } }))
        .await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([(("http", V4), &["p1", "p2", "p3"][..])]),
    )
    .await?;
    stays_for(Duration::from_secs(8), || async {
        ensure!(
            !slices_managed_by(&ns, "web", Some(NATIVE_MANAGER))
                .await?
                .is_empty(),
            "native slices removed"
        );
        ensure!(endpoints_object(&ns).await?.is_some(), "Endpoints removed");
        ensure!(
            events_for(&ns, "web", Some(CLEANED)).await?.is_empty(),
            "{CLEANED} with cleanup disabled"
        );
        Ok(())
    })
    .await?;
    Ok(())
}
