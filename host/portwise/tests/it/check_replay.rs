//! `portwise check --record`, `--replay` and `--bench`, the built binary
//! with real guests (`ready-role.wasm` on the http port, `admin-check.wasm`
//! on the admin port) probing real listeners on a pod address.
//!
//! `check` refuses loopback pods, so the listeners need a pod address: these
//! tests run inside the test network namespace (`tests/netns`), where
//! 10.244.0.0/16 is local and nothing leaves. Run outside it (`cargo test -p
//! portwise --test it check_replay`), each test runs itself again inside one.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::Duration,
};

use crate::common::guests_dir;

/// True inside the test network namespace; outside, runs `test` of this
/// binary inside one (failing here if it fails there) and returns false.
fn in_test_netns(test: &str) -> bool {
    if std::env::var("PORTWISE_NETNS").as_deref() == Ok("1") {
        return true;
    }
    let netns = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/netns");
    let status = Command::new(netns)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .status()
        .expect("run tests/netns");
    assert!(status.success(), "{test} failed inside tests/netns");
    false
}

/// The pod's address; other tests in the same namespace use other ones.
const POD_IP: &str = "10.244.77.10";

/// An HTTP server answering `GET /ready` with a role (and 404 otherwise),
/// and a listener that only accepts; both on [`POD_IP`], both closed by
/// [`Listeners::stop`].
struct Listeners {
    http: SocketAddr,
    tcp: SocketAddr,
    http_requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Listeners {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let http_requests = Arc::new(AtomicUsize::new(0));
        let bind = || {
            let l = TcpListener::bind((POD_IP, 0)).expect("bind a pod address (in tests/netns?)");
            l.set_nonblocking(true).unwrap();
            l
        };
        let (http, tcp) = (bind(), bind());
        let (http_addr, tcp_addr) = (http.local_addr().unwrap(), tcp.local_addr().unwrap());
        let serve = |listener: TcpListener, answer: bool| {
            let (stop, requests) = (stop.clone(), http_requests.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let Ok((mut sock, _)) = listener.accept() else {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    if !answer {
                        continue;
                    }
                    sock.set_nonblocking(false).unwrap();
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match sock.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => break,
                        }
                    }
                    requests.fetch_add(1, Ordering::SeqCst);
                    let head = String::from_utf8_lossy(&head);
                    let (status, body) = match head.split_whitespace().nth(1) {
                        Some("/ready") => ("200 OK", r#"{"role":"primary"}"#),
                        _ => ("404 Not Found", ""),
                    };
                    let _ = write!(
                        sock,
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
            })
        };
        let threads = vec![serve(http, true), serve(tcp, false)];
        Listeners {
            http: http_addr,
            tcp: tcp_addr,
            http_requests,
            stop,
            threads,
        }
    }

