//! Write economy, measured at the apiserver (audit log of the test
//! namespace, or `apiserver_request_total` when no audit log is written; see
//! `WriteCounter`): a steady state costs zero writes, a restart costs none,
//! and one pod changing in a 1000-endpoint Service rewrites one slice.

use std::time::Duration;

use anyhow::{Result, ensure};
use portwise_tests::*;

/// Probes and readiness both in play, resync every 2s: a quiet minute
/// (about 30 resyncs) must not write anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_writes_over_a_quiet_minute() -> Result<()> {
    quiet_minute_on(ControlPlane::shared().await?).await
}

// The Kubernetes matrix: an older apiserver that dropped or defaulted a
// field portwise sends would make every resync see a difference and
// write again, so zero idle writes on 1.35 and 1.36 is also the proof
// that each stores what portwise sends.
on_older_minors!(zero_writes_over_a_quiet_minute => quiet_minute_on);

async fn quiet_minute_on(cp: &'static ControlPlane) -> Result<()> {
    let ns = TestNs::new(cp, "quiet").await?;
    let node = ns.ensure_node("n1", "zone-a").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080)
            .port("https", 8443)
            .dual_stack(),
    )
    .await?;
    let mut listeners = Vec::new();
    for i in 0..6 {
        let ip = next_ips();
        ns.create_pod(
            pod(&format!("p{i}"))
                .annotation(GROUP_KEY, "g")
                .node(&node)
                .ips(ip.dual()),
        )
        .await?;
        if i % 2 == 0 {
            listeners.push(TcpListener::start(ip.v4, 8443).await?);
            listeners.push(TcpListener::start(ip.v6, 8443).await?);
        }
    }
    let cfg = config("{perPort: {ports: {https: {tcpDial: {timeout: 1s}}}, fallback: podReady}}");
    let _pw = Portwise::start(&ns, &cfg).await?;
    let all = ["p0", "p1", "p2", "p3", "p4", "p5"];
    let even = ["p0", "p2", "p4"];
    expect_endpoints(
        &ns,
        "web",
        by_port([
            (("http", V4), &all[..]),
            (("http", V6), &all[..]),
            (("https", V4), &even[..]),
            (("https", V6), &even[..]),
        ]),
    )
    .await?;
    // Let anything still in flight land before the window opens.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let counter = WriteCounter::start(&ns).await?;
    tokio::time::sleep(Duration::from_secs(60)).await;
    counter.expect(0, "quiet minute").await?;
    let accepted: usize = listeners.iter().map(TcpListener::accepted).sum();
    ensure!(
        accepted > 6 * 3,
        "probes did not keep running during the quiet minute ({accepted} dials)"
    );
    Ok(())
}

/// A restarted portwise finds its slices already right (deterministic names,
/// state read back) and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_costs_no_writes() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "restart-quiet").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080)
            .port("spare", 9090),
    )
    .await?;
    let names: Vec<String> = (0..30).map(|i| format!("p{i:02}")).collect();
    ns.create_pods(
        names
            .iter()
            .map(|n| pod(n).annotation(GROUP_KEY, "g").ips(next_ips().v4()))
            .collect(),
    )
    .await?;
    let cfg = config_with(
        "{perPort: {ports: {http: podReady}}}",
        "maxEndpointsPerSlice: 7\n",
    );
    // The binary: its log says when the restart has reconciled everything.
    let mut pw = Portwise::spawn_binary(&ns, &cfg).await?;
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    expect_endpoints(
        &ns,
        "web",
        by_port([(("http", V4), &all[..]), (("spare", V4), &[][..])]),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;

    let counter = WriteCounter::start(&ns).await?;
    pw.restart().await?;
    pw.wait_for_log("cold start: every Service reconciled once", SETTLE)
        .await?;
    // A write the last reconcile issued would have landed by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    pw.check_running()?;
    counter.expect(0, "restart").await?;

    // The quiet was not a dead process: the restarted instance has synced
    // and reconciles. One pod leaves: exactly its slice is rewritten.
    let counter = WriteCounter::start(&ns).await?;
    ns.set_ready("p00", false).await?;
    let rest: Vec<&str> = all[1..].to_vec();
    expect_endpoints(
        &ns,
        "web",
        by_port([(("http", V4), &rest[..]), (("spare", V4), &[][..])]),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    counter
        .expect(1, "one pod leaving after the restart")
        .await?;
    Ok(())
}

/// 1000 endpoints in slices of 100: one pod flipping rewrites exactly one
/// slice, and flipping back rewrites one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_write_when_one_pod_flips_among_1000() -> Result<()> {
    one_flip_on(ControlPlane::shared().await?).await
}

