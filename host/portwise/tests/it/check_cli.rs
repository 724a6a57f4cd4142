//! `portwise check`, the command users try a checker with before deploying
//! it: the built binary, run on Pod and Service files, with built-in
//! expressions, a config file and a WebAssembly guest. No probes here (they
//! would need a network namespace; the probes themselves are tested in
//! `tests/tests/it/probes.rs`), so nothing leaves this process but files.

// The WebAssembly tests' fixtures (where the built guests are).

use std::process::Command;

use crate::common::guests_dir;

const SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  ports:
  - {name: http, port: 80, targetPort: http}
  - {name: admin, port: 81, targetPort: admin}
"#;

fn pod(ip: &str, ready: bool, annotations: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: web-0, namespace: default, annotations: {{{annotations}}}}}
spec:
  containers:
  - name: app
    image: app
    ports: [{{name: http, containerPort: 18080}}, {{name: admin, containerPort: 18081}}]
status:
  phase: Running
  podIP: {ip}
  podIPs: [{{ip: {ip}}}]
  conditions: [{{type: Ready, status: "{}"}}]
"#,
        if ready { "True" } else { "False" }
    )
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `portwise check` on the given pod (and the fixed Service) plus `args`.
fn check(pod_yaml: &str, args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pod.yaml"), pod_yaml).unwrap();
    std::fs::write(dir.path().join("svc.yaml"), SERVICE).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_portwise"))
        .arg("check")
        .args(["--pod", "pod.yaml", "--service", "svc.yaml"])
        .args(args)
        .current_dir(dir.path())
        .env("PORTWISE_CACHE_DIR", dir.path().join("cache"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("run portwise check");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// The verdict column of the row for `port`.
fn verdict<'a>(run: &'a Run, port: &str) -> &'a str {
    run.stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(port))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap_or_else(|| panic!("no row for {port} in:\n{}\n{}", run.stdout, run.stderr))
}

#[test]
fn built_in_expressions_give_one_verdict_per_port() {
    let ready = pod("10.244.0.10", true, "example.com/ports: admin");
    let run = check(&ready, &["--expr", "podReady"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(verdict(&run, "http"), "include");
    assert_eq!(verdict(&run, "admin"), "include");
    assert!(
        run.stdout.contains("10.244.0.10:18080") && run.stdout.contains("10.244.0.10:18081"),
        "named target ports not resolved:\n{}",
        run.stdout
    );

    // Per port: the annotation lists only admin.
    let run = check(
        &ready,
        &[
            "--expr",
            "{all: [podReady, {portNames: {annotation: example.com/ports}}]}",
        ],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(verdict(&run, "http"), "exclude");
    assert_eq!(verdict(&run, "admin"), "include");

    let unready = pod("10.244.0.10", false, "");
    let run = check(&unready, &["--expr", "podReady"]);
    assert_eq!(verdict(&run, "http"), "exclude");
}

#[test]
fn a_config_file_supplies_the_expression() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("portwise.yaml");
    std::fs::write(
        &config,
        "serviceKey: {annotation: example.com/group}\n\
         membership: {not: {portNames: {annotation: example.com/drain}}}\n",
    )
    .unwrap();
    let run = check(
        &pod("10.244.0.10", true, "example.com/drain: http"),
        &["--config", config.to_str().unwrap()],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(verdict(&run, "http"), "exclude");
    assert_eq!(verdict(&run, "admin"), "include");
}

#[test]
fn bad_input_is_named_and_fails() {
    let ready = pod("10.244.0.10", true, "");
    let run = check(&ready, &["--expr", "{podReddy: {}}"]);
    assert_ne!(run.code, 0, "a misspelt checker was accepted");
    assert!(
        run.stderr.contains("podReddy"),
        "the error does not name the bad checker:\n{}",
        run.stderr
    );

    let run = check("kind: Pod\nspec: 12\n", &["--expr", "podReady"]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains("pod.yaml"),
        "the error does not name the bad file:\n{}",
        run.stderr
    );
}

/// The controller's candidate rules apply unchanged, and a loopback address
/// (the usual first try on a laptop) gets a message that says why.
#[test]
fn loopback_pods_are_not_candidates_and_the_message_says_why() {
    let run = check(&pod("127.0.0.1", true, ""), &["--expr", "podReady"]);
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("not a candidate") && run.stdout.contains("127.0.0.1"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("loopback"), "{}", run.stdout);
    // Named once, though the pod lists it as podIP and in podIPs.
    assert_eq!(run.stdout.matches("127.0.0.1").count(), 1, "{}", run.stdout);
}

#[test]
fn a_webassembly_guest_runs_with_its_config() {
    let module = guests_dir().join("admin-check.wasm");
    assert!(
        module.is_file(),
        "{} is missing: run guests/build first (or set PORTWISE_GUESTS_DIR)",
        module.display()
    );
    let module = module.to_str().unwrap();
    // Marked pods are included without a probe.
    let run = check(
        &pod("10.244.0.10", true, "example.com/admin: \"yes\""),
        &[
            "--wasm",
            module,
            "--wasm-config",
            r#"{"key": "example.com/admin"}"#,
        ],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(verdict(&run, "http"), "include");
    assert_eq!(verdict(&run, "admin"), "include");

    // The guest rejects an unknown key at load time, and check says so.
    let run = check(
        &pod("10.244.0.10", true, ""),
        &["--wasm", module, "--wasm-config", r#"{"kee": "x"}"#],
    );
    assert_ne!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("kee"),
        "the guest's rejection is not shown:\n{}",
        run.stderr
    );
}