    /// Closes both ports.
    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A directory with the pod (ports `http` and `admin` at the listeners'),
/// the Service and a config file running the two guests.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new(http: u16, admin: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // Only the two guests: the guests directory also holds an 18 MB
        // Python one, which every run would compile (the cache is per test).
        std::fs::create_dir(dir.path().join("modules")).unwrap();
        for guest in ["ready-role.wasm", "admin-check.wasm"] {
            let path = guests_dir().join(guest);
            assert!(
                path.is_file(),
                "{} is missing: run guests/build first (or set PORTWISE_GUESTS_DIR)",
                path.display()
            );
            std::fs::copy(&path, dir.path().join("modules").join(guest)).unwrap();
        }
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        write(
            "pod.yaml",
            format!(
                r#"
apiVersion: v1
kind: Pod
metadata: {{name: web-0, namespace: default}}
spec:
  containers:
  - name: app
    image: app
    ports: [{{name: http, containerPort: {http}}}, {{name: admin, containerPort: {admin}}}]
status:
  phase: Running
  podIP: {POD_IP}
  podIPs: [{{ip: {POD_IP}}}]
  conditions: [{{type: Ready, status: "True"}}]
"#
            ),
        );
        write(
            "svc.yaml",
            r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  ports:
  - {name: http, port: 80, targetPort: http}
  - {name: admin, port: 81, targetPort: admin}
"#
            .into(),
        );
        write(
            "portwise.yaml",
            format!(
                r#"
serviceKey: {{annotation: example.com/group}}
modulesDir: {}
membership:
  perPort:
    ports:
      http: {{wasm: {{module: ready-role.wasm, config: {{roles: [primary], timeoutMs: 500}}}}}}
      admin: {{wasm: {{module: admin-check.wasm, config: {{key: example.com/admin, timeoutMs: 500}}}}}}
"#,
                dir.path().join("modules").display()
            ),
        );
        Files { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `portwise check --config portwise.yaml ...` plus `args`.
    fn check(&self, args: &[&str]) -> Run {
        let out = Command::new(env!("CARGO_BIN_EXE_portwise"))
            .args(["check", "--config", "portwise.yaml"])
            .args(["--pod", "pod.yaml", "--service", "svc.yaml"])
            .args(args)
            .current_dir(self.dir.path())
            .env("PORTWISE_CACHE_DIR", self.path("cache"))
            .env("PORTWISE_LOG", "warn")
            .env_remove("KUBECONFIG")
            .output()
            .expect("run portwise check");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        }
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The verdict table: the lines up to the first blank one.
    fn table(&self) -> String {
        self.stdout
            .lines()
            .take_while(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The verdict column of `port`'s row and its reason.
    fn verdict(&self, port: &str) -> (String, String) {
        let line = self
            .table()
            .lines()
            .find(|l| l.split_whitespace().next() == Some(port))
            .unwrap_or_else(|| panic!("no row for {port} in:\n{}\n{}", self.stdout, self.stderr))
            .to_string();
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields[3].to_string(), fields[4..].join(" "))
    }
}

#[test]
fn a_recorded_check_replays_to_the_same_table_with_the_listeners_gone() {
    if !in_test_netns(
        "check_replay::a_recorded_check_replays_to_the_same_table_with_the_listeners_gone",
    ) {
        return;
    }
    let mut listeners = Listeners::start();
    let files = Files::new(listeners.http.port(), listeners.tcp.port());
    let recorded = files.check(&["--record", "probes.json"]);
    assert_eq!(recorded.code, 0, "{}{}", recorded.stdout, recorded.stderr);
    assert_eq!(recorded.verdict("http").0, "include", "{}", recorded.stdout);
    assert_eq!(
        recorded.verdict("admin").0,
        "include",
        "{}",
        recorded.stdout
    );
    assert!(
        recorded.stderr.contains("recorded 2 probe(s)"),
        "{}",
        recorded.stderr
    );

    // The file: versioned, one entry per probe, in order.
    let text = std::fs::read_to_string(files.path("probes.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["format"], "portwise-probe-recording", "{text}");
    assert_eq!(json["version"], 1, "{text}");
    let probes = json["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 2, "{text}");
    assert_eq!(probes[0]["kind"], "http-get");
    assert_eq!(probes[0]["address"], POD_IP);
    assert_eq!(probes[0]["port"], listeners.http.port());
    assert_eq!(probes[0]["path"], "/ready");
    assert_eq!(probes[0]["timeoutMs"], 500);
    assert_eq!(probes[0]["answer"]["status"], 200);
    assert_eq!(probes[0]["answer"]["body"], r#"{"role":"primary"}"#);
    assert_eq!(probes[1]["kind"], "tcp-dial");
    assert_eq!(probes[1]["answer"]["result"], "connected");

    // The listeners go: live, both ports now exclude ...
    listeners.stop();
    let live = files.check(&[]);
    assert_eq!(live.verdict("http").0, "exclude", "{}", live.stdout);
    assert_eq!(live.verdict("admin").0, "exclude", "{}", live.stdout);

    // ... and the replay prints the recorded table, byte for byte.
    let replayed = files.check(&["--replay", "probes.json"]);
    assert_eq!(replayed.code, 0, "{}{}", replayed.stdout, replayed.stderr);
    assert_eq!(replayed.table(), recorded.table());
    assert!(
        !replayed.stderr.contains("no recorded answer"),
        "{}",
        replayed.stderr
    );

    // Without the dial's entry, the guest sees the miss, and so does CI.
    let mut partial = json.clone();
    partial["probes"].as_array_mut().unwrap().truncate(1);
    std::fs::write(files.path("partial.json"), partial.to_string()).unwrap();
    let missed = files.check(&["--replay", "partial.json"]);
    assert_eq!(missed.code, 4, "{}{}", missed.stdout, missed.stderr);
    let miss = format!(
        "no recorded answer for TCP {POD_IP}:{}",
        listeners.tcp.port()
    );
    let (decision, reason) = missed.verdict("admin");
    assert_eq!(decision, "exclude", "{}", missed.stdout);
    assert!(reason.contains(&miss), "{}", missed.stdout);
    assert_eq!(missed.verdict("http"), recorded.verdict("http"));
    assert!(
        missed.stderr.contains("1 probe(s) had no recorded answer")
            && missed
                .stderr
                .contains(&format!("TCP {POD_IP}:{} (1×)", listeners.tcp.port())),
        "{}",
        missed.stderr
    );

    // A file that is not a recording is refused up front.
    std::fs::write(files.path("bad.json"), r#"{"format": "x"}"#).unwrap();
    let bad = files.check(&["--replay", "bad.json"]);
    assert_eq!(bad.code, 1, "{}{}", bad.stdout, bad.stderr);
    assert!(
        bad.stderr.contains("not a probe recording"),
        "{}",
        bad.stderr
    );
}

/// The numbers of a `--bench` row: p50, p99, min, max (ms).
fn bench_row(run: &Run, port: &str) -> [f64; 4] {
    let bench = run
        .stdout
        .split_once("\nbench: ")
        .unwrap_or_else(|| panic!("no bench section in:\n{}\n{}", run.stdout, run.stderr))
        .1;
    let line = bench
        .lines()
        .find(|l| l.split_whitespace().next() == Some(port))
        .unwrap_or_else(|| panic!("no bench row for {port} in:\n{bench}"));
    let numbers: Vec<f64> = line
        .split_whitespace()
        .skip(3)
        .map(|n| n.parse().unwrap_or_else(|_| panic!("{line}")))
        .collect();
    numbers.try_into().unwrap_or_else(|_| panic!("{line}"))
}

/// `ms` after `what ` in a module line: `compile 312.2 ms`.
fn module_ms(line: &str, what: &str) -> f64 {
    let rest = line
        .split_once(&format!("{what} "))
        .unwrap_or_else(|| panic!("no {what} in {line}"))
        .1;
    rest.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {what} in {line}"))
}

#[test]
fn bench_prints_p50_and_p99_per_decision_and_the_module_costs() {
    if !in_test_netns("check_replay::bench_prints_p50_and_p99_per_decision_and_the_module_costs") {
        return;
    }
    let listeners = Listeners::start();
    let files = Files::new(listeners.http.port(), listeners.tcp.port());
    let run = files.check(&["--bench", "50"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    // The verdict table is still there ...
    assert_eq!(run.verdict("http").0, "include", "{}", run.stdout);
    assert_eq!(run.verdict("admin").0, "include", "{}", run.stdout);
    // ... the probes really happened, once for the table and 50 times more ...
    assert_eq!(listeners.http_requests.load(Ordering::SeqCst), 51);
    // ... and every decision has plausible numbers.
    assert!(
        run.stdout.contains("bench: 50 runs of each decision") && run.stdout.contains("P99 (ms)"),
        "{}",
        run.stdout
    );
    for port in ["http", "admin"] {
        let [p50, p99, min, max] = bench_row(&run, port);
        assert!(
            0.0 < min && min <= p50 && p50 <= p99 && p99 <= max && max < 2000.0,
            "{port}: p50 {p50} p99 {p99} min {min} max {max}\n{}",
            run.stdout
        );
    }
    for module in ["ready-role.wasm", "admin-check.wasm"] {
        let line = run
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("module {module} ")))
            .unwrap_or_else(|| panic!("no line for {module} in:\n{}", run.stdout));
        let (compile, cached, instantiate) = (
            module_ms(line, "compile"),
            module_ms(line, "cached load"),
            module_ms(line, "instantiate"),
        );
        // Loading compiled code is what the cache is for: far cheaper.
        assert!(
            0.0 < cached && cached < compile && 0.0 < instantiate && instantiate < compile,
            "{line}"
        );
    }
    // Only the modules the expression runs.
    assert_eq!(
        run.stdout
            .lines()
            .filter(|l| l.starts_with("module "))
            .count(),
        2,
        "{}",
        run.stdout
    );

    // Replayed, the benchmark needs no network and the file's answers
    // repeat: the table and a bench row for each decision, no misses.
    let recorded = files.check(&["--record", "probes.json"]);
    assert_eq!(recorded.code, 0, "{}{}", recorded.stdout, recorded.stderr);
    drop(listeners);
    let replayed = files.check(&["--replay", "probes.json", "--bench", "20"]);
    assert_eq!(replayed.code, 0, "{}{}", replayed.stdout, replayed.stderr);
    assert_eq!(replayed.table(), recorded.table());
    assert!(
        replayed.stdout.contains("probes replayed"),
        "{}",
        replayed.stdout
    );
    for port in ["http", "admin"] {
        let [p50, p99, ..] = bench_row(&replayed, port);
        assert!(0.0 < p50 && p50 <= p99, "{}", replayed.stdout);
    }
}
