//! targetPort resolution per pod: named ports (by name and protocol, across
//! containers and restartable init containers), one slice set per resolved
//! target.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use portwise_tests::*;
use serde_json::json;

/// (port name, resolved port number) -> pods, from the live slices.
async fn by_target(ns: &TestNs, svc: &str) -> Result<BTreeMap<(String, i32), BTreeSet<String>>> {
    let mut out: BTreeMap<(String, i32), BTreeSet<String>> = BTreeMap::new();
    for e in endpoint_views(ns, svc).await? {
        out.entry((e.port_name.clone(), e.port.unwrap_or(-1)))
            .or_default()
            .insert(e.pod);
    }
    Ok(out)
}

fn targets(entries: &[(&str, i32, &[&str])]) -> BTreeMap<(String, i32), BTreeSet<String>> {
    entries
        .iter()
        .map(|(n, p, pods)| {
            (
                (n.to_string(), *p),
                pods.iter().map(|s| s.to_string()).collect(),
            )
        })
        .collect()
}

/// Mid-rollout the named port `web` means 8080 on old pods and 9090 on new
/// ones: two slice sets for the one Service port, each with its own number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_target_port_mid_rollout() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "rollout").await?;
    ns.create_service(
        service("app")
            .annotation(GROUP_KEY, "g")
            .port_to("http", 80, json!("web")),
    )
    .await?;
    for (name, port) in [
        ("old-1", 8080),
        ("old-2", 8080),
        ("new-1", 9090),
        ("new-2", 9090),
    ] {
        ns.create_pod(
            pod(name)
                .annotation(GROUP_KEY, "g")
                .container_port("web", port, "TCP")
                .ips(next_ips().v4()),
        )
        .await?;
    }
    let _pw = Portwise::start(&ns, &config("podReady")).await?;

    wait_for(SETTLE, || async {
        expect_eq(
            by_target(&ns, "app").await?,
            targets(&[
                ("http", 8080, &["old-1", "old-2"]),
                ("http", 9090, &["new-1", "new-2"]),
            ]),
        )
    })
    .await?;
    slice_invariants(&ns, "app", 100).await?;

    // The rollout finishes: the 8080 set disappears entirely (the port still
    // has members, so no placeholder).
    ns.delete_pod("old-1").await?;
    ns.delete_pod("old-2").await?;
    wait_for(SETTLE, || async {
        let ports: BTreeSet<Option<i32>> = slices_for(&ns, "app")
            .await?
            .iter()
            .map(|s| s.ports.iter().flatten().next().and_then(|p| p.port))
            .collect();
        expect_eq(ports, BTreeSet::from([Some(9090)]))?;
        expect_eq(
            by_target(&ns, "app").await?,
            targets(&[("http", 9090, &["new-1", "new-2"])]),
        )
    })
    .await?;
    Ok(())
}

/// A named port found only on a sidecar (init container with
/// `restartPolicy: Always`) or on a second container resolves; one found only
/// on a run-to-completion init container does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_and_multi_container_ports() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "sidecar").await?;
    ns.create_service(service("app").annotation(GROUP_KEY, "g").port_to(
        "metrics",
        9100,
        json!("metrics"),
    ))
    .await?;
    let g = |name: &str| pod(name).annotation(GROUP_KEY, "g").ips(next_ips().v4());
    let _pw = Scenario::new(&ns)
        .pod(
            g("sidecar")
                .container_port("http", 8080, "TCP")
                .sidecar_port("metrics", 9101, "TCP"),
        )
        .pod(
            g("init-only")
                .container_port("http", 8080, "TCP")
                .init_port("metrics", 9102, "TCP"),
        )
        .pod(
            g("second")
                .container_port("http", 8080, "TCP")
                .container_port_in("proxy", "metrics", 9103, "TCP"),
        )
        .pod(g("none").container_port("http", 8080, "TCP"))
        .start()
        .await?;

    wait_for(SETTLE, || async {
        expect_eq(
            by_target(&ns, "app").await?,
            targets(&[
                ("metrics", 9101, &["sidecar"]),
                ("metrics", 9103, &["second"]),
            ]),
        )
    })
    .await?;
    slice_invariants(&ns, "app", 100).await?;
    Ok(())
}

/// Named ports resolve by name *and* protocol: a UDP Service port never
/// resolves to a TCP container port of the same name (and a container port
/// without protocol is TCP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_ports_match_protocol() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "proto").await?;
    ns.create_service(
        service("dns")
            .annotation(GROUP_KEY, "g")
            .port_full("dns-udp", 53, json!("dns"), "UDP")
            .port_full("dns-tcp", 53, json!("dns"), "TCP"),
    )
    .await?;
    let g = |name: &str| pod(name).annotation(GROUP_KEY, "g").ips(next_ips().v4());
    let _pw = Scenario::new(&ns)
        .pod(g("udp").container_port("dns", 5353, "UDP"))
        .pod(g("tcp").container_port("dns", 5354, "TCP"))
        .pod(g("default").container_port("dns", 5355, ""))
        .start()
        .await?;

    wait_for(SETTLE, || async {
        expect_eq(
            by_target(&ns, "dns").await?,
            targets(&[
                ("dns-udp", 5353, &["udp"]),
                ("dns-tcp", 5354, &["tcp"]),
                ("dns-tcp", 5355, &["default"]),
            ]),
        )
    })
    .await?;
    // Each slice's port carries the Service port's protocol.
    for e in endpoint_views(&ns, "dns").await? {
        let want = if e.port_name == "dns-udp" {
            "UDP"
        } else {
            "TCP"
        };
        expect_eq(e.protocol.as_deref(), Some(want))?;
    }
    Ok(())
}
