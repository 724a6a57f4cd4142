//! What each endpoint and slice carries: targetRef, nodeName, zone from the
//! Node, hostname when the pod's subdomain is the Service, traffic
//! distribution hints on ready endpoints only; the Service's labels and the
//! headless label on the slices.

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use portwise_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_fields_from_pod_and_node() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "fields").await?;
    let n1 = ns.ensure_node("n1", "zone-a").await?;
    let n2 = ns.ensure_node("n2", "zone-b").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .label("team", "blue")
            .port("http", 8080),
    )
    .await?;
    ns.create_service(
        service("web-headless")
            .annotation(GROUP_KEY, "g")
            .headless()
            .port("http", 8080),
    )
    .await?;
    let g = |name: &str| pod(name).annotation(GROUP_KEY, "g").ips(next_ips().v4());
    let a: Pod = ns
        .create_pod(g("a").node(&n1).subdomain("web").hostname("a-host"))
        .await?;
    let _pw = Scenario::new(&ns)
        .pod(g("b").node(&n2).subdomain("elsewhere").hostname("b-host"))
        .pod(g("c"))
        .start()
        .await?;

    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b", "c"][..])])).await?;
    let ea = endpoint_of(&ns, "web", "http", V4, "a").await?;
    expect_eq(ea.target_kind.as_deref(), Some("Pod"))?;
    expect_eq(ea.target_namespace.as_deref(), Some(ns.name()))?;
    expect_eq(ea.target_uid.clone(), a.metadata.uid.clone())?;
    expect_eq(
        (ea.node_name.clone(), ea.zone.clone()),
        (Some(n1.clone()), Some("zone-a".into())),
    )?;
    expect_eq(ea.hostname.as_deref(), Some("a-host"))?;
    let eb = endpoint_of(&ns, "web", "http", V4, "b").await?;
    expect_eq(
        (eb.node_name.clone(), eb.zone.clone()),
        (Some(n2.clone()), Some("zone-b".into())),
    )?;
    expect_eq(eb.hostname, None)?; // subdomain names another Service
    let ec = endpoint_of(&ns, "web", "http", V4, "c").await?;
    expect_eq((ec.node_name, ec.zone), (None, None))?;
    // For the headless Service a's subdomain does not match either.
    wait_for(SETTLE, || async {
        expect_eq(
            endpoint_of(&ns, "web-headless", "http", V4, "a")
                .await?
                .hostname,
            None,
        )
    })
    .await?;

    // Labels: the Service's own, plus headless exactly when headless.
    for s in slices_for(&ns, "web").await? {
        let l = s.metadata.labels.unwrap_or_default();
        ensure!(
            l.get("team").map(String::as_str) == Some("blue"),
            "Service labels not copied: {l:?}"
        );
        ensure!(
            !l.contains_key("service.kubernetes.io/headless"),
            "non-headless slice labelled headless: {l:?}"
        );
    }
    for s in slices_for(&ns, "web-headless").await? {
        let l = s.metadata.labels.unwrap_or_default();
        ensure!(
            l.get("service.kubernetes.io/headless").map(String::as_str) == Some(""),
            "headless label: {l:?}"
        );
    }
    slice_invariants(&ns, "web", 100).await?;
    slice_invariants(&ns, "web-headless", 100).await?;

    // A Service label change reaches the slices.
    ns.patch_service(
        "web",
        serde_json::json!({"metadata": {"labels": {"team": "green"}}}),
    )
    .await?;
    wait_for(SETTLE, || async {
        for s in slices_for(&ns, "web").await? {
            let l = s.metadata.labels.unwrap_or_default();
            ensure!(
                l.get("team").map(String::as_str) == Some("green"),
                "labels {l:?}"
            );
        }
        Ok(())
    })
    .await?;

    // Another writer's label stays through portwise's updates (each a PUT
    // of the whole object), and a label the Service drops leaves the
    // slices: portwise created them with a POST and updated them with
    // PUTs, so its keys are known from its Update entry in managedFields.
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Patch, PatchParams};
    let name = slices_for(&ns, "web").await?[0]
        .metadata
        .name
        .clone()
        .unwrap_or_default();
    ns.api::<EndpointSlice>()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"mesh": "on"}}})),
        )
        .await?;
    ns.patch_service(
        "web",
        serde_json::json!({"metadata": {"labels": {"team": null}}}),
    )
    .await?;
    wait_for(SETTLE, || async {
        for s in slices_for(&ns, "web").await? {
            let l = s.metadata.labels.unwrap_or_default();
            ensure!(!l.contains_key("team"), "a dropped label stayed: {l:?}");
        }
        let l = ns.api::<EndpointSlice>().get(&name).await?.metadata.labels;
        let l = l.unwrap_or_default();
        ensure!(
            l.get("mesh").map(String::as_str) == Some("on"),
            "another writer's label was lost: {l:?}"
        );
        Ok(())
    })
    .await?;
    // A later content change keeps it too.
    ns.set_ready("c", false).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;
    let l = ns.api::<EndpointSlice>().get(&name).await?.metadata.labels;
    ensure!(
        l.unwrap_or_default().get("mesh").map(String::as_str) == Some("on"),
        "another writer's label was lost by an endpoints update"
    );
    Ok(())
}

