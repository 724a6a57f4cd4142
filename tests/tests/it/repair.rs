//! portwise owns its slices: manual edits are repaired, a deleted slice
//! comes back, and a slice whose managed-by label was stripped is reclaimed
//! through its owner reference.

use anyhow::{Result, ensure};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams};
use portwise_tests::*;
use serde_json::json;

async fn setup(ns: &TestNs) -> Result<Portwise> {
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080)
            .port("admin", 9090),
    )
    .await?;
    for name in ["a", "b", "c"] {
        ns.create_pod(pod(name).annotation(GROUP_KEY, "g").ips(next_ips().v4()))
            .await?;
    }
    let pw = Portwise::start(ns, &config("podReady")).await?;
    wait_for(SETTLE, || async {
        expect_eq(endpoints_by_port(ns, "web").await?, expected())
    })
    .await?;
    Ok(pw)
}

fn expected() -> ByPort {
    by_port([
        (("http", V4), &["a", "b", "c"][..]),
        (("admin", V4), &["a", "b", "c"][..]),
    ])
}

async fn http_slice(ns: &TestNs) -> Result<EndpointSlice> {
    slice_for_port(ns, "web", "http").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_edit_repaired() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "repair").await?;
    let _pw = setup(&ns).await?;
    let slice = http_slice(&ns).await?;
    let name = slice.metadata.name.clone().unwrap();

    // Someone drops an endpoint, adds a stranger, marks one unready and
    // renumbers the port.
    let mut eps = slice.endpoints.clone().unwrap_or_default();
    eps.remove(0);
    if let Some(first) = eps.first_mut() {
        first.conditions.get_or_insert_default().ready = Some(false);
    }
    let stranger = next_ips().v4.to_string();
    let mut eps = serde_json::to_value(eps)?;
    eps.as_array_mut()
        .unwrap()
        .push(json!({ "addresses": [stranger] }));
    ns.api::<EndpointSlice>()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "endpoints": eps,
                "ports": [{ "name": "http", "port": 1234, "protocol": "TCP" }],
            })),
        )
        .await?;

    wait_for(SETTLE, || async {
        let s = http_slice(&ns).await?;
        let got: Vec<_> = s
            .endpoints
            .iter()
            .flatten()
            .map(|e| {
                (
                    e.target_ref.as_ref().and_then(|r| r.name.clone()),
                    e.conditions.as_ref().and_then(|c| c.ready),
                )
            })
            .collect();
        expect_eq(
            got,
            vec![
                (Some("a".into()), Some(true)),
                (Some("b".into()), Some(true)),
                (Some("c".into()), Some(true)),
            ],
        )?;
        // Every pod backs both ports: the slice lists both, renumbered back.
        expect_eq(
            s.ports.iter().flatten().map(|p| p.port).collect::<Vec<_>>(),
            vec![Some(8080), Some(9090)],
        )
    })
    .await?;
    slice_invariants(&ns, "web", 100).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_slice_recreated() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "recreate").await?;
    let _pw = setup(&ns).await?;
    let name = http_slice(&ns).await?.metadata.name.unwrap();
    ns.api::<EndpointSlice>()
        .delete(&name, &DeleteParams::default())
        .await?;
    wait_for(SETTLE, || async {
        expect_eq(endpoints_by_port(&ns, "web").await?, expected())
    })
    .await?;
    expect_eq(http_slice(&ns).await?.metadata.name.unwrap(), name)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripped_managed_by_label_reclaimed() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "reclaim").await?;
    let _pw = setup(&ns).await?;
    let slice = http_slice(&ns).await?;
    let (name, uid) = (
        slice.metadata.name.clone().unwrap(),
        slice.metadata.uid.clone().unwrap(),
    );

    // Merge patch: null removes exactly the managed-by label.
    ns.api::<EndpointSlice>()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { MANAGED_BY_LABEL: null } } })),
        )
        .await?;
    ensure!(
        !ns.api::<EndpointSlice>()
            .get(&name)
            .await?
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(MANAGED_BY_LABEL),
        "label still there"
    );

    // Reclaimed in place: same object gets the label back; no second slice
    // appears (every pod backs both ports: one slice lists both).
    wait_for(SETTLE, || async {
        let s = ns.api::<EndpointSlice>().get(&name).await?;
        let labels = s.metadata.labels.clone().unwrap_or_default();
        ensure!(
            labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY),
            "labels {labels:?}"
        );
        expect_eq(s.metadata.uid.clone().unwrap(), uid.clone())?;
        let all = slices_managed_by(&ns, "web", None).await?;
        expect_eq(all.len(), 1)?;
        expect_eq(endpoints_by_port(&ns, "web").await?, expected())
    })
    .await?;
    slice_invariants(&ns, "web", 100).await?;
    Ok(())
}
