//! Control-plane faults (issue 7, item 1; docs/reliability.md): the
//! apiserver restarts, watches expire after etcd compaction, the apiserver
//! sheds load with 429, and portwise is `kill -9`ed half-way through a
//! multi-slice change.
//!
//! Each test runs on a control plane of its own in a network namespace of
//! its own ([`faults::isolated`]), with the real `portwise` binary running
//! as the `portwise` ServiceAccount under deploy/'s least-privilege RBAC.
//! Every test ends the same way: the slices equal what the pods say (the
//! Ready pods, read back from the apiserver), with no address twice.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{ConfigMap, Pod},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams, VersionMatch, WatchEvent, WatchParams},
};
use portwise_tests::{faults::*, *};
use serde_json::json;

const GROUP: &str = "g";
const PORTS: [&str; 2] = ["http", "admin"];

fn cfg(max_per_slice: usize) -> String {
    config_with(
        "podReady",
        &format!("maxEndpointsPerSlice: {max_per_slice}\n"),
    )
}

/// The binary watching `ns`, as `kubeconfig`'s identity (the ServiceAccount).
async fn start_portwise(
    ns: &TestNs,
    kubeconfig: &std::path::Path,
    config: &str,
) -> Result<Portwise> {
    Portwise::builder(ns.cp())
        .namespace(ns.name())
        .config(config)
        .identity(kubeconfig)
        .start()
        .await
}

async fn web_service(ns: &TestNs) -> Result<()> {
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, GROUP)
            .port("http", 8080)
            .port("admin", 9090),
    )
    .await?;
    Ok(())
}

fn web_pod(i: usize, ready: bool) -> PodBuilder {
    pod(&format!("p{i:03}"))
        .annotation(GROUP_KEY, GROUP)
        .ips(next_ips().v4())
        .ready(ready)
}

/// Waits until the slices publish exactly the Ready pods, each once, and
/// returns how long that took.
async fn converged(ns: &TestNs, max_per_slice: usize, within: Duration) -> Result<Duration> {
    let start = Instant::now();
    wait_for(within, || async {
        let truth = ready_truth(ns, GROUP, &PORTS).await?;
        expect_eq(endpoints_by_port(ns, "web").await?, truth)?;
        slice_invariants(ns, "web", max_per_slice).await
    })
    .await?;
    Ok(start.elapsed())
}

/// Log lines that report a failure (kube-runtime and portwise warnings).
fn warnings(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .count()
}

// ---- apiserver restart --------------------------------------------------

/// The apiserver (with its embedded etcd) crashes (SIGKILL) and comes back
/// 5s later on the same etcd data, while pods change just before and just
/// after. portwise keeps running,
/// reconnects, and publishes exactly the Ready pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart() -> Result<()> {
    isolated(
        "faults::apiserver_restart",
        Isolation::default(),
        || async {
            let cp = ControlPlane::shared().await?;
            let ns = TestNs::new(cp, "restart").await?;
            web_service(&ns).await?;
            ns.create_pods((0..40).map(|i| web_pod(i, i % 4 != 0)).collect())
                .await?;
            let kc = portwise_identity(cp).await?;
            let mut pw = start_portwise(&ns, &kc, &cfg(20)).await?;
            let first = converged(&ns, 20, SETTLE).await?;
            println!("initial convergence: {first:?}");

            // Changes portwise may or may not have seen when the apiserver goes.
            for i in 0..8 {
                ns.set_ready(&format!("p{i:03}"), i % 2 == 0).await?;
            }
            for i in 36..40 {
                ns.delete_pod(&format!("p{i:03}")).await?;
            }
            crash_apiserver(cp).await?;
            let log_at_stop = pw.current_logs().len();
            tokio::time::sleep(Duration::from_secs(5)).await;
            pw.check_running()
                .context("portwise died while the apiserver was down")?;
            let down_log = pw.current_logs()[log_at_stop..].to_string();

            let starting = Instant::now();
            start_control_plane(cp).await?;
            let start_took = starting.elapsed();
            let up = Instant::now();

            // Changes while portwise reconnects (once the test's own client
            // gets through again).
            retrying(SETTLE, || ns.get_service("web")).await?;
            ns.create_pod(web_pod(40, true)).await?;
            for i in 8..14 {
                ns.set_ready(&format!("p{i:03}"), i % 3 == 0).await?;
            }
            ns.delete_pod("p020").await?;
            // Generous: the watches' backoff grew while nothing answered (up to
            // 30s, docs/reliability.md, open item 2), and the machine is busy.
            let after = converged(&ns, 20, SETTLE * 2).await?;
            pw.check_running()?;

            // Backoff, not a hot loop, while nothing answered: kube-runtime's
            // watchers back off exponentially from 800ms, each Service's
            // reconcile from 0.5s (host/controller/src/retry.rs).
            let errors = warnings(&down_log);
            println!(
                "apiserver killed, down 5s, start {start_took:?}; \
             portwise logged {errors} warnings while it was down; \
             converged {after:?} after the apiserver was ready again \
             ({:?} including the post-restart changes)",
                up.elapsed()
            );
            ensure!(
                errors < 100,
                "{errors} warnings in 5s without an apiserver: a hot loop?\n{down_log}"
            );
            Ok(())
        },
    )
    .await
}

