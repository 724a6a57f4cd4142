//! Slice name collisions: a name already used by another Service's or
//! another manager's slice is an error with an `EndpointSliceNameCollision`
//! Event, never an overwrite.
//!
//! Both scenarios take a name portwise wants (`<svc>-<port>`, the Go
//! library's scheme): the Event must appear, the existing slice stays
//! untouched, and portwise serves the Service under the next free name.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Result, ensure};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::PostParams;
use portwise_tests::*;
use serde_json::json;

const COLLISION: &str = "EndpointSliceNameCollision";

/// (name -> resourceVersion, uid) of the slices selected by `svc` and manager.
async fn versions(
    ns: &TestNs,
    svc: &str,
    mgr: Option<&str>,
) -> Result<BTreeMap<String, (String, String)>> {
    Ok(slices_managed_by(ns, svc, mgr)
        .await?
        .into_iter()
        .map(|s| {
            let m = s.metadata;
            (
                m.name.unwrap_or_default(),
                (
                    m.resource_version.unwrap_or_default(),
                    m.uid.unwrap_or_default(),
                ),
            )
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn name_collision_between_two_services() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "collide").await?;
    // "a" + port "b-http" and "a-b" + port "http" both make "a-b-http".
    let _pw = Scenario::new(&ns)
        .service(service("a").annotation(GROUP_KEY, "g").port("b-http", 8080))
        .pods(["x", "y"].map(|name| pod(name).annotation(GROUP_KEY, "g").ips(next_ips().v4())))
        .expect("a", by_port([(("b-http", V4), &["x", "y"][..])]))
        .start()
        .await?;
    let before = versions(&ns, "a", None).await?;

    ns.create_service(service("a-b").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    // The wanted name is taken: an Event says so, and a-b is served under
    // the next free name.
    wait_for(SETTLE, || async {
        expect_eq(
            endpoints_by_port(&ns, "a-b").await?,
            by_port([(("http", V4), &["x", "y"][..])]),
        )?;
        let events = events_for(&ns, "a-b", Some(COLLISION)).await?;
        ensure!(!events.is_empty(), "no {COLLISION} Event for a-b");
        ensure!(
            events.iter().all(|e| e.type_.as_deref() == Some("Warning")),
            "{events:?}"
        );
        let names: Vec<String> = slices_for(&ns, "a-b")
            .await?
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect();
        ensure!(
            !names.contains(&"a-b-http".to_string()),
            "a-b holds the taken name: {names:?}"
        );
        Ok(())
    })
    .await?;

    // Service a's slices are never touched: same objects, same versions,
    // still a's, still serving x and y.
    stays_for(Duration::from_secs(8), || async {
        expect_eq(versions(&ns, "a", None).await?, before.clone())?;
        slice_invariants(&ns, "a", 100).await?;
        expect_eq(
            endpoints_by_port(&ns, "a").await?,
            by_port([(("b-http", V4), &["x", "y"][..])]),
        )
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn name_taken_by_another_manager() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "collide-foreign").await?;
    // Another controller's slice, labelled for the same Service, sitting on
    // the Go library's name for port http.
    let foreign: EndpointSlice = serde_json::from_value(json!({
        "metadata": { "name": "web-http", "labels": {
            SERVICE_NAME_LABEL: "web", MANAGED_BY_LABEL: "someone-else.example.com",
        }},
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        "endpoints": [{ "addresses": [next_ips().v4.to_string()] }],
    }))?;
    ns.api::<EndpointSlice>()
        .create(&PostParams::default(), &foreign)
        .await?;
    let before = versions(&ns, "web", Some("someone-else.example.com")).await?;

    let _pw = Scenario::new(&ns)
        .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .pod(pod("x").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .start()
        .await?;

    // Served under another name, with the Event naming the taken one.
    wait_for(SETTLE, || async {
        let mine = versions(&ns, "web", Some(MANAGED_BY)).await?;
        ensure!(
            !mine.contains_key("web-http"),
            "portwise holds web-http: {mine:?}"
        );
        let x: Vec<String> = slices_managed_by(&ns, "web", Some(MANAGED_BY))
            .await?
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter_map(|e| e.target_ref.as_ref()?.name.clone())
            .collect();
        expect_eq(x, vec!["x".to_string()])?;
        let events = events_for(&ns, "web", Some(COLLISION)).await?;
        ensure!(!events.is_empty(), "no {COLLISION} Event for web");
        ensure!(
            events
                .iter()
                .any(|e| e.message.as_deref().is_some_and(|m| m.contains("web-http"))),
            "{events:?}"
        );
        Ok(())
    })
    .await?;
    stays_for(Duration::from_secs(8), || async {
        expect_eq(
            versions(&ns, "web", Some("someone-else.example.com")).await?,
            before.clone(),
        )
    })
    .await?;
    Ok(())
}
