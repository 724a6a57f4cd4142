//! One tenant cannot stall another (issue 45): a namespace whose probes
//! never answer holds neither the reconcile slots nor the check permits
//! that another namespace's Services need.

use std::time::Duration;

use anyhow::{Result, ensure};
use portwise_tests::*;

use crate::policies::POLICY;

/// The noisy tenant: Services whose every probe hangs until its timeout,
/// as when a NetworkPolicy drops portwise's traffic (accepted, never
/// answered, here). `--reconcile-concurrency` is 8 and `maxConcurrentChecks`
/// 16 by default, so 8 such Services fill every slot, and their 8 × 4 × 10
/// checks of 5 s every permit, for 100 s a round.
const NOISY_SERVICES: usize = 8;
const NOISY_PORTS: u16 = 4;
const NOISY_PODS: usize = 10;

/// With the noisy tenant's probes hanging, a readiness flip in a quiet
/// namespace (`podReady`, no probe) and a probe that starts failing there
/// (`httpGet`) are both published promptly, and the noisy tenant's checks
/// still go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_whose_probes_hang_does_not_stall_another() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let noisy = TestNs::new(cp, "noisy").await?;
    let quiet = TestNs::new(cp, "quiet").await?;

    let mut hanging = Vec::new();
    for s in 0..NOISY_SERVICES {
        let group = format!("g{s}");
        let mut svc = service(&format!("svc{s}"))
            .annotation(GROUP_KEY, &group)
            .annotation(POLICY, "noisy");
        for p in 0..NOISY_PORTS {
            svc = svc.port(&format!("p{p}"), i32::from(8080 + p));
        }
        noisy.create_service(svc).await?;
        for i in 0..NOISY_PODS {
            let ip = next_ips();
            noisy
                .create_pod(
                    pod(&format!("s{s}-{i}"))
                        .annotation(GROUP_KEY, &group)
                        .ips(ip.v4()),
                )
                .await?;
            for p in 0..NOISY_PORTS {
                let l = HttpListener::start(ip.v4, 8080 + p).await?;
                l.set_mode(HttpMode::Hang);
                hanging.push(l);
            }
        }
    }

    let (a, b) = (next_ips(), next_ips());
    quiet
        .create_service(
            service("ready")
                .annotation(GROUP_KEY, "r")
                .port("http", 8080),
        )
        .await?;
    quiet
        .create_service(
            service("probed")
                .annotation(GROUP_KEY, "p")
                .annotation(POLICY, "probed")
                .port("http", 8080),
        )
        .await?;
    for (name, group, ip) in [
        ("a", "r", &a),
        ("b", "r", &b),
        ("c", "p", &a),
        ("d", "p", &b),
    ] {
        quiet
            .create_pod(pod(name).annotation(GROUP_KEY, group).ips(ip.v4()))
            .await?;
    }
    let http_a = HttpListener::start(a.v4, 8080).await?;
    let _http_b = HttpListener::start(b.v4, 8080).await?;

    let cfg = config_with(
        "podReady",
        "policies:\n  noisy: {httpGet: {path: /healthz, timeout: 5s}}\n  \
         probed: {httpGet: {path: /healthz, timeout: 1s}}\n",
    );
    let pw = Portwise::builder(cp)
        .namespaces(&[noisy.name(), quiet.name()])
        .config(&cfg)
        .binary()
        .start()
        .await?;
    wait_for(SETTLE, || async {
        expect_eq(
            members(&quiet, "ready", "http", V4).await?,
            names(&["a", "b"]),
        )?;
        expect_eq(
            members(&quiet, "probed", "http", V4).await?,
            names(&["c", "d"]),
        )
    })
    .await?;
    let noisy_checks = |m: &Metrics| -> f64 {
        m.select("portwise_checks_total", &[("policy", "policies.noisy")])
            .map(|s| s.value)
            .sum()
    };
    // The noisy reconciles began at the cold start and wait on their
    // probes: every slot and permit is taken.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = noisy_checks(&pw.scrape().await?);

    // A readiness flip in the quiet namespace: published while the noisy
    // one's reconciles wait on their probes.
    let flipped = std::time::Instant::now();
    quiet.set_ready("b", false).await?;
    wait_for(Duration::from_secs(10), || async {
        expect_eq(members(&quiet, "ready", "http", V4).await?, names(&["a"]))
    })
    .await
    .map_err(|e| e.context(format!("the quiet flip, {:?} after it", flipped.elapsed())))?;

    // A probe that starts failing there is judged (its resync comes every
    // 2 s) though every check permit is held by hanging probes.
    http_a.set_status(503);
    wait_for(Duration::from_secs(15), || async {
        expect_eq(members(&quiet, "probed", "http", V4).await?, names(&["d"]))
    })
    .await
    .map_err(|e| e.context("the quiet probe's failure"))?;

    // The noisy tenant still makes progress: its checks go on ending (each
    // by its timeout).
    wait_for(Duration::from_secs(30), || async {
        let now = noisy_checks(&pw.scrape().await?);
        ensure!(now > before, "no noisy check ended: {before} then {now}");
        Ok(())
    })
    .await?;
    drop(hanging);
    Ok(())
}

/// A stop does not wait for probes that hang: reconciles still judging
/// give up (nothing written) and only writes in flight are awaited. Behind
/// hanging probes portwise used to take longer than a pod's 30 s grace
/// period to exit after SIGTERM, so the kubelet's SIGKILL came first and
/// its Lease expired instead of being handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_does_not_wait_for_hanging_probes() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "stophang").await?;
    let mut svc = service("hung")
        .annotation(GROUP_KEY, "h")
        .annotation(POLICY, "hung");
    for p in 0..2u16 {
        svc = svc.port(&format!("p{p}"), i32::from(8080 + p));
    }
    ns.create_service(svc).await?;
    let mut hanging = Vec::new();
    for i in 0..3 {
        let ip = next_ips();
        ns.create_pod(
            pod(&format!("h{i}"))
                .annotation(GROUP_KEY, "h")
                .ips(ip.v4()),
        )
        .await?;
        for p in 0..2u16 {
            let l = HttpListener::start(ip.v4, 8080 + p).await?;
            l.set_mode(HttpMode::Hang);
            hanging.push(l);
        }
    }
    // Probes that would hang a minute, far past the grace period.
    let cfg = config_with(
        "podReady",
        "policies:\n  hung: {httpGet: {path: /healthz, timeout: 60s}}\n",
    );
    let mut pw = Portwise::builder(cp)
        .namespace(ns.name())
        .config(&cfg)
        .leader_elect(ns.name(), 15, "hung-replica")
        .start()
        .await?;
    // Every probe is in flight: each listener holds a request unanswered.
    wait_for(SETTLE, || async {
        let waiting = hanging.iter().filter(|l| l.request_count() > 0).count();
        ensure!(
            waiting == hanging.len(),
            "{waiting} of {} probes in flight",
            hanging.len()
        );
        Ok(())
    })
    .await?;

    // Well inside the 30 s grace period, exit 0 (`stop_within` checks it).
    let took = pw.stop_within(Duration::from_secs(10)).await?;
    println!("stopped {took:?} after SIGTERM with 6 probes hanging");
    // And the Lease is handed back, not left to expire.
    let lease = ns
        .api::<k8s_openapi::api::coordination::v1::Lease>()
        .get("portwise")
        .await?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    ensure!(
        holder.is_empty(),
        "the Lease still names {holder:?} after the stop"
    );
    drop(hanging);
    Ok(())
}
