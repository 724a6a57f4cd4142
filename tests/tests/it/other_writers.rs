//! Other writers (issue 7, item 2; docs/reliability.md): the native
//! EndpointSlice controller and the mirroring controller run beside portwise
//! the whole time, and nobody fights over an object.
//!
//! The other two rows of item 2 are covered elsewhere: a slice edited by
//! another field manager is repaired in tests/tests/it/repair.rs, and a slice
//! name held by another manager is left alone with an
//! `EndpointSliceNameCollision` Event in tests/tests/it/collisions.rs.
//!
//! Writers are told apart by User-Agent in the apiserver's audit log
//! (`kube-controller-manager/... /endpointslice-controller`,
//! `.../endpointslicemirroring-controller`, the portwise binary, and the
//! test itself, which is left out).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Endpoints;
use kube::api::PostParams;
use portwise_tests::{faults::*, *};
use serde_json::json;

/// Five resync periods of the test config (2s).
const QUIET: Duration = Duration::from_secs(10);

/// (user agent, resource/name) -> writes, for this namespace, without the
/// test's own writes.
fn writes_by_agent(audit: &Audit, ns: &str) -> Result<BTreeMap<(String, String), usize>> {
    let mut out = BTreeMap::new();
    for e in audit.events()? {
        if e.namespace != ns
            || !e.is_write()
            || e.user_agent.starts_with(TEST_AGENT)
            || !(e.resource == "endpointslices" || e.resource == "endpoints")
        {
            continue;
        }
        *out.entry((
            short_agent(&e.user_agent),
            format!("{}/{}", e.resource, e.name),
        ))
        .or_default() += 1;
    }
    Ok(out)
}

const TEST_AGENT: &str = "portwise-tests";

/// `kube-controller-manager/v1.37.2 (...) kubernetes/$Format/endpointslice-controller`
/// -> `endpointslice-controller`; anything else as is.
fn short_agent(ua: &str) -> String {
    if ua.starts_with("kube-controller-manager") {
        ua.rsplit('/').next().unwrap_or(ua).to_string()
    } else {
        ua.split(' ').next().unwrap_or(ua).to_string()
    }
}

/// Objects written by more than one writer.
fn contested(writes: &BTreeMap<(String, String), usize>) -> Vec<(String, BTreeSet<String>)> {
    let mut by_object: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (agent, object) in writes.keys() {
        by_object
            .entry(object.clone())
            .or_default()
            .insert(agent.clone());
    }
    by_object
        .into_iter()
        .filter(|(_, agents)| agents.len() > 1)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_and_mirroring_controllers_beside_portwise_do_not_fight() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "no-fights").await?;
    ensure!(
        cp.audit_log().is_some(),
        "this test needs the control plane's audit log"
    );
    // The native controller skips pods whose Node it cannot find.
    let node = ns.ensure_node("n1", "zone-a").await?;

    // Mid-migration: a selector Service portwise also serves (the native
    // slices stay: nativeCleanup is off).
    ns.create_service(
        service("migrating")
            .annotation(GROUP_KEY, "m")
            .selector("app", "m")
            .port("http", 8080),
    )
    .await?;
    // portwise's own: selector-less, two ports.
    ns.create_service(
        service("owned")
            .annotation(GROUP_KEY, "o")
            .port("http", 8080)
            .port("admin", 9090),
    )
    .await?;
    // Not portwise's: selector-less with a hand-written Endpoints, which
    // the mirroring controller turns into a slice.
    ns.create_service(service("mirrored").port("http", 8080))
        .await?;
    let mirrored_ip = next_ips().v4.to_string();
    ns.api::<Endpoints>()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "mirrored"},
                "subsets": [{"addresses": [{"ip": mirrored_ip}],
                             "ports": [{"name": "http", "port": 8080}]}],
            }))?,
        )
        .await?;
    for name in ["m1", "m2"] {
        ns.create_pod(
            pod(name)
                .label("app", "m")
                .annotation(GROUP_KEY, "m")
                .node(&node)
                .ips(next_ips().v4()),
        )
        .await?;
    }
    for name in ["o1", "o2", "o3"] {
        ns.create_pod(
            pod(name)
                .annotation(GROUP_KEY, "o")
                .node(&node)
                .ips(next_ips().v4()),
        )
        .await?;
    }

    let cfg = config_with(
        "podReady",
        "nativeCleanup: false\npublishLegacyEndpoints: true\n",
    );
    let mut pw = Portwise::spawn_binary(&ns, &cfg).await?;

    let settled = |m: &'static [&'static str], o: &'static [&'static str]| {
        let ns = &ns;
        async move {
            expect_eq(
                endpoints_by_port(ns, "owned").await?,
                by_port([(("http", V4), o), (("admin", V4), o)]),
            )?;
            expect_eq(
                endpoints_by_port(ns, "migrating").await?,
                by_port([(("http", V4), m)]),
            )?;
            let native = slices_managed_by(ns, "migrating", Some(NATIVE_MANAGER)).await?;
            let native_ready: BTreeSet<String> = native
                .iter()
                .flat_map(|s| s.endpoints.clone().unwrap_or_default())
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .filter_map(|e| e.target_ref.and_then(|r| r.name))
                .collect();
            expect_eq(
                native_ready,
                m.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
            )?;
            let mirror = slices_managed_by(ns, "mirrored", Some(MIRROR_MANAGER)).await?;
            ensure!(mirror.len() == 1, "mirrored slices: {}", mirror.len());
            ensure!(
                slices_managed_by(ns, "owned", Some(MIRROR_MANAGER))
                    .await?
                    .is_empty()
                    && slices_managed_by(ns, "migrating", Some(MIRROR_MANAGER))
                        .await?
                        .is_empty(),
                "portwise's Endpoints were mirrored into slices"
            );
            for svc in ["owned", "migrating"] {
                ensure!(
                    ns.api::<Endpoints>().get_opt(svc).await?.is_some(),
                    "no legacy Endpoints {svc} yet"
                );
            }
            anyhow::Ok(())
        }
    };
    wait_for(SETTLE, || settled(&["m1", "m2"], &["o1", "o2", "o3"])).await?;
    // Whatever was still in flight lands before the window opens.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let quiet = Audit::mark(cp);
    tokio::time::sleep(QUIET).await;
    let idle = writes_by_agent(&quiet, ns.name())?;
    ensure!(
        idle.is_empty(),
        "writes during a quiet {QUIET:?} with everything settled: {idle:#?}"
    );

    // One change every writer reacts to.
    let change = Audit::mark(cp);
    ns.set_ready("m1", false).await?;
    ns.set_ready("o1", false).await?;
    wait_for(SETTLE, || settled(&["m2"], &["o2", "o3"])).await?;
    tokio::time::sleep(QUIET / 2).await;
    let during = writes_by_agent(&change, ns.name())?;
    let fights = contested(&during);
    ensure!(
        fights.is_empty(),
        "objects written by several writers: {fights:?}"
    );
    let most = during.values().copied().max().unwrap_or_default();
    ensure!(
        most <= 2,
        "an object was written {most} times for one change: {during:#?}"
    );

    let quiet_again = Audit::mark(cp);
    tokio::time::sleep(QUIET).await;
    let idle_again = writes_by_agent(&quiet_again, ns.name())?;
    ensure!(
        idle_again.is_empty(),
        "writes after the change settled: {idle_again:#?}"
    );
    pw.check_running()?;
    println!(
        "no writes in {QUIET:?} quiet windows before and after; one change cost {} writes: \
         {during:#?}",
        during.values().sum::<usize>()
    );
    Ok(())
}