// ---- watch expiry (410 Gone) after compaction ----------------------------

/// Is a watch from `rv` already compacted away?
async fn gone(api: &Api<Pod>, rv: &str) -> Result<()> {
    match api.watch(&WatchParams::default().timeout(1), rv).await {
        Err(kube::Error::Api(s)) if s.code == 410 => Ok(()),
        Err(e) => Err(e.into()),
        Ok(stream) => {
            let mut stream = stream.boxed();
            while let Some(ev) = stream.next().await {
                if let Ok(WatchEvent::Error(e)) = ev
                    && e.code == 410
                {
                    return Ok(());
                }
            }
            anyhow::bail!("a watch from resourceVersion {rv} still works")
        }
    }
}

/// Freezes portwise and cuts its connections first: events sent into a
/// live socket while it is frozen would wait in the socket buffer and be
/// read on SIGCONT, moving its resourceVersion past the compaction (then no
/// 410 is needed, and whether one comes depends on how soon it
/// re-watches). Then, with it away, deletes `ns`'s pods 0–4, makes 5–9
/// NotReady and creates 20–22. Returns the connections cut and the pods'
/// resourceVersion from before the changes.
async fn away_while_pods_change(
    pw: &Portwise,
    cp: &ControlPlane,
    ns: &TestNs,
) -> Result<(usize, String)> {
    let pid = pw.pid().context("pid")?;
    pw.freeze()?;
    let cut = cut_connections(pid, apiserver_port(cp)?).await?;
    let rv = ns
        .api::<Pod>()
        .list_metadata(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .context("list resourceVersion")?;
    for i in 0..5 {
        ns.delete_pod(&format!("p{i:03}")).await?;
    }
    for i in 5..10 {
        ns.set_ready(&format!("p{i:03}"), false).await?;
    }
    ns.create_pods((20..23).map(|i| web_pod(i, true)).collect())
        .await?;
    Ok((cut, rv))
}

/// Unrelated writes (a ConfigMap in `churn`) move etcd's revision on, and
/// the compactor follows: returns once a watch of `pods` from `rv` is
/// answered 410 Gone.
async fn compact_past(churn: &TestNs, pods: &Api<Pod>, rv: &str) -> Result<()> {
    let cms = churn.api::<ConfigMap>();
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "churn"}}))?,
    )
    .await?;
    for i in 0..20 {
        cms.patch(
            "churn",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"i": i.to_string()}})),
        )
        .await?;
    }
    wait_for(SETTLE, || gone(pods, rv)).await
}

