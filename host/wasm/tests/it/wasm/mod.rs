//! The WebAssembly runtime with the real Rust guests: verdicts against real
//! listeners on 127.0.0.1, containment of every hostile guest, the
//! compiled-code cache, hot swaps in the kubelet's ConfigMap layout, sha256
//! pins, gzip-compressed (`.wasm.gz`) modules, expressions' own limits and
//! guests of both WIT versions: one file a subject, and here what they share.
//!
//! Guests come from `guests/build` (default output
//! `~/.cache/portwise/guests`, or `PORTWISE_GUESTS_DIR`). A missing guest
//! fails the test with that hint: skipping would hide a broken toolchain.

mod code_cache;
mod gzip;
mod hostile;
mod limits;
mod memories;
mod modules_dir;
mod runtimes;
mod verdicts;
mod versions;

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
    async fn new(limits: Limits) -> Self {
        let cache = TempDir::new("cache");
        let rt = WasmRuntime::new(WasmConfig {
            supply: Arc::new(Supplier),
            oci: Default::default(),
            probes: Default::default(),
            modules_dir: None,
            expressions: None,
            cache_dir: Some(cache.path().to_path_buf()),
            watch: false,
            limits,
        })
        .await
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
                .checker(name, &config, None)
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

// ---------------------------------------------------------------------------
// Module directories: the kubelet's ConfigMap layout, and events

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

async fn dir_runtime(dir: &Path, cache: &TempDir) -> WasmRuntime {
    WasmRuntime::new(WasmConfig {
        supply: Arc::new(Supplier),
        oci: Default::default(),
        probes: Default::default(),
        modules_dir: Some(dir.to_path_buf()),
        expressions: None,
        cache_dir: Some(cache.path().to_path_buf()),
        watch: true,
        limits: test_limits(),
    })
    .await
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

fn sha256_of(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(fs::read(path).unwrap()))
}

/// The 0.1 component kept byte for byte (tests/fixtures/README.md).
const FIXTURE_0_1: &str = "admin-check-0.1.wasm";
const FIXTURE_0_1_SHA256: &str = "b1ef0463fa9e5716b65139f88a48c87ff2e8cd09813855f43032201addd8142a";
/// The 0.2.0 component kept byte for byte, for the 0.2.x minor releases.
const FIXTURE_0_2_0: &str = "admin-check-0.2.0.wasm";
const FIXTURE_0_2_0_SHA256: &str =
    "8c2376db5ee9c8f4301f0ccf63a47b414339bcdee9389907ff72208283abcb56";
