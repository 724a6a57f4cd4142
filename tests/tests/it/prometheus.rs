//! Issue 44, item 6: Prometheus' Kubernetes service discovery with
//! `role: endpointslice` (its own code, run by promtool;
//! tests/src/prometheus.rs) on portwise's slices. Prometheus makes one
//! target per endpoint address and slice port, labelled with the slice
//! port's name (`__meta_kubernetes_endpointslice_port_name`): for every
//! Service port, the targets carrying its name must be exactly its members,
//! as `address:port`. Nothing here depends on how members are grouped into
//! slices.
//!
//! What Prometheus adds on its own is checked too, since docs/consumers.md
//! tells users about it:
//! - a target, with no port name, for each container port of a listed pod
//!   that its slice does not list; so every port a pod does *not* back
//!   gets one;
//! - nothing from the secondary family's slices of a dual-stack Service
//!   (skipped since Prometheus 3.11), so a pod published in that family
//!   only is not discovered at all.
//!
//! `role: endpoints` (the Prometheus Operator's default) reads v1
//! Endpoints, which portwise writes only with `publishLegacyEndpoints`:
//! with it, the same holds for `__meta_kubernetes_endpoint_port_name`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, bail, ensure};
use portwise_tests::{prometheus::*, *};
use serde_json::json;

const SVC: &str = "my-service";
/// The seed pods' container ports (`seed_pod`), which are also the target
/// ports of the Service ports http (8080) and https (8443).
const CONTAINER_PORTS: [u16; 2] = [8080, 8443];

/// Who backs which Service port: (name, target port, member pods).
type Ports<'a> = [(&'a str, u16, &'a [&'a str])];

/// The test is to return at once: ./test deferred promtool's build.
fn skipped(test: &str) -> bool {
    deferred::skip(&["promtool"], &format!("prometheus::{test}"))
}

/// Each pod's address of one family, for the pods that have one.
async fn pod_ips(ns: &TestNs, pods: &[&str], v6: bool) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for p in pods {
        let ip = ns
            .get_pod(p)
            .await?
            .status
            .and_then(|s| s.pod_ips)
            .unwrap_or_default()
            .into_iter()
            .map(|ip| ip.ip)
            .find(|ip| ip.contains(':') == v6);
        if let Some(ip) = ip {
            out.insert(p.to_string(), ip);
        }
    }
    Ok(out)
}