/// With the watch cache off, watches read etcd directly and the apiserver
/// compacts etcd every second. portwise is frozen (SIGSTOP) while pods are
/// deleted, flipped and created, its connections cut before; once etcd
/// has compacted past what it saw, it is thawed. Its watches resume from a
/// compacted resourceVersion, get 410 Gone, relist, and it must notice the
/// pods deleted while it was away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_expiry_relists() -> Result<()> {
    let iso = Isolation {
        apiserver_args: "--watch-cache=false --etcd-compaction-interval=1s",
        controllers: "",
    };
    isolated("faults::watch_expiry_relists", iso, || async {
        let cp = ControlPlane::shared().await?;
        let ns = TestNs::new(cp, "expiry").await?;
        let churn = TestNs::new(cp, "churn").await?;
        web_service(&ns).await?;
        ns.create_pods((0..20).map(|i| web_pod(i, true)).collect())
            .await?;
        let kc = portwise_identity(cp).await?;
        let mut pw = start_portwise(&ns, &kc, &cfg(100)).await?;
        converged(&ns, 100, SETTLE).await?;

        let (cut, rv) = away_while_pods_change(&pw, cp, &ns).await?;
        ensure!(cut > 0, "portwise held no connection to the apiserver");
        let pods = ns.api::<Pod>();
        let compacting = Instant::now();
        compact_past(&churn, &pods, &rv).await?;
        let compacted_after = compacting.elapsed();

        pw.thaw()?;
        let thawed = Instant::now();
        let took = converged(&ns, 100, SETTLE).await?;
        pw.check_running()?;

        let log = pw.current_logs();
        let gone_lines: Vec<&str> = log
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("410") || l.contains("too old") || l.contains("expired")
            })
            .collect();
        ensure!(
            !gone_lines.is_empty(),
            "portwise converged, but its log shows no 410 Gone (no relist?):\n{log}"
        );
        println!(
            "compacted past rv {rv} {compacted_after:?} after the changes; cut {cut} \
             connections; converged {took:?} after SIGCONT ({:?}); the log reports:\n  {}",
            thawed.elapsed(),
            gone_lines.join("\n  ")
        );
        Ok(())
    })
    .await
}

// ---- 429: the apiserver sheds load ------------------------------------------

