//! Bad config files are rejected at start by the real binary, with a
//! non-zero exit and a message that names the offending field's path.
//!
//! These run the binary only; they need no control plane (KUBECONFIG points
//! at an unreachable apiserver unless the test command exported one), so a
//! config error must be reported before portwise talks to the cluster.

use std::time::Duration;

use anyhow::{Result, ensure};
use portwise_tests::*;

const GOOD: &str = "managedBy: portwise\nserviceKey: {annotation: example.com/group}\n";

/// Runs `portwise run --config FILE` and requires a quick non-zero exit
/// whose output contains every one of `needles`.
async fn rejected(config: impl AsRef<str>, needles: &[&str]) -> Result<()> {
    let config = config.as_ref();
    let out = run_binary_to_exit(
        &["run", "--config", "{config}"],
        config,
        Duration::from_secs(20),
    )
    .await?;
    let text = format!("{}{}", out.stderr, out.stdout);
    ensure!(
        !out.timed_out,
        "portwise kept running with a bad config:\n{config}\noutput:\n{text}"
    );
    ensure!(
        out.code.is_some_and(|c| c != 0),
        "exit code {:?} for a bad config:\n{config}\noutput:\n{text}",
        out.code
    );
    for n in needles {
        ensure!(
            text.contains(n),
            "the error does not name `{n}`:\n{text}\nconfig:\n{config}"
        );
    }
    Ok(())
}

macro_rules! bad_config {
    ($($name:ident: $config:expr => [$($needle:expr),+ $(,)?];)+) => {$(
        #[tokio::test]
        async fn $name() -> Result<()> {
            rejected($config, &[$($needle),+]).await
        }
    )+};
}

bad_config! {
    unknown_top_level_key: format!("{GOOD}membership: podReady\nresyncPeriodd: 2s\n") => ["resyncPeriodd"];
    max_endpoints_too_large: format!("{GOOD}maxEndpointsPerSlice: 1001\n") => ["maxEndpointsPerSlice"];
    max_endpoints_zero: format!("{GOOD}maxEndpointsPerSlice: 0\n") => ["maxEndpointsPerSlice"];
    max_concurrent_checks_zero: format!("{GOOD}maxConcurrentChecks: 0\n") => ["maxConcurrentChecks"];
    bad_resync_duration: format!("{GOOD}resyncPeriod: soon\n") => ["resyncPeriod"];
    bad_probe_timeout: format!(
        "{GOOD}membership:\n  perPort:\n    ports:\n      http:\n        httpGet: {{path: /healthz, timeout: forever}}\n"
    ) => ["membership.perPort.ports.http.httpGet.timeout"];
    unknown_probe_field: format!(
        "{GOOD}membership:\n  perPort:\n    ports:\n      http:\n        httpGet: {{path: /healthz, timeout: 1s, retries: 3}}\n"
    ) => ["membership.perPort.ports.http.httpGet", "retries"];
    unknown_checker: format!("{GOOD}membership:\n  all: [podReady, {{bogus: {{}}}}]\n") => ["membership.all", "bogus"];
    checker_map_with_two_keys: format!("{GOOD}membership: {{not: podReady, all: []}}\n") => ["membership"];
    stable_zero_threshold: format!(
        "{GOOD}membership: {{stable: {{checker: podReady, successThreshold: 0, failureThreshold: 3}}}}\n"
    ) => ["membership.stable.successThreshold"];
    service_key_both_kinds: "managedBy: portwise\nserviceKey: {label: a.example.com/g, annotation: b.example.com/g}\n"
        => ["serviceKey"];
    service_key_missing: "managedBy: portwise\nmembership: podReady\n" => ["serviceKey"];
    native_managed_by: "managedBy: endpointslice-controller.k8s.io\nserviceKey: {annotation: example.com/group}\n"
        => ["managedBy"];
    invalid_label_key: "managedBy: portwise\nserviceKey: {annotation: 'not a key!'}\n" => ["serviceKey.annotation"];
    wrong_type: format!("{GOOD}nativeCleanup: sometimes\n") => ["nativeCleanup"];
    port_names_without_key: format!("{GOOD}membership: {{portNames: {{}}}}\n") => ["membership.portNames"];
}

/// The good base config is accepted: the same binary does not exit at once
/// (it would go on to connect to the cluster).
#[tokio::test]
async fn good_config_is_accepted() -> Result<()> {
    // A key nothing else uses: against a real cluster it runs for 3s.
    let config = "managedBy: portwise-config-test\n\
                  serviceKey: {annotation: config-test.portwise.test/none}\n\
                  membership: podReady\n";
    let out = run_binary_to_exit(
        &["run", "--config", "{config}"],
        config,
        Duration::from_secs(3),
    )
    .await?;
    let text = format!("{}{}", out.stderr, out.stdout);
    // Accepted means: still running when the time was up, having started
    // the controller, and no configuration error on the way.
    ensure!(
        out.timed_out,
        "portwise exited ({:?}) with a good config:\n{text}",
        out.code
    );
    ensure!(
        text.contains("portwise controller starting"),
        "the controller never started with a good config:\n{text}"
    );
    ensure!(
        !text.contains("invalid configuration"),
        "a good config was reported as bad:\n{text}"
    );
    Ok(())
}

/// A missing file is an error naming the file.
#[tokio::test]
async fn missing_config_file() -> Result<()> {
    let out = run_binary_to_exit(
        &["run", "--config", "/nonexistent/portwise.yaml"],
        "",
        Duration::from_secs(20),
    )
    .await?;
    let text = format!("{}{}", out.stderr, out.stdout);
    ensure!(
        out.code.is_some_and(|c| c != 0),
        "exit {:?}: {text}",
        out.code
    );
    ensure!(text.contains("/nonexistent/portwise.yaml"), "{text}");
    Ok(())
}
