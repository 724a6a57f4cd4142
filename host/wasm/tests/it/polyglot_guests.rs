//! The Python, JavaScript, C and Go example guests, run through the real host
//! runtime against real listeners on 127.0.0.1.
//!
//! The guests are built by `guests/build` (which runs `guests/build-polyglot`)
//! into `PORTWISE_GUESTS_DIR` (default `~/.cache/portwise/guests`); the test
//! command builds them before the suite. A missing guest fails the test with
//! that hint rather than skipping it: these tests are the proof that the
//! non-Rust toolchains produce components the host can run.
//!
//! Each guest is exercised for a real verdict of each kind it can give, for
//! `validate-config` refusing bad configuration, and for many calls on a
//! reused instance (a guest that leaks or corrupts its state between calls
//! would drift or hit the memory limit).

use crate::common::{guests_dir, subject_for};
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    sync::Arc,
};

use k8s_openapi::{
    api::core::v1::{Pod, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use portwise_checkers::Checker;
use portwise_core::membership::{Decision, Subject, Verdict};
use portwise_supply::{Supplier, default_cache_dir};
use portwise_wasm::{CompileSource, WasmChecker, WasmConfig, WasmError, WasmRuntime};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A runtime with exactly one module loaded from the guests directory.
async fn runtime_with(module: &str) -> WasmRuntime {
    let path = guests_dir().join(module);
    assert!(
        path.is_file(),
        "{} is missing: build the guests first (guests/build, or guests/build-polyglot)",
        path.display()
    );
    runtime_loading(&path).await
}

/// A runtime with exactly the module at `path` loaded.
async fn runtime_loading(path: &Path) -> WasmRuntime {
    let module = path.display();
    // The on-disk code cache keeps the 18 MB Python guest from being
    // recompiled on every run. Loads are serialised so that tests running in
    // parallel after a rebuild compile it once and then hit the cache,
    // instead of all compiling it at the same time.
    static LOADING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one_at_a_time = LOADING.lock().await;
    let rt = WasmRuntime::new(WasmConfig {
        supply: Arc::new(Supplier),
        oci: Default::default(),
        probes: Default::default(),
        modules_dir: None,
        expressions: None,
        cache_dir: Some(default_cache_dir()),
        watch: false,
        // These tests check answers, not timing: a loaded CI machine running
        // a debug build must not turn a slow call into a deadline abstain.
        limits: portwise_wasm::Limits {
            deadline: std::time::Duration::from_secs(2),
            ..Default::default()
        },
    })
    .await
    .expect("runtime starts");
    rt.load_file(path)
        .await
        .unwrap_or_else(|e| panic!("{module} loads: {e}"));
    rt
}

async fn checker(rt: &WasmRuntime, module: &str, config: Value) -> WasmChecker {
    rt.checker(module, &config, None)
        .await
        .unwrap_or_else(|e| panic!("{module} accepts {config}: {e}"))
}

/// validate-config must refuse `config`, with a message containing `needle`.
async fn assert_rejects(rt: &WasmRuntime, module: &str, config: Value, needle: &str) {
    match rt.checker(module, &config, None).await {
        Err(WasmError::ConfigRejected { rejection, .. }) => {
            let message = rejection.to_string();
            assert!(
                message.contains(needle),
                "{module} rejected {config} with {message:?}, expected {needle:?}"
            )
        }
        Err(e) => panic!("{module} with {config}: expected a config rejection, got {e}"),
        Ok(_) => panic!("{module} accepted bad config {config}"),
    }
}

fn kv(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn subject(
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
    port_name: &str,
    target: u16,
) -> Subject {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("web-0".into()),
            namespace: Some("default".into()),
            uid: Some("4f1d1c9e-0000-4000-8000-000000000001".into()),
            labels: kv(labels),
            annotations: kv(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec::default()),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(LOCALHOST.to_string()),
            ..Default::default()
        }),
    };
    subject_for(pod, None, port_name, target, LOCALHOST)
}

