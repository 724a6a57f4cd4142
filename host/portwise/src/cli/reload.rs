//! The config file, read again when it changes (issue 48): a mounted
//! ConfigMap changes by the kubelet's swap of the `..data` symlink, so the
//! file's directory is watched (the modules directory's watch,
//! `portwise_supply::watch`, with its debounce and its periodic look in
//! case an event was missed) and the file is read whole each time.
//!
//! Why a new file is checked here exactly as at start: a file that would
//! not start portwise must not replace one that runs. A refused file is
//! logged, counted (`portwise_config_last_reload_successful` 0) and raised
//! as a Warning Event on portwise's own Pod; the running config keeps
//! running, and what it published stays.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use portwise_core::config::Config;

use super::run::RunArgs;

/// Each item: the config file's directory may have changed.
pub(super) fn changes(path: &Path) -> anyhow::Result<UnboundedReceiver<()>> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let (watch, rescans) = portwise_supply::watch::watch(&dir)
        .with_context(|| format!("cannot watch {} for config changes", dir.display()))?;
    let (tx, rx) = unbounded_channel();
    std::thread::Builder::new()
        .name("config-watch".into())
        .spawn(move || {
            let _watch = watch;
            for () in rescans {
                if tx.send(()).is_err() {
                    return;
                }
            }
        })
        .context("cannot start the config watch")?;
    Ok(rx)
}

/// The config at `args.config`, checked as `portwise run` checks it at
/// start: parsed and validated, its guests within the container's memory,
/// its checks within `--check-timeout`.
pub(super) fn load(args: &RunArgs, call_timeout: Duration) -> anyhow::Result<Config> {
    let invalid = || format!("invalid configuration {}", args.config.display());
    let config = Config::load(&args.config).with_context(invalid)?;
    super::budget::check(
        &config,
        &super::run::runtime_limits(&config, args),
        super::budget::container_memory_limit(),
    )
    .with_context(invalid)?;
    config
        .check_timeout(args.check_timeout, call_timeout)
        .with_context(invalid)?;
    Ok(config)
}

/// Raises a Warning Event on portwise's own Pod (when POD_NAME and
/// POD_NAMESPACE say which) for a refused config.
pub(super) async fn report_refused(client: &kube::Client, managed_by: &str, why: &str) {
    use kube::runtime::events::{Event, Recorder, Reporter};
    use portwise_controller::Reason;
    let (Ok(name), Ok(ns)) = (std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE")) else {
        return;
    };
    let pod = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name),
        namespace: Some(ns),
        ..Default::default()
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: managed_by.to_owned(),
            instance: None,
        },
    );
    let event = Event {
        type_: Reason::ConfigReloadFailed.event_type(),
        reason: Reason::ConfigReloadFailed.as_str().into(),
        note: Some(why.chars().take(1000).collect()),
        action: "ReloadConfig".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &pod).await {
        tracing::debug!(error = %e, "could not publish the config Event");
    }
}
