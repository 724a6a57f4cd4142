//! The starter templates (`guests/templates/<language>`), as a user's CI
//! would test them: the built binary runs `portwise check --wasm <template>
//! --replay <recording>` on the pod, Service and recordings committed in the
//! template's `testdata/`, with no listener anywhere (replayed probes send
//! nothing). The recordings were made by `guests/templates/record-testdata`
//! against real listeners; here they must give exactly the verdicts below,
//! and a changed recording must change them.
//!
//! The templates come from `guests/build` (`PORTWISE_GUESTS_DIR/templates/
//! <language>-template.wasm`); a missing one fails its test.

// The WebAssembly tests' fixtures (where the built guests are).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::common::guests_dir;
use serde_json::{Value, json};

const LABEL: &str = "app.example.com/serve";

/// The verdicts every template gives with `config-http.json` and its
/// recording: port 18080 answered 200, nothing listened on 18081, and 18082
/// accepted the connection but never answered.
const HTTP: [(&str, &str, &str); 3] = [
    (
        "http",
        "include",
        "label app.example.com/serve=yes, GET /healthz on port 18080: 200",
    ),
    (
        "admin",
        "exclude",
        "GET /healthz on port 18081: connection refused",
    ),
    ("slow", "abstain", "GET /healthz on port 18082: timeout"),
];

/// The same listeners with `config-tcp.json` (a TCP dial, no path).
const TCP: [(&str, &str, &str); 3] = [
    (
        "http",
        "include",
        "label app.example.com/serve=yes, TCP dial of port 18080: connected",
    ),
    (
        "admin",
        "exclude",
        "TCP dial of port 18081: connection refused",
    ),
    (
        "slow",
        "include",
        "label app.example.com/serve=yes, TCP dial of port 18082: connected",
    ),
];

struct Template {
    lang: &'static str,
    /// A directory holding only this template (`check --wasm` reads the
    /// module it names from the file's directory, no other).
    dir: tempfile::TempDir,
    module: PathBuf,
    testdata: PathBuf,
    /// The compiled-code cache, shared by this template's runs (Python
    /// compiles for seconds).
    cache: PathBuf,
}

impl Template {
    fn new(lang: &'static str) -> Self {
        let built = guests_dir()
            .join("templates")
            .join(format!("{lang}-template.wasm"));
        Self::of(lang, built)
    }