/// An HTTP/1.1 server on 127.0.0.1 answering every request for `path` with
/// `status`, and 404 otherwise. Lives as long as the test's runtime.
async fn http_listener(path: &'static str, status: u16) -> SocketAddr {
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf);
                let requested = head.split_whitespace().nth(1).unwrap_or("");
                let code = if requested == path { status } else { 404 };
                let body = format!("{{\"status\":{code}}}");
                let response = format!(
                    "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    addr
}

/// A TCP listener on 127.0.0.1 that accepts and drops connections.
async fn tcp_listener() -> SocketAddr {
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            drop(conn);
        }
    });
    addr
}

/// A port on 127.0.0.1 where nothing listens (bound, then released).
async fn closed_port() -> u16 {
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    listener.local_addr().unwrap().port()
}

#[track_caller]
fn assert_verdict(v: &Verdict, decision: Decision, reason_part: &str) {
    let reason = v.reason.as_deref().unwrap_or("");
    assert_eq!(v.decision, decision, "verdict {v:?}");
    assert!(
        reason.contains(reason_part),
        "reason {reason:?} lacks {reason_part:?}"
    );
}

// --- Python: tier label + GET /healthz --------------------------------------

const PY: &str = "python-tier-check.wasm";

#[tokio::test]
async fn python_tier_check_verdicts() {
    let rt = runtime_with(PY).await;
    let healthy = http_listener("/healthz", 200).await;
    let sick = http_listener("/healthz", 503).await;
    let closed = closed_port().await;
    let c = checker(
        &rt,
        PY,
        json!({"tiers": ["frontend", "api"], "timeoutMs": 1000}),
    )
    .await;

    let front = [("tier", "frontend")];
    let v = c.check(&subject(&front, &[], "http", healthy.port())).await;
    assert_verdict(&v, Decision::Include, "200");
    let v = c.check(&subject(&front, &[], "http", sick.port())).await;
    assert_verdict(&v, Decision::Exclude, "503");
    let v = c.check(&subject(&front, &[], "http", closed)).await;
    assert_verdict(&v, Decision::Exclude, "refused");
    let v = c
        .check(&subject(&[("tier", "batch")], &[], "http", healthy.port()))
        .await;
    assert_verdict(&v, Decision::Exclude, "'batch' is not served");
    let v = c.check(&subject(&[], &[], "http", healthy.port())).await;
    assert_verdict(&v, Decision::Exclude, "no label tier");

    // Another label key and probe path, through the config.
    let ready = http_listener("/ready", 204).await;
    let c = checker(
        &rt,
        PY,
        json!({"tiers": ["db"], "label": "role", "path": "/ready"}),
    )
    .await;
    let v = c
        .check(&subject(&[("role", "db")], &[], "pg", ready.port()))
        .await;
    assert_verdict(&v, Decision::Include, "204");
}

#[tokio::test]
async fn python_tier_check_rejects_bad_config() {
    let rt = runtime_with(PY).await;
    assert_rejects(&rt, PY, Value::Null, "must be an object").await;
    assert_rejects(&rt, PY, json!({"tiers": []}), "non-empty list").await;
    assert_rejects(
        &rt,
        PY,
        json!({"tiers": ["a", 3]}),
        "only non-empty strings",
    )
    .await;
    assert_rejects(&rt, PY, json!({"tier": ["a"]}), "unknown config keys: tier").await;
    assert_rejects(
        &rt,
        PY,
        json!({"tiers": ["a"], "path": "healthz"}),
        "absolute path",
    )
    .await;
    assert_rejects(
        &rt,
        PY,
        json!({"tiers": ["a"], "timeoutMs": true}),
        "must be an integer",
    )
    .await;
    assert_rejects(&rt, PY, json!({"tiers": ["a"], "timeoutMs": 0}), "1..60000").await;
}

// --- JavaScript: TCP dial + drain annotation -------------------------------

