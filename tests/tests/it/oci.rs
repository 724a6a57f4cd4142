//! `oci://` modules from a real registry (the CNCF distribution registry,
//! tests/registry, TLS from the test CA, htpasswd auth): pulled by digest at
//! start and deciding a port end to end, refused on a wrong digest, damaged
//! content, wrong credentials or a size past `maxModuleBytes` (before the
//! download), and served from the cache after a restart with the registry
//! gone. Under `moduleSignatures`, modules signed by real cosign (both of
//! the forms it stores signatures in) serve, unsigned or wrongly signed ones
//! are refused while the running portwise keeps serving its own, and the
//! cache is verified again, offline, against the keys of each start.
//! Credentials rotated under a running portwise (the registry's password,
//! then its Secret volume) reach the next pull of its restarted container.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result, ensure};
use oci_client::client::{Config, ImageLayer};
use portwise_tests::{
    cosign::{Cosign, Form},
    registry::Registry,
    *,
};
use sha2::{Digest, Sha256};

const REPO: &str = "guests/python-tier-check";

fn python_guest() -> Result<Vec<u8>> {
    let path = guests_dir().join("python-tier-check.wasm");
    std::fs::read(&path).with_context(|| format!("{} (run guests/build)", path.display()))
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `wasm` pushed as `repo:tag` under a config blob of its own (`variant`):
/// the same component under another manifest digest.
async fn push_variant(
    reg: &Registry,
    repo: &str,
    tag: &str,
    wasm: &[u8],
    variant: &str,
) -> Result<String> {
    reg.push_layers(
        repo,
        tag,
        vec![ImageLayer::new(
            wasm.to_vec(),
            registry::WASM_LAYER_MEDIA_TYPE.to_string(),
            None,
        )],
        Config::new(
            format!(r#"{{"architecture":"wasm","os":"wasip2","variant":"{variant}"}}"#)
                .into_bytes(),
            registry::WASM_CONFIG_MEDIA_TYPE.to_string(),
            None,
        ),
    )
    .await
}

/// The config: port `http` decided by the guest at `module`, `admin` by
/// readiness; the registry's CA and `auth` as the credentials.
fn oci_config(reg: &Registry, module: &str, auth: &Path, extra: &str) -> String {
    config_with(
        &format!(
            "{{perPort: {{ports: {{http: {{wasm: {{module: '{module}', \
             config: {{tiers: [frontend], timeoutMs: 1000}}}}}}}}, fallback: podReady}}}}"
        ),
        &format!(
            "registryAuth: {}\nregistryCA: {}\n{extra}",
            auth.display(),
            reg.ca_file().display()
        ),
    )
}

/// What each test starts with: a namespace, a registry, and a work
/// directory holding credentials for it (`auth`, a Docker config JSON).
struct Setup {
    ns: TestNs,
    reg: Registry,
    work: tempfile::TempDir,
    auth: std::path::PathBuf,
}

async fn setup(name: &str) -> Result<Setup> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, name).await?;
    let reg = Registry::start(cp).await?;
    let work = tempfile::Builder::new()
        .prefix(&format!("{name}-"))
        .tempdir()?;
    let auth = work.path().join("config.json");
    reg.write_auth(&auth, registry::USER, registry::PASSWORD)?;
    Ok(Setup {
        ns,
        reg,
        work,
        auth,
    })
}

/// The binary (pull cache at `cache`) on Service `web` (port `http`,
/// 8080) and pod `a` at `ip`, once `a` backs `http`.
async fn serving_a(ns: &TestNs, ip: &PodIps, config: &str, cache: &Path) -> Result<Portwise> {
    let pw = Scenario::new(ns)
        .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(ip.v4()))
        .config(config)
        .with_portwise(|l| {
            l.binary()
                .args(&["--cache-dir", &cache.display().to_string()])
        })
        .start()
        .await?;
    wait_for(Duration::from_secs(90), || async {
        expect_eq(members(ns, "web", "http", V4).await?, names(&["a"]))
    })
    .await?;
    Ok(pw)
}

/// Runs `portwise run` on `config` until it exits (it should: refused).
async fn run_refused(ns: &TestNs, config: &str, cache: &Path) -> Result<String> {
    run_refused_as(ns, config, cache, None).await
}