    /// The template `lang`'s testdata, judged with the component `built`.
    fn of(lang: &'static str, built: PathBuf) -> Self {
        assert!(
            built.is_file(),
            "{} is missing: run guests/build first (or set PORTWISE_GUESTS_DIR)",
            built.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("modules").join(built.file_name().unwrap());
        std::fs::create_dir_all(module.parent().unwrap()).unwrap();
        std::fs::copy(&built, &module).unwrap();
        let testdata = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../guests/templates")
            .join(lang)
            .join("testdata");
        let cache = dir.path().join("cache");
        Template {
            lang,
            dir,
            module,
            testdata,
            cache,
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.testdata.join(name)
    }

    fn read(&self, name: &str) -> String {
        let path = self.file(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Writes `text` to a scratch file and returns its path.
    fn scratch(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `portwise check --wasm <template> --wasm-config <config> --pod <pod>
    /// --service testdata/service.yaml` plus `args`.
    fn check(&self, config: &str, pod: &Path, args: &[&Path]) -> Run {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_portwise"));
        cmd.arg("check")
            .arg("--wasm")
            .arg(&self.module)
            .args(["--wasm-config", config])
            .arg("--pod")
            .arg(pod)
            .arg("--service")
            .arg(self.file("service.yaml"));
        let out = cmd
            .args(args)
            .current_dir(self.dir.path())
            .env("PORTWISE_CACHE_DIR", &self.cache)
            .env_remove("KUBECONFIG")
            .output()
            .expect("run portwise check");
        Run {
            what: format!("{} template", self.lang),
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        }
    }

    /// Replays `recording` with the committed config `config-<name>.json`.
    fn replay(&self, name: &str, pod: &Path, recording: &Path) -> Run {
        let config = self.read(&format!("config-{name}.json"));
        self.check(config.trim(), pod, &[Path::new("--replay"), recording])
    }

    fn recording(&self, name: &str) -> Value {
        serde_json::from_str(&self.read(&format!("probes-{name}.json"))).unwrap()
    }
}

struct Run {
    what: String,
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// (port, verdict, reason) per row of the table.
    fn rows(&self) -> Vec<(String, String, String)> {
        let mut lines = self.stdout.lines();
        let header = lines.next().unwrap_or_default();
        let reason_at = header.find("REASON").unwrap_or_else(|| {
            panic!("{}: no table:\n{}\n{}", self.what, self.stdout, self.stderr)
        });
        lines
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let mut cols = l.split_whitespace();
                let port = cols.next().unwrap_or_default().to_string();
                let verdict = cols.nth(2).unwrap_or_default().to_string();
                let reason = l.get(reason_at..).unwrap_or_default().trim().to_string();
                (port, verdict, reason)
            })
            .collect()
    }

    fn assert_rows(&self, want: &[(&str, &str, &str)]) {
        let want: Vec<_> = want
            .iter()
            .map(|(p, v, r)| (p.to_string(), v.to_string(), r.to_string()))
            .collect();
        assert_eq!(
            self.rows(),
            want,
            "{}: wrong verdicts:\n{}\n{}",
            self.what,
            self.stdout,
            self.stderr
        );
    }

    fn assert_code(&self, code: i32) {
        assert_eq!(
            self.code, code,
            "{}: exit {} (want {code}):\n{}\n{}",
            self.what, self.code, self.stdout, self.stderr
        );
    }
}

/// The recorded answer of the probe of `port` (in its recording's entry).
fn answer_of(recording: &mut Value, port: u16) -> &mut Value {
    recording["probes"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["port"] == json!(port))
        .unwrap_or_else(|| panic!("no probe of port {port} in the recording"))
        .get_mut("answer")
        .unwrap()
}

fn exercise(lang: &'static str) {
    let t = Template::new(lang);
    let pod = t.file("pod.yaml");

    // 1. The committed recordings give the committed tables, exactly, and
    //    the verdicts every template agrees on.
    for (name, want) in [("http", &HTTP), ("tcp", &TCP)] {
        let run = t.replay(name, &pod, &t.file(&format!("probes-{name}.json")));
        run.assert_code(0);
        run.assert_rows(want);
        assert_eq!(
            run.stdout,
            t.read(&format!("expected-{name}.txt")),
            "{lang}: the replayed table differs from testdata/expected-{name}.txt"
        );
    }

    // 2. A changed recording changes the verdicts: 18080 now answers 503,
    //    18082 answers 200 instead of timing out, 18081 times out.
    let mut changed = t.recording("http");
    *answer_of(&mut changed, 18080) =
        json!({"result": "response", "status": 503, "body": "", "truncated": false});
    *answer_of(&mut changed, 18081) = json!({"result": "timeout"});
    *answer_of(&mut changed, 18082) =
        json!({"result": "response", "status": 200, "body": "ok\n", "truncated": false});
    let changed = t.scratch("changed.json", &changed.to_string());
    let run = t.replay("http", &pod, &changed);
    run.assert_code(0);
    run.assert_rows(&[
        ("http", "exclude", "GET /healthz on port 18080: 503"),
        ("admin", "abstain", "GET /healthz on port 18081: timeout"),
        (
            "slow",
            "include",
            "label app.example.com/serve=yes, GET /healthz on port 18082: 200",
        ),
    ]);

    // 3. A probe the recording lacks is named on stderr and exits 4; the
    //    guest saw an I/O error for it (and excluded).
    let mut missing = t.recording("tcp");
    missing["probes"]
        .as_array_mut()
        .unwrap()
        .retain(|p| p["port"] != json!(18081));
    let missing = t.scratch("missing.json", &missing.to_string());
    let run = t.replay("tcp", &pod, &missing);
    run.assert_code(4);
    assert!(
        run.stderr.contains("TCP 10.244.0.10:18081"),
        "{lang}: the missing probe is not named:\n{}",
        run.stderr
    );
    let rows = run.rows();
    assert_eq!(rows[1].0, "admin");
    assert_eq!(rows[1].1, "exclude", "{lang}: {:?}", rows[1]);
    assert!(
        rows[1].2.contains("no recorded answer"),
        "{lang}: {:?}",
        rows[1]
    );

    // 4. Without the label the pod is excluded before any probe: an empty
    //    recording has nothing to miss.
    let unlabelled = t.read("pod.yaml").replace(&format!("{LABEL}: \"yes\""), "");
    assert!(
        !unlabelled.contains(LABEL),
        "{lang}: pod.yaml changed shape"
    );
    let unlabelled = t.scratch("unlabelled.yaml", &unlabelled);
    let empty = t.scratch(
        "empty.json",
        r#"{"format": "portwise-probe-recording", "version": 1, "probes": []}"#,
    );
    let run = t.replay("http", &unlabelled, &empty);
    run.assert_code(0);
    let no_label = format!("pod has no label {LABEL}");
    run.assert_rows(&[
        ("http", "exclude", &no_label),
        ("admin", "exclude", &no_label),
        ("slow", "exclude", &no_label),
    ]);

    // 5. An unknown config key is rejected at load time, by name.
    let run = t.check(
        r#"{"label": "app.example.com/serve", "lable": "x"}"#,
        &pod,
        &[Path::new("--replay"), &empty],
    );
    assert_ne!(run.code, 0, "{lang}: an unknown key was accepted");
    assert!(
        run.stderr.contains("lable"),
        "{lang}: the rejection does not name the key:\n{}",
        run.stderr
    );
}

#[test]
fn rust_template_replays_its_recordings() {
    exercise("rust");
}

#[test]
fn c_template_replays_its_recordings() {
    exercise("c");
}

#[test]
fn python_template_replays_its_recordings() {
    exercise("python");
}

#[test]
fn js_template_replays_its_recordings() {
    exercise("js");
}

#[test]
fn go_template_replays_its_recordings() {
    exercise("go");
}

/// A user's start, outside this repository: the Rust template and the
/// helper crate `portwise-guest` copied into a directory of their own, the
/// template's crates.io dependency patched to the copy (as guests/build
/// patches it to the checkout), built offline for wasm32-wasip2. The crate
/// carries its WIT and inherits nothing from a workspace, so the copy
/// builds; the component gives the committed recordings' verdicts. (The
/// crate as packaged, `cargo package`, and the template against it are
/// `ship::sdk` in the suite.)
#[test]
fn the_rust_template_builds_outside_the_repository() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let outside = tempfile::Builder::new()
        .prefix("my-checker-")
        .tempdir()
        .unwrap();
    let helper = outside.path().join("portwise-guest");
    copy_tree(&repo.join("guests/rust/portwise-guest"), &helper);
    let checker = outside.path().join("my-checker");
    copy_tree(&repo.join("guests/templates/rust"), &checker);
    let manifest = std::fs::read_to_string(checker.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("\nportwise-guest = \"0.2\"\n"),
        "the template no longer names portwise-guest by version:\n{manifest}"
    );
    let patch = format!(
        "patch.crates-io.portwise-guest.path={:?}",
        helper.display().to_string()
    );
    // A target directory of its own, kept between runs (only the copies
    // rebuild); inside the copy when no cache is configured.
    let target = std::env::var_os("PORTWISE_CACHE")
        .map(|c| PathBuf::from(c).join("guests-outside-target"))
        .unwrap_or_else(|| outside.path().join("target"));
    let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args([
            "build",
            "--release",
            "--offline",
            "--locked",
            "--target",
            "wasm32-wasip2",
            "--config",
            &patch,
        ])
        .current_dir(&checker)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("CARGO_BUILD_TARGET")
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "the copied template does not build outside the repository:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = target.join("wasm32-wasip2/release/my_checker.wasm");
    replays_the_recordings(&Template::of("rust", built));
}

/// The Go template outside this repository, against the helper module as
/// its tag publishes it: `guests/sdk/go-proxy` lays the module out as the
/// Go module proxy serves it, and the copied template, its `replace` line
/// dropped as its README says, resolves the helper from there alone
/// (`GOPROXY=file://…`, a module cache of its own). Built by the template's
/// own `build` with Go, wasm-tools and the adapter (no binding generator);
/// the component gives the committed recordings' verdicts.
#[test]
fn the_go_template_builds_outside_the_repository() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tools = std::env::var_os("PORTWISE_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/portwise/tools")
        });
    let wasm_tools = tools.join("bin/wasm-tools");
    let adapter = std::fs::read_dir(tools.join("adapter"))
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "wasm"))
        .unwrap_or_else(|| {
            panic!(
                "no preview1 adapter under {}: run guests/build go first",
                tools.display()
            )
        });
    assert!(
        wasm_tools.exists(),
        "{} is missing: run guests/build go first",
        wasm_tools.display()
    );
    let outside = tempfile::Builder::new()
        .prefix("my-go-checker-")
        .tempdir()
        .unwrap();
    let proxy = outside.path().join("proxy");
    let out = Command::new(repo.join("guests/sdk/go-proxy"))
        .arg(&proxy)
        .output()
        .expect("run guests/sdk/go-proxy");
    assert!(
        out.status.success(),
        "guests/sdk/go-proxy failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checker = outside.path().join("my-checker");
    copy_tree(&repo.join("guests/templates/go"), &checker);
    let go_mod = checker.join("go.mod");
    let text = std::fs::read_to_string(&go_mod).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("replace "))
        .collect();
    assert_eq!(
        text.lines().count() - kept.len(),
        1,
        "the template's go.mod should have one replace line, for this repository's build:\n{text}"
    );
    std::fs::write(&go_mod, kept.join("\n") + "\n").unwrap();
    let built = outside.path().join("my-checker.wasm");
    let out = Command::new(checker.join("build"))
        .arg(&built)
        .current_dir(outside.path())
        .env("WASM_TOOLS", &wasm_tools)
        .env("ADAPTER", &adapter)
        // The helper from the proxy directory and nowhere else; no checksum
        // database to ask (go.sum is written from what was fetched).
        .env("GOPROXY", format!("file://{}", proxy.display()))
        .env("GOSUMDB", "off")
        .env("GOFLAGS", "-mod=mod -modcacherw")
        .env("GOMODCACHE", outside.path().join("gomod"))
        .env_remove("GOWORK")
        .output()
        .expect("run the template's build");
    assert!(
        out.status.success(),
        "the copied Go template does not build from the published helper module:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What it was built from: the module proxy's copy, not the checkout.
    let sum = std::fs::read_to_string(checker.join("go.sum")).unwrap_or_default();
    assert!(
        sum.contains("github.com/portwise/portwise/guests/go v"),
        "go.sum does not pin the helper from the proxy:\n{sum}"
    );
    replays_the_recordings(&Template::of("go", built));
}

/// A component built from a copied template gives the committed
/// recordings' verdicts.
fn replays_the_recordings(t: &Template) {
    let pod = t.file("pod.yaml");
    for (name, want) in [("http", &HTTP), ("tcp", &TCP)] {
        let run = t.replay(name, &pod, &t.file(&format!("probes-{name}.json")));
        run.assert_code(0);
        run.assert_rows(want);
    }
}

/// Copies a directory tree (files and directories; no `target/`).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() != "target" {
                copy_tree(&src, &dst);
            }
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}