const JS: &str = "js-drain-check.wasm";

#[tokio::test]
async fn js_drain_check_verdicts() {
    let rt = runtime_with(JS).await;
    let open = tcp_listener().await;
    let closed = closed_port().await;
    let c = checker(&rt, JS, json!({"timeoutMs": 500})).await;

    let v = c.check(&subject(&[], &[], "http", open.port())).await;
    assert_verdict(&v, Decision::Include, "connected");
    let v = c.check(&subject(&[], &[], "http", closed)).await;
    assert_verdict(&v, Decision::Exclude, "refused");
    let drained = [("app.example.com/drain", "true")];
    let v = c.check(&subject(&[], &drained, "http", open.port())).await;
    assert_verdict(&v, Decision::Exclude, "drained");
    // "false" is an explicit "not drained".
    let v = c
        .check(&subject(
            &[],
            &[("app.example.com/drain", "false")],
            "http",
            open.port(),
        ))
        .await;
    assert_verdict(&v, Decision::Include, "connected");

    // `null` config means the defaults.
    let c = checker(&rt, JS, Value::Null).await;
    let v = c.check(&subject(&[], &drained, "http", open.port())).await;
    assert_verdict(&v, Decision::Exclude, "app.example.com/drain=true");
    let c = checker(&rt, JS, json!({"annotation": "example.com/out"})).await;
    let v = c.check(&subject(&[], &drained, "http", open.port())).await;
    assert_verdict(&v, Decision::Include, "connected");
}

/// The JavaScript guest (12 MB: the StarlingMonkey engine) gzips to about a
/// third, still over a ConfigMap's 1 MiB (docs/guests.md), and the `.wasm.gz`
/// judges exactly like the plain file.
#[tokio::test]
async fn js_drain_check_gzipped_judges_the_same() {
    use std::io::Write;
    let plain = runtime_with(JS).await;
    let wasm = std::fs::read(guests_dir().join(JS)).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&wasm).unwrap();
    let gz = gz.finish().unwrap();
    eprintln!(
        "{JS}: {} KB, gzip -9 {} KB",
        wasm.len() / 1024,
        gz.len() / 1024
    );
    assert!(gz.len() < wasm.len() / 2);
    let dir = std::env::temp_dir().join(format!("portwise-js-gz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{JS}.gz"));
    std::fs::write(&path, &gz).unwrap();
    let gzipped = runtime_loading(&path).await;
    std::fs::remove_dir_all(&dir).unwrap();
    // The code cache is keyed by the component: no second compile.
    assert_eq!(gzipped.modules()[0].compiled, CompileSource::Cached);

    let open = tcp_listener().await;
    let closed = closed_port().await;
    let drained = [("app.example.com/drain", "true")];
    let a = checker(&plain, JS, json!({"timeoutMs": 500})).await;
    let b = checker(&gzipped, &format!("{JS}.gz"), json!({"timeoutMs": 500})).await;
    for s in [
        subject(&[], &[], "http", open.port()),
        subject(&[], &[], "http", closed),
        subject(&[], &drained, "http", open.port()),
    ] {
        assert_eq!(a.check(&s).await, b.check(&s).await);
    }
}

#[tokio::test]
async fn js_drain_check_rejects_bad_config() {
    let rt = runtime_with(JS).await;
    assert_rejects(&rt, JS, json!([1]), "must be an object").await;
    assert_rejects(&rt, JS, json!("drain"), "must be an object").await;
    assert_rejects(
        &rt,
        JS,
        json!({"timeout": 5}),
        "unknown config keys: timeout",
    )
    .await;
    assert_rejects(&rt, JS, json!({"timeoutMs": 0}), "1..60000").await;
    assert_rejects(&rt, JS, json!({"timeoutMs": 2.5}), "1..60000").await;
    assert_rejects(&rt, JS, json!({"annotation": ""}), "non-empty string").await;
}

// --- C: port names listed in an annotation/label ---------------------------

