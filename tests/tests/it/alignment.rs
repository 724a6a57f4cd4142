//! Alignment: which Services are managed, which pods back them.

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Event;
use portwise_tests::*;

/// portwise's own warnings: the apiserver warns on Services too (its
/// ClusterIP repair loop reports `ClusterIPNotAllocated` now and then), and
/// those are not what these tests count.
fn warnings(events: &[Event]) -> i32 {
    events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| {
            e.reporting_component.as_deref() == Some("portwise")
                || e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("portwise")
        })
        .map(|e| {
            e.series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .unwrap_or(1)
                .max(1)
        })
        .sum()
}

/// ExternalName Services are ignored, with a warning Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_name_ignored_with_event() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "extname").await?;
    let _pw = Scenario::new(&ns)
        .service(
            service("ext")
                .annotation(GROUP_KEY, "g")
                .external_name("db.example.com")
                .port("http", 8080),
        )
        // A managed neighbour proves portwise has looked at this namespace.
        .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .start()
        .await?;

    wait_for(SETTLE, || async {
        expect_eq(
            endpoints_by_port(&ns, "web").await?,
            by_port([(("http", V4), &["a"][..])]),
        )?;
        ensure!(
            warnings(&events_for(&ns, "ext", None).await?) >= 1,
            "no warning Event for the ExternalName Service"
        );
        Ok(())
    })
    .await?;
    stays_for(Duration::from_secs(5), || async {
        let slices = slices_managed_by(&ns, "ext", None).await?;
        ensure!(
            slices.is_empty(),
            "slices published for an ExternalName Service: {slices:?}"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// A managed Service that still has a selector gets one warning Event (not
/// one per resync) and is served anyway, for live migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selector_service_warned_once_and_served() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "selector").await?;
    let _pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .selector("app", "nothing-matches")
                .port("http", 8080),
        )
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .start()
        .await?;

    wait_for(SETTLE, || async {
        expect_eq(
            endpoints_by_port(&ns, "web").await?,
            by_port([(("http", V4), &["a"][..])]),
        )?;
        ensure!(
            warnings(&events_for(&ns, "web", None).await?) >= 1,
            "no warning Event for a Service with a selector"
        );
        Ok(())
    })
    .await?;
    // Later reconciles (each pod change below is published, so each was
    // reconciled), still one warning.
    for (name, published) in [("b", &["a", "b"][..]), ("c", &["a", "b", "c"][..])] {
        ns.create_pod(pod(name).annotation(GROUP_KEY, "g").ips(next_ips().v4()))
            .await?;
        expect_endpoints(&ns, "web", by_port([(("http", V4), published)])).await?;
    }
    let events = events_for(&ns, "web", None).await?;
    let summary: Vec<_> = events
        .iter()
        .map(|e| {
            (
                &e.type_,
                &e.reason,
                &e.message,
                e.count,
                e.series.as_ref().and_then(|s| s.count),
            )
        })
        .collect();
    ensure!(
        warnings(&events) == 1,
        "expected one warning, got {summary:#?}"
    );
    Ok(())
}

/// Keys can be labels or annotations, and the pod key can differ from the
/// Service key; the wrong kind of key does not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_and_annotation_keys() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "keys").await?;
    ns.create_service(
        service("by-label")
            .label("example.com/group", "g")
            .port("http", 8080),
    )
    .await?;
    // Carries the key as an annotation: not managed under a label key.
    ns.create_service(
        service("by-annotation")
            .annotation("example.com/group", "g")
            .port("http", 8080),
    )
    .await?;
    ns.create_pod(
        pod("member")
            .annotation("example.com/member", "g")
            .ips(next_ips().v4()),
    )
    .await?;
    ns.create_pod(
        pod("labelled")
            .label("example.com/member", "g")
            .ips(next_ips().v4()),
    )
    .await?;
    ns.create_pod(
        pod("other-group")
            .annotation("example.com/member", "h")
            .ips(next_ips().v4()),
    )
    .await?;
    let cfg = format!(
        "managedBy: {MANAGED_BY}\n\
         serviceKey: {{label: example.com/group}}\n\
         podKey: {{annotation: example.com/member}}\n\
         resyncPeriod: 2s\n\
         membership: podReady\n"
    );
    let _pw = Portwise::start(&ns, &cfg).await?;

    expect_endpoints(&ns, "by-label", by_port([(("http", V4), &["member"][..])])).await?;
    stays_for(Duration::from_secs(5), || async {
        let s = slices_managed_by(&ns, "by-annotation", None).await?;
        ensure!(s.is_empty(), "unmanaged Service got slices: {s:?}");
        Ok(())
    })
    .await?;
    Ok(())
}