// The Kubernetes matrix: one write per flip on 1.35 and 1.36 too.
on_older_minors!(one_write_when_one_pod_flips_among_1000 => one_flip_on);

async fn one_flip_on(cp: &'static ControlPlane) -> Result<()> {
    let ns = TestNs::new(cp, "churn").await?;
    ns.create_service(service("big").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    let names: Vec<String> = (0..1000).map(|i| format!("p{i:04}")).collect();
    ns.create_pods(
        names
            .iter()
            .map(|n| pod(n).annotation(GROUP_KEY, "g").ips(next_ips().v4()))
            .collect(),
    )
    .await?;
    let _pw = Portwise::start(&ns, &config("podReady")).await?;

    let count = || async {
        let m = endpoints_by_port(&ns, "big").await?;
        Ok::<_, anyhow::Error>(
            m.get(&("http".to_string(), V4.to_string()))
                .map_or(0, |s| s.len()),
        )
    };
    wait_for(SETTLE * 4, || async {
        let n = count().await?;
        ensure!(n == 1000, "{n} of 1000 published");
        Ok(())
    })
    .await?;
    slice_invariants(&ns, "big", 100).await?;
    let slices_before = slices_for(&ns, "big").await?.len();
    ensure!(
        slices_before == 10,
        "{slices_before} slices for 1000 endpoints at 100 per slice"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;

    let counter = WriteCounter::start(&ns).await?;
    ns.set_ready("p0500", false).await?;
    wait_for(SETTLE, || async {
        let m = endpoints_by_port(&ns, "big").await?;
        let http = m
            .get(&("http".to_string(), V4.to_string()))
            .cloned()
            .unwrap_or_default();
        ensure!(
            !http.contains("p0500") && http.len() == 999,
            "p0500 still published ({} members)",
            http.len()
        );
        Ok(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await; // a couple of resyncs
    counter.expect(1, "one pod leaving").await?;

    ns.set_ready("p0500", true).await?;
    wait_for(SETTLE, || async {
        let n = count().await?;
        ensure!(n == 1000, "{n} of 1000 published");
        Ok(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    counter.expect(2, "the pod leaving and coming back").await?;
    expect_eq(slices_for(&ns, "big").await?.len(), slices_before)?;
    if let Ok(ws) = counter.writes() {
        ensure!(
            ws.iter().all(|w| w.verb == "update"),
            "writes other than a resourceVersion-checked update: {ws:?}"
        );
    }
    Ok(())
}

/// The reconciles a portwise has completed (served Services).
async fn reconciles(pw: &Portwise) -> Result<f64> {
    Ok(pw
        .scrape()
        .await?
        .value("portwise_reconcile_duration_seconds_count", &[])?
        .unwrap_or(0.0))
}

/// Issue 29: portwise's own writes come back through its slice watch and
/// trigger nothing, so a cold start reconciles each Service once (it was
/// twice: once for the Service, once for the echo of its write). A change
/// to a slice by anyone else still triggers a reconcile, which repairs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_writes_trigger_no_reconcile_and_other_writers_do() -> Result<()> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Patch, PatchParams};
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "echoes").await?;
    const SERVICES: usize = 10;
    for i in 0..SERVICES {
        let group = format!("g{i}");
        ns.create_service(
            service(&format!("web-{i}"))
                .annotation(GROUP_KEY, &group)
                .port("http", 8080)
                .port("admin", 9000),
        )
        .await?;
        ns.create_pods(
            (0..3)
                .map(|p| {
                    pod(&format!("p{i}-{p}"))
                        .annotation(GROUP_KEY, &group)
                        .ips(next_ips().v4())
                })
                .collect(),
        )
        .await?;
    }
    // A resync (Action::requeue) is a reconcile too: keep it out of the
    // window.
    let cfg = config("podReady").replace("resyncPeriod: 2s", "resyncPeriod: 10m");
    let mut pw = Portwise::spawn_binary(&ns, &cfg).await?;
    pw.wait_for_log("cold start: every Service reconciled once", SETTLE)
        .await?;
    for i in 0..SERVICES {
        let pods: Vec<String> = (0..3).map(|p| format!("p{i}-{p}")).collect();
        let pods: Vec<&str> = pods.iter().map(String::as_str).collect();
        expect_endpoints(
            &ns,
            &format!("web-{i}"),
            by_port([(("http", V4), &pods[..]), (("admin", V4), &pods[..])]),
        )
        .await?;
    }
    // Every echo (two slices per Service) has arrived by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cold = reconciles(&pw).await?;
    println!("cold start: {cold} reconciles for {SERVICES} Services");
    ensure!(
        cold == SERVICES as f64,
        "{cold} reconciles for {SERVICES} Services: portwise's own writes triggered reconciles"
    );

    // Another writer drops an endpoint: reconciled, repaired.
    let slice = slice_for_port(&ns, "web-0", "http").await?;
    let name = slice.metadata.name.clone().unwrap_or_default();
    let mut endpoints = slice.endpoints.clone().unwrap_or_default();
    endpoints.remove(0);
    ns.api::<EndpointSlice>()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "endpoints": endpoints })),
        )
        .await?;
    let pods = ["p0-0", "p0-1", "p0-2"];
    wait_for(SETTLE, || async {
        let s = slice_for_port(&ns, "web-0", "http").await?;
        expect_eq(s.endpoints.map_or(0, |e| e.len()), 3)
    })
    .await?;
    expect_endpoints(
        &ns,
        "web-0",
        by_port([(("http", V4), &pods[..]), (("admin", V4), &pods[..])]),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = reconciles(&pw).await?;
    ensure!(
        after == cold + 1.0,
        "{after} reconciles after one foreign edit (was {cold}): expected exactly one more, \
         the repair, and none for the repair's own write"
    );
    pw.check_running()?;
    Ok(())
}

/// The reconcile profile (issue 29): where each reconcile's time went, as
/// `portwise_reconcile_phase_duration_seconds{phase}` and as one
/// `portwise::profile` debug line per reconcile. A pod change is timed
/// from its event (`trigger`); the phases a reconcile goes through add up
/// to its duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_reconcile_reports_where_its_time_went() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "profile").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "web")
            .port("http", 8080),
    )
    .await?;
    ns.create_pods(Vec::from(
        ["a", "b"].map(|n| pod(n).annotation(GROUP_KEY, "web").ips(next_ips().v4())),
    ))
    .await?;
    let cfg = config("podReady").replace("resyncPeriod: 2s", "resyncPeriod: 10m");
    let pw = Portwise::builder(cp)
        .namespace(ns.name())
        .config(&cfg)
        .binary()
        .log_filter("info,portwise::profile=debug")
        .start()
        .await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;
    ns.set_ready("b", false).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let m = pw.scrape().await?;
    let phase = |stat: &str, phase: &str| -> Result<f64> {
        Ok(m.value(
            &format!("portwise_reconcile_phase_duration_seconds_{stat}"),
            &[("phase", phase)],
        )?
        .unwrap_or(0.0))
    };
    let reconciles = m
        .value("portwise_reconcile_duration_seconds_count", &[])?
        .unwrap_or(0.0);
    let total = m
        .value("portwise_reconcile_duration_seconds_sum", &[])?
        .unwrap_or(0.0);
    ensure!(
        reconciles >= 2.0,
        "{reconciles} reconciles: the cold start and the flip"
    );
    for p in ["queue", "judge", "plan", "write", "finish"] {
        expect_eq(phase("count", p)?, reconciles)?;
    }
    // The flip's pod event asked for a reconcile, and its wait was timed.
    ensure!(phase("count", "trigger")? >= 1.0, "no trigger timed");
    ensure!(phase("sum", "trigger")? > 0.0, "a trigger of zero seconds");
    // Two writes, each an apiserver round trip.
    ensure!(phase("sum", "write")? > 0.0, "writes took no time");
    let phases: f64 = ["judge", "plan", "write", "finish"]
        .iter()
        .map(|p| phase("sum", p))
        .sum::<Result<f64>>()?;
    ensure!(
        phases <= total && total - phases < 0.005 * reconciles,
        "the phases ({phases} s) do not add up to the reconciles' duration ({total} s)"
    );

    let log = pw.current_logs();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("reconcile profile") && l.contains("service=\"web\""))
        .collect();
    expect_eq(lines.len() as f64, reconciles)?;
    let flip = lines.last().expect("a line per reconcile");
    for field in [
        "trigger_us=",
        "queue_us=",
        "write_us=",
        "total_us=",
        "writes=1",
    ] {
        ensure!(flip.contains(field), "{field} missing in {flip}");
    }
    Ok(())
}