/// `trafficDistribution`: zone hints (PreferSameZone, and its older name
/// PreferClose), node and zone hints (PreferSameNode), on ready endpoints
/// only; no hints without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_distribution_hints() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "hints").await?;
    let n1 = ns.ensure_node("n1", "zone-a").await?;
    let n2 = ns.ensure_node("n2", "zone-b").await?;
    for (svc, td) in [
        ("zone", Some("PreferSameZone")),
        ("close", Some("PreferClose")),
        ("node", Some("PreferSameNode")),
        ("none", None),
    ] {
        let mut b = service(svc).annotation(GROUP_KEY, "g").port("http", 8080);
        if let Some(td) = td {
            b = b.traffic_distribution(td);
        }
        ns.create_service(b).await?;
    }
    let g = |name: &str, node: &str| {
        pod(name)
            .annotation(GROUP_KEY, "g")
            .node(node)
            .held()
            .ips(next_ips().v4())
    };
    ns.create_pod(g("a", &n1)).await?;
    ns.create_pod(g("b", &n2)).await?;
    ns.create_pod(g("leaving", &n1)).await?;
    ns.terminate_pod("leaving").await?; // published, but not ready
    let _pw = Portwise::start(&ns, &config("podReady")).await?;

    let hints = |svc: &'static str| {
        let ns = &ns;
        async move {
            let v = endpoint_views(ns, svc).await?;
            Ok::<_, anyhow::Error>(
                v.into_iter()
                    .map(|e| (e.pod, e.hint_zones, e.hint_nodes))
                    .collect::<Vec<_>>(),
            )
        }
    };
    let z = |s: &str| Some(vec![s.to_string()]);
    wait_for(SETTLE, || async {
        for svc in ["zone", "close"] {
            expect_eq(
                hints(svc).await?,
                vec![
                    ("a".into(), z("zone-a"), None),
                    ("b".into(), z("zone-b"), None),
                    ("leaving".into(), None, None),
                ],
            )?;
        }
        expect_eq(
            hints("node").await?,
            vec![
                ("a".into(), z("zone-a"), z(&n1)),
                ("b".into(), z("zone-b"), z(&n2)),
                ("leaving".into(), None, None),
            ],
        )?;
        expect_eq(
            hints("none").await?,
            vec![
                ("a".into(), None, None),
                ("b".into(), None, None),
                ("leaving".into(), None, None),
            ],
        )
    })
    .await?;
    Ok(())
}

/// `disableNodeLookups`: no Node watch, so no zones and no hints, while
/// nodeName still comes from the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lookups_can_be_disabled() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "no-nodes").await?;
    let n1 = ns.ensure_node("n1", "zone-a").await?;
    let _pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .traffic_distribution("PreferSameZone")
                .port("http", 8080),
        )
        .pod(
            pod("a")
                .annotation(GROUP_KEY, "g")
                .node(&n1)
                .ips(next_ips().v4()),
        )
        .config(&config_with("podReady", "disableNodeLookups: true\n"))
        .start()
        .await?;
    wait_for(SETTLE, || async {
        let a = endpoint_of(&ns, "web", "http", V4, "a").await?;
        expect_eq(
            (a.node_name, a.zone, a.hint_zones, a.hint_nodes),
            (Some(n1.clone()), None, None, None),
        )
    })
    .await?;
    Ok(())
}

/// Issue 12: a headless Service without ports (DNS peer discovery for a
/// StatefulSet) gets slices with no ports, which the apiserver accepts,
/// holding its Ready pods with their hostnames; portwise then leaves them be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portless_headless_service_gets_slices_without_ports() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "portless").await?;
    ns.create_service(service("peers").annotation(GROUP_KEY, "g").headless())
        .await?;
    for (name, ready) in [("a", true), ("b", true), ("c", false)] {
        ns.create_pod(
            pod(name)
                .annotation(GROUP_KEY, "g")
                .ips(next_ips().v4())
                .ready(ready),
        )
        .await?;
    }
    let _pw = Portwise::start(&ns, &config("podReady")).await?;
    // The apiserver makes a selector-less headless Service dual-stack; the
    // pods have IPv4 addresses only.
    let v4 = || async {
        let slices = slices_for(&ns, "peers").await?;
        let v4: Vec<_> = slices
            .into_iter()
            .filter(|s| s.address_type == "IPv4")
            .collect();
        ensure!(v4.len() == 1, "{} IPv4 slices", v4.len());
        Ok(v4.into_iter().next().unwrap())
    };
    wait_for(SETTLE, || async {
        let s = &v4().await?;
        ensure!(
            s.ports.as_deref().unwrap_or_default().is_empty(),
            "ports {:?}",
            s.ports
        );
        let mut pods: Vec<String> = s
            .endpoints
            .iter()
            .flatten()
            .filter_map(|e| e.target_ref.as_ref()?.name.clone())
            .collect();
        pods.sort();
        expect_eq(pods, vec!["a".to_string(), "b".to_string()])
    })
    .await?;
    let before = v4().await?.metadata.resource_version.clone();
    // Several resyncs: a second plan against the live slice writes nothing.
    stays_for(std::time::Duration::from_secs(5), || async {
        expect_eq(
            v4().await?.metadata.resource_version.clone(),
            before.clone(),
        )
    })
    .await?;
    ns.set_ready("c", true).await?;
    wait_for(SETTLE, || async {
        expect_eq(v4().await?.endpoints.as_ref().map_or(0, Vec::len), 3)
    })
    .await?;
    Ok(())
}