/// Pods join only Services of their own namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_do_not_cross_namespaces() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns1 = TestNs::new(cp, "ns-one").await?;
    let ns2 = TestNs::new(cp, "ns-two").await?;
    ns1.create_service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    ns1.create_pod(pod("here").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .await?;
    ns2.create_pod(pod("there").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .await?;
    let _pw = Portwise::builder(cp)
        .namespaces(&[ns1.name(), ns2.name()])
        .config(&config("podReady"))
        .start()
        .await?;

    wait_for(SETTLE, || async {
        expect_eq(
            endpoints_by_port(&ns1, "web").await?,
            by_port([(("http", V4), &["here"][..])]),
        )
    })
    .await?;
    stays_for(Duration::from_secs(4), || async {
        expect_eq(
            endpoints_by_port(&ns1, "web").await?,
            by_port([(("http", V4), &["here"][..])]),
        )
    })
    .await?;
    Ok(())
}

/// Candidate rules, with a checker that includes everything: terminal
/// phases, pods without an address, other groups and pods without the key
/// are never candidates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidate_rules() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "candidates").await?;
    ns.create_service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    let g = |name: &str| pod(name).annotation(GROUP_KEY, "g");
    let _pw = Scenario::new(&ns)
        .pod(g("running").ips(next_ips().v4()))
        .pod(g("unready").ready(false).ips(next_ips().v4()))
        .pod(g("succeeded").phase("Succeeded").ips(next_ips().v4()))
        .pod(g("failed").phase("Failed").ips(next_ips().v4()))
        .pod(g("no-ip").ips(Vec::<String>::new()))
        .pod(g("pending").no_status())
        .pod(
            pod("other-group")
                .annotation(GROUP_KEY, "h")
                .ips(next_ips().v4()),
        )
        .pod(pod("no-key").ips(next_ips().v4()))
        .config(&config("include"))
        .start()
        .await?;

    expect_endpoints(
        &ns,
        "web",
        by_port([(("http", V4), &["running", "unready"][..])]),
    )
    .await?;
    // A pod that joins the group later, and one that leaves it.
    ns.annotate_pod("other-group", GROUP_KEY, Some("g")).await?;
    ns.annotate_pod("running", GROUP_KEY, None).await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([(("http", V4), &["other-group", "unready"][..])]),
    )
    .await?;
    Ok(())
}

/// No new slices for a Service that is being deleted; once it is gone, its
/// slices go with it (owner reference, garbage collector).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_being_deleted_gets_no_new_slices() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "deleting").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080)
            .held(),
    )
    .await?;
    for name in ["a", "b"] {
        ns.create_pod(pod(name).annotation(GROUP_KEY, "g").ips(next_ips().v4()))
            .await?;
    }
    let _pw = Portwise::start(&ns, &config_with("podReady", "maxEndpointsPerSlice: 2\n")).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;
    let names: Vec<_> = slices_for(&ns, "web")
        .await?
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();

    ns.delete_service("web").await?; // held by a finalizer: now being deleted
    ensure!(
        ns.get_service("web")
            .await?
            .metadata
            .deletion_timestamp
            .is_some(),
        "service not being deleted"
    );
    for name in ["c", "d", "e"] {
        ns.create_pod(pod(name).annotation(GROUP_KEY, "g").ips(next_ips().v4()))
            .await?;
    }
    stays_for(Duration::from_secs(8), || async {
        let now: Vec<_> = slices_for(&ns, "web")
            .await?
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect();
        ensure!(
            now.iter().all(|n| names.contains(n)),
            "new slices {now:?} (had {names:?})"
        );
        Ok(())
    })
    .await?;
    // Still served, only without new slices: a pod that leaves leaves its
    // slice (the quiet above was not portwise having stopped).
    ns.set_ready("a", false).await?;
    wait_for(SETTLE, || async {
        let slices = slices_for(&ns, "web").await?;
        let pods: Vec<String> = slices
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter_map(|e| e.target_ref.as_ref()?.name.clone())
            .collect();
        ensure!(
            !pods.contains(&"a".to_string()),
            "a still published: {pods:?}"
        );
        let now: Vec<_> = slices.into_iter().filter_map(|s| s.metadata.name).collect();
        ensure!(now.iter().all(|n| names.contains(n)), "new slices {now:?}");
        Ok(())
    })
    .await?;

    ns.api::<k8s_openapi::api::core::v1::Service>()
        .patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    wait_for(SETTLE, || async {
        let left = slices_managed_by(&ns, "web", None).await?;
        ensure!(
            left.is_empty(),
            "{} slices outlived their Service",
            left.len()
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// Service ports come and go: a removed port's slices go, a new port's
/// slices come, a renamed port's slices are renamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_port_changes_follow() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "ports-change").await?;
    let _pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .port("http", 8080)
                .port("admin", 9090),
        )
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .start()
        .await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([(("http", V4), &["a"][..]), (("admin", V4), &["a"][..])]),
    )
    .await?;

    let ports = serde_json::json!({ "spec": { "ports": [
        { "name": "web", "port": 8080, "protocol": "TCP" },
        { "name": "grpc", "port": 9091, "protocol": "TCP" },
    ]}});
    ns.patch_service("web", ports).await?;
    wait_for(SETTLE, || async {
        expect_eq(
            endpoints_by_port(&ns, "web").await?,
            by_port([(("web", V4), &["a"][..]), (("grpc", V4), &["a"][..])]),
        )?;
        // a backs both ports: one slice lists both.
        expect_eq(slices_for(&ns, "web").await?.len(), 1)
    })
    .await?;
    slice_invariants(&ns, "web", 100).await?;
    Ok(())
}

/// `portwise run --namespace NS` (the binary's flag) watches only NS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_watches_only_its_namespace() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let watched = TestNs::new(cp, "watched").await?;
    let other = TestNs::new(cp, "unwatched").await?;
    for ns in [&watched, &other] {
        ns.create_service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
            .await?;
        ns.create_pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
            .await?;
    }
    let mut pw = Portwise::spawn_binary(&watched, &config("podReady")).await?;
    wait_for(SETTLE, || async {
        expect_eq(
            endpoints_by_port(&watched, "web").await?,
            by_port([(("http", V4), &["a"][..])]),
        )
    })
    .await?;
    stays_for(Duration::from_secs(4), || async {
        let s = slices_managed_by(&other, "web", Some(MANAGED_BY)).await?;
        ensure!(s.is_empty(), "unwatched namespace got slices: {s:?}");
        Ok(())
    })
    .await?;
    pw.stop().await?;
    Ok(())
}
