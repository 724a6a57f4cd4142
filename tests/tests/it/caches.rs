//! What portwise caches (issue 13, "Cost that grows with the managed set"):
//! only pods and Services that carry the key, and only its own slices;
//! objects that gain or lose the key move in and out, and a Service that
//! loses its key still has its slices taken back, also when it lost it
//! while portwise was down.
//!
//! The cache sizes are read from `portwise_cache_objects{kind}` on the
//! binary's operations port. Every scenario runs with the key as a label
//! (the apiserver selects) and as an annotation (portwise filters before
//! its caches).

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::PostParams;
use portwise_tests::*;
use serde_json::json;

#[derive(Clone, Copy, Debug)]
enum Key {
    Label,
    Annotation,
}

impl Key {
    fn config(self) -> String {
        let kind = match self {
            Key::Label => "label",
            Key::Annotation => "annotation",
        };
        format!(
            "managedBy: {MANAGED_BY}\n\
             serviceKey: {{{kind}: {GROUP_KEY}}}\n\
             resyncPeriod: 2s\n\
             membership: podReady\n"
        )
    }

    fn svc(self, name: &str, group: &str) -> ServiceBuilder {
        let s = service(name).port("http", 8080);
        match self {
            Key::Label => s.label(GROUP_KEY, group),
            Key::Annotation => s.annotation(GROUP_KEY, group),
        }
    }

    fn pod(self, name: &str, group: &str) -> PodBuilder {
        let p = pod(name).ips(next_ips().v4());
        match self {
            Key::Label => p.label(GROUP_KEY, group),
            Key::Annotation => p.annotation(GROUP_KEY, group),
        }
    }

    async fn set_pod(self, ns: &TestNs, name: &str, group: Option<&str>) -> Result<()> {
        match self {
            Key::Label => ns.label_pod(name, GROUP_KEY, group).await?,
            Key::Annotation => ns.annotate_pod(name, GROUP_KEY, group).await?,
        };
        Ok(())
    }

    async fn drop_from_service(self, ns: &TestNs, name: &str) -> Result<()> {
        let field = match self {
            Key::Label => "labels",
            Key::Annotation => "annotations",
        };
        ns.patch_service(name, json!({ "metadata": { field: { GROUP_KEY: null } } }))
            .await?;
        Ok(())
    }
}

async fn start(ns: &TestNs, key: Key) -> Result<Portwise> {
    let mut pw = Portwise::builder(ns.cp())
        .namespace(ns.name())
        .config(&key.config())
        .binary()
        .start()
        .await?;
    pw.wait_ready().await?;
    Ok(pw)
}

/// `portwise_cache_objects` for services, pods, endpointslices, once they
/// read `want` (the gauge is sampled every second).
async fn caches_are(pw: &Portwise, want: (f64, f64, f64)) -> Result<()> {
    wait_for(SETTLE, || async {
        let m = pw.scrape().await?;
        let got = (
            m.sum("portwise_cache_objects", &[("kind", "services")]),
            m.sum("portwise_cache_objects", &[("kind", "pods")]),
            m.sum("portwise_cache_objects", &[("kind", "endpointslices")]),
        );
        ensure!(
            got == want,
            "cached (services, pods, slices) {got:?}, want {want:?}"
        );
        Ok(())
    })
    .await
}

