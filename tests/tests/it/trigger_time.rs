//! The `endpoints.kubernetes.io/last-change-trigger-time` annotation, as
//! kube-proxy and CoreDNS read it: a new Service's slices are dated by its
//! creation; a readiness flip dates the slice it changes by the pod's Ready
//! `lastTransitionTime` and leaves the other port's slice (and its value)
//! alone; a change without a time of its own is dated when portwise
//! observed it; a quiet resync writes nothing. Writes are counted at the
//! apiserver.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::{
    api::{core::v1::Pod, discovery::v1::EndpointSlice},
    jiff::{Timestamp, ToSpan},
};
use kube::api::{Patch, PatchParams};
use portwise_tests::*;
use serde_json::json;

const TRIGGER: &str = "endpoints.kubernetes.io/last-change-trigger-time";

fn trigger(s: &EndpointSlice) -> Option<&str> {
    s.metadata
        .annotations
        .as_ref()?
        .get(TRIGGER)
        .map(String::as_str)
}

/// The one slice of `port`.
async fn slice_of(ns: &TestNs, port: &str) -> Result<EndpointSlice> {
    let mut slices: Vec<EndpointSlice> = slices_for(ns, "web")
        .await?
        .into_iter()
        .filter(|s| {
            s.ports
                .iter()
                .flatten()
                .any(|p| p.name.as_deref() == Some(port))
        })
        .collect();
    ensure!(slices.len() == 1, "{} slices for {port}", slices.len());
    Ok(slices.remove(0))
}

/// Go's RFC3339Nano of a whole second, as the apiserver also serialises
/// a condition's `lastTransitionTime`.
fn rfc3339(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Sets the Ready condition (status subresource) with its transition time.
async fn set_ready_at(ns: &TestNs, name: &str, ready: bool, at: &str) -> Result<Pod> {
    let status = if ready { "True" } else { "False" };
    let patch = json!({ "status": { "conditions": [
        { "type": "Ready", "status": status, "lastTransitionTime": at },
        { "type": "ContainersReady", "status": status, "lastTransitionTime": at },
    ]}});
    ns.api::<Pod>()
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .with_context(|| format!("setting readiness of pod {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_time_follows_the_change_each_slice_publishes() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "trigger").await?;
    // http's pods and admin's are apart, so each port has a slice of its
    // own (a pod of both would sit in one slice listing both).
    let everyone = ["a", "b", "c"];
    let admins = ["d", "e", "f"];
    let _pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .port("http", 8080)
                .port("admin", 9090),
        )
        .pods(everyone.map(|n| {
            pod(n)
                .annotation(GROUP_KEY, "g")
                .annotation(PORTS_KEY, "http")
                .ips(next_ips().v4())
        }))
        .pods(admins.map(|n| {
            pod(n)
                .annotation(GROUP_KEY, "g")
                .annotation(PORTS_KEY, "admin")
                .ips(next_ips().v4())
        }))
        .config(&config(&format!(
            "{{perPort: {{ports: {{http: {{all: [podReady, {{portNames: {{annotation: {PORTS_KEY}}}}}]}}, admin: {{portNames: {{annotation: {PORTS_KEY}}}}}}}}}}}"
        )))
        .expect(
            "web",
            by_port([
                (("http", V4), &everyone[..]),
                (("admin", V4), &admins[..]),
            ]),
        )
        .start()
        .await?;

    // A new Service: its slices are dated by its creation.
    let created = ns
        .get_service("web")
        .await?
        .metadata
        .creation_timestamp
        .context("no creationTimestamp")?
        .0;
    for port in ["http", "admin"] {
        let s = slice_of(&ns, port).await?;
        expect_eq(trigger(&s), Some(rfc3339(created).as_str())).context(port)?;
    }
    // Let anything still in flight land before counting.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let admin_before = slice_of(&ns, "admin").await?;
    let counter = WriteCounter::start(&ns).await?;

    // b turns unready; its Ready condition says when (a whole second, as
    // the API keeps it; earlier than portwise can observe it).
    let now = Timestamp::now();
    let unready_at = rfc3339(
        Timestamp::from_second(now.as_second())?
            .checked_sub(3.seconds())
            .context("time")?,
    );
    set_ready_at(&ns, "b", false, &unready_at).await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([
            (("http", V4), &["a", "c"][..]),
            (("admin", V4), &admins[..]),
        ]),
    )
    .await?;
    let http = slice_of(&ns, "http").await?;
    expect_eq(trigger(&http), Some(unready_at.as_str())).context("http after the flip")?;
    let admin = slice_of(&ns, "admin").await?;
    expect_eq(
        admin.metadata.resource_version.as_deref(),
        admin_before.metadata.resource_version.as_deref(),
    )
    .context("the admin slice was written")?;
    expect_eq(trigger(&admin), trigger(&admin_before)).context("admin keeps its value")?;
    tokio::time::sleep(Duration::from_secs(5)).await; // a couple of resyncs
    counter.expect(1, "one readiness flip").await?;

    // Back to Ready, later: the new transition dates it.
    let ready_at = rfc3339(Timestamp::from_second(Timestamp::now().as_second())?);
    set_ready_at(&ns, "b", true, &ready_at).await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([(("http", V4), &everyone[..]), (("admin", V4), &admins[..])]),
    )
    .await?;
    let http = slice_of(&ns, "http").await?;
    expect_eq(trigger(&http), Some(ready_at.as_str())).context("http after the flip back")?;

    // f leaves admin through its ports annotation, which has no time of its
    // own: dated when portwise observed it, after the edit was made.
    let before_edit = Timestamp::now();
    ns.annotate_pod("f", PORTS_KEY, Some("none")).await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([
            (("http", V4), &everyone[..]),
            (("admin", V4), &["d", "e"][..]),
        ]),
    )
    .await?;
    let seen = Timestamp::now();
    let admin = slice_of(&ns, "admin").await?;
    let dated: Timestamp = trigger(&admin)
        .context("admin not dated")?
        .parse()
        .context("admin's trigger time does not parse")?;
    ensure!(
        before_edit <= dated && dated <= seen,
        "admin dated {dated}, the edit was made after {before_edit} and seen by {seen}"
    );
    ensure!(
        trigger(&admin).is_some_and(|t| t.ends_with('Z')),
        "not UTC RFC 3339: {:?}",
        trigger(&admin)
    );
    expect_eq(
        trigger(&slice_of(&ns, "http").await?),
        Some(ready_at.as_str()),
    )
    .context("http keeps its value")?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    counter.expect(3, "three changes").await?;

    // Quiet: resyncs (every 2 s) write nothing and change no value.
    let (http, admin) = (slice_of(&ns, "http").await?, slice_of(&ns, "admin").await?);
    let quiet = WriteCounter::start(&ns).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    quiet.expect(0, "quiet resyncs").await?;
    expect_eq(trigger(&slice_of(&ns, "http").await?), trigger(&http))?;
    expect_eq(trigger(&slice_of(&ns, "admin").await?), trigger(&admin))?;
    slice_invariants(&ns, "web", 100).await?;
    Ok(())
}