/// [`run_refused`], as Pod `pod` of the test namespace (where its module
/// Events go).
async fn run_refused_as(
    ns: &TestNs,
    config: &str,
    cache: &Path,
    pod: Option<&str>,
) -> Result<String> {
    let cache = cache.display().to_string();
    let env: Vec<(&str, &str)> = match pod {
        Some(p) => vec![("POD_NAME", p), ("POD_NAMESPACE", ns.name())],
        None => Vec::new(),
    };
    let out = run_binary_to_exit_with_env(
        &[
            "run",
            "--config",
            "{config}",
            "--namespace",
            ns.name(),
            "--metrics-addr",
            "127.0.0.1:0",
            "--cache-dir",
            &cache,
        ],
        config,
        Duration::from_secs(120),
        &env,
    )
    .await?;
    ensure!(
        !out.timed_out && out.code.is_some_and(|c| c != 0),
        "portwise was expected to refuse the configuration and exit: {:?}\n{}",
        out.code,
        out.stderr
    );
    Ok(format!("{}\n{}", out.stdout, out.stderr))
}

/// The Python guest (18 MB: no ConfigMap holds it) pushed to the registry,
/// pulled by digest, deciding port `http` of a real Service; then portwise
/// restarts with the registry gone and still decides (from its cache),
/// following a pod's health as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_guest_pulled_by_digest_decides_a_port_and_survives_the_registry_going_away()
-> Result<()> {
    if portwise_tests::deferred::skip(
        &["registry"],
        "oci::python_guest_pulled_by_digest_decides_a_port_and_survives_the_registry_going_away",
    ) {
        return Ok(());
    }
    let Setup {
        ns,
        mut reg,
        work,
        auth,
    } = setup("oci-python").await?;
    let wasm = python_guest()?;
    ensure!(
        wasm.len() > 3 << 20,
        "the Python guest is {} bytes",
        wasm.len()
    );
    let digest = reg.push(REPO, "v1", &wasm).await?;
    let module = reg.module(REPO, &digest);
    let cache = work.path().join("cache");

    let ips: Vec<_> = (0..3).map(|_| next_ips()).collect();
    let [a, b, c] = [ips[0].v4, ips[1].v4, ips[2].v4];
    let _http_a = HttpListener::start(a, 8080).await?;
    let _http_b = HttpListener::start(b, 8080).await?;
    let http_c = HttpListener::start(c, 8080).await?;
    http_c.set_status(503);
    let tiers = ["frontend", "batch", "frontend"];
    let mut pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .port("http", 8080)
                .port("admin", 9000),
        )
        .pods(
            ["a", "b", "c"]
                .iter()
                .zip(&ips)
                .zip(tiers)
                .map(|((name, ip), tier)| {
                    pod(name)
                        .annotation(GROUP_KEY, "g")
                        .label("tier", tier)
                        .ips(ip.v4())
                }),
        )
        .config(&oci_config(&reg, &module, &auth, ""))
        .with_portwise(|l| {
            l.binary()
                .args(&["--cache-dir", &cache.display().to_string()])
        })
        .start()
        .await?;
    // a: frontend and healthy; b: not a frontend; c: a frontend failing /healthz.
    wait_for(Duration::from_secs(90), || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["a"]))?;
        expect_eq(
            members(&ns, "web", "admin", V4).await?,
            names(&["a", "b", "c"]),
        )
    })
    .await?;
    let logs = pw.logs();
    ensure!(
        logs.contains(&format!("{} bytes pulled", wasm.len())),
        "no pull in the log:\n{logs}"
    );
    let served = reg.blob_bytes_served(&sha256(&wasm));
    ensure!(
        served >= wasm.len() as u64,
        "the registry served {served} bytes of the layer"
    );

    // The registry goes away; portwise restarts and serves from its cache.
    pw.stop().await?;
    reg.stop().await?;
    pw.start_again().await?;
    http_c.set_status(200);
    wait_for(Duration::from_secs(90), || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["a", "c"]))
    })
    .await?;
    let logs = pw.current_logs();
    ensure!(
        logs.contains("read from the pull cache"),
        "the restart did not use the cache:\n{logs}"
    );
    pw.check_running()?;
    Ok(())
}

/// A digest the registry does not have is refused, and so is content the
/// registry serves that does not match its digest (damaged in its storage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_digest_or_damaged_content_is_refused() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["registry"],
        "oci::a_wrong_digest_or_damaged_content_is_refused",
    ) {
        return Ok(());
    }
    let Setup {
        ns,
        reg,
        work,
        auth,
    } = setup("oci-digest").await?;
    let wasm = std::fs::read(guests_dir().join("ready-role.wasm"))?;
    let digest = reg.push("guests/ready-role", "v1", &wasm).await?;

    // The layer's digest where the manifest's belongs: a common mistake.
    let wrong = reg.module("guests/ready-role", &sha256(&wasm));
    let out = run_refused(
        &ns,
        &oci_config(&reg, &wrong, &auth, ""),
        &work.path().join("c1"),
    )
    .await?;
    ensure!(out.contains("no such artifact"), "{out}");

    // The tag moved elsewhere does not matter: the digest decides.
    let other = reg
        .push("guests/ready-role", "v1", b"\0asm\x0d\0\x01\0other")
        .await?;
    ensure!(other != digest);

    // Damaged in the registry's storage (same length, other bytes).
    let blob = reg.blob_path(&sha256(&wasm));
    let mut bytes = std::fs::read(&blob)?;
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&blob, &bytes)?;
    let pinned = reg.module("guests/ready-role", &digest);
    let out = run_refused(
        &ns,
        &oci_config(&reg, &pinned, &auth, ""),
        &work.path().join("c2"),
    )
    .await?;
    ensure!(out.contains("does not match"), "{out}");
    Ok(())
}

