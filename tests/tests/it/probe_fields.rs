//! The kubelet's probe fields (issue 50) on real listeners: an HTTPS admin
//! port with a self-signed certificate, named by container port and behind
//! a header, deciding another port; gRPC health per service, on a port by
//! number and by name. `portwise check` shows the reasons users read.

use std::time::Duration;

use anyhow::{Result, ensure};
use portwise_tests::*;

/// The reason `portwise check` gives for `pod`'s only row of `service`.
async fn reason(
    cp: &ControlPlane,
    ns: &TestNs,
    cfg: &str,
    service: &str,
    pod: &str,
) -> Result<String> {
    let out = run_binary_to_exit_on(
        cp,
        &[
            "check",
            "--config",
            "{config}",
            "-n",
            ns.name(),
            "--service-name",
            service,
            "--pod-name",
            pod,
        ],
        cfg,
        Duration::from_secs(60),
    )
    .await?;
    ensure!(
        out.code == Some(0),
        "check {pod}: {:?}\n{}{}",
        out.code,
        out.stdout,
        out.stderr
    );
    Ok(out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_admin_port_named_by_container_port_decides_another_port() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "probe-https").await?;
    let ips: Vec<_> = (0..4).map(|_| next_ips()).collect();
    let [a, b, c, d] = [ips[0].v4, ips[1].v4, ips[2].v4, ips[3].v4];
    // a: HTTPS, the header portwise sends is the one it wants.
    let admin_a = HttpListener::start_tls(a, 9644).await?;
    admin_a.require_header("Authorization", "Bearer s3cret");
    // b: HTTPS, wants another credential: 401.
    let admin_b = HttpListener::start_tls(b, 9644).await?;
    admin_b.require_header("Authorization", "Bearer rotated");
    // c: the admin port speaks plain HTTP, not HTTPS (it waits for a
    // request head that the TLS handshake never sends: the probe times out,
    // as the kubelet's would).
    let _admin_c = HttpListener::start(c, 9644).await?;
    // d: serves HTTPS on 9644 but does not declare a port named admin.
    let _admin_d = HttpListener::start_tls(d, 9644).await?;
    // Nothing listens on the kafka port itself: only the admin port decides.
    let cfg = config(
        "{perPort: {ports: {kafka: {httpGet: {path: /v1/ready, port: admin, scheme: HTTPS, \
         httpHeaders: [{name: Authorization, value: Bearer s3cret}], timeout: 1s}}}}}",
    );
    let _pw = Scenario::new(&ns)
        .service(
            service("kafka")
                .annotation(GROUP_KEY, "g")
                .port("kafka", 9092),
        )
        .pods(["a", "b", "c", "d"].iter().zip(&ips).map(|(name, ip)| {
            let p = pod(name)
                .annotation(GROUP_KEY, "g")
                .container_port("kafka", 9092, "TCP")
                .ips(ip.v4());
            if *name == "d" {
                p.container_port("metrics", 9644, "TCP")
            } else {
                p.container_port("admin", 9644, "TCP")
            }
        }))
        .config(&cfg)
        .start()
        .await?;
    wait_for(SETTLE, || async {
        expect_eq(members(&ns, "kafka", "kafka", V4).await?, names(&["a"]))
    })
    .await?;
    ensure!(
        admin_a
            .requests()
            .iter()
            .all(|r| r.path == "/v1/ready" && r.status == 200),
        "a's admin requests: {:?}",
        admin_a.requests()
    );
    let why_b = reason(cp, &ns, &cfg, "kafka", "b").await?;
    ensure!(
        why_b.contains(&format!(
            "httpGet https://{b}:9644/v1/ready: status 401: missing or wrong credentials"
        )),
        "b's reason:\n{why_b}"
    );
    let why_c = reason(cp, &ns, &cfg, "kafka", "c").await?;
    ensure!(
        why_c.contains(&format!("httpGet https://{c}:9644/v1/ready: timed out")),
        "c's reason:\n{why_c}"
    );
    let why_d = reason(cp, &ns, &cfg, "kafka", "d").await?;
    ensure!(
        why_d.contains("httpGet: the pod has no TCP container port named \"admin\""),
        "d's reason:\n{why_d}"
    );

    // b takes the credential portwise sends: no API change, the resync sees it.
    admin_b.require_header("Authorization", "Bearer s3cret");
    wait_for(SETTLE, || async {
        expect_eq(
            members(&ns, "kafka", "kafka", V4).await?,
            names(&["a", "b"]),
        )
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_decides_each_port_by_its_service() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "probe-grpc").await?;
    let ips: Vec<_> = (0..3).map(|_| next_ips()).collect();
    let [a, b, c] = [ips[0].v4, ips[1].v4, ips[2].v4];
    let health_a = GrpcHealthServer::start(a, 50051).await?;
    health_a.set("db", true).await;
    health_a.set("cache", true).await;
    let health_b = GrpcHealthServer::start(b, 50051).await?;
    health_b.set("db", false).await;
    health_b.set("cache", true).await;
    // c's server knows neither service... but reports the cache down.
    let health_c = GrpcHealthServer::start(c, 50051).await?;
    health_c.set("", true).await;
    health_c.set("cache", false).await;
    let cfg = config(
        "{perPort: {ports: {\
         db: {grpc: {port: 50051, service: db, timeout: 1s}}, \
         cache: {grpc: {port: grpc-health, service: cache, timeout: 1s}}}}}",
    );
    let _pw = Scenario::new(&ns)
        .service(
            service("store")
                .annotation(GROUP_KEY, "g")
                .port("db", 5432)
                .port("cache", 6379),
        )
        .pods(["a", "b", "c"].iter().zip(&ips).map(|(name, ip)| {
            pod(name)
                .annotation(GROUP_KEY, "g")
                .container_port("grpc-health", 50051, "TCP")
                .ips(ip.v4())
        }))
        .config(&cfg)
        .start()
        .await?;
    wait_for(SETTLE, || async {
        expect_eq(members(&ns, "store", "db", V4).await?, names(&["a"]))?;
        expect_eq(
            members(&ns, "store", "cache", V4).await?,
            names(&["a", "b"]),
        )
    })
    .await?;
    let why_c = reason(cp, &ns, &cfg, "store", "c").await?;
    ensure!(
        why_c.contains(&format!(
            "grpc {c}:50051 service \"db\": the server does not know the service"
        )) && why_c.contains(&format!("grpc {c}:50051 service \"cache\": NOT_SERVING")),
        "c's reasons:\n{why_c}"
    );

    // Statuses change with no API change: the resync follows them.
    health_b.set("db", true).await;
    health_a.set("cache", false).await;
    wait_for(SETTLE, || async {
        expect_eq(members(&ns, "store", "db", V4).await?, names(&["a", "b"]))?;
        expect_eq(members(&ns, "store", "cache", V4).await?, names(&["b"]))
    })
    .await?;
    Ok(())
}

/// The same reach for guests (WIT 0.2.1): `broker-health` asks a pod's
/// HTTPS admin API (with a header) and its gRPC health service, each on a
/// port it finds by container-port name. Beside it in one `modulesDir`, the
/// `admin-check` guest exactly as it was built against 0.2.0 (kept byte for
/// byte in host/wasm/tests/fixtures) decides another port unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_2_1_guest_probes_https_and_grpc_beside_an_unchanged_0_2_0_guest() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "probe-guests").await?;
    let modules = tempfile::Builder::new().prefix("guests-0-2-1-").tempdir()?;
    std::fs::copy(
        guests_dir().join("broker-health.wasm"),
        modules.path().join("broker-health.wasm"),
    )?;
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../host/wasm/tests/fixtures/admin-check-0.2.0.wasm");
    std::fs::copy(&fixture, modules.path().join("admin-check-0.2.0.wasm"))?;

    let ips: Vec<_> = (0..3).map(|_| next_ips()).collect();
    let [a, b, c] = [ips[0].v4, ips[1].v4, ips[2].v4];
    let mut admins = Vec::new();
    let mut healths = Vec::new();
    for (ip, credential, serving) in [
        (a, "Bearer s3cret", true),
        (b, "Bearer s3cret", false),
        (c, "Bearer rotated", true),
    ] {
        let admin = HttpListener::start_tls(ip, 9644).await?;
        admin.require_header("Authorization", credential);
        admins.push(admin);
        let health = GrpcHealthServer::start(ip, 50051).await?;
        health.set("broker", serving).await;
        healths.push(health);
    }
    let cfg = config_with(
        "{perPort: {ports: {\
         kafka: {wasm: {module: broker-health.wasm, config: {adminPort: admin, \
         path: /v1/broker/ready, headers: {Authorization: Bearer s3cret}, \
         grpcPort: grpc-health, service: broker, timeoutMs: 1000}}}, \
         legacy: {wasm: {module: admin-check-0.2.0.wasm, config: {key: example.com/admin, timeoutMs: 500}}}}}}",
        &format!("modulesDir: {}\n", modules.path().display()),
    );
    let _pw = Scenario::new(&ns)
        .service(
            service("brokers")
                .annotation(GROUP_KEY, "g")
                .port("kafka", 9092)
                .port("legacy", 7000),
        )
        .pods(["a", "b", "c"].iter().zip(&ips).map(|(name, ip)| {
            let p = pod(name)
                .annotation(GROUP_KEY, "g")
                .container_port("admin", 9644, "TCP")
                .container_port("grpc-health", 50051, "TCP")
                .ips(ip.v4());
            if *name == "b" {
                p
            } else {
                p.label("example.com/admin", "yes")
            }
        }))
        .config(&cfg)
        .binary()
        .start()
        .await?;
    wait_for(SETTLE, || async {
        expect_eq(members(&ns, "brokers", "kafka", V4).await?, names(&["a"]))?;
        expect_eq(
            members(&ns, "brokers", "legacy", V4).await?,
            names(&["a", "c"]),
        )
    })
    .await?;
    ensure!(
        admins[0]
            .requests()
            .iter()
            .all(|r| r.path == "/v1/broker/ready" && r.status == 200),
        "a's admin requests: {:?}",
        admins[0].requests()
    );
    ensure!(
        admins[2].answered(401) > 0,
        "c's admin API never refused the header"
    );

    // b's broker comes up: the guest's next check sees SERVING.
    healths[1].set("broker", true).await;
    wait_for(SETTLE, || async {
        expect_eq(
            members(&ns, "brokers", "kafka", V4).await?,
            names(&["a", "b"]),
        )
    })
    .await?;
    Ok(())
}