/// Two ports on one target port (issue 26, docs/semantics.md): a pod that
/// backs both sits in the shared slice. Leaving both ports (readiness) and
/// coming back costs one write each, as for any pod; leaving one of the
/// ports moves it to the other port's slice: the slice taking it in, the delete of the shared
/// slice it left, and the taker once more to finish the move (3 writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_between_port_sets_costs_three_writes_and_a_flip_one() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "move-writes").await?;
    let svc = service("colo")
        .annotation(GROUP_KEY, "colo")
        .port_to("web", 80, serde_json::json!(8080))
        .port_to("alt", 8090, serde_json::json!(8080));
    let expected = |web: &[&str], alt: &[&str]| by_port([(("web", V4), web), (("alt", V4), alt)]);
    let _pw = Scenario::new(&ns)
        .service(svc)
        .pods(
            [("a", "web"), ("b", "web,alt"), ("c", "alt")].map(|(n, ports)| {
                seed_pod(n, ports)
                    .annotation(GROUP_KEY, "colo")
                    .ips(next_ips().v4())
            }),
        )
        .config(&config(SEED_MEMBERSHIP))
        .expect("colo", expected(&["a", "b"], &["b", "c"]))
        .start()
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let counter = WriteCounter::start(&ns).await?;
    ns.set_ready("b", false).await?;
    expect_endpoints(&ns, "colo", expected(&["a"], &["c"])).await?;
    ns.set_ready("b", true).await?;
    expect_endpoints(&ns, "colo", expected(&["a", "b"], &["b", "c"])).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    counter
        .expect(2, "b leaving both ports and coming back")
        .await?;

    let counter = WriteCounter::start(&ns).await?;
    ns.annotate_pod("b", PORTS_KEY, Some("web")).await?;
    expect_endpoints(&ns, "colo", expected(&["a", "b"], &["c"])).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    counter.expect(3, "b moving from web+alt to web").await?;
    if let Ok(ws) = counter.writes() {
        let shape: Vec<(String, String)> = ws
            .iter()
            .map(|w| (w.verb.clone(), w.name.clone()))
            .collect();
        expect_eq(
            shape,
            vec![
                ("update".to_string(), "colo-web".to_string()),
                ("delete".to_string(), "colo-alt.web".to_string()),
                ("update".to_string(), "colo-web".to_string()),
            ],
        )?;
    }
    slice_invariants(&ns, "colo", 100).await?;
    Ok(())
}