/// Wrong credentials are refused with an error that names the registry,
/// the user and where the credentials came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_refused_clearly() -> Result<()> {
    if portwise_tests::deferred::skip(&["registry"], "oci::wrong_credentials_are_refused_clearly") {
        return Ok(());
    }
    let Setup {
        ns,
        reg,
        work,
        auth,
    } = setup("oci-auth").await?;
    let wasm = std::fs::read(guests_dir().join("ready-role.wasm"))?;
    let digest = reg.push("guests/ready-role", "v1", &wasm).await?;
    let module = reg.module("guests/ready-role", &digest);
    reg.write_auth(&auth, registry::USER, "not-the-password")?;
    let out = run_refused(
        &ns,
        &oci_config(&reg, &module, &auth, ""),
        &work.path().join("c"),
    )
    .await?;
    ensure!(
        out.contains(&reg.host()) && out.contains(registry::USER) && out.contains("refused"),
        "{out}"
    );
    ensure!(
        out.contains(&auth.display().to_string()),
        "the error does not say where the credentials came from:\n{out}"
    );
    Ok(())
}

/// An artifact past `maxModuleBytes` is refused from its manifest: the
/// registry never serves a byte of its layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_artifact_is_refused_before_it_is_downloaded() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["registry"],
        "oci::a_huge_artifact_is_refused_before_it_is_downloaded",
    ) {
        return Ok(());
    }
    let Setup {
        ns,
        reg,
        work,
        auth,
    } = setup("oci-huge").await?;
    let mut huge = b"\0asm\x0d\0\x01\0".to_vec();
    huge.resize(4 << 20, 0x5a);
    let digest = reg.push("guests/huge", "v1", &huge).await?;
    let module = reg.module("guests/huge", &digest);
    let out = run_refused(
        &ns,
        &oci_config(&reg, &module, &auth, "maxModuleBytes: 1048576\n"),
        &work.path().join("c"),
    )
    .await?;
    ensure!(out.contains("over maxModuleBytes"), "{out}");
    let served = reg.blob_bytes_served(&sha256(&huge));
    ensure!(
        served == 0,
        "the registry served {served} bytes of the layer"
    );
    ensure!(
        reg.logs().contains("/v2/guests/huge/manifests/sha256:"),
        "portwise never asked for the manifest:\n{}",
        reg.logs()
    );
    Ok(())
}

/// Port `http` decided by ready-role from `bundle_module` (signed in
/// cosign 3's bundle form), `admin` by the same guest from `sig_module`
/// (signed in the older `.sig` form), both requiring role `primary`.
fn signed_config(
    reg: &Registry,
    bundle_module: &str,
    sig_module: &str,
    auth: &Path,
    keys: &[&Path],
) -> String {
    let guest = |m: &str| {
        format!("{{wasm: {{module: '{m}', config: {{roles: [primary], path: /ready}}}}}}")
    };
    let keys: Vec<String> = keys.iter().map(|k| k.display().to_string()).collect();
    config_with(
        &format!(
            "{{perPort: {{ports: {{http: {}, admin: {}}}, fallback: podReady}}}}",
            guest(bundle_module),
            guest(sig_module)
        ),
        &format!(
            "registryAuth: {}\nregistryCA: {}\nmoduleSignatures: {{keys: [{}]}}\n",
            auth.display(),
            reg.ca_file().display(),
            keys.join(", ")
        ),
    )
}