async fn only_keyed_objects_are_cached(key: Key) -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "caches").await?;
    ns.create_service(key.svc("web", "g")).await?;
    // Unmanaged: no key, or the key of the other kind.
    ns.create_service(service("plain").port("http", 8080))
        .await?;
    ns.create_service(match key {
        Key::Label => service("wrong-kind")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080),
        Key::Annotation => service("wrong-kind")
            .label(GROUP_KEY, "g")
            .port("http", 8080),
    })
    .await?;
    ns.create_pods(vec![key.pod("a", "g"), key.pod("b", "g")])
        .await?;
    ns.create_pods(
        (0..6)
            .map(|i| pod(&format!("stranger-{i}")).ips(next_ips().v4()))
            .collect(),
    )
    .await?;
    // Another manager's slice (nobody's Service): not cached either.
    let foreign: EndpointSlice = serde_json::from_value(json!({
        "metadata": { "name": "foreign", "labels": {
            SERVICE_NAME_LABEL: "plain", MANAGED_BY_LABEL: "someone-else.example.com",
        }},
        "addressType": "IPv4",
        "endpoints": [],
    }))?;
    ns.api::<EndpointSlice>()
        .create(&PostParams::default(), &foreign)
        .await?;

    let pw = start(&ns, key).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;
    caches_are(&pw, (1.0, 2.0, 1.0)).await?;

    // A pod whose key is removed leaves the slice and the cache; one that
    // gains it joins both.
    key.set_pod(&ns, "b", None).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;
    caches_are(&pw, (1.0, 1.0, 1.0)).await?;
    key.set_pod(&ns, "stranger-0", Some("g")).await?;
    expect_endpoints(
        &ns,
        "web",
        by_port([(("http", V4), &["a", "stranger-0"][..])]),
    )
    .await?;
    caches_are(&pw, (1.0, 2.0, 1.0)).await?;
    // A pod that moves to another group leaves this one.
    key.set_pod(&ns, "a", Some("h")).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["stranger-0"][..])])).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_keyed_objects_are_cached_label_key() -> Result<()> {
    only_keyed_objects_are_cached(Key::Label).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_keyed_objects_are_cached_annotation_key() -> Result<()> {
    only_keyed_objects_are_cached(Key::Annotation).await
}

async fn service_losing_its_key_is_released(key: Key) -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "key-lost").await?;
    ns.create_service(key.svc("one", "g")).await?;
    ns.create_service(key.svc("two", "g")).await?;
    ns.create_pods(vec![key.pod("a", "g")]).await?;
    let mut pw = start(&ns, key).await?;
    for svc in ["one", "two"] {
        expect_endpoints(&ns, svc, by_port([(("http", V4), &["a"][..])])).await?;
    }
    caches_are(&pw, (2.0, 1.0, 2.0)).await?;

    // Loses its key while portwise watches: released, and out of the cache.
    key.drop_from_service(&ns, "one").await?;
    wait_for(SETTLE, || async {
        let s = slices_managed_by(&ns, "one", Some(MANAGED_BY)).await?;
        ensure!(s.is_empty(), "one keeps {} slice(s)", s.len());
        Ok(())
    })
    .await?;
    caches_are(&pw, (1.0, 1.0, 1.0)).await?;

    // Loses its key while portwise is down: released after the restart.
    pw.stop().await?;
    key.drop_from_service(&ns, "two").await?;
    pw.start_again().await?;
    pw.wait_ready().await?;
    wait_for(SETTLE, || async {
        let s = slices_managed_by(&ns, "two", Some(MANAGED_BY)).await?;
        ensure!(s.is_empty(), "two keeps {} slice(s)", s.len());
        Ok(())
    })
    .await?;
    caches_are(&pw, (0.0, 1.0, 0.0)).await?;

    // Gaining the key back serves it again.
    ns.patch_service(
        "two",
        match key {
            Key::Label => json!({ "metadata": { "labels": { GROUP_KEY: "g" } } }),
            Key::Annotation => json!({ "metadata": { "annotations": { GROUP_KEY: "g" } } }),
        },
    )
    .await?;
    expect_endpoints(&ns, "two", by_port([(("http", V4), &["a"][..])])).await?;
    // "one" stays released.
    stays_for(Duration::from_secs(4), || async {
        let s = slices_managed_by(&ns, "one", Some(MANAGED_BY)).await?;
        ensure!(s.is_empty(), "one got slices again: {s:?}");
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_losing_its_key_is_released_label_key() -> Result<()> {
    service_losing_its_key_is_released(Key::Label).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_losing_its_key_is_released_annotation_key() -> Result<()> {
    service_losing_its_key_is_released(Key::Annotation).await
}

/// The endpoints (by pod name) of the slices `manager` publishes for `svc`.
async fn members_by(ns: &TestNs, svc: &str, manager: &str) -> Result<Vec<String>> {
    let mut names: Vec<String> = slices_managed_by(ns, svc, Some(manager))
        .await?
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter_map(|e| e.target_ref.as_ref()?.name.clone())
        .collect();
    names.sort();
    Ok(names)
}

/// A cluster-wide portwise's own annotation key and manager, named after
/// `ns` so that no other test's Services are served, and its config.
fn own_key(ns: &TestNs, what: &str) -> (String, String, String) {
    let key = format!("{}.{what}.example.com/group", ns.name());
    let manager = format!("pw-{}", ns.name());
    let config = format!(
        "managedBy: {manager}\n\
         serviceKey: {{annotation: {key}}}\n\
         resyncPeriod: 2s\n\
         membership: podReady\n"
    );
    (key, manager, config)
}

/// Cluster-wide with an annotation key, pods are watched only in the
/// namespaces that hold a keyed Service (`host/controller/src/pod_scopes.rs`):
/// keyed pods elsewhere are never cached; a Service created in a new
/// namespace is published from its pods' complete list (never an empty or
/// partial slice first); the namespace's pods leave the cache with its last
/// keyed Service and come back with the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotation_keys_watch_pods_only_where_keyed_services_are() -> Result<()> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};

    let cp = ControlPlane::shared().await?;
    let home = TestNs::new(cp, "scopes-home").await?;
    let late = TestNs::new(cp, "scopes-late").await?;
    let never = TestNs::new(cp, "scopes-never").await?;
    let (key, manager, config) = own_key(&home, "scopes");
    let keyed = |name: &str| pod(name).annotation(&key, "g").ips(next_ips().v4());
    home.create_service(service("web").annotation(&key, "g").port("http", 8080))
        .await?;
    home.create_pods(vec![keyed("a"), keyed("b")]).await?;
    late.create_service(service("plain").port("http", 8080))
        .await?;
    late.create_pods((0..4).map(|i| keyed(&format!("l{i}"))).collect())
        .await?;
    never
        .create_pods((0..6).map(|i| keyed(&format!("n{i}"))).collect())
        .await?;

    let mut pw = Portwise::builder(cp)
        .config(&config)
        .binary()
        .start()
        .await?;
    pw.wait_ready().await?;
    pw.wait_for_log("namespaces=1", SETTLE).await?;
    wait_for(SETTLE, || async {
        expect_eq(
            members_by(&home, "web", &manager).await?,
            vec!["a".into(), "b".into()],
        )
    })
    .await?;
    // Only the home namespace's pods: the 10 keyed pods elsewhere were
    // never received.
    wait_for(SETTLE, || async { expect_eq(pw.cached_pods().await?, 2.0) }).await?;

    // Every version of the late namespace's slices, from before its first
    // keyed Service.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
    let slices: kube::Api<EndpointSlice> = late.api();
    let selector = format!("{MANAGED_BY_LABEL}={manager}");
    let watch = tokio::spawn({
        let seen = seen.clone();
        watcher(slices, watcher::Config::default().labels(&selector))
            .applied_objects()
            .for_each(move |s| {
                if let Ok(s) = s {
                    seen.lock()
                        .unwrap()
                        .push(s.endpoints.iter().flatten().count());
                }
                futures::future::ready(())
            })
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let all_late: Vec<String> = (0..4).map(|i| format!("l{i}")).collect();
    for round in 0..2 {
        late.create_service(service("svc").annotation(&key, "g").port("http", 8080))
            .await?;
        wait_for(SETTLE, || async {
            expect_eq(members_by(&late, "svc", &manager).await?, all_late.clone())
        })
        .await?;
        wait_for(SETTLE, || async { expect_eq(pw.cached_pods().await?, 6.0) }).await?;
        // Its last keyed Service gone, the namespace's pods leave the cache.
        late.delete_service("svc").await?;
        wait_for(SETTLE, || async { expect_eq(pw.cached_pods().await?, 2.0) }).await?;
        // The garbage collector takes its slices before the next round.
        wait_for(SETTLE, || async {
            expect_eq(members_by(&late, "svc", &manager).await?, Vec::new())
        })
        .await?;
        let counts = seen.lock().unwrap().clone();
        ensure!(
            !counts.is_empty() && counts.iter().all(|&n| n == 4),
            "round {round}: the late Service's slice was published with {counts:?} endpoints, \
             want 4 in every version"
        );
    }
    watch.abort();
    // The home Service was served throughout.
    expect_eq(
        members_by(&home, "web", &manager).await?,
        vec!["a".into(), "b".into()],
    )?;
    Ok(())
}

/// Past `--pod-watch-namespaces` at start, pods are watched with one
/// cluster-wide watch instead of one per namespace: every keyed pod is
/// cached, Services in any namespace are served, and a namespace's last
/// Service going closes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_namespace_limit_pods_are_watched_cluster_wide() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let one = TestNs::new(cp, "limit-one").await?;
    let two = TestNs::new(cp, "limit-two").await?;
    let three = TestNs::new(cp, "limit-three").await?;
    let (key, manager, config) = own_key(&one, "limit");
    let keyed = |name: &str| pod(name).annotation(&key, "g").ips(next_ips().v4());
    for ns in [&one, &two] {
        ns.create_service(service("web").annotation(&key, "g").port("http", 8080))
            .await?;
    }
    one.create_pods(vec![keyed("a")]).await?;
    two.create_pods(vec![keyed("b"), keyed("c")]).await?;
    three
        .create_pods((0..3).map(|i| keyed(&format!("t{i}"))).collect())
        .await?;

    let mut pw = Portwise::builder(cp)
        .config(&config)
        .args(&["--pod-watch-namespaces", "1"])
        .start()
        .await?;
    pw.wait_ready().await?;
    pw.wait_for_log("pods watched cluster-wide", SETTLE).await?;
    ensure!(
        !pw.current_logs().contains("pods watched in each namespace"),
        "two namespaces past a limit of one were watched one by one"
    );
    for (ns, want) in [(&one, vec!["a"]), (&two, vec!["b", "c"])] {
        let want: Vec<String> = want.into_iter().map(String::from).collect();
        wait_for(SETTLE, || async {
            expect_eq(members_by(ns, "web", &manager).await?, want.clone())
        })
        .await?;
    }
    // Every keyed pod of the cluster, the third namespace's too.
    wait_for(SETTLE, || async { expect_eq(pw.cached_pods().await?, 6.0) }).await?;
    three
        .create_service(service("web").annotation(&key, "g").port("http", 8080))
        .await?;
    wait_for(SETTLE, || async {
        expect_eq(
            members_by(&three, "web", &manager).await?,
            vec!["t0".into(), "t1".into(), "t2".into()],
        )
    })
    .await?;
    one.delete_service("web").await?;
    stays_for(Duration::from_secs(4), || async {
        expect_eq(pw.cached_pods().await?, 6.0)
    })
    .await?;
    Ok(())
}