/// `ip:port` as Prometheus writes `__address__`.
fn host_port(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// One line per target, for failure messages and the log.
fn summary(targets: &[Target]) -> String {
    targets
        .iter()
        .map(|t| {
            format!(
                "  {} {} {} ({})",
                t.get(POD_NAME).unwrap_or("-"),
                t.address(),
                t.get(ENDPOINTSLICE.port_name)
                    .or(t.get(ENDPOINTS.port_name))
                    .map_or("no port name".to_string(), |n| format!("port name {n}")),
                ENDPOINTSLICE
                    .address_type
                    .and_then(|l| t.get(l))
                    .unwrap_or("no address type"),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// One discovery of `SVC`'s endpoints by `role` against `ports` (IPv4
/// `ips`):
/// - the targets with a port name are exactly each port's members, at
///   their address and the port's number, ready (and from IPv4 slices);
/// - the others (Prometheus' own additions) are each at a container port
///   of a published pod, and include every container port such a pod does
///   not back.
fn check(
    role: Role,
    targets: &[Target],
    ips: &BTreeMap<String, String>,
    ports: &Ports,
) -> Result<()> {
    // (port name, pod, address) and (pod, address).
    let mut named = BTreeSet::new();
    let mut added = BTreeSet::new();
    for t in targets {
        ensure!(t.get(SERVICE_NAME) == Some(SVC), "not {SVC}'s: {t:?}");
        if let Some(label) = role.address_type {
            ensure!(t.get(label) == Some(V4), "not from an IPv4 slice: {t:?}");
        }
        let pod = t
            .get(POD_NAME)
            .with_context(|| format!("a target without a pod: {t:?}"))?;
        let port = t.address().rsplit_once(':').map(|(_, p)| p);
        match t.get(role.port_name) {
            Some(name) => {
                if let Some(label) = role.port_number {
                    ensure!(t.get(label) == port, "port label: {t:?}");
                }
                ensure!(t.get(role.ready) == Some("true"), "not ready: {t:?}");
                named.insert((name.to_string(), pod.to_string(), t.address().to_string()));
            }
            None => {
                ensure!(
                    t.get(CONTAINER_PORT_NUMBER) == port,
                    "container port: {t:?}"
                );
                added.insert((pod.to_string(), t.address().to_string()));
            }
        }
    }
    let ip = |p: &str| {
        ips.get(p)
            .with_context(|| format!("pod {p} has no IPv4 address"))
    };
    let mut want = BTreeSet::new();
    for (name, number, pods) in ports {
        for p in *pods {
            want.insert((name.to_string(), p.to_string(), host_port(ip(p)?, *number)));
        }
    }
    expect_eq(&named, &want)
        .context("targets with a slice port name, as (port name, pod, address)")?;

    let backed: BTreeSet<(String, String)> =
        want.into_iter().map(|(_, pod, addr)| (pod, addr)).collect();
    let mut every = BTreeSet::new();
    for (_, _, pods) in ports {
        for p in *pods {
            for n in CONTAINER_PORTS {
                every.insert((p.to_string(), host_port(ip(p)?, n)));
            }
        }
    }
    let beyond: Vec<_> = added.difference(&every).collect();
    ensure!(
        beyond.is_empty(),
        "targets without a port name that are no published pod's container port: {beyond:?}"
    );
    let missing: Vec<_> = every
        .difference(&backed)
        .filter(|t| !added.contains(*t))
        .collect();
    ensure!(
        missing.is_empty(),
        "Prometheus no longer adds a target for a container port a published pod does not back \
         (docs/consumers.md says it does): none for {missing:?}"
    );
    Ok(())
}

/// Waits until a fresh discovery by `role` passes [`check`]; returns its
/// targets.
async fn expect_prometheus(
    ns: &TestNs,
    role: Role,
    ips: &BTreeMap<String, String>,
    ports: &Ports<'_>,
) -> Result<Vec<Target>> {
    let targets = wait_for(SETTLE, || async {
        let targets = discover(ns.cp(), ns.name(), role, &json!([])).await?;
        if let Err(e) = check(role, &targets, ips, ports) {
            bail!("{e:#}\nPrometheus discovered:\n{}", summary(&targets));
        }
        Ok(targets)
    })
    .await?;
    eprintln!(
        "Prometheus discovered (role {}):\n{}",
        role.name,
        summary(&targets)
    );
    Ok(targets)
}

/// The seed example (http {a,b,c}, https {b,c,d}) as Prometheus discovers
/// it, and what a job scrapes without relabeling (every container port of
/// every pod in a slice), when it keeps one port name (that port's
/// members) and when it keeps one container port (non-members too); then after a joins https and b turns unready (it leaves both
/// ports and every target), then with https left without members (its
/// placeholder slice gives no target).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpointslice_targets_are_each_ports_members() -> Result<()> {
    if skipped("endpointslice_targets_are_each_ports_members") {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "prom-seed").await?;
    let _pw = seed_scenario(&ns)
        .binary()
        .expect(SVC, seed_slices(&["a", "b", "c"], &["b", "c", "d"]))
        .start()
        .await?;
    let ips = pod_ips(&ns, &["a", "b", "c", "d"], false).await?;
    let targets = expect_prometheus(
        &ns,
        ENDPOINTSLICE,
        &ips,
        &[
            ("http", 8080, &["a", "b", "c"]),
            ("https", 8443, &["b", "c", "d"]),
        ],
    )
    .await?;
    let addresses = |pods: &[&str], ports: &[u16]| -> BTreeSet<String> {
        pods.iter()
            .flat_map(|p| ports.iter().map(|n| host_port(&ips[*p], *n)))
            .collect()
    };
    // A job without relabeling scrapes every container port of every pod
    // in a slice: a on 8443 too, which it does not back.
    let scraped: BTreeSet<String> = targets
        .iter()
        .filter_map(|t| t.scraped().map(str::to_string))
        .collect();
    expect_eq(scraped, addresses(&["a", "b", "c", "d"], &CONTAINER_PORTS))
        .context("what a job without relabel_configs scrapes")?;
    // A job keeping one port (docs/consumers.md): by the slice port's name
    // (what a ServiceMonitor's `port: https` generates) it scrapes exactly
    // https's members; by container port number (what `targetPort: 8443`
    // generates) every pod in a slice with that container port, a too.
    for (label, regex, want) in [
        (
            ENDPOINTSLICE.port_name,
            "https",
            addresses(&["b", "c", "d"], &[8443]),
        ),
        (
            CONTAINER_PORT_NUMBER,
            "8443",
            addresses(&["a", "b", "c", "d"], &[8443]),
        ),
    ] {
        let keep = json!([{ "source_labels": [label], "regex": regex, "action": "keep" }]);
        wait_for(SETTLE, || async {
            let targets = discover(cp, ns.name(), ENDPOINTSLICE, &keep).await?;
            let scraped: BTreeSet<String> = targets
                .iter()
                .filter_map(|t| t.scraped().map(str::to_string))
                .collect();
            expect_eq(&scraped, &want)
                .with_context(|| format!("what a job keeping {label}={regex} scrapes"))
        })
        .await?;
    }

    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    ns.set_ready("b", false).await?;
    expect_seed(&ns, &["a", "c"], &["a", "c", "d"]).await?;
    let targets = expect_prometheus(
        &ns,
        ENDPOINTSLICE,
        &ips,
        &[
            ("http", 8080, &["a", "c"]),
            ("https", 8443, &["a", "c", "d"]),
        ],
    )
    .await?;
    ensure!(
        targets.iter().all(|t| t.get(POD_NAME) != Some("b")),
        "b is in no slice, yet Prometheus has a target for it:\n{}",
        summary(&targets)
    );

    for p in ["a", "c", "d"] {
        ns.annotate_pod(p, PORTS_KEY, Some("http")).await?;
    }
    expect_seed(&ns, &["a", "c", "d"], &[]).await?;
    expect_prometheus(
        &ns,
        ENDPOINTSLICE,
        &ips,
        &[("http", 8080, &["a", "c", "d"])],
    )
    .await?;
    Ok(())
}

/// A dual-stack Service (`RequireDualStack`, IPv4 first): Prometheus reads
/// the IPv4 slices only. Pods a–d have both families; e has IPv6 only and
/// backs https, so portwise publishes it in https's IPv6 slice, and
/// Prometheus never discovers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secondary_family_slices_are_skipped() -> Result<()> {
    if skipped("secondary_family_slices_are_skipped") {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "prom-dual").await?;
    let _pw = seed_scenario_with(
        &ns,
        service(SVC)
            .annotation(GROUP_KEY, "my-group")
            .dual_stack()
            .port("http", 8080)
            .port("https", 8443),
        |_, pod| pod.ips(next_ips().dual()),
    )
    .pod(
        seed_pod("e", "https")
            .annotation(GROUP_KEY, "my-group")
            .ips(next_ips().v6()),
    )
    .binary()
    .expect(
        SVC,
        by_port([
            (("http", V4), &["a", "b", "c"][..]),
            (("http", V6), &["a", "b", "c"]),
            (("https", V4), &["b", "c", "d"]),
            (("https", V6), &["b", "c", "d", "e"]),
        ]),
    )
    .start()
    .await?;
    let ips = pod_ips(&ns, &["a", "b", "c", "d", "e"], false).await?;
    ensure!(!ips.contains_key("e"), "e has an IPv4 address: {ips:?}");
    let targets = expect_prometheus(
        &ns,
        ENDPOINTSLICE,
        &ips,
        &[
            ("http", 8080, &["a", "b", "c"]),
            ("https", 8443, &["b", "c", "d"]),
        ],
    )
    .await?;
    ensure!(
        targets.iter().all(|t| t.get(POD_NAME) != Some("e")),
        "Prometheus discovered e from an IPv6 slice:\n{}",
        summary(&targets)
    );
    Ok(())
}

/// `role: endpoints`, the Prometheus Operator's default for ServiceMonitors,
/// reads v1 Endpoints: portwise writes none by default, so it discovers
/// nothing; with `publishLegacyEndpoints: true` (addresses grouped by the
/// ports they back), the targets carrying a port name are exactly each
/// port's members, through a readiness flip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_role_needs_legacy_endpoints() -> Result<()> {
    if skipped("endpoints_role_needs_legacy_endpoints") {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "prom-legacy").await?;
    let mut pw = seed_scenario(&ns)
        .binary()
        .expect(SVC, seed_slices(&["a", "b", "c"], &["b", "c", "d"]))
        .start()
        .await?;
    let ips = pod_ips(&ns, &["a", "b", "c", "d"], false).await?;
    let seed: &Ports = &[
        ("http", 8080, &["a", "b", "c"]),
        ("https", 8443, &["b", "c", "d"]),
    ];
    // The slices are discovered (so discovery works here); the Endpoints
    // role finds nothing.
    expect_prometheus(&ns, ENDPOINTSLICE, &ips, seed).await?;
    let legacy = discover(cp, ns.name(), ENDPOINTS, &json!([])).await?;
    ensure!(
        legacy.is_empty(),
        "role endpoints without legacy Endpoints:\n{}",
        summary(&legacy)
    );

    pw.stop().await?;
    let _pw = Portwise::builder(cp)
        .namespace(ns.name())
        .config(&config_with(
            SEED_MEMBERSHIP,
            "publishLegacyEndpoints: true\n",
        ))
        .binary()
        .start()
        .await?;
    expect_prometheus(&ns, ENDPOINTS, &ips, seed).await?;
    ns.set_ready("b", false).await?;
    expect_seed(&ns, &["a", "c"], &["c", "d"]).await?;
    expect_prometheus(
        &ns,
        ENDPOINTS,
        &ips,
        &[("http", 8080, &["a", "c"]), ("https", 8443, &["c", "d"])],
    )
    .await?;
    Ok(())
}