/// Modules signed with cosign (3.x, offline, `--key`) serve in both of the
/// forms cosign stores signatures in. A new config naming an unsigned
/// module, or one signed by a key the config does not name, is refused by
/// the portwise that loads it, and the running one keeps serving its
/// modules (it follows a pod's change afterwards). A restart with the
/// registry gone verifies the cached signatures offline: under the same key
/// it serves, under another key it refuses, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_modules_serve_and_unsigned_or_wrongly_signed_ones_are_refused() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["registry", "cosign"],
        "oci::signed_modules_serve_and_unsigned_or_wrongly_signed_ones_are_refused",
    ) {
        return Ok(());
    }
    let Setup {
        ns,
        mut reg,
        work,
        auth,
    } = setup("oci-signed").await?;
    let cosign = Cosign::new(&reg)?;
    let release = cosign.generate_key_pair("release")?;
    let stranger = cosign.generate_key_pair("stranger")?;
    let cache = work.path().join("cache");

    let ready_role = std::fs::read(guests_dir().join("ready-role.wasm"))?;
    let digest = reg.push("guests/ready-role", "v1", &ready_role).await?;
    cosign.sign(&reg, "guests/ready-role", &digest, &release, Form::Bundle)?;
    // The same component under another manifest (its config differs): a
    // signature is of a manifest digest, whatever repository holds it, and
    // the pull cache is keyed by that digest.
    let legacy = push_variant(
        &reg,
        "guests/ready-role-legacy",
        "v1",
        &ready_role,
        "legacy-signed",
    )
    .await?;
    ensure!(legacy != digest);
    cosign.sign(
        &reg,
        "guests/ready-role-legacy",
        &legacy,
        &release,
        Form::SimpleSigning,
    )?;
    ensure!(
        reg.logs().contains(&format!(
            "/v2/guests/ready-role-legacy/manifests/sha256-{legacy}.sig"
        )),
        "cosign did not write the .sig tag:\n{}",
        reg.logs()
    );
    let bundle_module = reg.module("guests/ready-role", &digest);
    let sig_module = reg.module("guests/ready-role-legacy", &legacy);

    let ips: Vec<_> = (0..2).map(|_| next_ips()).collect();
    let listeners = [
        HttpListener::start(ips[0].v4, 8080).await?,
        HttpListener::start(ips[1].v4, 8080).await?,
    ];
    let admin = [
        HttpListener::start(ips[0].v4, 9000).await?,
        HttpListener::start(ips[1].v4, 9000).await?,
    ];
    for (i, role) in ["primary", "replica"].iter().enumerate() {
        listeners[i].set_body(&format!("{{\"role\": \"{role}\"}}"));
        admin[i].set_body(&format!("{{\"role\": \"{role}\"}}"));
    }
    let mut pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .port("http", 8080)
                .port("admin", 9000),
        )
        .pods(
            ["a", "b"]
                .iter()
                .zip(&ips)
                .map(|(name, ip)| pod(name).annotation(GROUP_KEY, "g").ips(ip.v4())),
        )
        .config(&signed_config(
            &reg,
            &bundle_module,
            &sig_module,
            &auth,
            &[&stranger.public, &release.public],
        ))
        .with_portwise(|l| {
            l.binary()
                .args(&["--cache-dir", &cache.display().to_string()])
        })
        .start()
        .await?;
    wait_for(Duration::from_secs(90), || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["a"]))?;
        expect_eq(members(&ns, "web", "admin", V4).await?, names(&["a"]))
    })
    .await?;
    let logs = pw.logs();
    ensure!(
        logs.contains(&format!("{} (sigstore bundle", release.public.display()))
            && logs.contains(&format!(
                "{} (simple-signing payload",
                release.public.display()
            )),
        "the log does not say which key and form verified each module:\n{logs}"
    );

    // A rollout to an unsigned module: the new portwise refuses it.
    let admin_check = std::fs::read(guests_dir().join("admin-check.wasm"))?;
    let unsigned = reg.push("guests/admin-check", "v1", &admin_check).await?;
    let unsigned_module = reg.module("guests/admin-check", &unsigned);
    let out = run_refused_as(
        &ns,
        &signed_config(
            &reg,
            &unsigned_module,
            &sig_module,
            &auth,
            &[&release.public],
        ),
        &work.path().join("c-unsigned"),
        Some("portwise-next"),
    )
    .await?;
    ensure!(
        out.contains("it is not signed") && out.contains(&unsigned),
        "{out}"
    );
    let served = reg.blob_bytes_served(&sha256(&admin_check));
    ensure!(
        served == 0,
        "the unsigned module's layer was downloaded ({served} bytes)"
    );
    // The refusal reached its Pod's Events, although portwise exited at once.
    let events = events_for(&ns, "portwise-next", Some("ModuleLoadFailed")).await?;
    ensure!(
        events.iter().any(|e| e
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("it is not signed")),
        "no ModuleLoadFailed Event about the unsigned module: {events:?}"
    );

    // Signed, but by a key the config does not name.
    cosign.sign(
        &reg,
        "guests/admin-check",
        &unsigned,
        &stranger,
        Form::Bundle,
    )?;
    let out = run_refused(
        &ns,
        &signed_config(
            &reg,
            &unsigned_module,
            &sig_module,
            &auth,
            &[&release.public],
        ),
        &work.path().join("c-stranger"),
    )
    .await?;
    ensure!(
        out.contains("does not verify under any configured key")
            && out.contains(&release.public.display().to_string()),
        "{out}"
    );

    // The running portwise still decides with its own modules.
    listeners[1].set_body("{\"role\": \"primary\"}");
    wait_for(Duration::from_secs(60), || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["a", "b"]))?;
        expect_eq(members(&ns, "web", "admin", V4).await?, names(&["a"]))
    })
    .await?;
    pw.check_running()?;

    // Registry gone: the cached signatures are verified offline.
    pw.stop().await?;
    reg.stop().await?;
    let out = run_refused(
        &ns,
        &signed_config(
            &reg,
            &bundle_module,
            &sig_module,
            &auth,
            &[&stranger.public],
        ),
        &cache,
    )
    .await?;
    ensure!(
        out.contains("the cached copy is not served")
            && out.contains("does not verify under any configured key"),
        "{out}"
    );
    pw.start_again().await?;
    listeners[0].set_body("{\"role\": \"replica\"}");
    wait_for(Duration::from_secs(90), || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["b"]))
    })
    .await?;
    let logs = pw.current_logs();
    ensure!(
        logs.contains("read from the pull cache") && logs.contains("sigstore bundle"),
        "the restart did not serve verified modules from the cache:\n{logs}"
    );
    pw.check_running()?;
    Ok(())
}