/// One inflight slot for reads and one for writes, priority and fairness
/// off (so the classic limiter answers 429 with Retry-After: 1), and admin
/// clients (exempt from the limit, as system:masters) keep both slots busy:
/// reads that wait 3s for a resourceVersion from the future, and a tight
/// loop of writes. portwise starts into that. Over the window it must make
/// few requests (it backs off), and once the load stops it converges.
/// How long after an overload ends portwise may take to converge, whatever
/// the episode's length.
const RECOVERY_BOUND: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_backs_off() -> Result<()> {
    let iso = Isolation {
        apiserver_args: "--enable-priority-and-fairness=false \
                         --max-requests-inflight=1 --max-mutating-requests-inflight=1",
        controllers: "",
    };
    isolated("faults::overload_backs_off", iso, || async {
        let cp = ControlPlane::shared().await?;
        let ns = TestNs::new(cp, "overload").await?;
        let churn = TestNs::new(cp, "load").await?;
        web_service(&ns).await?;
        ns.create_pods((0..30).map(|i| web_pod(i, i % 3 != 0)).collect())
            .await?;
        let kc = portwise_identity(cp).await?;

        let stop = Arc::new(AtomicBool::new(false));
        let loads = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let (stop, loads) = (stop.clone(), loads.clone());
            let api: Api<Pod> = Api::all(client_without_retries(cp, "load").await?);
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    // Waits ~3s for the cache to reach this version, holding
                    // the read slot, then fails with 504.
                    let lp = ListParams::default()
                        .at("999999999")
                        .matching(VersionMatch::NotOlderThan);
                    let _ = api.list_metadata(&lp).await;
                    loads.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        churn
            .api::<ConfigMap>()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "load"}}))?,
            )
            .await?;
        let cms: Api<ConfigMap> =
            Api::namespaced(client_without_retries(cp, "load").await?, churn.name());
        for w in 0..3 {
            let (stop, loads, cms) = (stop.clone(), loads.clone(), cms.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let _ = cms
                        .patch(
                            "load",
                            &PatchParams::default(),
                            &Patch::Merge(json!({"data": {format!("w{w}"): i.to_string()}})),
                        )
                        .await;
                    loads.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;

        // 20s by default (PORTWISE_FAULT_OVERLOAD_SECS sets it): long enough
        // that an unbounded client retry backoff (kube's default grows past
        // a minute) shows as a recovery far slower than the bound below.
        let window = Duration::from_secs(
            std::env::var("PORTWISE_FAULT_OVERLOAD_SECS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(20),
        );
        let audit = Audit::mark(cp);
        let mut pw = start_portwise(&ns, &kc, &cfg(100)).await?;
        tokio::time::sleep(window / 2).await;
        for i in 0..6 {
            ns.set_ready(&format!("p{i:03}"), i % 2 == 1).await?;
        }
        tokio::time::sleep(window / 2).await;
        pw.check_running()?;
        let seen = audit.by_user(PORTWISE_USER)?;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.abort();
        }

        let requests: Vec<&AuditEvent> = seen.iter().filter(|e| e.verb != "watch").collect();
        let rejected = requests.iter().filter(|e| e.code == Some(429)).count();
        let rate = requests.len() as f64 / window.as_secs_f64();
        let mut by_kind: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
        for e in &requests {
            let k = by_kind
                .entry(format!("{} {}", e.verb, e.resource))
                .or_default();
            k.0 += 1;
            if e.code == Some(429) {
                k.1 += 1;
            }
        }
        println!(
            "load: {} admin requests; portwise in {window:?}: {} requests ({rate:.1}/s), \
             {rejected} answered 429; by kind (total, 429): {by_kind:?}",
            loads.load(Ordering::Relaxed),
            requests.len(),
        );
        ensure!(
            rejected > 0,
            "the apiserver never answered portwise 429: the fault was not injected"
        );
        ensure!(
            rate < 10.0,
            "{rate:.1} requests/s from portwise under 429s: it does not back off"
        );
        // Retries are bounded to seconds (ops/client.rs `api_retry_policy`, cache.rs
        // `WatchBackoff`), so recovery does not grow with the episode: a few
        // seconds measured (docs/reliability.md 1.3), 71s for 20s of 429s
        // with kube's default retry.
        let took = converged(&ns, 100, RECOVERY_BOUND).await?;
        println!("converged {took:?} after the load stopped");
        Ok(())
    })
    .await
}

// ---- kill -9 in the middle of a multi-slice change ----------------------

fn slice_port(s: &EndpointSlice) -> Option<i32> {
    s.ports.iter().flatten().next().and_then(|p| p.port)
}

