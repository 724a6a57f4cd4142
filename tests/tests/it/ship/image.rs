//! The host image (`deploy/build-image`, `localhost/portwise:dev`) run with
//! podman the way a cluster runs it: read-only root filesystem, uid 65532,
//! every capability dropped, config file and modules directory as
//! read-only volumes, an empty writable cache. It must publish the seed
//! example and stop cleanly on SIGTERM (`podman stop`).

use std::{
    os::unix::fs::PermissionsExt,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use portwise_tests::*;

use super::support::*;

/// The image under test (what deploy/build-image builds by default).
fn image() -> String {
    std::env::var("PORTWISE_IMAGE").unwrap_or_else(|_| "localhost/portwise:dev".into())
}

const BUILD_HINT: &str = "run deploy/build-image first (./test does)";

async fn podman<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(
    args: &[S],
) -> Result<std::process::Output> {
    // podman on these machines: runc, cgroupfs, no default ulimits.
    let conf = std::env::var_os("CONTAINERS_CONF")
        .unwrap_or_else(|| repo().join("deploy/containers.conf").into_os_string());
    let out = tokio::process::Command::new("podman")
        .args(args)
        .env("CONTAINERS_CONF", conf)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| {
            format!("running podman (is it installed? {BUILD_HINT}, it installs podman)")
        })?;
    Ok(out)
}

