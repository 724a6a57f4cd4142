//! Recording a guest's probes and replaying them (`WasmConfig::probes`, what
//! `portwise check --record/--replay` use): the real Rust guests, recorded
//! against real listeners on 127.0.0.1, then replayed with the listeners
//! gone. A replay must give the recorded verdicts, name the probes it has no
//! answer for, and leave the host's refusals (other addresses, bad paths)
//! exactly as they are live.
//!
//! Guests come from `guests/build` (`PORTWISE_GUESTS_DIR`, default
//! `~/.cache/portwise/guests`); a missing one fails the test with that hint.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use crate::common::{guests_dir, subject_for};
use k8s_openapi::{
    api::core::v1::{Pod, PodCondition, PodIP, PodStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use portwise_checkers::Checker;
use portwise_core::membership::{Decision, Subject, Verdict};
use portwise_supply::Supplier;
use portwise_wasm::{
    FailureKind, Limits, ProbeMode, Recorder, Recording, ReplayMiss, Replayer, WasmConfig,
    WasmRuntime,
    replay::{ProbeKind, RecordedAnswer},
};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
    task::JoinHandle,
};

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn guest(name: &str) -> PathBuf {
    let path = guests_dir().join(name);
    assert!(
        path.is_file(),
        "guest {} is missing: run guests/build first (or set PORTWISE_GUESTS_DIR)",
        path.display()
    );
    path
}

/// A runtime whose probes go where `probes` says, with its own code cache.
struct Harness {
    rt: WasmRuntime,
    _cache: tempfile::TempDir,
}

impl Harness {
    async fn new(probes: ProbeMode) -> Self {
        let cache = tempfile::tempdir().unwrap();
        let rt = WasmRuntime::new(WasmConfig {
            supply: Arc::new(Supplier),
            oci: Default::default(),
            modules_dir: None,
            expressions: None,
            cache_dir: Some(cache.path().to_path_buf()),
            watch: false,
            limits: Limits {
                max_instances: 16,
                // Verdicts are under test, not timing.
                deadline: Duration::from_secs(2),
                ..Limits::default()
            },
            probes,
        })
        .await
        .expect("runtime");
        Harness { rt, _cache: cache }
    }

    async fn checker(&self, module: &str, config: &Value) -> Arc<dyn Checker> {
        let path = guest(module);
        self.rt
            .load_file(&path)
            .await
            .unwrap_or_else(|e| panic!("{module}: {e}"));
        let name = path.file_name().unwrap().to_str().unwrap();
        Arc::new(
            self.rt
                .checker(name, config, None)
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

fn subject(port: u16, labels: &[(&str, &str)]) -> Subject {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("web-0".into()),
            namespace: Some("shop".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        status: Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            pod_ips: Some(vec![PodIP {
                ip: LOCAL.to_string(),
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    subject_for(pod, None, "http", port, LOCAL)
}

/// An HTTP server with canned answers per path, and a plain TCP listener;
/// both stop (and their ports close) when dropped.
struct Listeners {
    http: SocketAddr,
    tcp: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn listeners() -> Listeners {
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http_addr, tcp_addr) = (http.local_addr().unwrap(), tcp.local_addr().unwrap());
    let serve_http = tokio::spawn(async move {
        while let Ok((mut sock, _)) = http.accept().await {
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
                    "/ready" => ("200 OK", r#"{"role":"primary"}"#),
                    "/replica" => ("200 OK", r#"{"role":"replica"}"#),
                    "/fail" => ("503 Service Unavailable", r#"{"role":"primary"}"#),
                    "/slow" => {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        ("200 OK", "{}")
                    }
                    _ => ("404 Not Found", ""),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(response.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    let serve_tcp = tokio::spawn(async move { while tcp.accept().await.is_ok() {} });
    Listeners {
        http: http_addr,
        tcp: tcp_addr,
        tasks: vec![serve_http, serve_tcp],
    }
}

/// A port with (very likely) nothing listening.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The decisions under test: (module, config, target port, pod labels).
type Case = (&'static str, Value, u16, Vec<(&'static str, &'static str)>);

fn cases(l: &Listeners, closed: u16) -> Vec<Case> {
    let roles = |path: &str| json!({"roles": ["primary"], "path": path, "timeoutMs": 300});
    vec![
        ("ready-role.wasm", roles("/ready"), l.http.port(), vec![]),
        ("ready-role.wasm", roles("/replica"), l.http.port(), vec![]),
        ("ready-role.wasm", roles("/fail"), l.http.port(), vec![]),
        ("ready-role.wasm", roles("/slow"), l.http.port(), vec![]),
        ("ready-role.wasm", roles("/ready"), closed, vec![]),
        (
            "admin-check.wasm",
            json!({"key": "example.com/admin"}),
            l.tcp.port(),
            vec![],
        ),
        (
            "admin-check.wasm",
            json!({"key": "example.com/admin"}),
            closed,
            vec![],
        ),
        // Marked: no probe at all.
        (
            "admin-check.wasm",
            json!({"key": "example.com/admin"}),
            closed,
            vec![("example.com/admin", "yes")],
        ),
    ]
}

async fn judge(h: &Harness, cases: &[Case]) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for (module, config, port, labels) in cases {
        let checker = h.checker(module, config).await;
        verdicts.push(checker.check(&subject(*port, labels)).await);
    }
    verdicts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_without_the_listeners_gives_the_recorded_verdicts() {
    let l = listeners().await;
    let closed = closed_port();
    let cases = cases(&l, closed);

    let recorder = Arc::new(Recorder::new());
    let live = Harness::new(ProbeMode::Record(recorder.clone())).await;
    let recorded = judge(&live, &cases).await;
    let decisions: Vec<Decision> = recorded.iter().map(|v| v.decision).collect();
    assert_eq!(
        decisions,
        [
            Decision::Include,
            Decision::Exclude,
            Decision::Exclude,
            Decision::Abstain,
            Decision::Exclude,
            Decision::Include,
            Decision::Exclude,
            Decision::Include,
        ],
        "{recorded:#?}"
    );

    // Every probe, in order, through the file format.
    let file = tempfile::NamedTempFile::new().unwrap();
    recorder.finish().write(file.path()).unwrap();
    let recording = Recording::read(file.path()).unwrap();
    let seen: Vec<(ProbeKind, u16, Option<&str>)> = recording
        .probes
        .iter()
        .map(|p| (p.kind, p.port, p.path.as_deref()))
        .collect();
    let (http, tcp) = (l.http.port(), l.tcp.port());
    assert_eq!(
        seen,
        [
            (ProbeKind::HttpGet, http, Some("/ready")),
            (ProbeKind::HttpGet, http, Some("/replica")),
            (ProbeKind::HttpGet, http, Some("/fail")),
            (ProbeKind::HttpGet, http, Some("/slow")),
            (ProbeKind::HttpGet, closed, Some("/ready")),
            (ProbeKind::TcpDial, tcp, None),
            (ProbeKind::TcpDial, closed, None),
        ]
    );
    assert!(recording.probes.iter().all(|p| p.address == LOCAL));
    assert_eq!(recording.probes[3].answer, RecordedAnswer::Timeout);
    assert_eq!(recording.probes[3].timeout_ms, 300);
    assert_eq!(recording.probes[6].answer, RecordedAnswer::Refused);
    assert!(
        matches!(&recording.probes[2].answer, RecordedAnswer::Response { status: 503, body: Some(b), .. } if b.contains("primary")),
        "{:?}",
        recording.probes[2]
    );

    // The listeners go away: live probes now fail ...
    let (http_port, tcp_port) = (l.http.port(), l.tcp.port());
    drop(l);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let gone = Harness::new(ProbeMode::Live).await;
    let v = gone
        .checker("admin-check.wasm", &json!({"key": "example.com/admin"}))
        .await
        .check(&subject(tcp_port, &[]))
        .await;
    assert_eq!(v.decision, Decision::Exclude, "{v:?}");
    let v = gone
        .checker("ready-role.wasm", &json!({"roles": ["primary"]}))
        .await
        .check(&subject(http_port, &[]))
        .await;
    assert_eq!(v.decision, Decision::Exclude, "{v:?}");

    // ... and a replay still gives every recorded verdict, reasons included.
    let replayer = Arc::new(Replayer::new(recording));
    let replay = Harness::new(ProbeMode::Replay(replayer.clone())).await;
    let replayed = judge(&replay, &cases).await;
    assert_eq!(replayed, recorded);
    assert_eq!(replayer.misses(), []);
    // Again, as a benchmark repeats decisions: the last answer repeats.
    assert_eq!(judge(&replay, &cases).await, recorded);
    assert_eq!(replayer.misses(), []);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_missing_from_the_recording_fails_for_the_guest_and_is_reported() {
    // Recorded: only a dial on port 7000; the guest asks for other things.
    let recording = Recording::from_json(
        r#"{"format": "portwise-probe-recording", "version": 1, "probes": [
          {"kind": "tcp-dial", "address": "127.0.0.1", "port": 7000, "timeoutMs": 500,
           "answer": {"result": "connected"}}]}"#,
    )
    .unwrap();
    let replayer = Arc::new(Replayer::new(recording));
    let h = Harness::new(ProbeMode::Replay(replayer.clone())).await;

    let ready = h
        .checker("ready-role.wasm", &json!({"roles": ["primary"]}))
        .await;
    let v = ready.check(&subject(7000, &[])).await;
    assert_eq!(v.decision, Decision::Exclude, "{v:?}");
    let reason = v.reason.unwrap_or_default();
    assert!(
        reason.contains("replay: no recorded answer for GET 127.0.0.1:7000/ready"),
        "the guest did not see the miss: {reason}"
    );
    ready.check(&subject(7000, &[])).await;

    let admin = h
        .checker("admin-check.wasm", &json!({"key": "example.com/admin"}))
        .await;
    // Recorded: answered from the file (nothing listens on 7000).
    let v = admin.check(&subject(7000, &[])).await;
    assert_eq!(v.decision, Decision::Include, "{v:?}");
    // Not recorded: the port differs.
    let v = admin.check(&subject(7001, &[])).await;
    assert_eq!(v.decision, Decision::Exclude, "{v:?}");
    assert!(
        v.reason
            .as_deref()
            .unwrap_or("")
            .contains("no recorded answer for TCP 127.0.0.1:7001"),
        "{v:?}"
    );

    assert_eq!(
        replayer.misses(),
        [
            ReplayMiss {
                probe: "GET 127.0.0.1:7000/ready".into(),
                count: 2
            },
            ReplayMiss {
                probe: "TCP 127.0.0.1:7001".into(),
                count: 1
            },
        ]
    );
    // A miss is the guest's answer, not a guest failure.
    for kind in FailureKind::ALL {
        assert_eq!(h.failures("ready-role.wasm", kind), 0, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_probes_stay_denied_when_recording_and_replaying() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Answers for the very probes the host refuses, as a hand-edited file
    // could hold them: a replay must not use them.
    let forged = |address: &str, kind: &str, path: Option<&str>| {
        json!({"kind": kind, "address": address, "port": port, "path": path,
        "timeoutMs": 500, "answer": if kind == "tcp-dial" {
            json!({"result": "connected"})
        } else {
            json!({"result": "response", "status": 200, "body": "", "truncated": false})
        }})
    };
    let mut probes = vec![
        forged("10.244.0.99", "tcp-dial", None),
        forged("10.244.0.99", "http-get", Some("/")),
        forged("169.254.169.254", "http-get", Some("/")),
        forged("127.0.0.1", "http-get", Some("no-slash")),
    ];
    for p in &mut probes {
        if p["path"].is_null() {
            p.as_object_mut().unwrap().remove("path");
        }
    }
    let forged = Recording::from_json(
        &json!({"format": "portwise-probe-recording", "version": 1, "probes": probes}).to_string(),
    )
    .unwrap();

    let denied_configs = [
        json!({"host": "10.244.0.99", "kind": "tcp"}),
        json!({"host": "10.244.0.99", "kind": "http"}),
        json!({"host": "169.254.169.254", "kind": "http"}),
        json!({"host": "localhost", "kind": "tcp"}),
        json!({"host": "", "path": "no-slash"}),
    ];
    let recorder = Arc::new(Recorder::new());
    let replayer = Arc::new(Replayer::new(forged));
    let mut reasons = Vec::new();
    for mode in [
        ProbeMode::Live,
        ProbeMode::Record(recorder.clone()),
        ProbeMode::Replay(replayer.clone()),
    ] {
        let h = Harness::new(mode.clone()).await;
        let mut these = Vec::new();
        for config in &denied_configs {
            let v = h
                .checker("hostile/probe-other.wasm", config)
                .await
                .check(&subject(port, &[]))
                .await;
            assert_eq!(v.decision, Decision::Exclude, "{mode:?} {config}: {v:?}");
            let reason = v.reason.unwrap_or_default();
            assert!(reason.contains("denied: "), "{mode:?} {config}: {reason}");
            these.push(reason);
        }
        assert_eq!(
            h.failures("probe-other.wasm", FailureKind::DeniedProbe),
            denied_configs.len() as u64,
            "{mode:?}"
        );
        reasons.push(these);
    }
    // The same refusal, word for word, in all three modes.
    assert_eq!(reasons[0], reasons[1]);
    assert_eq!(reasons[0], reasons[2]);
    // Never recorded, never looked up.
    assert_eq!(recorder.finish().probes, []);
    assert_eq!(replayer.misses(), []);
}
