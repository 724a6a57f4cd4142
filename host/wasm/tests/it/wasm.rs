//! The WebAssembly runtime with the real Rust guests: verdicts against real
//! listeners on 127.0.0.1, containment of every hostile guest, the
//! compiled-code cache, hot swaps in the kubelet's ConfigMap layout, sha256
//! pins, and gzip-compressed (`.wasm.gz`) modules.
//!
//! Guests come from `guests/build` (default output
//! `~/.cache/portwise/guests`, or `PORTWISE_GUESTS_DIR`). A missing guest
//! fails the test with that hint: skipping would hide a broken toolchain.

use crate::common::{guests_dir, kv, subject_for};
use std::{
    fs,
    net::{IpAddr, SocketAddr},
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{Pod, PodCondition, PodIP, PodSpec, PodStatus},
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use portwise_checkers::Checker;
use portwise_core::{
    config::{WasmLimits, WasmSpec},
    membership::{Decision, Subject, Verdict},
};
use portwise_supply::Supplier;
use portwise_wasm::{
    CompileSource, FailureKind, Limits, ModuleEvent, WasmConfig, WasmError, WasmRuntime,
};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
    sync::broadcast,
};

// ---------------------------------------------------------------------------
// Fixtures

/// A built guest: `ready-role.wasm` or `hostile/loop.wasm`.
fn guest(name: &str) -> PathBuf {
    let path = guests_dir().join(name);
    assert!(
        path.is_file(),
        "guest {} is missing: run guests/build first (or set PORTWISE_GUESTS_DIR)",
        path.display()
    );
    path
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "portwise-wasm-test-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn test_limits() -> Limits {
    // Fewer pool slots than production: many runtimes live in one test
    // process, and each reserves address space for its slots.
    Limits {
        max_instances: 16,
        // Answers are under test here, not timing (the deadline tests set
        // their own): a loaded machine running a debug build must not turn
        // a slow call into a deadline abstain.
        deadline: Duration::from_secs(2),
        ..Limits::default()
    }
}

/// A runtime without a directory; modules come from `load_file`. Each test
/// gets its own cache so "compiled" vs "cached" is deterministic.
struct Harness {
    rt: WasmRuntime,
    _cache: TempDir,
}

impl Harness {
    fn new(limits: Limits) -> Self {
        let cache = TempDir::new("cache");
        let rt = WasmRuntime::new(WasmConfig {
            supply: Arc::new(Supplier),
            oci: Default::default(),
            probes: Default::default(),
            modules_dir: None,
            cache_dir: Some(cache.path().to_path_buf()),
            watch: false,
            limits,
        })
        .expect("runtime");
        Harness { rt, _cache: cache }
    }

    async fn checker(&self, module: &str, config: Value) -> Arc<dyn Checker> {
        let path = guest(module);
        self.rt
            .load_file(&path)
            .await
            .unwrap_or_else(|e| panic!("{module}: {e}"));
        let name = path.file_name().unwrap().to_str().unwrap();
        Arc::new(
            self.rt
                .checker_async(name, &config, None)
                .await
                .unwrap_or_else(|e| panic!("{module}: {e}")),
        )
    }

    fn failures(&self, module: &str, kind: FailureKind) -> u64 {
        self.rt
            .failures()
            .iter()
            .find(|f| f.module == module && f.kind == kind)
            .map_or(0, |f| f.count)
    }
}

/// A realistic pod (30 labels, 30 annotations) at `address`, plus `extra`
/// labels.
fn subject(address: IpAddr, target: u16, extra: &[(&str, &str)]) -> Subject {
    let mut labels = kv("label", 30);
    labels.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("web-0".into()),
            namespace: Some("shop".into()),
            uid: Some("pod-uid".into()),
            labels: Some(labels),
            annotations: Some(kv("annotation", 30)),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-a".into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            pod_ips: Some(vec![PodIP {
                ip: address.to_string(),
            }]),
            ..Default::default()
        }),
    };
    subject_for(pod, None, "http", target, address)
}