/// `allowTags`: the tag is resolved at start; with the registry gone, a
/// restart serves what the tag last pointed at (from the cache) and says
/// so, and the module still decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_tag_serves_its_last_resolution_when_the_registry_is_gone() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["registry"],
        "oci::an_allowed_tag_serves_its_last_resolution_when_the_registry_is_gone",
    ) {
        return Ok(());
    }
    let Setup {
        ns,
        mut reg,
        work,
        auth,
    } = setup("oci-tag").await?;
    let cache = work.path().join("cache");
    let wasm = std::fs::read(guests_dir().join("ready-role.wasm"))?;
    let digest = reg.push("guests/ready-role", "v1", &wasm).await?;
    let module = format!("oci://{}/guests/ready-role:v1", reg.host());

    let ip = next_ips();
    let http = HttpListener::start(ip.v4, 8080).await?;
    http.set_body(r#"{"role": "primary"}"#);
    let config = config_with(
        &format!(
            "{{perPort: {{ports: {{http: {{wasm: {{module: '{module}', allowTags: true, \
             config: {{roles: [primary], path: /ready}}}}}}}}, fallback: podReady}}}}"
        ),
        &format!(
            "registryAuth: {}\nregistryCA: {}\n",
            auth.display(),
            reg.ca_file().display()
        ),
    );
    let mut pw = serving_a(&ns, &ip, &config, &cache).await?;

    pw.stop().await?;
    reg.stop().await?;
    pw.start_again().await?;
    http.set_body(r#"{"role": "replica"}"#);
    wait_for(Duration::from_secs(90), || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&[]))
    })
    .await?;
    let logs = pw.current_logs();
    ensure!(
        logs.contains(&format!(
            "serving sha256:{digest}, what the tag last pointed at"
        )),
        "the restart did not say it served the tag's last resolution:\n{logs}"
    );
    pw.check_running()?;
    Ok(())
}

/// A registry that sends more than the manifest declares (its storage
/// holds a bigger blob than the descriptor says) is cut off at
/// `maxModuleBytes`: refused from the response's length, without taking
/// the whole blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_larger_than_its_manifest_says_is_refused_at_the_cap() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["registry"],
        "oci::a_blob_larger_than_its_manifest_says_is_refused_at_the_cap",
    ) {
        return Ok(());
    }
    let Setup {
        ns,
        reg,
        work,
        auth,
    } = setup("oci-liar").await?;
    let wasm = std::fs::read(guests_dir().join("ready-role.wasm"))?;
    let digest = reg.push("guests/liar", "v1", &wasm).await?;
    // The stored blob grows to 8 MiB; the manifest still says the original size.
    let blob = reg.blob_path(&sha256(&wasm));
    let mut bigger = wasm.clone();
    bigger.resize(8 << 20, 0x5a);
    std::fs::write(&blob, &bigger)?;
    let cap = wasm.len() + 4096;
    let out = run_refused(
        &ns,
        &oci_config(
            &reg,
            &reg.module("guests/liar", &digest),
            &auth,
            &format!("maxModuleBytes: {cap}\n"),
        ),
        &work.path().join("c"),
    )
    .await?;
    ensure!(
        out.contains("over maxModuleBytes") || out.contains("more than maxModuleBytes"),
        "{out}"
    );
    let served = reg.blob_bytes_served(&sha256(&wasm));
    ensure!(
        served < bigger.len() as u64,
        "the registry served all {served} bytes of the oversized blob"
    );
    Ok(())
}