/// 300 Ready pods backing both Service ports, in slices of 20: 15 slices,
/// each listing both ports. Renumbering both Service ports makes every
/// slice change; portwise is
/// killed with SIGKILL right after the apiserver completed its first write
/// of that change. A new process converges, and does not rewrite the slices
/// the first one already finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_mid_apply() -> Result<()> {
    isolated("faults::kill9_mid_apply", Isolation::default(), || async {
        const MAX: usize = 20;
        let cp = ControlPlane::shared().await?;
        let ns = TestNs::new(cp, "kill9").await?;
        web_service(&ns).await?;
        let creating = Instant::now();
        ns.create_pods((0..300).map(|i| web_pod(i, true)).collect())
            .await?;
        println!("300 pods created in {:?}", creating.elapsed());
        let kc = portwise_identity(cp).await?;
        let mut pw = start_portwise(&ns, &kc, &cfg(MAX)).await?;
        let first = converged(&ns, MAX, SETTLE * 2).await?;
        let total = slices_for(&ns, "web").await?.len();
        ensure!(total == 15, "expected 15 slices, got {total}");
        println!("initial convergence: {first:?}, {total} slices");

        let audit = Audit::mark(cp);
        ns.patch_service(
            "web",
            json!({"spec": {"ports": [
                {"name": "http", "port": 8081, "protocol": "TCP"},
                {"name": "admin", "port": 9091, "protocol": "TCP"},
            ]}}),
        )
        .await?;
        let changed = Instant::now();
        let slice_writes = |a: &Audit| -> Result<Vec<AuditEvent>> {
            Ok(a.by_user(PORTWISE_USER)?
                .into_iter()
                .filter(|e| e.resource == "endpointslices" && e.is_write())
                .collect())
        };
        loop {
            if !slice_writes(&audit)?.is_empty() {
                break;
            }
            ensure!(
                changed.elapsed() < SETTLE,
                "portwise never wrote after the Service changed"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        pw.kill().await?;
        let killed_after = changed.elapsed();
        let first_run = slice_writes(&audit)?;

        let is_new = |s: &EndpointSlice| matches!(slice_port(s), Some(8081) | Some(9091));
        let at_kill = slices_for(&ns, "web").await?;
        let done: Vec<String> = at_kill
            .iter()
            .filter(|s| is_new(s))
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        println!(
            "killed {killed_after:?} after the change: {} writes landed, {} of {} slices \
             at the new ports",
            first_run.len(),
            done.len(),
            at_kill.len()
        );
        ensure!(
            !done.is_empty() && at_kill.iter().any(|s| !is_new(s)),
            "the kill did not land mid-change ({} of {} slices updated)",
            done.len(),
            at_kill.len()
        );

        let second = Audit::mark(cp);
        let restarted = Instant::now();
        pw.start_again().await?;
        wait_for(SETTLE, || async {
            let slices = slices_for(&ns, "web").await?;
            ensure!(
                slices.iter().all(is_new) && slices.len() == 15,
                "{} slices, ports {:?}",
                slices.len(),
                slices.iter().map(slice_port).collect::<Vec<_>>()
            );
            Ok(())
        })
        .await?;
        let took = restarted.elapsed();
        converged(&ns, MAX, SETTLE).await?;
        // Let stragglers land, then look at what the second run wrote.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rewritten: Vec<AuditEvent> = slice_writes(&second)?
            .into_iter()
            .filter(|e| done.contains(&e.name))
            .collect();
        println!(
            "second run converged in {took:?} with {} slice writes; {} of them to slices \
             the first run had finished",
            slice_writes(&second)?.len(),
            rewritten.len()
        );
        ensure!(
            rewritten.is_empty(),
            "the second run rewrote finished slices: {rewritten:?}"
        );
        Ok(())
    })
    .await
}

// ---- cold-start cost -------------------------------------------------------

/// Issue 13: the cold start's migration cleanup lists native Endpoints once
/// (selected by the native controller's label) instead of GETting one per
/// Service. 20 managed Services, 10 with a native leftover: the leftovers
/// go, a hand-maintained Endpoints object stays, and portwise made no GET
/// of Endpoints at all (audit log, by the ServiceAccount's identity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_lists_native_endpoints_once() -> Result<()> {
    use k8s_openapi::api::core::v1::Endpoints;
    isolated(
        "faults::cold_start_lists_native_endpoints_once",
        Isolation::default(),
        || async {
            let cp = ControlPlane::shared().await?;
            let ns = TestNs::new(cp, "coldlist").await?;
            let endpoints: Api<Endpoints> = ns.api();
            for i in 0..20 {
                let name = format!("web{i:02}");
                let group = format!("g{i:02}");
                ns.create_service(
                    service(&name)
                        .annotation(GROUP_KEY, &group)
                        .port("http", 8080),
                )
                .await?;
                ns.create_pod(
                    pod(&format!("p{i:02}"))
                        .annotation(GROUP_KEY, &group)
                        .ips(next_ips().v4()),
                )
                .await?;
                // Leftovers of the native endpoints controller on half of
                // them, and one object someone maintains by hand.
                let manager = match i {
                    0..10 => Some("endpoint-controller"),
                    10 => Some("someone"),
                    _ => None,
                };
                if let Some(manager) = manager {
                    let ep: Endpoints = serde_json::from_value(json!({
                        "metadata": { "name": name, "labels": {
                            "endpoints.kubernetes.io/managed-by": manager } },
                        "subsets": [{ "addresses": [{ "ip": "10.244.250.1" }],
                                      "ports": [{ "name": "http", "port": 8080 }] }],
                    }))?;
                    endpoints.create(&PostParams::default(), &ep).await?;
                }
            }
            let kc = portwise_identity(cp).await?;
            let audit = Audit::mark(cp);
            let _pw =
                start_portwise(&ns, &kc, &config_with("podReady", "nativeCleanup: true\n")).await?;
            wait_for(SETTLE * 2, || async {
                let left: Vec<String> = endpoints
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .filter_map(|e| e.metadata.name)
                    .collect();
                ensure!(left == ["web10"], "Endpoints left: {left:?}");
                Ok(())
            })
            .await?;
            for i in 0..20 {
                let svc = format!("web{i:02}");
                let pod = format!("p{i:02}");
                expect_endpoints(&ns, &svc, by_port([(("http", V4), &[pod.as_str()][..])])).await?;
            }
            let seen = audit.by_user(PORTWISE_USER)?;
            let on_endpoints = |verb: &str| {
                seen.iter()
                    .filter(|e| e.resource == "endpoints" && e.verb == verb)
                    .count()
            };
            println!(
                "cold start, 20 Services: endpoints list {} get {} delete {}",
                on_endpoints("list"),
                on_endpoints("get"),
                on_endpoints("delete")
            );
            ensure!(
                on_endpoints("get") == 0,
                "{} GETs of Endpoints",
                on_endpoints("get")
            );
            ensure!(on_endpoints("list") >= 1, "no LIST of Endpoints");
            ensure!(
                on_endpoints("delete") == 10,
                "{} deletes",
                on_endpoints("delete")
            );
            Ok(())
        },
    )
    .await
}

