//! deploy/helm/files/rules.yaml, portwise's alerts, checked and unit-tested
//! by Prometheus' own promtool (built from its Go module by
//! tests/promtool/build, cached by version): `promtool check rules` accepts
//! them, and `promtool test rules` runs rules.test.yaml, where every alert
//! fires on a series that should fire it and none fires on a healthy pair
//! of replicas. A broken rule must fail it, so the test also runs the unit
//! tests against a copy with a threshold changed. That the metrics the
//! rules and the dashboard name exist is checked against a running portwise
//! (ship::metrics).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use portwise_tests::built_tool;

use super::support::repo;

fn files() -> PathBuf {
    repo().join("deploy/helm/files")
}

/// promtool's exit status and what it printed.
fn promtool(dir: &Path, args: &[&str]) -> Result<(bool, String)> {
    let bin = built_tool("tests/promtool/build")?;
    let out = Command::new(&bin)
        .args(args)
        .current_dir(dir)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["promtool"],
        "ship::alerts::promtool_accepts_the_rules_and_their_unit_tests_pass",
    ) {
        return Ok(());
    }
    let (ok, text) = promtool(&files(), &["check", "rules", "rules.yaml"])?;
    ensure!(ok, "promtool check rules refused rules.yaml:\n{text}");
    // Counted from the file, so that a new alert needs no edit here; promtool
    // must have read every one of them.
    let rules = std::fs::read_to_string(files().join("rules.yaml"))?;
    let alerts = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    ensure!(
        text.contains(&format!("SUCCESS: {alerts} rules found")),
        "promtool did not find the {alerts} alerts of rules.yaml:\n{text}"
    );
    let (ok, text) = promtool(&files(), &["test", "rules", "rules.test.yaml"])?;
    ensure!(ok, "promtool test rules failed:\n{text}");
    ensure!(text.contains("SUCCESS"), "{text}");

    // The same tests on a stale-slices threshold 10 times too high: the
    // alert no longer fires where the test says it must.
    let broken = tempfile::Builder::new()
        .prefix("portwise-rules-")
        .tempdir()?;
    ensure!(rules.contains("> 300"), "the stale-slices threshold moved");
    std::fs::write(
        broken.path().join("rules.yaml"),
        rules.replace("> 300", "> 3000"),
    )?;
    std::fs::copy(
        files().join("rules.test.yaml"),
        broken.path().join("rules.test.yaml"),
    )?;
    let (ok, text) = promtool(broken.path(), &["test", "rules", "rules.test.yaml"])?;
    ensure!(!ok, "the unit tests passed on a broken rule:\n{text}");
    ensure!(text.contains("PortwiseServiceSlicesStale"), "{text}");
    Ok(())
}

/// Every alert of rules.yaml has a case in rules.test.yaml that expects it
/// to fire (promtool only checks the cases it is given).
#[test]
fn every_alert_has_a_firing_case() -> Result<()> {
    let rules = std::fs::read_to_string(files().join("rules.yaml"))?;
    let tests = std::fs::read_to_string(files().join("rules.test.yaml"))?;
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    ensure!(alerts.len() == 8, "alerts in rules.yaml: {alerts:?}");
    // A case is `alertname: X` followed by a non-empty exp_alerts list.
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    for alert in alerts {
        let fires = lines.windows(3).any(|w| {
            w[0] == format!("alertname: {alert}")
                && w[1] == "exp_alerts:"
                && w[2].starts_with("- exp_labels:")
        });
        ensure!(fires, "no case in rules.test.yaml expects {alert} to fire");
    }
    Ok(())
}
