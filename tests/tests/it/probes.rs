//! `httpGet` and `tcpDial` against real listeners on pod addresses that
//! start, stop, fail and hang; probes refresh every `resyncPeriod` with no
//! API change; checks run concurrently under `maxConcurrentChecks`.

use std::time::Duration;

use anyhow::{Result, ensure};
use portwise_tests::*;

const PROBES: &str = "{perPort: {ports: {\
    http: {httpGet: {path: /healthz, timeout: 1s}}, \
    https: {tcpDial: {timeout: 1s}}}}}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_get_and_tcp_dial_follow_real_listeners() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "probes").await?;
    let ips: Vec<_> = (0..4).map(|_| next_ips()).collect();
    let [a, b, c, d] = [ips[0].v4, ips[1].v4, ips[2].v4, ips[3].v4];
    // http: a 200, b 503, c nothing listening, d redirects to a 200 page.
    let http_a = HttpListener::start(a, 8080).await?;
    let http_b = HttpListener::start(b, 8080).await?;
    http_b.set_status(503);
    let http_d = HttpListener::start(d, 8080).await?;
    http_d.set_mode(HttpMode::Redirect("/ok".into()));
    http_d.route("/ok", 200);
    // https: a and b accept connections, c and d refuse.
    let _tcp_a = TcpListener::start(a, 8443).await?;
    let tcp_b = TcpListener::start(b, 8443).await?;

    let _pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .port("http", 8080)
                .port("https", 8443),
        )
        .pods(
            ["a", "b", "c", "d"]
                .iter()
                .zip(&ips)
                .map(|(name, ip)| pod(name).annotation(GROUP_KEY, "g").ips(ip.v4())),
        )
        .config(&config(PROBES))
        .start()
        .await?;
    wait_for(SETTLE, || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["a"]))?;
        expect_eq(members(&ns, "web", "https", V4).await?, names(&["a", "b"]))
    })
    .await?;
    ensure!(
        http_a.requests().iter().all(|r| r.path == "/healthz"),
        "probe paths: {:?}",
        http_a.requests()
    );
    ensure!(http_d.requests_for("/healthz") > 0, "d was never probed");
    ensure!(
        http_d.requests_for("/ok") == 0,
        "the probe followed a redirect"
    );

    // No API object changes from here on: only resyncs can notice.
    http_b.set_status(200);
    let http_c = HttpListener::start(c, 8080).await?;
    wait_for(SETTLE, || async {
        expect_eq(
            members(&ns, "web", "http", V4).await?,
            names(&["a", "b", "c"]),
        )
    })
    .await?;

    // a hangs: its probe times out and it leaves; the others are judged on
    // time regardless.
    http_a.set_mode(HttpMode::Hang);
    http_c.set_status(500);
    wait_for(SETTLE, || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["b"]))
    })
    .await?;

    // tcpDial: b stops listening, d starts.
    tcp_b.stop();
    let _tcp_d = TcpListener::start(d, 8443).await?;
    wait_for(SETTLE, || async {
        expect_eq(members(&ns, "web", "https", V4).await?, names(&["a", "d"]))
    })
    .await?;

    // a answers again.
    http_a.set_status(204);
    wait_for(SETTLE, || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["a", "b"]))
    })
    .await?;
    Ok(())
}

/// Probes judge each address: a dual-stack pod healthy on IPv4 and failing
/// on IPv6 is published in the IPv4 slice only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_judge_each_family_separately() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "probes-dual").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .dual_stack()
            .port("http", 8080),
    )
    .await?;
    let a = next_ips();
    let b = next_ips();
    ns.create_pod(pod("a").annotation(GROUP_KEY, "g").ips(a.dual()))
        .await?;
    ns.create_pod(pod("b").annotation(GROUP_KEY, "g").ips(b.dual()))
        .await?;
    let _a4 = HttpListener::start(a.v4, 8080).await?;
    let a6 = HttpListener::start(a.v6, 8080).await?;
    a6.set_status(503);
    let _b4 = HttpListener::start(b.v4, 8080).await?;
    let b6 = HttpListener::start(b.v6, 8080).await?;

    let _pw = Portwise::start(&ns, &config("{httpGet: {path: /healthz, timeout: 1s}}")).await?;
    wait_for(SETTLE, || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["a", "b"]))?;
        expect_eq(members(&ns, "web", "http", V6).await?, names(&["b"]))
    })
    .await?;
    ensure!(
        b6.request_count() > 0 && a6.request_count() > 0,
        "IPv6 addresses were not probed"
    );
    Ok(())
}