/// Whoever can push to a module's repository without its key can attach
/// junk beside the real signature: a referrer declaring a 2 MiB bundle,
/// sixteen bundles that are not bundles, and a 1.5 MiB manifest under the
/// `.sig` tag. None of it blocks the module: each is passed over with its
/// reason, the 2 MiB layer is never downloaded, the big manifest is read
/// only up to the limit, and the real signature still verifies. Under a
/// key that signed nothing, the refusal lists what was passed over, so an
/// operator sees the junk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_beside_a_real_signature_does_not_block_the_module() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["registry", "cosign"],
        "oci::junk_beside_a_real_signature_does_not_block_the_module",
    ) {
        return Ok(());
    }
    use registry::SIGSTORE_BUNDLE_MEDIA_TYPE as BUNDLE_MEDIA_TYPE;
    let Setup {
        ns,
        reg,
        work,
        auth,
    } = setup("oci-junk-signatures").await?;
    let cosign = Cosign::new(&reg)?;
    let release = cosign.generate_key_pair("release")?;
    let stranger = cosign.generate_key_pair("stranger")?;
    let repo = "guests/ready-role";
    let ready_role = std::fs::read(guests_dir().join("ready-role.wasm"))?;
    let digest = reg.push(repo, "v1", &ready_role).await?;
    let big = vec![b'x'; 2 << 20];
    let big_referrer = reg
        .push_referrer(repo, &digest, BUNDLE_MEDIA_TYPE, BUNDLE_MEDIA_TYPE, &big)
        .await?;
    for i in 0..16 {
        reg.push_referrer(
            repo,
            &digest,
            BUNDLE_MEDIA_TYPE,
            BUNDLE_MEDIA_TYPE,
            format!("junk {i}: not a sigstore bundle").as_bytes(),
        )
        .await?;
    }
    // And a `.sig` tag of 1.5 MiB: read under a limit, never whole.
    let padded = reg
        .push_padded_manifest(repo, &format!("sha256-{digest}.sig"), 3 << 19)
        .await?;
    ensure!(padded > 1 << 20, "{padded}");
    cosign.sign(&reg, repo, &digest, &release, Form::Bundle)?;
    let module = reg.module(repo, &digest);
    let config = |key: &Path| {
        role_config(
            &reg,
            &module,
            &auth,
            &format!("moduleSignatures: {{keys: [{}]}}\n", key.display()),
        )
    };

    // Under a key that signed nothing, every referrer is looked at.
    let out = run_refused(
        &ns,
        &config(&stranger.public),
        &work.path().join("c-stranger"),
    )
    .await?;
    ensure!(
        out.contains("passed over")
            && out.contains(&format!("referrer sha256:{big_referrer}"))
            && out.contains("not downloaded")
            && out.contains(&format!("sha256-{digest}.sig: fetching a signature"))
            && out.contains("over the 1048576 read at most")
            && out.contains("does not verify under any configured key"),
        "the refusal does not list the junk it passed over:\n{out}"
    );

    let ip = next_ips();
    let listener = HttpListener::start(ip.v4, 8080).await?;
    listener.set_body("{\"role\": \"primary\"}");
    let cache = work.path().join("cache");
    let mut pw = serving_a(&ns, &ip, &config(&release.public), &cache).await?;
    ensure!(
        pw.logs()
            .contains(&format!("{} (sigstore bundle", release.public.display())),
        "the log does not say which key verified the module:\n{}",
        pw.logs()
    );
    let served = reg.blob_bytes_served(&sha256(&big));
    ensure!(
        served == 0,
        "the 2 MiB junk layer was downloaded ({served} bytes)"
    );
    pw.check_running()?;
    Ok(())
}

/// Writes a Secret volume holding `config.json` into `dir` the way the
/// kubelet does (its AtomicWriter): the content in a fresh directory,
/// `..data` switched to it by one atomic rename, and `config.json` a symlink
/// through `..data`. A reader sees the old file or the new one, never a mix.
/// `write` fills the new directory's `config.json`. Returns the path a
/// config names (`DIR/config.json`).
fn write_secret_volume(
    dir: &Path,
    generation: u32,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::symlink;
    std::fs::create_dir_all(dir)?;
    let data = format!("..2026_12_03_00_00_{generation:02}.000000001");
    std::fs::create_dir(dir.join(&data))?;
    write(&dir.join(&data).join("config.json"))?;
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&data, &tmp)?;
    std::fs::rename(&tmp, dir.join("..data"))?;
    let file = dir.join("config.json");
    if std::fs::symlink_metadata(&file).is_err() {
        symlink("..data/config.json", &file)?;
    }
    Ok(file)
}