// ---- streaming lists (WatchList) ------------------------------------------

/// How portwise's requests in `seen` split by verb and resource.
fn requests_by(seen: &[AuditEvent]) -> std::collections::BTreeMap<(String, String), usize> {
    let mut by = std::collections::BTreeMap::new();
    for e in seen {
        *by.entry((e.verb.clone(), e.resource.clone())).or_insert(0) += 1;
    }
    by
}

/// Starts portwise cold on a Service with 20 pods, waits for the slices,
/// flips one pod and waits again (the watch after the initial state
/// works); returns portwise's audited requests and its log.
async fn cold_start_and_flip(ns: &TestNs) -> Result<(Vec<AuditEvent>, String)> {
    let cp = ns.cp();
    web_service(ns).await?;
    ns.create_pods((0..20).map(|i| web_pod(i, true)).collect())
        .await?;
    let kc = portwise_identity(cp).await?;
    let audit = Audit::mark(cp);
    let mut pw = start_portwise(ns, &kc, &cfg(100)).await?;
    converged(ns, 100, SETTLE).await?;
    ns.set_ready("p000", false).await?;
    converged(ns, 100, SETTLE).await?;
    pw.check_running()?;
    Ok((audit.by_user(PORTWISE_USER)?, pw.current_logs()))
}