async fn podman_ok<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S]) -> Result<String> {
    let out = podman(args).await?;
    ensure!(
        out.status.success(),
        "podman {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Removes the container when the test ends, whatever happened, after
/// printing its log (shown by the harness for failing tests).
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let conf = repo().join("deploy/containers.conf");
        let run = |args: &[&str]| {
            std::process::Command::new("podman")
                .args(args)
                .env("CONTAINERS_CONF", &conf)
                .output()
        };
        if let Ok(out) = run(&["logs", &self.0]) {
            eprintln!(
                "---- container {} log ----\n{}{}",
                self.0,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = run(&["rm", "--force", "--time", "0", &self.0]);
    }
}

fn write_mode(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    std::fs::write(path, contents)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// `podman run` of the image as a cluster runs it: read-only root, every
/// capability dropped, no privilege escalation, `mounts` (host path,
/// container path) read-only, the Deployment's emptyDir cache as a tmpfs,
/// the kubeconfig at /kube/config; then `portwise run` with `args`. The
/// test network namespace is the "node": the apiserver and the pod
/// addresses live on its loopback, hence the host network.
fn confined_run(name: &str, image: &str, mounts: &[(&Path, &str)], args: &[&str]) -> Vec<String> {
    let mut run: Vec<String> = [
        "run",
        "--detach",
        "--name",
        name,
        "--network=host",
        "--read-only",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--env",
        "KUBECONFIG=/kube/config",
        "--tmpfs",
        "/var/cache/portwise:rw,size=64m,mode=1777",
    ]
    .map(String::from)
    .to_vec();
    for (host, at) in mounts {
        run.extend(["--volume".into(), format!("{}:{at}:ro", host.display())]);
    }
    run.extend(
        [
            image,
            "run",
            "--config",
            "/etc/portwise/config.yaml",
            "--cache-dir",
            "/var/cache/portwise",
        ]
        .map(String::from),
    );
    run.extend(args.iter().map(|a| a.to_string()));
    run
}

/// A `/proc/PID/status` field, e.g. `Uid:` → "65532\t65532\t65532\t65532".
fn status_field(status: &str, field: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_publishes_the_seed_example_and_stops_on_sigterm() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["image"],
        "ship::image::image_publishes_the_seed_example_and_stops_on_sigterm",
    ) {
        return Ok(());
    }
    wait_for_image_build().await?;
    let image = image();
    let exists = podman(&["image", "exists", &image]).await?;
    if !exists.status.success() {
        bail!("the image {image} is absent: {BUILD_HINT}");
    }
    // The recipe's own user, not one the test passes: runAsNonRoot needs a
    // numeric USER in the image.
    let user = podman_ok(&["image", "inspect", "--format", "{{.Config.User}}", &image]).await?;
    expect_eq(user.as_str(), "65532:65532")?;

    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "ship-image").await?;
    seed_scenario(&ns).create().await?;

    // What the container mounts. It runs as 65532: everything must be
    // readable by others (an admin kubeconfig is usually 0600).
    let dir = tempfile::Builder::new()
        .prefix("portwise-image-")
        .tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let kubeconfig = dir.path().join("kubeconfig");
    write_mode(&kubeconfig, &std::fs::read(cp.kubeconfig())?, 0o644)?;
    let config = dir.path().join("config.yaml");
    let yaml = config_with(SEED_MEMBERSHIP, "modulesDir: /etc/portwise/modules\n");
    write_mode(&config, yaml.as_bytes(), 0o644)?;
    let modules = dir.path().join("modules");
    std::fs::create_dir(&modules)?;
    std::fs::set_permissions(&modules, std::fs::Permissions::from_mode(0o755))?;
    let port = free_port()?;
    let ops = std::net::SocketAddr::from(([127, 0, 0, 1], port));

    let name = format!("portwise-test-{}", ns.name());
    let guard = Container(name.clone());
    let metrics_addr = ops.to_string();
    let started = Instant::now();
    podman_ok(&confined_run(
        &name,
        &image,
        &[
            (&kubeconfig, "/kube/config"),
            (&config, "/etc/portwise/config.yaml"),
            (&modules, "/etc/portwise/modules"),
        ],
        &["--namespace", ns.name(), "--metrics-addr", &metrics_addr],
    ))
    .await?;

    // Time to the first publish, and to the whole seed published.
    let mut first = None;
    let converged = loop {
        let eps = endpoints_by_port(&ns, "my-service").await?;
        if first.is_none() && eps.values().any(|s| !s.is_empty()) {
            first = Some(started.elapsed());
        }
        if seed_is(&ns, &["a", "b", "c"], &["b", "c", "d"])
            .await
            .is_ok()
        {
            break started.elapsed();
        }
        if started.elapsed() > SETTLE {
            let state = podman(&[
                "inspect",
                "--format",
                "{{.State.Status}} {{.State.ExitCode}}",
                &name,
            ])
            .await?;
            bail!(
                "the seed example was not published within {SETTLE:?} of podman run (container: {}); slices: {eps:?}",
                String::from_utf8_lossy(&state.stdout).trim()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let first = first.unwrap_or(converged);
    println!(
        "image {image}: podman run → first slice published {:.2}s, seed example complete {:.2}s",
        first.as_secs_f64(),
        converged.as_secs_f64()
    );
    // One slice per set of ports: a (http), b and c (both), d (https).
    expect_eq(slices_for(&ns, "my-service").await?.len(), 3)?;
    slice_invariants(&ns, "my-service", 100).await?;

    // It really runs confined: uid 65532, no capabilities at all, no
    // privilege escalation, read-only root.
    let pid = podman_ok(&["inspect", "--format", "{{.State.Pid}}", &name]).await?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status of the container's process"))?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    expect_eq(String::from_utf8_lossy(argv0).as_ref(), "/portwise")?;
    expect_eq(
        status_field(&status, "Uid:").as_deref(),
        Some("65532\t65532\t65532\t65532"),
    )?;
    expect_eq(
        status_field(&status, "Gid:").as_deref(),
        Some("65532\t65532\t65532\t65532"),
    )?;
    for cap in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        expect_eq(
            (cap, status_field(&status, cap).as_deref()),
            (cap, Some("0000000000000000")),
        )?;
    }
    expect_eq(status_field(&status, "NoNewPrivs:").as_deref(), Some("1"))?;
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .context("no / in the container's mountinfo")?;
    let opts = root.split_whitespace().nth(5).unwrap_or_default();
    ensure!(
        opts.split(',').any(|o| o == "ro"),
        "root filesystem is not read-only: {root}"
    );

    // Its operations port (host network): ready, and the figures agree.
    // Readiness is polled from the sync gate (every 100 ms), so it may trail
    // the first publish a little.
    wait_for(Duration::from_secs(5), || async {
        expect_eq(http_get(ops, "/readyz").await?.0, 200)
    })
    .await?;
    expect_eq(http_get(ops, "/healthz").await?.0, 200)?;
    let m = Metrics::parse(&http_get(ops, "/metrics").await?.1);
    let svc = [("namespace", ns.name()), ("service", "my-service")];
    expect_eq(m.value("portwise_slices_managed", &svc)?, Some(3.0))?;
    for port in ["http", "https"] {
        let labels = [svc[0], svc[1], ("port", port), ("family", "IPv4")];
        expect_eq(
            (port, m.value("portwise_endpoints_published", &labels)?),
            (port, Some(3.0)),
        )?;
    }

    // SIGTERM (podman stop) → exit 0, well before podman's SIGKILL.
    let stopping = Instant::now();
    podman_ok(&["stop", "--time", "20", &name]).await?;
    let stop_took = stopping.elapsed();
    let exit = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &name]).await?;
    expect_eq(exit.as_str(), "0")?;
    ensure!(
        stop_took < Duration::from_secs(15),
        "podman stop took {stop_took:?}: SIGTERM was not honoured (SIGKILL after 20s)"
    );
    println!(
        "image: podman stop → exit 0 in {:.2}s",
        stop_took.as_secs_f64()
    );
    drop(guard);
    Ok(())
}

/// The image carries TLS roots, and an `oci://` pull without `registryCA`
/// verifies the registry through them, as a pull from a public registry
/// must. The image's own bundle is Debian's Mozilla roots (not empty); the
/// test registry's CA is then provided only the way a system trust store
/// is, mounted over that bundle, and the module is pulled and decides a
/// port. With the image's own bundle, which does not know the test CA, the
/// same config is refused for the certificate: the trust store is what
/// decides, so the test cannot pass by accident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_trusts_registries_through_its_system_store() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["image", "registry"],
        "ship::image::the_image_trusts_registries_through_its_system_store",
    ) {
        return Ok(());
    }
    use portwise_tests::registry::{self, Registry};
    const BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
    wait_for_image_build().await?;
    let image = image();
    ensure!(
        podman(&["image", "exists", &image]).await?.status.success(),
        "the image {image} is absent: {BUILD_HINT}"
    );
    let dir = tempfile::Builder::new()
        .prefix("portwise-image-roots-")
        .tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;

    let probe = format!("portwise-bundle-{}", std::process::id());
    podman_ok(&["create", "--name", &probe, &image]).await?;
    let own = dir.path().join("own-bundle.crt");
    let copied = podman_ok(&[
        "cp",
        &format!("{probe}:{BUNDLE}"),
        &own.display().to_string(),
    ])
    .await;
    podman_ok(&["rm", "--force", &probe]).await?;
    copied?;
    let roots = std::fs::read_to_string(&own)?
        .matches("-----BEGIN CERTIFICATE-----")
        .count();
    ensure!(
        roots >= 100,
        "the image's {BUNDLE} holds {roots} certificates; expected the Mozilla roots"
    );
    println!("image {image}: {BUNDLE} holds {roots} root certificates");

    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "ship-image-roots").await?;
    let reg = Registry::start(cp).await?;
    let wasm = std::fs::read(guests_dir().join("ready-role.wasm"))?;
    let digest = reg.push("guests/ready-role", "v1", &wasm).await?;
    let module = reg.module("guests/ready-role", &digest);
    let ip = next_ips();
    let listener = HttpListener::start(ip.v4, 8080).await?;
    listener.set_body("{\"role\": \"primary\"}");
    Scenario::new(&ns)
        .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(ip.v4()))
        .create()
        .await?;

    let kubeconfig = dir.path().join("kubeconfig");
    write_mode(&kubeconfig, &std::fs::read(cp.kubeconfig())?, 0o644)?;
    let auth = dir.path().join("registry-auth.json");
    reg.write_auth(&auth, registry::USER, registry::PASSWORD)?;
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o644))?;
    let test_ca = dir.path().join("test-ca.crt");
    write_mode(&test_ca, &std::fs::read(reg.ca_file())?, 0o644)?;
    // No registryCA: the store decides.
    let config = dir.path().join("config.yaml");
    let yaml = config_with(
        &format!(
            "{{perPort: {{ports: {{http: {{wasm: {{module: '{module}', \
             config: {{roles: [primary], path: /ready}}}}}}}}, fallback: podReady}}}}"
        ),
        "registryAuth: /etc/portwise/registry-auth/config.json\n",
    );
    write_mode(&config, yaml.as_bytes(), 0o644)?;
    let mounts = [
        (kubeconfig.as_path(), "/kube/config"),
        (config.as_path(), "/etc/portwise/config.yaml"),
        (auth.as_path(), "/etc/portwise/registry-auth/config.json"),
    ];
    let args = ["--namespace", ns.name(), "--metrics-addr", "127.0.0.1:0"];

    // The image's own roots do not know the test CA: refused, and why.
    let name = format!("portwise-roots-own-{}", ns.name());
    let guard = Container(name.clone());
    podman_ok(&confined_run(&name, &image, &mounts, &args)).await?;
    let exit = podman_ok(&["wait", &name]).await?;
    let logs = podman(&["logs", &name]).await?;
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&logs.stdout),
        String::from_utf8_lossy(&logs.stderr)
    );
    ensure!(
        exit != "0" && logs.to_ascii_lowercase().contains("certificate"),
        "with the image's own roots the test registry should be refused for its certificate \
         (exit {exit}):\n{logs}"
    );
    drop(guard);

    // The test CA as the system store: pulled, verified, deciding.
    let name = format!("portwise-roots-{}", ns.name());
    let guard = Container(name.clone());
    let mut trusted = mounts.to_vec();
    trusted.push((test_ca.as_path(), BUNDLE));
    podman_ok(&confined_run(&name, &image, &trusted, &args)).await?;
    wait_for(SETTLE, || async {
        let eps = endpoints_by_port(&ns, "web").await?;
        let http = eps.get(&("http".to_string(), "IPv4".to_string()));
        expect_eq(
            http.map(|m| m.iter().cloned().collect::<Vec<_>>()),
            Some(vec!["a".to_string()]),
        )
    })
    .await?;
    listener.set_body("{\"role\": \"replica\"}");
    wait_for(SETTLE, || async {
        let eps = endpoints_by_port(&ns, "web").await?;
        let http = eps.get(&("http".to_string(), "IPv4".to_string()));
        expect_eq(http.map(|m| m.len()).unwrap_or(0), 0)
    })
    .await?;
    drop(guard);
    Ok(())
}
