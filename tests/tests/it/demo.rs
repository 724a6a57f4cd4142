//! `./demo` as a smoke test: the demo program checks every table it prints
//! against what the seed example promises and exits non-zero otherwise, so
//! running it here keeps the README's first command working. Under the
//! suite it reuses the suite's control plane (`PORTWISE_TEST_KUBECONFIG`)
//! and namespace; alone, it starts its own (inside `tests/netns`).

use std::process::Command;

use anyhow::{Context, Result, ensure};

#[test]
fn demo_shows_the_whole_story() -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_demo"))
        .output()
        .context("running the demo program")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shown = format!("---- stdout ----\n{stdout}\n---- stderr ----\n{stderr}");
    ensure!(
        out.status.success(),
        "demo exited with {}\n{shown}",
        out.status
    );
    for expected in [
        "slices converged in",
        "b left http's slice in",
        "demo passed in",
    ] {
        ensure!(
            stdout.contains(expected),
            "no {expected:?} in the demo's output\n{shown}"
        );
    }
    // Two tables (before and after), one row per slice, and each pod in
    // one row of each: one slice per pod and family, listing every port it
    // backs (the native controller's layout).
    let rows = |pod: &str| {
        stdout
            .lines()
            .filter(|l| l.contains("  IPv4  ") && l.contains(&format!(" {pod} 10.244.")))
            .count()
    };
    for pod in ["a", "b", "c", "d"] {
        ensure!(
            rows(pod) == 2,
            "expected pod {pod} in 2 slice rows, got {}\n{shown}",
            rows(pod)
        );
    }
    ensure!(
        stdout.contains("http 8080, https 8443"),
        "no slice lists both http and https\n{shown}"
    );
    // Who answered through the ClusterIP, before and after b turned
    // unhealthy: kube-proxy routes http to b only before.
    let http_rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("http ") && l.contains("answered by:"))
        .collect();
    ensure!(
        http_rows.len() == 2,
        "expected 2 traffic rows for http, got {http_rows:?}\n{shown}"
    );
    ensure!(
        http_rows[0].contains("b x") && !http_rows[1].contains("b x"),
        "b should answer http before and not after: {http_rows:?}\n{shown}"
    );
    // Every pick kube-proxy makes reaches a pod that serves the port: a
    // member that refuses reads as broken to someone trying portwise.
    let unanswered: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("answered by:") && (l.contains("refused") || l.contains("failed")))
        .collect();
    ensure!(
        unanswered.is_empty(),
        "connections went unanswered: {unanswered:?}\n{shown}"
    );
    Ok(())
}