/// Port `http` decided by ready-role from `module` (role `primary`), with
/// `auth` as the credentials and `extra` config keys.
fn role_config(reg: &Registry, module: &str, auth: &Path, extra: &str) -> String {
    config_with(
        &format!(
            "{{perPort: {{ports: {{http: {{wasm: {{module: '{module}', \
             config: {{roles: [primary], path: /ready}}}}}}}}, fallback: podReady}}}}"
        ),
        &format!(
            "registryAuth: {}\nregistryCA: {}\n{extra}",
            auth.display(),
            reg.ca_file().display()
        ),
    )
}

/// Registry credentials rotate under a running portwise. The Docker config
/// is a Secret volume, updated the way the kubelet updates one (an atomic
/// `..data` swap). The registry's password changes: the running portwise
/// keeps serving what it pulled (it needs the registry only to pull), and a
/// pull with the old Secret is refused, naming the user. Then the Secret is
/// rotated in place, and the next pull of a new digest, by the same
/// container restarted on the same mount (no new Pod), succeeds: the file is
/// read at every pull, and nothing caches the credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_registry_credentials_reach_the_next_pull_without_a_new_pod() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["registry"],
        "oci::rotated_registry_credentials_reach_the_next_pull_without_a_new_pod",
    ) {
        return Ok(());
    }
    const ROTATED: &str = "rotated-s3cret-for-tests";
    let Setup {
        ns, mut reg, work, ..
    } = setup("oci-rotate").await?;
    let secret = work.path().join("registry-secret");
    let auth = write_secret_volume(&secret, 1, |p| {
        reg.write_auth(p, registry::USER, registry::PASSWORD)
    })?;
    let ready_role = std::fs::read(guests_dir().join("ready-role.wasm"))?;
    let v1 = reg.push("guests/ready-role", "v1", &ready_role).await?;
    let cache = work.path().join("cache");

    let ips: Vec<_> = (0..2).map(|_| next_ips()).collect();
    let listeners = [
        HttpListener::start(ips[0].v4, 8080).await?,
        HttpListener::start(ips[1].v4, 8080).await?,
    ];
    listeners[0].set_body("{\"role\": \"primary\"}");
    listeners[1].set_body("{\"role\": \"replica\"}");
    let mut pw = Scenario::new(&ns)
        .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .pods(
            ["a", "b"]
                .iter()
                .zip(&ips)
                .map(|(name, ip)| pod(name).annotation(GROUP_KEY, "g").ips(ip.v4())),
        )
        .config(&role_config(
            &reg,
            &reg.module("guests/ready-role", &v1),
            &auth,
            "",
        ))
        .with_portwise(|l| {
            l.binary()
                .args(&["--cache-dir", &cache.display().to_string()])
        })
        .start()
        .await?;
    wait_for(Duration::from_secs(90), || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["a"]))
    })
    .await?;

    // The registry's password rotates; a new digest is published under it.
    reg.rotate_password(ROTATED).await?;
    let v2 = push_variant(&reg, "guests/ready-role", "v2", &ready_role, "v2").await?;
    ensure!(v2 != v1);
    let v2_config = role_config(&reg, &reg.module("guests/ready-role", &v2), &auth, "");
    // The Secret still holds the old password: a pull is refused, by name.
    let out = run_refused(&ns, &v2_config, &work.path().join("c-old")).await?;
    ensure!(
        out.contains(registry::USER) && out.contains("refused") && out.contains(&v2),
        "the pull with the old Secret was not refused clearly:\n{out}"
    );
    // The running portwise needs no registry to go on deciding.
    listeners[1].set_body("{\"role\": \"primary\"}");
    wait_for(Duration::from_secs(60), || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["a", "b"]))
    })
    .await?;
    pw.check_running()?;

    // The Secret rotates in place; the same container, restarted on the
    // same mount with the new digest, pulls it.
    let rotated = write_secret_volume(&secret, 2, |p| reg.write_auth(p, registry::USER, ROTATED))?;
    ensure!(rotated == auth);
    listeners[0].set_body("{\"role\": \"replica\"}");
    pw.restart_with(&v2_config).await?;
    wait_for(Duration::from_secs(90), || async {
        expect_eq(members(&ns, "web", "http", V4).await?, names(&["b"]))
    })
    .await?;
    let logs = pw.current_logs();
    ensure!(
        logs.contains("pulled module serving") && logs.contains(&v2),
        "the restart did not pull the new digest:\n{logs}"
    );
    ensure!(
        reg.logs()
            .contains(&format!("/v2/guests/ready-role/manifests/sha256:{v2}")),
        "the registry never served the new digest's manifest"
    );
    pw.check_running()?;
    Ok(())
}