const C: &str = "c-port-names.wasm";
const PORTS: &str = "app.example.com/ports";

#[tokio::test]
async fn c_port_names_verdicts() {
    let rt = runtime_with(C).await;
    let c = checker(&rt, C, json!({"annotation": PORTS})).await;
    let listed = [(PORTS, "metrics, http ,admin")];

    let v = c.check(&subject(&[], &listed, "http", 8080)).await;
    assert_verdict(&v, Decision::Include, "lists http");
    let v = c.check(&subject(&[], &listed, "grpc", 8080)).await;
    assert_verdict(&v, Decision::Exclude, "does not list grpc");
    let v = c.check(&subject(&[], &[], "http", 8080)).await;
    assert_verdict(&v, Decision::Exclude, "no annotation");
    // The same key as a label is not the annotation.
    let v = c
        .check(&subject(&[("ports", "http")], &[], "http", 8080))
        .await;
    assert_verdict(&v, Decision::Exclude, "no annotation");

    let c = checker(&rt, C, json!({"label": "ports"})).await;
    let v = c
        .check(&subject(&[("ports", "http")], &[], "http", 8080))
        .await;
    assert_verdict(&v, Decision::Include, "label ports lists http");

    // With a dial: the listed port must also accept connections.
    let open = tcp_listener().await;
    let closed = closed_port().await;
    let c = checker(&rt, C, json!({"annotation": PORTS, "dialTimeoutMs": 500})).await;
    let v = c.check(&subject(&[], &listed, "http", open.port())).await;
    assert_verdict(&v, Decision::Include, "accepts connections");
    let v = c.check(&subject(&[], &listed, "http", closed)).await;
    assert_verdict(&v, Decision::Exclude, "refused");
}

#[tokio::test]
async fn c_port_names_rejects_bad_config() {
    let rt = runtime_with(C).await;
    assert_rejects(&rt, C, Value::Null, "must be an object").await;
    assert_rejects(&rt, C, json!({}), "needs \"annotation\" or \"label\"").await;
    assert_rejects(
        &rt,
        C,
        json!({"annotation": "a", "label": "b"}),
        "exactly one",
    )
    .await;
    assert_rejects(
        &rt,
        C,
        json!({"annotation": PORTS, "dialTimeoutMs": 0}),
        "1..60000",
    )
    .await;
    assert_rejects(
        &rt,
        C,
        json!({"annotation": PORTS, "extra": true}),
        "unknown config key \"extra\"",
    )
    .await;
}

// --- Go: zone label + TCP dial / HTTP GET -----------------------------------

const GO: &str = "go-zone-check.wasm";
const ZONE: &str = "topology.kubernetes.io/zone";
const ZONES: &str = "app.example.com/zones";

/// `s` with its Service annotated.
fn with_service_annotations(mut s: Subject, annotations: &[(&str, &str)]) -> Subject {
    let mut service = (*s.service).clone();
    service.metadata.annotations = kv(annotations);
    s.service = Arc::new(service);
    s
}

/// A TCP listener on 127.0.0.1 that accepts connections and never answers:
/// an HTTP GET to it times out.
async fn silent_listener() -> SocketAddr {
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    addr
}