const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// A tiny HTTP server with canned answers per path.
async fn http_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match sock.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, body) = match path.as_str() {
                    "/ready" => ("200 OK", r#"{"role":"primary","uptime":12}"#),
                    "/replica" => ("200 OK", r#"{"role":"replica"}"#),
                    "/norole" => ("200 OK", r#"{"ok":true}"#),
                    "/notjson" => ("200 OK", "hello"),
                    "/fail" => ("503 Service Unavailable", r#"{"role":"primary"}"#),
                    "/slow" => {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        ("200 OK", "{}")
                    }
                    _ => ("404 Not Found", ""),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(response.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    addr
}

/// A port on 127.0.0.1 with (very likely) nothing listening.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn assert_verdict(v: &Verdict, decision: Decision, reason_part: &str) {
    assert_eq!(v.decision, decision, "{v:?}");
    let reason = v.reason.as_deref().unwrap_or("");
    assert!(
        reason.contains(reason_part),
        "reason {reason:?} lacks {reason_part:?}"
    );
}

// ---------------------------------------------------------------------------
// Well-behaved guests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_role_judges_by_the_role_in_the_ready_answer() {
    let h = Harness::new(test_limits());
    let server = http_server().await;
    let s = subject(LOCAL, server.port(), &[]);

    let cases: &[(Value, Decision, &str)] = &[
        (
            json!({"roles": ["primary"]}),
            Decision::Include,
            "role primary",
        ),
        (
            json!({"roles": ["replica", "primary"], "path": "/replica"}),
            Decision::Include,
            "role replica",
        ),
        (
            json!({"roles": ["primary"], "path": "/replica"}),
            Decision::Exclude,
            "role replica is not one of",
        ),
        (
            json!({"roles": ["primary"], "path": "/fail"}),
            Decision::Exclude,
            "answered 503",
        ),
        (
            json!({"roles": ["primary"], "path": "/norole"}),
            Decision::Exclude,
            "no role",
        ),
        (
            json!({"roles": ["primary"], "path": "/notjson"}),
            Decision::Exclude,
            "not the expected JSON",
        ),
        (
            json!({"roles": ["primary"], "path": "/slow", "timeoutMs": 200}),
            Decision::Abstain,
            "timed out",
        ),
    ];
    for (config, decision, reason) in cases {
        let checker = h.checker("ready-role.wasm", config.clone()).await;
        assert_verdict(&checker.check(&s).await, *decision, reason);
    }

    let checker = h
        .checker("ready-role.wasm", json!({"roles": ["primary"]}))
        .await;
    let nothing = subject(LOCAL, closed_port(), &[]);
    assert_verdict(
        &checker.check(&nothing).await,
        Decision::Exclude,
        "connection refused",
    );
    for kind in FailureKind::ALL {
        assert_eq!(h.failures("ready-role.wasm", kind), 0, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_probe_does_not_count_against_the_compute_deadline() {
    // The probe takes 600 ms, six times the compute deadline; the guest still
    // answers (abstain from its own probe timeout), it is not interrupted.
    let h = Harness::new(Limits {
        deadline: Duration::from_millis(100),
        ..test_limits()
    });
    let server = http_server().await;
    let checker = h
        .checker(
            "ready-role.wasm",
            json!({"roles": ["primary"], "path": "/slow", "timeoutMs": 600}),
        )
        .await;
    let started = Instant::now();
    let v = checker.check(&subject(LOCAL, server.port(), &[])).await;
    assert_verdict(&v, Decision::Abstain, "GET /slow timed out");
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(h.failures("ready-role.wasm", FailureKind::Deadline), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_timeouts_are_capped_by_the_host() {
    let h = Harness::new(Limits {
        probe_timeout_cap: Duration::from_millis(300),
        ..test_limits()
    });
    let server = http_server().await;
    let checker = h
        .checker(
            "ready-role.wasm",
            json!({"roles": ["primary"], "path": "/slow", "timeoutMs": 60000}),
        )
        .await;
    let started = Instant::now();
    assert_verdict(
        &checker.check(&subject(LOCAL, server.port(), &[])).await,
        Decision::Abstain,
        "timed out",
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_role_rejects_a_configuration_without_roles() {
    let h = Harness::new(test_limits());
    h.rt.load_file(&guest("ready-role.wasm")).await.unwrap();
    for (config, part) in [
        (json!({}), "roles"),
        (Value::Null, "invalid config"),
        (json!({"roles": []}), "at least one role"),
        (
            json!({"roles": ["a"], "path": "ready"}),
            "must start with '/'",
        ),
        (json!({"roles": ["a"], "colour": "blue"}), "unknown field"),
    ] {
        match h.rt.checker_async("ready-role.wasm", &config, None).await {
            Err(WasmError::ConfigRejected { module, message }) => {
                assert_eq!(module, "ready-role.wasm");
                assert!(message.contains(part), "{config}: {message}");
            }
            other => panic!("{config}: expected a rejection, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_check_trusts_the_mark_then_dials() {
    let h = Harness::new(test_limits());
    let checker = h
        .checker(
            "admin-check.wasm",
            json!({"key": "example.com/admin", "timeoutMs": 500}),
        )
        .await;
    let closed = closed_port();

    let marked = subject(LOCAL, closed, &[("example.com/admin", "true")]);
    assert_verdict(
        &checker.check(&marked).await,
        Decision::Include,
        "marked example.com/admin=true",
    );

    let unmarked = subject(LOCAL, closed, &[("example.com/admin", "false")]);
    assert_verdict(
        &checker.check(&unmarked).await,
        Decision::Exclude,
        "connection refused",
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = subject(LOCAL, listener.local_addr().unwrap().port(), &[]);
    assert_verdict(
        &checker.check(&open).await,
        Decision::Include,
        "accepts connections",
    );

    // `null` means defaults; unknown keys are typos.
    h.rt.checker_async("admin-check.wasm", &Value::Null, None)
        .await
        .unwrap();
    match h
        .rt
        .checker_async("admin-check.wasm", &json!({"minReplicas": 2}), None)
        .await
    {
        Err(WasmError::ConfigRejected { message, .. }) => {
            assert!(message.contains("unknown field"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_checks_share_a_small_pool() {
    let h = Harness::new(Limits {
        idle_instances: 2,
        ..test_limits()
    });
    let checker = h.checker("admin-check.wasm", Value::Null).await;
    let s = Arc::new(subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    ));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (c, s) = (checker.clone(), s.clone());
            tokio::spawn(async move { c.check(&s).await })
        })
        .collect();
    for t in tasks {
        assert_verdict(&t.await.unwrap(), Decision::Include, "marked");
    }
    let calls =
        h.rt.calls()
            .into_iter()
            .find(|(m, _)| m == "admin-check.wasm")
            .unwrap()
            .1;
    assert_eq!(calls, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_wait_for_an_instance_slot_instead_of_failing() {
    // Two slots, eight calls that each hold an instance for 200 ms while
    // their probe times out: they queue, none fails to instantiate.
    let h = Harness::new(Limits {
        max_instances: 2,
        ..test_limits()
    });
    let server = http_server().await;
    let checker = h
        .checker(
            "ready-role.wasm",
            json!({"roles": ["primary"], "path": "/slow", "timeoutMs": 200}),
        )
        .await;
    let s = Arc::new(subject(LOCAL, server.port(), &[]));
    let started = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (c, s) = (checker.clone(), s.clone());
            tokio::spawn(async move { c.check(&s).await })
        })
        .collect();
    for t in tasks {
        assert_verdict(&t.await.unwrap(), Decision::Abstain, "GET /slow timed out");
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800),
        "8 calls through 2 slots took only {took:?}"
    );
    for kind in FailureKind::ALL {
        assert_eq!(h.failures("ready-role.wasm", kind), 0, "{kind}");
    }
    // Another module still gets a slot afterwards (idle ones are evicted).
    still_serving(&h).await;
}

// ---------------------------------------------------------------------------
// Hostile guests: each contained, with the host still answering afterwards

/// After a hostile guest, a well-behaved one on the same runtime still works.
async fn still_serving(h: &Harness) {
    let checker = h.checker("admin-check.wasm", Value::Null).await;
    let s = subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    );
    let started = Instant::now();
    assert_verdict(&checker.check(&s).await, Decision::Include, "marked");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_loop_hits_the_deadline() {
    let h = Harness::new(Limits {
        deadline: Duration::from_millis(100),
        ..test_limits()
    });
    let looping = h.checker("hostile/loop.wasm", Value::Null).await;
    let s = subject(LOCAL, 80, &[]);

    // While the loop spins, other checks keep being answered: the guest
    // yields to the async runtime between epoch ticks.
    let spinning = {
        let (c, s) = (looping.clone(), s.clone());
        tokio::spawn(async move { (Instant::now(), c.check(&s).await) })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    still_serving(&h).await;

    let (started, v) = spinning.await.unwrap();
    let took = started.elapsed();
    assert_verdict(&v, Decision::Abstain, "deadline");
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(1),
        "{took:?}"
    );
    assert_eq!(h.failures("loop.wasm", FailureKind::Deadline), 1);

    // The interrupted instance is gone; the next call gets a fresh one (and
    // is interrupted again).
    assert_verdict(&looping.check(&s).await, Decision::Abstain, "deadline");
    assert_eq!(h.failures("loop.wasm", FailureKind::Deadline), 2);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_allocation_hits_the_memory_limit() {
    let h = Harness::new(Limits {
        memory_bytes: 64 << 20,
        ..test_limits()
    });
    let hog = h.checker("hostile/alloc.wasm", Value::Null).await;
    let v = hog.check(&subject(LOCAL, 80, &[])).await;
    assert_verdict(&v, Decision::Abstain, "memory limit");
    assert_verdict(&v, Decision::Abstain, "limit 65536 KiB");
    assert_eq!(h.failures("alloc.wasm", FailureKind::Memory), 1);

    // Below the limit the same guest is fine.
    let modest =
        h.rt.checker_async("alloc.wasm", &json!({"bytes": 1 << 20}), None)
            .await
            .unwrap();
    assert_verdict(
        &modest.check(&subject(LOCAL, 80, &[])).await,
        Decision::Include,
        "allocated 1048576 bytes",
    );
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_abstains_quotes_stderr_and_the_next_call_gets_a_fresh_instance() {
    let h = Harness::new(test_limits());
    let boom = h.checker("hostile/trap.wasm", Value::Null).await;
    let s = subject(LOCAL, 80, &[]);
    let v = boom.check(&s).await;
    assert_verdict(&v, Decision::Abstain, "trap");
    // The panic message reached stderr, which the host captured.
    assert_verdict(&v, Decision::Abstain, "hostile-trap: deliberate panic");
    let v = boom.check(&s).await;
    assert_verdict(
        &v,
        Decision::Abstain,
        "trap: wasm `unreachable` instruction executed",
    );
    assert_eq!(h.failures("trap.wasm", FailureKind::Trap), 2);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_reason_is_truncated_and_the_decision_kept() {
    let h = Harness::new(test_limits());
    let chatty = h.checker("hostile/huge-reason.wasm", Value::Null).await;
    let v = chatty.check(&subject(LOCAL, 80, &[])).await;
    assert_eq!(v.decision, Decision::Include);
    let reason = v.reason.unwrap();
    assert!(reason.starts_with(&"x".repeat(1024)), "{}", &reason[..64]);
    assert!(reason.len() < 1100, "{}", reason.len());
    assert!(
        reason.ends_with(&format!("({} bytes truncated)", (8 << 20) - 1024)),
        "{}",
        &reason[1000..]
    );
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_of_other_addresses_are_denied() {
    let h = Harness::new(test_limits());
    h.rt.load_file(&guest("hostile/probe-other.wasm"))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let s = subject(LOCAL, port, &[]);

    let mut denied = 0;
    for host in [
        "10.244.0.99",
        "169.254.169.254",
        "metadata.google.internal",
        "localhost",
        "::1",
        "127.0.0.2",
    ] {
        for kind in ["http", "tcp"] {
            let c =
                h.rt.checker_async(
                    "probe-other.wasm",
                    &json!({"host": host, "kind": kind}),
                    None,
                )
                .await
                .unwrap();
            let v = c.check(&s).await;
            assert_verdict(&v, Decision::Exclude, "denied: ");
            denied += 1;
        }
    }
    assert_eq!(
        h.failures("probe-other.wasm", FailureKind::DeniedProbe),
        denied
    );

    // Malformed paths are denied before anything is sent.
    for path in ["no-slash", "/a\r\nHost: evil", "//evil/x"] {
        let c =
            h.rt.checker_async("probe-other.wasm", &json!({"host": "", "path": path}), None)
                .await
                .unwrap();
        assert_verdict(&c.check(&s).await, Decision::Exclude, "denied: ");
    }

    // The address under judgement itself, spelled out, is allowed.
    let c =
        h.rt.checker_async(
            "probe-other.wasm",
            &json!({"host": "127.0.0.1", "kind": "tcp"}),
            None,
        )
        .await
        .unwrap();
    assert_verdict(&c.check(&s).await, Decision::Include, "reached 127.0.0.1");
    // A checker is not a proxy: no failure is recorded as a trap or load.
    assert_eq!(h.failures("probe-other.wasm", FailureKind::Trap), 0);
}

/// A `hostNetwork` pod's address is its Node's: a guest may probe there
/// only the ports the Service resolves for the pod, not the kubelet or
/// whatever else listens on the Node. The same probe of a pod with an
/// address of its own is allowed, so the rule is what denies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_network_pod_is_probed_only_on_its_service_ports() {
    let h = Harness::new(test_limits());
    h.rt.load_file(&guest("hostile/probe-other.wasm"))
        .await
        .unwrap();
    let served = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node_port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (served, other) = (
        served.local_addr().unwrap().port(),
        node_port.local_addr().unwrap().port(),
    );
    let mut s = subject(LOCAL, served, &[]);
    Arc::make_mut(&mut s.service)
        .spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()[0]
        .target_port = Some(IntOrString::Int(i32::from(served)));
    let probe = |port: u16| {
        let h = &h;
        async move {
            h.rt.checker_async(
                "probe-other.wasm",
                &json!({"host": "", "kind": "tcp", "port": port}),
                None,
            )
            .await
            .unwrap()
        }
    };
    // An address of its own: any port of it.
    assert_verdict(
        &probe(other).await.check(&s).await,
        Decision::Include,
        "reached",
    );
    Arc::make_mut(&mut s.pod)
        .spec
        .as_mut()
        .unwrap()
        .host_network = Some(true);
    let v = probe(other).await.check(&s).await;
    assert_verdict(&v, Decision::Exclude, "denied: ");
    assert!(
        v.reason
            .as_deref()
            .unwrap_or_default()
            .contains("hostNetwork"),
        "{v:?}"
    );
    assert_verdict(
        &probe(served).await.check(&s).await,
        Decision::Include,
        "reached",
    );
    drop(node_port);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_answer_abstains() {
    let h = Harness::new(test_limits());
    let garbage = h.checker("hostile/garbage.wasm", Value::Null).await;
    let v = garbage.check(&subject(LOCAL, 80, &[])).await;
    assert_verdict(&v, Decision::Abstain, "invalid_answer");
    assert_eq!(h.failures("garbage.wasm", FailureKind::InvalidAnswer), 1);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_for_another_world_is_refused() {
    let h = Harness::new(test_limits());
    let e =
        h.rt.load_file(&guest("hostile/wrong-world.wasm"))
            .await
            .unwrap_err();
    let message = e.to_string();
    assert!(
        message.contains("not a portwise membership checker"),
        "{message}"
    );
    // Both versions the host serves are named, so the author knows what
    // to build against.
    assert!(
        message.contains("portwise:membership/checker@0.2.0")
            && message.contains("portwise:membership/checker@0.1.0"),
        "{message}"
    );
    match h
        .rt
        .checker_async("wrong-world.wasm", &Value::Null, None)
        .await
    {
        Err(WasmError::NotLoaded { why, .. }) => {
            assert!(why.contains("not a portwise membership checker"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.failures("wrong-world.wasm", FailureKind::Load), 1);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_that_are_not_components_are_refused_with_a_clear_error() {
    let h = Harness::new(test_limits());
    let dir = TempDir::new("notwasm");
    for (name, bytes, part) in [
        (
            "text.wasm",
            b"#!/bin/sh\necho hi\n".to_vec(),
            "not a WebAssembly file",
        ),
        ("empty.wasm", Vec::new(), "not a WebAssembly file"),
        (
            "core.wasm",
            b"\0asm\x01\0\0\0".to_vec(),
            "core WebAssembly module, not a component",
        ),
        (
            "broken.wasm",
            b"\0asm\x0d\0\x01\0\xff\xff\xff".to_vec(),
            "not a valid component",
        ),
    ] {
        let path = dir.path().join(name);
        fs::write(&path, bytes).unwrap();
        let message = h.rt.load_file(&path).await.unwrap_err().to_string();
        assert!(message.contains(part), "{name}: {message}");
        assert!(message.starts_with(&format!("module {name}")), "{message}");
    }
    still_serving(&h).await;
}

// ---------------------------------------------------------------------------
// Compiled-code cache

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_code_is_cached_on_disk_and_corrupt_entries_are_rebuilt() {
    let cache = TempDir::new("codecache");
    let runtime = || {
        WasmRuntime::new(WasmConfig {
            supply: Arc::new(Supplier),
            oci: Default::default(),
            probes: Default::default(),
            modules_dir: None,
            cache_dir: Some(cache.path().to_path_buf()),
            watch: false,
            limits: test_limits(),
        })
        .unwrap()
    };
    let path = guest("ready-role.wasm");

    let first = runtime().load_file(&path).await.unwrap();
    assert_eq!(first.compiled, CompileSource::Compiled);
    let second_rt = runtime();
    let second = second_rt.load_file(&path).await.unwrap();
    assert_eq!(second.compiled, CompileSource::Cached);
    assert_eq!(first.sha256, second.sha256);
    eprintln!(
        "ready-role.wasm ({} KB): compile {:.2} ms, cached load {:.3} ms",
        first.size / 1024,
        first.load_time.as_secs_f64() * 1e3,
        second.load_time.as_secs_f64() * 1e3
    );
    assert!(
        second.load_time < first.load_time,
        "{second:?} vs {first:?}"
    );
    // The cached module works.
    let server = http_server().await;
    let c = second_rt
        .checker_async("ready-role.wasm", &json!({"roles": ["primary"]}), None)
        .await
        .unwrap();
    assert_verdict(
        &c.check(&subject(LOCAL, server.port(), &[])).await,
        Decision::Include,
        "role primary",
    );

    // Overwrite the entry with garbage: the next load discards and rebuilds
    // it.
    drop((c, second_rt));
    let entry = cache_entry(cache.path(), "");
    fs::write(&entry, b"this is not compiled code").unwrap();
    let third = runtime().load_file(&path).await.unwrap();
    assert_eq!(third.compiled, CompileSource::Compiled);
    let fourth = runtime().load_file(&path).await.unwrap();
    assert_eq!(fourth.compiled, CompileSource::Cached);
}

/// The one compiled-code cache entry in `dir` whose name starts with
/// `prefix` (a module's sha256, or "" when there is only one).
fn cache_entry(dir: &Path, prefix: &str) -> PathBuf {
    let entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".cwasm") && name.starts_with(prefix)
        })
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries[0].clone()
}

/// A fresh runtime on `cache` loads `module` and judges a pod with it. The
/// verdict must be `expected`; returns how the code was obtained, the
/// cache's counters and the load's message.
async fn load_and_judge(
    cache: &Path,
    module: &str,
    config: Value,
    s: &Subject,
    expected: (Decision, &str),
) -> (CompileSource, portwise_supply::CodeCacheStats, String) {
    let rt = WasmRuntime::new(WasmConfig {
        supply: Arc::new(Supplier),
        oci: Default::default(),
        probes: Default::default(),
        modules_dir: None,
        cache_dir: Some(cache.to_path_buf()),
        watch: false,
        limits: test_limits(),
    })
    .unwrap();
    let mut events = rt.subscribe();
    let info = rt.load_file(&guest(module)).await.unwrap();
    let message = events.try_recv().map(|e| e.message).unwrap_or_default();
    let c = rt.checker_async(module, &config, None).await.unwrap();
    assert_verdict(&c.check(s).await, expected.0, expected.1);
    (info.compiled, rt.code_cache_stats().unwrap(), message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_entries_that_fail_verification_never_run_and_are_recompiled() {
    use portwise_supply::CodeCacheStats;
    let cache = TempDir::new("sealed");
    let server = http_server().await;
    let s = subject(LOCAL, server.port(), &[]);
    let roles = || json!({"roles": ["primary"]});
    let include = (Decision::Include, "role primary");
    let stats = |hits, misses, rejected| CodeCacheStats {
        hits,
        misses,
        rejected,
    };
    let judge = || load_and_judge(cache.path(), "ready-role.wasm", roles(), &s, include);

    // Cold: compiled, entry written.
    let (how, st, _) = judge().await;
    assert_eq!((how, st), (CompileSource::Compiled, stats(0, 1, 0)));
    // (d) Warm: loaded from the cache, no compile.
    let (how, st, message) = judge().await;
    assert_eq!((how, st), (CompileSource::Cached, stats(1, 0, 0)));
    assert!(
        message.contains("loaded from the compiled-code cache"),
        "{message}"
    );

    let entry = cache_entry(cache.path(), "");
    let sealed = fs::read(&entry).unwrap();
    // What wasmtime wrote, then a 32-byte tag and 8 bytes of magic.
    let artifact_len = sealed.len() - 40;
    assert_eq!(&sealed[..4], b"\x7fELF");
    let damage: Vec<(&str, Vec<u8>)> = vec![
        // (a) One byte in the middle of the code; the header stays valid, so
        // wasmtime alone would have loaded (and run) it.
        ("a flipped byte mid-code", {
            let mut b = sealed.clone();
            b[artifact_len / 2] ^= 0xff;
            b
        }),
        // (b) Cut short, and cut to less than a seal.
        ("truncated to half", sealed[..sealed.len() / 2].to_vec()),
        ("truncated to 20 bytes", sealed[..20].to_vec()),
        // (c) No seal at all: exactly what `Component::serialize` produced,
        // as an unsealing version would have stored it; and a wrong tag.
        ("the seal missing", sealed[..artifact_len].to_vec()),
        ("a wrong tag", {
            let mut b = sealed.clone();
            b[artifact_len + 7] ^= 0x01;
            b
        }),
    ];
    for (what, bytes) in damage {
        assert_eq!(&bytes[..4], b"\x7fELF", "{what}");
        fs::write(&entry, &bytes).unwrap();
        // Not deserialised: recompiled from the .wasm, and still judging.
        let (how, st, message) = judge().await;
        assert_eq!(
            (how, st),
            (CompileSource::Compiled, stats(0, 0, 1)),
            "{what}"
        );
        assert!(
            message.contains("its cached code was rejected"),
            "{what}: {message}"
        );
        // Rewritten with a valid seal: the next start loads it.
        let (how, st, _) = judge().await;
        assert_eq!((how, st), (CompileSource::Cached, stats(1, 0, 0)), "{what}");
    }

    // A genuine entry, of another module, under this module's name.
    let admin = (Decision::Include, "accepts connections");
    let (how, _, _) =
        load_and_judge(cache.path(), "admin-check.wasm", Value::Null, &s, admin).await;
    assert_eq!(how, CompileSource::Compiled);
    let admin_entry = cache_entry(cache.path(), &sha256_of(&guest("admin-check.wasm")));
    let entry = cache_entry(cache.path(), &sha256_of(&guest("ready-role.wasm")));
    fs::copy(&admin_entry, &entry).unwrap();
    let (how, st, _) = judge().await;
    assert_eq!((how, st), (CompileSource::Compiled, stats(0, 0, 1)));
}

// ---------------------------------------------------------------------------
// Module directory: kubelet ConfigMap layout, hot swap, failed reloads, pins

/// A ConfigMap volume as the kubelet lays it out:
/// `NAME.wasm -> ..data/NAME.wasm`, `..data -> ..<timestamp>/`.
struct ConfigMapDir {
    dir: TempDir,
    generation: u32,
}

impl ConfigMapDir {
    fn new(files: &[(&str, &Path)]) -> Self {
        let mut cm = ConfigMapDir {
            dir: TempDir::new("configmap"),
            generation: 0,
        };
        cm.publish(files);
        for (name, _) in files {
            symlink(format!("..data/{name}"), cm.dir.path().join(name)).unwrap();
        }
        cm
    }

    /// The kubelet's atomic update: a new timestamped directory, a new
    /// `..data_tmp` link renamed over `..data`, the old directory removed.
    fn publish(&mut self, files: &[(&str, &Path)]) {
        self.generation += 1;
        let root = self.dir.path();
        let old = fs::read_link(root.join("..data")).ok();
        let ts = format!("..2026_11_30_07_00_00.{:04}", self.generation);
        fs::create_dir(root.join(&ts)).unwrap();
        for (name, source) in files {
            fs::copy(source, root.join(&ts).join(name)).unwrap();
        }
        symlink(&ts, root.join("..data_tmp")).unwrap();
        fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        if let Some(old) = old {
            fs::remove_dir_all(root.join(old)).unwrap();
        }
    }

    fn publish_bytes(&mut self, name: &str, bytes: &[u8]) {
        let scratch = TempDir::new("scratch");
        let path = scratch.path().join(name);
        fs::write(&path, bytes).unwrap();
        self.publish(&[(name, &path)]);
    }
}

fn dir_runtime(dir: &Path, cache: &TempDir) -> WasmRuntime {
    WasmRuntime::new(WasmConfig {
        supply: Arc::new(Supplier),
        oci: Default::default(),
        probes: Default::default(),
        modules_dir: Some(dir.to_path_buf()),
        cache_dir: Some(cache.path().to_path_buf()),
        watch: true,
        limits: test_limits(),
    })
    .unwrap()
}

async fn next_event(events: &mut broadcast::Receiver<ModuleEvent>, module: &str) -> ModuleEvent {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Ok(e)) if e.module == module => return e,
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => panic!("event channel: {e}"),
            Err(_) => panic!("no event for {module} within 20 s"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_swap_through_the_kubelet_layout_changes_the_verdict() {
    let cache = TempDir::new("cache");
    let mut cm = ConfigMapDir::new(&[("check.wasm", &guest("hostile/huge-reason.wasm"))]);
    let rt = dir_runtime(cm.dir.path(), &cache);
    assert_eq!(rt.modules().len(), 1);
    let mut events = rt.subscribe();

    // Valid for both versions: huge-reason ignores its config, ready-role
    // needs `roles`.
    let checker = rt
        .checker_async("check.wasm", &json!({"roles": ["replica"]}), None)
        .await
        .unwrap();
    let server = http_server().await;
    let s = subject(LOCAL, server.port(), &[]);
    assert_verdict(&checker.check(&s).await, Decision::Include, "xxxx");

    // New content: ready-role. The pod answers role primary, the config
    // wants replicas: the same checker object now excludes.
    cm.publish(&[("check.wasm", &guest("ready-role.wasm"))]);
    let e = next_event(&mut events, "check.wasm").await;
    assert!(e.ok, "{e:?}");
    assert_eq!(e.compiled, Some(CompileSource::Compiled));
    assert_eq!(
        e.sha256.as_deref(),
        Some(sha256_of(&guest("ready-role.wasm")).as_str())
    );
    assert_verdict(
        &checker.check(&s).await,
        Decision::Exclude,
        "role primary is not one of",
    );

    // Once more, to a guest that traps: abstain.
    cm.publish(&[("check.wasm", &guest("hostile/trap.wasm"))]);
    assert!(next_event(&mut events, "check.wasm").await.ok);
    assert_verdict(&checker.check(&s).await, Decision::Abstain, "trap: ");
    assert_eq!(
        rt.modules()[0].sha256,
        sha256_of(&guest("hostile/trap.wasm"))
    );
}

fn sha256_of(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(fs::read(path).unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_new_version_leaves_the_old_one_serving() {
    let cache = TempDir::new("cache");
    let mut cm = ConfigMapDir::new(&[("check.wasm", &guest("admin-check.wasm"))]);
    let rt = dir_runtime(cm.dir.path(), &cache);
    let mut events = rt.subscribe();
    let original = rt.modules()[0].sha256.clone();
    // `{}` suits admin-check; ready-role rejects it (no roles).
    let checker = rt
        .checker_async("check.wasm", &json!({}), None)
        .await
        .unwrap();
    let s = subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    );

    let bad_versions: [(&str, Vec<u8>, &str); 3] = [
        (
            "garbage",
            b"not wasm at all".to_vec(),
            "not a WebAssembly file",
        ),
        (
            "wrong world",
            fs::read(guest("hostile/wrong-world.wasm")).unwrap(),
            "not a portwise membership checker",
        ),
        (
            "config rejected",
            fs::read(guest("ready-role.wasm")).unwrap(),
            "rejects configuration {}",
        ),
    ];
    for (what, bytes, part) in bad_versions {
        cm.publish_bytes("check.wasm", &bytes);
        let e = next_event(&mut events, "check.wasm").await;
        assert!(!e.ok, "{what}: {e:?}");
        assert!(e.message.contains(part), "{what}: {}", e.message);
        assert!(
            e.message
                .contains(&format!("still serving sha256 {}", &original[..12])),
            "{}",
            e.message
        );
        assert_verdict(&checker.check(&s).await, Decision::Include, "marked");
        assert_eq!(rt.modules()[0].sha256, original);
        assert!(
            rt.load_errors()
                .await
                .iter()
                .any(|(m, why)| m == "check.wasm" && why.contains(part))
        );
    }
    assert_eq!(
        rt.failures()
            .iter()
            .find(|f| f.module == "check.wasm" && f.kind == FailureKind::Load)
            .unwrap()
            .count,
        3
    );

    // A good version afterwards is taken and clears the error.
    cm.publish(&[("check.wasm", &guest("hostile/huge-reason.wasm"))]);
    assert!(next_event(&mut events, "check.wasm").await.ok);
    assert_eq!(checker.check(&s).await.decision, Decision::Include);
    assert!(rt.load_errors().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sha256_pins_are_enforced_at_build_and_on_reload() {
    let cache = TempDir::new("cache");
    let mut cm = ConfigMapDir::new(&[("check.wasm", &guest("admin-check.wasm"))]);
    let rt = dir_runtime(cm.dir.path(), &cache);
    let mut events = rt.subscribe();
    let good = sha256_of(&guest("admin-check.wasm"));
    let wrong = "0".repeat(64);

    match rt
        .checker_async("check.wasm", &Value::Null, Some(&wrong))
        .await
    {
        Err(WasmError::PinMismatch {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (wrong, good.clone())),
        other => panic!("{other:?}"),
    }
    // Case-insensitive.
    let pinned = rt
        .checker_async("check.wasm", &Value::Null, Some(&good.to_uppercase()))
        .await
        .unwrap();
    let s = subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    );
    assert_verdict(&pinned.check(&s).await, Decision::Include, "marked");

    // New content that does not match a pin in use is refused.
    cm.publish(&[("check.wasm", &guest("hostile/trap.wasm"))]);
    let e = next_event(&mut events, "check.wasm").await;
    assert!(!e.ok && e.message.contains("pinned"), "{e:?}");
    assert_verdict(&pinned.check(&s).await, Decision::Include, "marked");

    // Once no checker pins it any more, the next change goes through.
    drop(pinned);
    cm.publish(&[("check.wasm", &guest("hostile/huge-reason.wasm"))]);
    assert!(next_event(&mut events, "check.wasm").await.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_appear_and_disappear_with_the_directory() {
    let cache = TempDir::new("cache");
    let dir = TempDir::new("plain");
    let rt = dir_runtime(dir.path(), &cache);
    let mut events = rt.subscribe();
    assert!(rt.modules().is_empty());
    match rt
        .checker_async("admin-check.wasm", &Value::Null, None)
        .await
    {
        Err(WasmError::NotLoaded { why, .. }) => assert!(why.contains("no such file"), "{why}"),
        other => panic!("{other:?}"),
    }

    // A plain directory: copy a file in (via a temporary name, as `kubectl
    // cp` or an installer would), then remove it.
    fs::copy(guest("admin-check.wasm"), dir.path().join(".tmp-upload")).unwrap();
    fs::rename(
        dir.path().join(".tmp-upload"),
        dir.path().join("admin-check.wasm"),
    )
    .unwrap();
    assert!(next_event(&mut events, "admin-check.wasm").await.ok);
    let checker = rt
        .checker_async("admin-check", &Value::Null, None)
        .await
        .unwrap();
    assert_eq!(checker.module(), "admin-check.wasm");

    fs::remove_file(dir.path().join("admin-check.wasm")).unwrap();
    let e = next_event(&mut events, "admin-check.wasm").await;
    assert!(!e.ok && e.message.contains("still serving"), "{e:?}");
    let s = subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    );
    assert_verdict(&checker.check(&s).await, Decision::Include, "marked");
}

// ---------------------------------------------------------------------------
// Gzip-compressed modules (`.wasm.gz`)

/// `gzip -9` of the parts, one after the other.
fn gzip(parts: &[&[u8]]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    for part in parts {
        gz.write_all(part).unwrap();
    }
    gz.finish().unwrap()
}

/// `NAME.wasm.gz` of a built guest, written to `dir`.
fn gzipped_guest(name: &str, dir: &Path) -> PathBuf {
    let plain = guest(name);
    let file = plain.file_name().unwrap().to_str().unwrap();
    let path = dir.join(format!("{file}.gz"));
    fs::write(&path, gzip(&[&fs::read(&plain).unwrap()])).unwrap();
    path
}

/// 100 MiB of zeros, gzipped (about 100 KB), built in memory.
fn gzip_bomb() -> Vec<u8> {
    let zeros = vec![0u8; 1 << 20];
    gzip(&vec![&zeros[..]; 100])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzipped_module_judges_like_the_plain_one_and_shares_its_cached_code() {
    let h = Harness::new(test_limits());
    let dir = TempDir::new("gz");
    let gz_path = gzipped_guest("ready-role.wasm", dir.path());
    let plain = h.rt.load_file(&guest("ready-role.wasm")).await.unwrap();
    let gz = h.rt.load_file(&gz_path).await.unwrap();
    assert_eq!(gz.module, "ready-role.wasm.gz");
    // The pin is over the file as stored (`sha256sum ready-role.wasm.gz`);
    // the code cache is keyed by the component, so the plain file's entry
    // serves the gzipped one.
    assert_eq!(gz.sha256, sha256_of(&gz_path));
    assert_ne!(gz.sha256, plain.sha256);
    assert_eq!(gz.size, plain.size);
    assert_eq!(plain.compiled, CompileSource::Compiled);
    assert_eq!(gz.compiled, CompileSource::Cached);

    let server = http_server().await;
    let s = subject(LOCAL, server.port(), &[]);
    let configs = [
        json!({"roles": ["primary"]}),
        json!({"roles": ["replica", "primary"], "path": "/replica"}),
        json!({"roles": ["primary"], "path": "/replica"}),
        json!({"roles": ["primary"], "path": "/fail"}),
        json!({"roles": ["primary"], "path": "/notjson"}),
    ];
    let mut decisions = Vec::new();
    for config in configs {
        let a =
            h.rt.checker_async("ready-role.wasm", &config, None)
                .await
                .unwrap();
        let b =
            h.rt.checker_async("ready-role.wasm.gz", &config, Some(&gz.sha256))
                .await
                .unwrap();
        let (va, vb) = (a.check(&s).await, b.check(&s).await);
        assert_eq!(va, vb, "{config}");
        decisions.push(va.decision);
    }
    assert_eq!(
        decisions,
        [
            Decision::Include,
            Decision::Include,
            Decision::Exclude,
            Decision::Exclude,
            Decision::Exclude
        ]
    );
    // The component's digest is not the file's.
    match h
        .rt
        .checker_async(
            "ready-role.wasm.gz",
            &json!({"roles": ["primary"]}),
            Some(&plain.sha256),
        )
        .await
    {
        Err(WasmError::PinMismatch { actual, .. }) => assert_eq!(actual, gz.sha256),
        other => panic!("{other:?}"),
    }
    for kind in FailureKind::ALL {
        assert_eq!(h.failures("ready-role.wasm.gz", kind), 0, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzipped_module_hot_swaps_and_a_gzip_bomb_leaves_the_old_one_serving() {
    let cache = TempDir::new("cache");
    let scratch = TempDir::new("gz");
    let admin = gzipped_guest("admin-check.wasm", scratch.path());
    let mut cm = ConfigMapDir::new(&[("check.wasm.gz", &admin)]);
    let rt = dir_runtime(cm.dir.path(), &cache);
    let mut events = rt.subscribe();
    let original = sha256_of(&admin);
    let modules = rt.modules();
    assert_eq!(
        (modules[0].module.as_str(), modules[0].sha256.as_str()),
        ("check.wasm.gz", original.as_str())
    );

    // Names are exact: `check.wasm` does not find `check.wasm.gz`, but the
    // error says where it is.
    match rt.checker_async("check.wasm", &json!({}), None).await {
        Err(WasmError::NotLoaded { why, .. }) => {
            assert!(why.contains("check.wasm.gz is loaded"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    let checker = rt
        .checker_async("check.wasm.gz", &json!({}), Some(&original))
        .await
        .unwrap();
    let s = subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    );
    assert_verdict(&checker.check(&s).await, Decision::Include, "marked");

    // A bomb and a corrupt file, each swapped in by the kubelet: refused,
    // counted, reported; the old version keeps serving.
    let started = Instant::now();
    let bomb = gzip_bomb();
    eprintln!(
        "gzip bomb: 100 MiB -> {} KB in {:.0} ms",
        bomb.len() / 1024,
        started.elapsed().as_secs_f64() * 1e3
    );
    let bad_versions: [(&str, Vec<u8>, &str); 2] = [
        (
            "bomb",
            bomb,
            "gunzips to more than 64 MiB, the limit for a module's gunzipped size",
        ),
        (
            "not gzip",
            fs::read(guest("admin-check.wasm")).unwrap(),
            "not a valid gzip file",
        ),
    ];
    for (i, (what, bytes, part)) in bad_versions.into_iter().enumerate() {
        let started = Instant::now();
        cm.publish_bytes("check.wasm.gz", &bytes);
        let e = next_event(&mut events, "check.wasm.gz").await;
        eprintln!(
            "{what}: refused {:.0} ms after the swap",
            started.elapsed().as_secs_f64() * 1e3
        );
        assert!(!e.ok, "{what}: {e:?}");
        assert!(
            e.message.starts_with("module check.wasm.gz (sha256 "),
            "{what}: {}",
            e.message
        );
        assert!(e.message.contains(part), "{what}: {}", e.message);
        assert!(
            e.message
                .contains(&format!("still serving sha256 {}", &original[..12])),
            "{}",
            e.message
        );
        assert_verdict(&checker.check(&s).await, Decision::Include, "marked");
        assert_eq!(rt.modules()[0].sha256, original);
        assert!(
            rt.load_errors()
                .await
                .iter()
                .any(|(m, why)| m == "check.wasm.gz" && why.contains(part))
        );
        let loads_failed = rt
            .failures()
            .iter()
            .find(|f| f.module == "check.wasm.gz" && f.kind == FailureKind::Load)
            .unwrap()
            .count;
        assert_eq!(loads_failed, i as u64 + 1, "{what}");
    }

    // A good gzipped version is hot-swapped in (the pinned checker goes
    // first: a pin in use refuses new content).
    drop(checker);
    let trap = gzipped_guest("hostile/trap.wasm", scratch.path());
    cm.publish(&[("check.wasm.gz", &trap)]);
    let e = next_event(&mut events, "check.wasm.gz").await;
    assert!(e.ok, "{e:?}");
    assert_eq!(e.sha256, Some(sha256_of(&trap)));
    let checker = rt
        .checker_async("check.wasm.gz", &json!({}), None)
        .await
        .unwrap();
    assert_verdict(&checker.check(&s).await, Decision::Abstain, "trap: ");
    assert!(rt.load_errors().await.is_empty());
}

#[test]
fn the_synchronous_provider_works_inside_and_outside_a_runtime() {
    let h = Harness::new(test_limits());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(h.rt.load_file(&guest("admin-check.wasm")))
        .unwrap();
    // Outside any runtime.
    assert!(h.rt.checker("admin-check.wasm", &Value::Null, None).is_ok());
    // Inside one (the controller builds its checkers from async code).
    let e = rt.block_on(async {
        h.rt.checker("admin-check.wasm", &json!({"key": ""}), None)
            .map(drop)
    });
    assert!(e.unwrap_err().contains("key: must not be empty"));
}

/// Instances are made where they run. The instance that ran
/// `validate-config` on the private runtime behind `checker` (dropped when
/// it returns) does not serve checks; a check makes its own instance on the
/// runtime that polls it and reuses it there; another runtime, even once
/// the first is gone, gets an instance of its own. (Today's host keeps
/// nothing bound to a runtime in an instance between calls, so reusing one
/// elsewhere does not crash: see `modules/pool.rs`. What is pinned here is
/// the rule that keeps it so.) Each check probes over HTTP through the
/// reactor of the runtime it runs on.
#[test]
fn instances_run_on_the_runtime_that_created_them() {
    let h = Harness::new(test_limits());
    let instances = || {
        h.rt.instantiations()
            .into_iter()
            .find(|(m, _)| m == "ready-role.wasm")
            .map_or(0, |(_, n)| n)
    };
    let current_thread = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    // The HTTP server lives on a runtime of its own, outliving the others.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = server_rt.block_on(http_server());
    let s = subject(LOCAL, server.port(), &[]);
    let include = |v: Verdict| assert_verdict(&v, Decision::Include, "role primary");

    let first = current_thread();
    first
        .block_on(h.rt.load_file(&guest("ready-role.wasm")))
        .unwrap();
    let checker =
        h.rt.checker("ready-role.wasm", &json!({"roles": ["primary"]}), None)
            .unwrap();
    assert_eq!(instances(), 1, "validate-config's");

    include(first.block_on(checker.check(&s)));
    assert_eq!(instances(), 2, "the check made its own");
    include(first.block_on(checker.check(&s)));
    assert_eq!(instances(), 2, "and reused it");

    let second = current_thread();
    include(second.block_on(checker.check(&s)));
    assert_eq!(instances(), 3, "another runtime made its own");
    drop(first);
    include(second.block_on(checker.check(&s)));
    include(second.block_on(checker.check(&s)));
    assert_eq!(instances(), 3, "and reused it");

    // After `first` is gone, a third runtime still starts afresh.
    drop(second);
    let third = current_thread();
    include(third.block_on(checker.check(&s)));
    assert_eq!(instances(), 4);
}

/// A checker for `module` (already loaded) with an expression's own limits.
async fn limited(h: &Harness, module: &str, config: Value, limits: WasmLimits) -> Arc<dyn Checker> {
    Arc::new(
        h.rt.checker_with_limits(module, &config, None, &limits)
            .await
            .unwrap_or_else(|e| panic!("{module}: {e}")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tighter_memory_limit_contains_its_expression_only() {
    // One module, two expressions: 24 MiB fits the runtime's default of
    // 64 MiB but not the first expression's 16 MiB.
    let h = Harness::new(Limits {
        memory_bytes: 64 << 20,
        ..test_limits()
    });
    h.checker("hostile/alloc.wasm", Value::Null).await;
    let config = json!({"bytes": 24 << 20});
    // Through the same door the configuration's checker tree uses.
    let tight = portwise_checkers::WasmCheckers::checker(
        &h.rt,
        &WasmSpec {
            module: "alloc.wasm".into(),
            config: config.clone(),
            sha256: None,
            limits: WasmLimits {
                memory_mib: Some(16),
                ..Default::default()
            },
            allow_tags: false,
        },
    )
    .unwrap();
    let default = limited(&h, "alloc.wasm", config, WasmLimits::default()).await;
    let s = subject(LOCAL, 80, &[]);
    for round in 0..3 {
        // Interleaved, so that a pooled instance of one limit would be
        // handed to the other expression if instances were not kept apart.
        let v = tight.check(&s).await;
        assert_verdict(&v, Decision::Abstain, "memory limit");
        assert_verdict(&v, Decision::Abstain, "limit 16384 KiB");
        assert_verdict(
            &default.check(&s).await,
            Decision::Include,
            &format!("allocated {} bytes", 24 << 20),
        );
        assert_eq!(
            h.failures("alloc.wasm", FailureKind::Memory),
            round + 1,
            "round {round}"
        );
    }
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expressions_deadline_and_call_timeout_replace_the_runtimes() {
    let h = Harness::new(test_limits()); // deadline 2 s, call timeout 5 s
    h.checker("hostile/loop.wasm", Value::Null).await;
    let s = subject(LOCAL, 80, &[]);
    let quick = limited(
        &h,
        "loop.wasm",
        Value::Null,
        WasmLimits {
            deadline: Some(Duration::from_millis(30)),
            ..Default::default()
        },
    )
    .await;
    assert_verdict(
        &quick.check(&s).await,
        Decision::Abstain,
        "compute deadline of 30ms",
    );
    // The wall clock bounds the call before the runtime's 2 s compute
    // deadline does.
    let walled = limited(
        &h,
        "loop.wasm",
        Value::Null,
        WasmLimits {
            call_timeout: Some(Duration::from_millis(40)),
            ..Default::default()
        },
    )
    .await;
    assert_verdict(
        &walled.check(&s).await,
        Decision::Abstain,
        "did not finish within 40ms",
    );
    assert_eq!(h.failures("loop.wasm", FailureKind::Deadline), 2);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expressions_probe_cap_replaces_the_runtimes() {
    let server = http_server().await;
    let h = Harness::new(test_limits());
    let config = json!({"roles": ["primary"]});
    let free = h.checker("ready-role.wasm", config.clone()).await;
    let capped = limited(
        &h,
        "ready-role.wasm",
        config,
        WasmLimits {
            probes_per_call: Some(0),
            ..Default::default()
        },
    )
    .await;
    let s = subject(server.ip(), server.port(), &[]);
    assert_verdict(&free.check(&s).await, Decision::Include, "role primary");
    assert_verdict(
        &capped.check(&s).await,
        Decision::Exclude,
        "more than 0 probes in one call",
    );
    assert_eq!(h.failures("ready-role.wasm", FailureKind::DeniedProbe), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_above_the_runtimes_ceiling_is_refused_by_name() {
    let h = Harness::new(Limits {
        memory_bytes: 32 << 20,
        max_memory_bytes: 48 << 20,
        ..test_limits()
    });
    h.checker("hostile/alloc.wasm", Value::Null).await;
    // Up to the ceiling is fine...
    limited(
        &h,
        "alloc.wasm",
        Value::Null,
        WasmLimits {
            memory_mib: Some(48),
            ..Default::default()
        },
    )
    .await;
    // ...past it the expression is refused, naming the key and the fix.
    let e =
        h.rt.checker_with_limits(
            "alloc.wasm",
            &Value::Null,
            None,
            &WasmLimits {
                memory_mib: Some(64),
                ..Default::default()
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("limits.memoryMiB 64") && e.contains("ceiling of 48 MiB"),
        "{e}"
    );
}

/// The 0.1 component kept byte for byte (tests/fixtures/README.md).
const FIXTURE_0_1: &str = "admin-check-0.1.wasm";
const FIXTURE_0_1_SHA256: &str = "b1ef0463fa9e5716b65139f88a48c87ff2e8cd09813855f43032201addd8142a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_guest_serves_next_to_0_2_guests_in_one_modules_dir() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(FIXTURE_0_1);
    let bytes = fs::read(&fixture).unwrap();
    assert_eq!(
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)),
        FIXTURE_0_1_SHA256,
        "the 0.1 fixture changed: it must stay the component built in 0.1 days"
    );
    let dir = TempDir::new("mixed");
    fs::write(dir.path().join(FIXTURE_0_1), &bytes).unwrap();
    for name in ["admin-check.wasm", "ready-role.wasm"] {
        fs::copy(guest(name), dir.path().join(name)).unwrap();
    }
    let cache = TempDir::new("cache");
    let rt = dir_runtime(dir.path(), &cache);
    rt.rescan().await;
    let mut served: Vec<(String, &str)> = rt
        .modules()
        .into_iter()
        .map(|m| (m.module, m.interface))
        .collect();
    served.sort();
    assert_eq!(
        served,
        [
            (FIXTURE_0_1.to_string(), "0.1"),
            ("admin-check.wasm".to_string(), "0.2"),
            ("ready-role.wasm".to_string(), "0.2"),
        ]
    );

    // The same checker built against both versions answers alike: the mark
    // (a label the 0.2 guest reads by key, the 0.1 guest from the whole
    // list), a dial that connects, a dial that is refused.
    let config = json!({"key": "example.com/admin", "timeoutMs": 500});
    let old = rt.checker_async(FIXTURE_0_1, &config, None).await.unwrap();
    let new = rt
        .checker_async("admin-check.wasm", &config, None)
        .await
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let open = listener.local_addr().unwrap().port();
    let cases = [
        (
            subject(LOCAL, closed_port(), &[("example.com/admin", "yes")]),
            Decision::Include,
        ),
        (subject(LOCAL, open, &[]), Decision::Include),
        (subject(LOCAL, closed_port(), &[]), Decision::Exclude),
    ];
    for (s, want) in &cases {
        let (a, b) = (old.check(s).await, new.check(s).await);
        assert_eq!(a.decision, *want, "0.1: {a:?}");
        assert_eq!(b.decision, *want, "0.2: {b:?}");
    }
    // A 0.2 guest with a probe, in the same runtime.
    let server = http_server().await;
    let role = rt
        .checker_async("ready-role.wasm", &json!({"roles": ["primary"]}), None)
        .await
        .unwrap();
    assert_verdict(
        &role.check(&subject(server.ip(), server.port(), &[])).await,
        Decision::Include,
        "role primary",
    );
    assert!(
        rt.failures().iter().all(|f| f.count == 0),
        "{:?}",
        rt.failures()
    );
}

/// `bytes` (a component) with a custom section carrying `payload`
/// appended: the same component, with a different sha256.
fn with_custom_section(bytes: &[u8], payload: &str) -> Vec<u8> {
    let name = b"portwise-test";
    let len = 1 + name.len() + payload.len();
    assert!(len < 128, "one LEB128 byte");
    let mut out = bytes.to_vec();
    out.extend([0x00, len as u8, name.len() as u8]);
    out.extend(name);
    out.extend(payload.as_bytes());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compiled_code_cache_keeps_only_what_is_loaded() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(FIXTURE_0_1);
    let bytes = fs::read(&fixture).unwrap();
    let dir = TempDir::new("reloads");
    let cache = TempDir::new("bounded");
    let rt = WasmRuntime::new(WasmConfig {
        supply: Arc::new(Supplier),
        oci: Default::default(),
        probes: Default::default(),
        modules_dir: None,
        cache_dir: Some(cache.path().to_path_buf()),
        watch: false,
        limits: test_limits(),
    })
    .unwrap();
    // Another module, loaded once and kept loaded: its entry stays.
    let other = dir.path().join("other.wasm");
    fs::write(&other, with_custom_section(&bytes, "other")).unwrap();
    let other = rt.load_file(&other).await.unwrap();
    // An entry this runtime never touched (another engine's, or a module
    // of the previous start not loaded yet): left alone.
    let foreign = cache
        .path()
        .join(format!("{}-0123456789abcdef.sealed.cwasm", "a".repeat(64)));
    fs::write(&foreign, b"someone else's").unwrap();
    // Twenty hot reloads of one module, each with new content.
    let path = dir.path().join("reloaded.wasm");
    let mut last = None;
    for i in 0..20 {
        fs::write(&path, with_custom_section(&bytes, &format!("v{i}"))).unwrap();
        last = Some(rt.load_file(&path).await.unwrap());
    }
    // New content that fails to load: its entry goes too.
    let broken = dir.path().join("broken.wasm");
    fs::write(&broken, b"\0asm\x0d\0\x01\0").unwrap();
    rt.load_file(&broken).await.unwrap_err();

    let last = last.unwrap();
    let mut names: Vec<String> = fs::read_dir(cache.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cwasm"))
        .collect();
    names.sort();
    let mut expected = vec![
        cache_entry(cache.path(), &last.sha256),
        cache_entry(cache.path(), &other.sha256),
        foreign,
    ]
    .into_iter()
    .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
    .collect::<Vec<_>>();
    expected.sort();
    assert_eq!(names, expected);
    assert!(
        cache
            .path()
            .join(portwise_supply::sealed::KEY_FILE)
            .is_file()
    );
    // Both modules still serving (the broken one never did).
    assert_eq!(rt.modules().len(), 2);
}