/// The caches' first state comes through their watches (streaming lists,
/// as the native controller's informers take it), not through paged LISTs:
/// on a cold start portwise LISTs no pods, Services or Nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_streams_its_caches() -> Result<()> {
    isolated(
        "faults::cold_start_streams_its_caches",
        Isolation::default(),
        || async {
            let cp = ControlPlane::shared().await?;
            let ns = TestNs::new(cp, "stream").await?;
            let (seen, log) = cold_start_and_flip(&ns).await?;
            let by = requests_by(&seen);
            println!("cold start, streaming lists: {by:?}");
            for resource in ["pods", "services", "nodes", "endpointslices"] {
                let n = |verb: &str| {
                    by.get(&(verb.to_string(), resource.to_string()))
                        .copied()
                        .unwrap_or(0)
                };
                ensure!(n("watch") >= 1, "no watch of {resource}: {by:?}");
                if resource != "endpointslices" {
                    // Slices are also LISTed once at start-up, by label, to
                    // find the native controller's leftovers (migrate.rs).
                    ensure!(n("list") == 0, "{} LISTs of {resource}: {by:?}", n("list"));
                }
            }
            ensure!(
                !seen.iter().any(|e| e.code == Some(422)),
                "an apiserver that serves streaming lists refused a request: {seen:?}"
            );
            ensure!(
                !log.contains("refuses streaming lists"),
                "portwise fell back to LISTs on an apiserver that streams:\n{log}"
            );
            Ok(())
        },
    )
    .await
}

/// An apiserver with the WatchList gate off answers a streaming watch with
/// 422. portwise says so once per watch, LISTs instead, and publishes as
/// before: the cold start converges and a pod change still arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchlist_off_falls_back_to_lists() -> Result<()> {
    let iso = Isolation {
        apiserver_args: "--feature-gates=WatchList=false",
        controllers: "",
    };
    isolated("faults::watchlist_off_falls_back_to_lists", iso, || async {
        let cp = ControlPlane::shared().await?;
        let ns = TestNs::new(cp, "nostream").await?;
        let (seen, log) = cold_start_and_flip(&ns).await?;
        let by = requests_by(&seen);
        println!("cold start, WatchList off: {by:?}");
        for resource in ["pods", "services", "nodes", "endpointslices"] {
            let refused = seen
                .iter()
                .filter(|e| e.verb == "watch" && e.resource == resource && e.code == Some(422))
                .count();
            ensure!(
                refused == 1,
                "{refused} refused streaming watches of {resource} (one, then LISTs): {by:?}"
            );
            let lists = by
                .get(&("list".to_string(), resource.to_string()))
                .copied()
                .unwrap_or(0);
            ensure!(
                lists >= 1,
                "no LIST of {resource} after the refusal: {by:?}"
            );
        }
        let said = log
            .lines()
            .filter(|l| l.contains("refuses streaming lists"))
            .count();
        ensure!(
            said >= 4,
            "the fallback was logged {said} times, not once per watch:\n{log}"
        );
        Ok(())
    })
    .await
}

// ---- per-namespace pod watches (pod_scopes.rs) under the same faults ------