/// Issue 48: a team's MembershipPolicy with a guest pulled from the
/// registry by digest decides its Service (ModulesReady True); one from a
/// repository the operator did not allow is refused in `Accepted`, and one
/// whose digest the registry does not have fails `ModulesReady` with the
/// pull error, its Service held as it was. Fails when a policy object's
/// modules are not pulled after start (the first Service would be held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_objects_guest_is_pulled_from_the_registry_and_decides() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["registry"],
        "oci::a_policy_objects_guest_is_pulled_from_the_registry_and_decides",
    ) {
        return Ok(());
    }
    let Setup {
        ns,
        reg,
        work,
        auth,
    } = setup("oci-mpol").await?;
    let cp = ns.cp();
    install_crds(
        cp,
        Path::new("deploy/kustomize/membershippolicies.portwise.io.yaml"),
        "the MembershipPolicy CRD",
    )
    .await?;
    let wasm = std::fs::read(guests_dir().join("ready-role.wasm"))?;
    let digest = reg.push("team/ready-role", "v1", &wasm).await?;
    let outside = reg.push("other/ready-role", "v1", &wasm).await?;
    let ips: Vec<_> = (0..2).map(|_| next_ips()).collect();
    let (a, b) = (ips[0].v4, ips[1].v4);
    let http_a = HttpListener::start(a, 8080).await?;
    http_a.set_body(r#"{"role": "primary"}"#);
    let http_b = HttpListener::start(b, 8080).await?;
    http_b.set_body(r#"{"role": "replica"}"#);
    for svc in ["guarded", "outside", "missing"] {
        ns.create_service(
            service(svc)
                .annotation(GROUP_KEY, "g")
                .annotation(crate::policies::POLICY, svc)
                .port("http", 8080),
        )
        .await?;
    }
    for (name, ip) in [("a", &ips[0]), ("b", &ips[1])] {
        ns.create_pod(pod(name).annotation(GROUP_KEY, "g").ips(ip.v4()))
            .await?;
    }
    let policy = |module: String| {
        serde_json::json!({
            "apiVersion": "portwise.io/v1alpha1",
            "kind": "MembershipPolicy",
            "metadata": {"namespace": ns.name()},
            "spec": {"membership": {"wasm": {"module": module, "config": {"roles": ["primary"]}}}},
        })
    };
    let api: kube::Api<portwise_api::MembershipPolicy> = ns.api();
    for (name, module) in [
        ("guarded", reg.module("team/ready-role", &digest)),
        ("outside", reg.module("other/ready-role", &outside)),
        ("missing", reg.module("team/ready-role", &"0".repeat(64))),
    ] {
        let mut obj: portwise_api::MembershipPolicy = serde_json::from_value(policy(module))?;
        obj.metadata.name = Some(name.into());
        api.create(&Default::default(), &obj).await?;
    }
    let config = config_with(
        "podReady",
        &format!(
            "registryAuth: {}\nregistryCA: {}\n\
             membershipPolicies: {{checkers: [podReady, wasm], moduleRepositories: ['{}/team']}}\n",
            auth.display(),
            reg.ca_file().display(),
            reg.host()
        ),
    );
    let cache = work.path().join("cache");
    let mut pw = Portwise::builder(cp)
        .namespace(ns.name())
        .config(&config)
        .binary()
        .args(&["--cache-dir", &cache.display().to_string()])
        .start()
        .await?;
    // The guest: a plays `primary`, b does not.
    wait_for(Duration::from_secs(90), || async {
        expect_eq(members(&ns, "guarded", "http", V4).await?, names(&["a"]))
    })
    .await?;
    let condition = |p: &portwise_api::MembershipPolicy, t: &str| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == t).cloned())
    };
    wait_for(SETTLE, || async {
        let p = api.get("guarded").await?;
        let ready = condition(&p, "ModulesReady").context("no ModulesReady yet")?;
        ensure!(ready.status == "True", "{ready:?}");
        let p = api.get("outside").await?;
        let accepted = condition(&p, "Accepted").context("no Accepted yet")?;
        ensure!(
            accepted.status == "False"
                && accepted.reason == "NotAllowed"
                && accepted
                    .message
                    .starts_with("spec.membership.wasm.module: ")
                && accepted
                    .message
                    .contains("is not a repository the operator allows"),
            "{accepted:?}"
        );
        let p = api.get("missing").await?;
        let ready = condition(&p, "ModulesReady").context("no ModulesReady yet")?;
        ensure!(
            ready.status == "False" && ready.reason == "PullFailed",
            "{ready:?}"
        );
        Ok(())
    })
    .await?;
    // Held, not judged by `membership` (which would publish a and b).
    for held in ["outside", "missing"] {
        ensure!(
            endpoints_by_port(&ns, held).await?.is_empty(),
            "{held} published"
        );
        newest_event_message(&ns, held, "PolicyNotReady").await?;
    }
    pw.check_running()?;
    Ok(())
}