#[tokio::test]
async fn go_zone_check_verdicts() {
    let rt = runtime_with(GO).await;
    let open = tcp_listener().await;
    let closed = closed_port().await;
    let eu1a = [(ZONE, "eu-1a")];

    // TCP dial (the default probe) once the zone matches.
    let c = checker(
        &rt,
        GO,
        json!({"zones": ["eu-1a", "eu-1b"], "timeoutMs": 500}),
    )
    .await;
    let v = c.check(&subject(&eu1a, &[], "http", open.port())).await;
    assert_verdict(
        &v,
        Decision::Include,
        &format!("zone eu-1a, port {} accepts TCP", open.port()),
    );
    let v = c.check(&subject(&eu1a, &[], "http", closed)).await;
    assert_verdict(&v, Decision::Exclude, "TCP dial: connection refused");
    let v = c
        .check(&subject(&[(ZONE, "us-2")], &[], "http", open.port()))
        .await;
    assert_verdict(
        &v,
        Decision::Exclude,
        "zone us-2 not in [eu-1a eu-1b] (config)",
    );
    // The zone is a label: the same key as an annotation does not count.
    let v = c.check(&subject(&[], &eu1a, "http", open.port())).await;
    assert_verdict(
        &v,
        Decision::Exclude,
        "pod has no label topology.kubernetes.io/zone",
    );

    // The Service's annotation, when present, replaces the configured zones.
    let c = checker(
        &rt,
        GO,
        json!({"zones": ["eu-1a"], "serviceAnnotation": ZONES, "probe": "none", "zoneLabel": "zone"}),
    )
    .await;
    let us2 = [("zone", "us-2")];
    let annotated = |labels: &[(&str, &str)]| {
        with_service_annotations(
            subject(labels, &[], "http", closed),
            &[(ZONES, " us-1, us-2 ")],
        )
    };
    let v = c.check(&annotated(&us2)).await;
    assert_verdict(&v, Decision::Include, "zone us-2");
    let v = c.check(&annotated(&[("zone", "eu-1a")])).await;
    assert_verdict(
        &v,
        Decision::Exclude,
        "zone eu-1a not in [us-1 us-2] (Service annotation app.example.com/zones)",
    );
    let v = c.check(&subject(&us2, &[], "http", closed)).await;
    assert_verdict(&v, Decision::Exclude, "zone us-2 not in [eu-1a] (config)");
    let v = c
        .check(&subject(&[("zone", "eu-1a")], &[], "http", closed))
        .await;
    assert_verdict(&v, Decision::Include, "zone eu-1a");

    // HTTP GET: 2xx includes, another status excludes, a timeout abstains.
    let healthy = http_listener("/healthz", 200).await;
    let sick = http_listener("/healthz", 503).await;
    let silent = silent_listener().await;
    let c = checker(
        &rt,
        GO,
        json!({"zones": ["eu-1a"], "probe": "http", "timeoutMs": 300}),
    )
    .await;
    let v = c.check(&subject(&eu1a, &[], "http", healthy.port())).await;
    assert_verdict(
        &v,
        Decision::Include,
        &format!("GET /healthz on port {}: 200", healthy.port()),
    );
    let v = c.check(&subject(&eu1a, &[], "http", sick.port())).await;
    assert_verdict(&v, Decision::Exclude, "503");
    let v = c.check(&subject(&eu1a, &[], "http", silent.port())).await;
    assert_verdict(&v, Decision::Abstain, "GET /healthz: timeout");
    let v = c.check(&subject(&eu1a, &[], "http", closed)).await;
    assert_verdict(&v, Decision::Exclude, "refused");
    let ready = http_listener("/ready", 204).await;
    let c = checker(
        &rt,
        GO,
        json!({"zones": ["eu-1a"], "probe": "http", "path": "/ready"}),
    )
    .await;
    let v = c.check(&subject(&eu1a, &[], "http", ready.port())).await;
    assert_verdict(&v, Decision::Include, "GET /ready");
}

#[tokio::test]
async fn go_zone_check_rejects_bad_config() {
    let rt = runtime_with(GO).await;
    assert_rejects(&rt, GO, Value::Null, "config is required").await;
    assert_rejects(&rt, GO, json!([1]), "must be a JSON object").await;
    assert_rejects(&rt, GO, json!({"zones": []}), "at least one zone").await;
    assert_rejects(
        &rt,
        GO,
        json!({"zones": ["a"], "zone": "a"}),
        "unknown config key \"zone\" (known: zoneLabel,",
    )
    .await;
    assert_rejects(
        &rt,
        GO,
        json!({"zones": ["a"], "probe": "udp"}),
        "probe \"udp\"",
    )
    .await;
    assert_rejects(
        &rt,
        GO,
        json!({"zones": ["a"], "timeoutMs": 0}),
        "timeoutMs 0: want 1..10000",
    )
    .await;
    assert_rejects(
        &rt,
        GO,
        json!({"zones": ["a"], "path": "/x"}),
        "path is only for probe \"http\"",
    )
    .await;
    assert_rejects(&rt, GO, json!({"zones": "a"}), "cannot unmarshal").await;
}