/// `(name, resourceVersion)` of `ns`'s slices of "web": equal before and
/// after means nothing rewrote them.
async fn slice_versions(ns: &TestNs) -> Result<Vec<(String, String)>> {
    let mut v: Vec<(String, String)> = ns
        .api::<EndpointSlice>()
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await?
        .items
        .into_iter()
        .map(|s| {
            (
                s.metadata.name.unwrap_or_default(),
                s.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    Ok(v)
}

/// The cluster-wide default with an annotation key watches pods in each
/// namespace that holds a keyed Service, one watch each, all feeding one
/// cache. Here those watches go through both faults above: a 410 Gone
/// after compaction (while portwise is frozen, one namespace's pods change
/// and a new keyed namespace appears), then an apiserver crash. One
/// namespace's relist must not touch another's pods: the untouched
/// namespace's slices are never rewritten. Keyed pods in a namespace
/// without a keyed Service are never cached, before or after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_namespace_pod_watches_survive_410_and_restart() -> Result<()> {
    let iso = Isolation {
        apiserver_args: "--watch-cache=false --etcd-compaction-interval=1s",
        controllers: "",
    };
    isolated(
        "faults::per_namespace_pod_watches_survive_410_and_restart",
        iso,
        || async {
            let cp = ControlPlane::shared().await?;
            let changing = TestNs::new(cp, "scoped-a").await?;
            let still = TestNs::new(cp, "scoped-b").await?;
            let late = TestNs::new(cp, "scoped-c").await?;
            let unkeyed = TestNs::new(cp, "scoped-none").await?;
            let churn = TestNs::new(cp, "churn").await?;
            for ns in [&changing, &still] {
                web_service(ns).await?;
            }
            changing
                .create_pods((0..20).map(|i| web_pod(i, true)).collect())
                .await?;
            still
                .create_pods((0..10).map(|i| web_pod(i, i % 3 != 0)).collect())
                .await?;
            late.create_pods((0..6).map(|i| web_pod(i, true)).collect())
                .await?;
            unkeyed
                .create_pods((0..5).map(|i| web_pod(i, true)).collect())
                .await?;

            let kc = portwise_identity(cp).await?;
            // No --namespace: the chart's default.
            let mut pw = Portwise::builder(cp)
                .config(&cfg(100))
                .identity(&kc)
                .start()
                .await?;
            pw.wait_for_log("pods watched in each namespace", SETTLE)
                .await?;
            for ns in [&changing, &still] {
                converged(ns, 100, SETTLE).await?;
            }
            wait_for(SETTLE, || async {
                expect_eq(pw.cached_pods().await?, 30.0)
            })
            .await?;
            let before = slice_versions(&still).await?;
            ensure!(!before.is_empty(), "no slice of web in {}", still.name());

            // A 410 Gone for every watch: frozen with its connections cut,
            // while etcd compacts past what it saw.
            let (cut, rv) = away_while_pods_change(&pw, cp, &changing).await?;
            ensure!(cut > 0, "portwise held no connection to the apiserver");
            let pods = changing.api::<Pod>();
            // A keyed Service where there was none: its watch opens after
            // the Services watch relists.
            web_service(&late).await?;
            compact_past(&churn, &pods, &rv).await?;
            let log_at_thaw = pw.current_logs().len();
            pw.thaw()?;
            for ns in [&changing, &late] {
                converged(ns, 100, SETTLE).await?;
            }
            pw.check_running()?;
            // 18 + 10 + 6: the keyed pods of the unkeyed namespace never.
            wait_for(SETTLE, || async {
                expect_eq(pw.cached_pods().await?, 34.0)
            })
            .await?;
            let relisted = pw.current_logs()[log_at_thaw..]
                .lines()
                .filter(|l| {
                    let l = l.to_ascii_lowercase();
                    l.contains("410") || l.contains("too old") || l.contains("expired")
                })
                .count();
            ensure!(
                relisted > 0,
                "converged after the thaw, but the log shows no 410 Gone:\n{}",
                &pw.current_logs()[log_at_thaw..]
            );
            // Two resyncs (2s each) after the relists: nothing rewrote the
            // namespace whose pods did not change.
            tokio::time::sleep(Duration::from_secs(5)).await;
            expect_eq(slice_versions(&still).await?, before.clone())
                .context("the unchanged namespace's slices were rewritten after a relist")?;

            // The apiserver crashes and comes back; pods change on both
            // sides of it.
            changing.set_ready("p010", false).await?;
            crash_apiserver(cp).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            pw.check_running()
                .context("portwise died while the apiserver was down")?;
            start_control_plane(cp).await?;
            retrying(SETTLE, || changing.get_service("web")).await?;
            late.set_ready("p000", false).await?;
            changing.delete_pod("p020").await?;
            for ns in [&changing, &late, &still] {
                converged(ns, 100, SETTLE * 2).await?;
            }
            wait_for(SETTLE, || async {
                expect_eq(pw.cached_pods().await?, 33.0)
            })
            .await?;
            expect_eq(slice_versions(&still).await?, before)
                .context("the unchanged namespace's slices were rewritten after the restart")?;
            pw.check_running()?;
            Ok(())
        },
    )
    .await
}