/// `maxConcurrentChecks` bounds the probes in flight (and they do run
/// concurrently up to it); a hanging pod does not hold up the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_checks_bounds_probes() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "concurrency").await?;
    ns.create_service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    let gauge = Concurrency::new();
    let mut listeners = Vec::new();
    let mut pods = Vec::new();
    for i in 0..8 {
        let ip = next_ips();
        let name = format!("p{i}");
        ns.create_pod(pod(&name).annotation(GROUP_KEY, "g").ips(ip.v4()))
            .await?;
        let l = HttpListener::start(ip.v4, 8080).await?;
        l.set_delay(Duration::from_millis(400));
        l.track(gauge.clone());
        listeners.push(l);
        pods.push(name);
    }
    let hung = next_ips();
    ns.create_pod(pod("hung").annotation(GROUP_KEY, "g").ips(hung.v4()))
        .await?;
    let h = HttpListener::start(hung.v4, 8080).await?;
    h.set_mode(HttpMode::Hang);
    // The hanging listener is not tracked: it sees the probe end only when it
    // next reads the closed connection, which can be after portwise has
    // already started the next probe in the freed slot.

    let cfg = config_with(
        "{httpGet: {path: /healthz, timeout: 2s}}",
        "maxConcurrentChecks: 2\n",
    );
    let _pw = Portwise::start(&ns, &cfg).await?;
    let expected: Vec<&str> = pods.iter().map(String::as_str).collect();
    wait_for(SETTLE, || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&expected))
    })
    .await?;
    // Let a few resync rounds run (the hanging pod is probed once a
    // round), then look at the high-water mark.
    let rounds = h.request_count();
    wait_for(SETTLE, || async {
        ensure!(
            h.request_count() >= rounds + 2,
            "only {} probes of the hanging pod",
            h.request_count()
        );
        Ok(())
    })
    .await?;
    let max = gauge.max();
    ensure!(
        max <= 2,
        "{max} probes in flight at once with maxConcurrentChecks: 2"
    );
    ensure!(
        max == 2,
        "probes never overlapped (max {max} in flight): checks do not run concurrently"
    );
    ensure!(h.request_count() > 0, "the hanging pod was never probed");
    Ok(())
}

/// Issue 24: a Service deleted while a slow probe of it is in flight
/// leaves no metric series behind once the probe ends (the reconcile that
/// ran it used to put them back), while a Service that stays keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_deleted_mid_probe_leaves_no_series() -> Result<()> {
    const SLOW: &str = "{httpGet: {path: /healthz, timeout: 4s}}";
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "probes-gone").await?;
    let (a, b) = (next_ips(), next_ips());
    let http_a = HttpListener::start(a.v4, 8080).await?;
    let _http_b = HttpListener::start(b.v4, 8080).await?;
    let pw = Scenario::new(&ns)
        .service(
            service("gone")
                .annotation(GROUP_KEY, "g")
                .port("http", 8080),
        )
        .service(
            service("stays")
                .annotation(GROUP_KEY, "h")
                .port("http", 8080),
        )
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(a.v4()))
        .pod(pod("b").annotation(GROUP_KEY, "h").ips(b.v4()))
        .config(&config(SLOW))
        .binary()
        .expect("gone", by_port([(("http", V4), &["a"][..])]))
        .expect("stays", by_port([(("http", V4), &["b"][..])]))
        .start()
        .await?;
    let series_of = |text: &str, svc: &str| {
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(&format!("service=\"{svc}\"")))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    ensure!(
        !series_of(&pw.metrics_text().await?, "gone").is_empty(),
        "no series for the Service to begin with"
    );

    // a's probe hangs, and a pod change makes the next reconcile probe it
    // afresh; the Service goes while that probe waits.
    http_a.set_mode(HttpMode::Hang);
    let probed = http_a.request_count();
    ns.annotate_pod("a", "touched", Some("1")).await?;
    wait_for(SETTLE, || async {
        ensure!(http_a.request_count() > probed, "a not probed again yet");
        Ok(())
    })
    .await?;
    ns.delete_service("gone").await?;
    wait_for(SETTLE, || async {
        let left = series_of(&pw.metrics_text().await?, "gone");
        ensure!(left.is_empty(), "series of a deleted Service: {left:#?}");
        Ok(())
    })
    .await?;

    // The probe times out (4 s) and its reconcile ends; nothing of `gone`
    // may come back, and `stays` keeps its series.
    stays_for(Duration::from_secs(8), || async {
        let text = pw.metrics_text().await?;
        let left = series_of(&text, "gone");
        ensure!(left.is_empty(), "series of a deleted Service: {left:#?}");
        ensure!(
            !series_of(&text, "stays").is_empty(),
            "the Service that stays lost its series"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// Issue 24: the per-check deadline follows each expression's own limits.
/// A guest whose call takes 12 s (eight GETs answered after 1.5 s each),
/// with `limits.callTimeout: 30s`, is included: the default deadline used
/// to count 5 s per `wasm` expression whatever its limit (10 s here), so
/// the check abstained, and after `abstainLimit` the pod was excluded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_guest_within_its_call_timeout_is_included() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "probes-slow-guest").await?;
    let modules = tempfile::Builder::new().prefix("slow-guest-").tempdir()?;
    std::fs::copy(
        guests_dir().join("hostile/slow-probes.wasm"),
        modules.path().join("slow-probes.wasm"),
    )?;
    let a = next_ips();
    let http = HttpListener::start(a.v4, 8080).await?;
    http.set_delay(Duration::from_millis(1500));
    let cfg = config_with(
        "{wasm: {module: slow-probes.wasm, config: {probes: 8, path: /slow}, \
         limits: {callTimeout: 30s}}}",
        &format!(
            "modulesDir: {}\nabstainLimit: 2s\n",
            modules.path().display()
        ),
    );
    let started = std::time::Instant::now();
    let _pw = Scenario::new(&ns)
        .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(a.v4()))
        .config(&cfg)
        .binary()
        .expect("web", by_port([(("http", V4), &["a"][..])]))
        .start()
        .await?;
    println!(
        "figure: a 12 s guest call included {:.1} s after start",
        started.elapsed().as_secs_f64()
    );
    ensure!(
        http.request_count() >= 8,
        "the guest made {} probes, not 8",
        http.request_count()
    );
    // It stays included through further checks (resync every 2 s).
    stays_for(Duration::from_secs(15), || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["a"]))
    })
    .await?;
    Ok(())
}
