#![cfg(feature = "in-process")]
//! Issue 13's write-path guards against the real apiserver: the writer's
//! view is a cache, so its writes must never take over or delete an object
//! the cache did not show it. Each case drives `SliceWriter` directly with
//! the stale view a race would give, because the race itself (another
//! writer between our snapshot and our write) cannot be timed from outside.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use portwise_controller::{
    apply::{SliceWriter, Writes},
    metrics::Metrics,
};
use portwise_tests::*;

const OTHER: &str = "other-writer";

fn slice(ns: &TestNs, name: &str, manager: &str, ip: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.name().into()),
            labels: Some(
                [
                    (SERVICE_NAME_LABEL.to_string(), "web".to_string()),
                    (MANAGED_BY_LABEL.to_string(), manager.to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }]),
        endpoints: Some(vec![Endpoint {
            addresses: vec![ip.into()],
            ..Default::default()
        }]),
    }
}

/// Another writer's create, through server-side apply as its own manager.
async fn written_by_other(api: &Api<EndpointSlice>, s: &EndpointSlice) -> Result<EndpointSlice> {
    let name = s.metadata.name.clone().unwrap_or_default();
    Ok(api
        .patch(&name, &PatchParams::apply(OTHER), &Patch::Apply(s))
        .await?)
}

fn addresses(s: &EndpointSlice) -> Vec<String> {
    s.endpoints
        .iter()
        .flatten()
        .flat_map(|e| e.addresses.clone())
        .collect()
}

/// A name the cache has not seen is applied without force: a slice that
/// another writer created after our snapshot is refused (409), not taken
/// over. The same write from a view that holds the slice repairs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_name_never_takes_over_another_writers_slice() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "guard-new").await?;
    let api: Api<EndpointSlice> = ns.api();
    let theirs = written_by_other(&api, &slice(&ns, "web-http", OTHER, "10.244.200.1")).await?;
    let writer = SliceWriter::new(cp.client().await?, MANAGED_BY.into());
    let ours = slice(&ns, "web-http", MANAGED_BY, "10.244.200.2");

    let err = writer
        .execute(
            ns.name(),
            &Writes::new(std::slice::from_ref(&ours), &[], |_| None),
            &Metrics::new(),
        )
        .await
        .err()
        .context("an apply onto another writer's slice went through")?;
    ensure!(
        err.to_string().contains("409") || err.to_string().to_lowercase().contains("conflict"),
        "{err}"
    );
    let live = api.get("web-http").await?;
    ensure!(
        addresses(&live) == addresses(&theirs),
        "taken over: {live:?}"
    );
    ensure!(
        live.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL] == OTHER,
        "labels changed: {live:?}"
    );

    // Where the view holds it (a slice of ours that someone edited), the
    // write is forced: the repair.
    let seen = Arc::new(live);
    writer
        .execute(
            ns.name(),
            &Writes::new(std::slice::from_ref(&ours), &[], |_| Some(seen.clone())),
            &Metrics::new(),
        )
        .await?;
    ensure!(addresses(&api.get("web-http").await?) == ["10.244.200.2"]);
    Ok(())
}

/// A name the view holds is forced only onto the object the view holds:
/// deleted and re-created by another writer since, it is refused ("uid
/// mismatch"). A delete likewise carries the uid and leaves the new object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_slice_is_neither_taken_over_nor_deleted() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "guard-uid").await?;
    let api: Api<EndpointSlice> = ns.api();
    let writer = SliceWriter::new(cp.client().await?, MANAGED_BY.into());
    let ours = slice(&ns, "web-http", MANAGED_BY, "10.244.201.1");
    api.create(&PostParams::default(), &ours).await?;
    let seen = Arc::new(api.get("web-http").await?);

    // Deleted and re-created by another writer after our snapshot.
    api.delete("web-http", &DeleteParams::default()).await?;
    wait_for(SETTLE, || async {
        ensure!(api.get_opt("web-http").await?.is_none(), "still there");
        Ok(())
    })
    .await?;
    let theirs = written_by_other(&api, &slice(&ns, "web-http", OTHER, "10.244.201.9")).await?;
    ensure!(
        theirs.metadata.uid != seen.metadata.uid,
        "same uid after re-creation"
    );

    let mut desired = ours.clone();
    desired.endpoints = Some(vec![Endpoint {
        addresses: vec!["10.244.201.2".into()],
        ..Default::default()
    }]);
    let err = writer
        .execute(
            ns.name(),
            &Writes::new(&[desired], &[], |_| Some(seen.clone())),
            &Metrics::new(),
        )
        .await
        .err()
        .context("a forced apply went onto the re-created object")?;
    ensure!(err.to_string().contains("uid"), "{err}");
    ensure!(addresses(&api.get("web-http").await?) == addresses(&theirs));

    // The delete with our stale view: the precondition fails (409, which
    // the writer treats as already done) and the new object stays.
    writer
        .execute(
            ns.name(),
            &Writes::new(&[], &["web-http".to_string()], |_| Some(seen.clone())),
            &Metrics::new(),
        )
        .await?;
    let live = api.get_opt("web-http").await?;
    ensure!(
        live.as_ref().map(addresses) == Some(addresses(&theirs)),
        "the re-created slice was deleted: {live:?}"
    );
    Ok(())
}