// --- every guest: many calls on reused instances ----------------------------

/// Thousands of checks with a large pod (30 labels, 30 annotations) on the
/// same instances: the verdicts must not drift and no call may fail (a leak
/// in a guest would end in the memory limit, i.e. a trap and an abstain).
#[tokio::test]
async fn guests_stay_correct_over_many_calls() {
    let open = tcp_listener().await;
    let healthy = http_listener("/healthz", 200).await;
    let mut labels: Vec<(String, String)> = (0..30)
        .map(|i| (format!("l{i}.example.com/k"), "v".repeat(40)))
        .collect();
    labels.push(("tier".into(), "frontend".into()));
    labels.push((ZONE.into(), "eu-1a".into()));
    let annotations: Vec<(String, String)> = (0..30)
        .map(|i| (format!("a{i}.example.com/k"), "w".repeat(200)))
        .chain([(PORTS.into(), "http".into())])
        .collect();
    let l: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let a: Vec<(&str, &str)> = annotations
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();

    for (module, config, port, calls) in [
        (C, json!({"annotation": PORTS}), 8080, 5000),
        (JS, json!({"timeoutMs": 500}), open.port(), 1000),
        (PY, json!({"tiers": ["frontend"]}), healthy.port(), 300),
        (GO, json!({"zones": ["eu-1a"]}), open.port(), 3000),
    ] {
        let rt = runtime_with(module).await;
        let c = checker(&rt, module, config).await;
        let s = subject(&l, &a, "http", port);
        for i in 0..calls {
            let v = c.check(&s).await;
            assert_eq!(v.decision, Decision::Include, "{module} call {i}: {v:?}");
        }
        let failed: u64 = rt
            .failures()
            .iter()
            .filter(|f| f.module == module)
            .map(|f| f.count)
            .sum();
        assert_eq!(failed, 0, "{module}: {:?}", rt.failures());
    }
}

/// Issue 45: the compile bounds (`Limits::max_component_bytes`,
/// `max_functions`, `max_function_bytes`) must leave room for every real
/// guest: each figure of each built guest is at most half its default.
/// Prints the figures (`--nocapture`): docs/configuration.md quotes them.
#[test]
fn every_guest_is_well_within_the_compile_bounds() {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "wasm") {
                out.push(path);
            }
        }
    }
    let mut guests = Vec::new();
    walk(&guests_dir(), &mut guests);
    guests.sort();
    for name in ["python-tier-check.wasm", "js-drain-check.wasm"] {
        assert!(
            guests.iter().any(|g| g.ends_with(name)),
            "{name} is missing: build the guests first (guests/build)"
        );
    }
    let limits = portwise_wasm::Limits::default();
    for path in guests {
        let bytes = std::fs::read(&path).unwrap();
        let name = path
            .strip_prefix(guests_dir())
            .unwrap()
            .display()
            .to_string();
        let f = portwise_wasm::measure_component(&name, &bytes, None).unwrap();
        println!(
            "{name}: {} bytes, {} core modules, {} functions, largest body {} bytes",
            f.bytes, f.modules, f.functions, f.largest_function
        );
        assert!(f.bytes <= limits.max_component_bytes / 2, "{name}: {f:?}");
        assert!(f.functions <= limits.max_functions / 2, "{name}: {f:?}");
        assert!(
            f.largest_function <= limits.max_function_bytes / 2,
            "{name}: {f:?}"
        );
    }
}
