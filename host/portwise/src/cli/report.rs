//! What `portwise run` reports about the WebAssembly runtime: module loads
//! and guest failures as metrics, module load failures as Events on
//! portwise's own Pod.

use std::{sync::Arc, time::Duration};

use kube::Client;
use tracing::info;

use portwise_wasm::WasmRuntime;

/// The task reporting module loads; [`ModuleReports::flush`] waits until
/// it has reported every load so far.
pub(super) struct ModuleReports {
    flush: tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>,
}

impl ModuleReports {
    /// Waits (at most `limit`) until every module event sent so far has been
    /// logged, counted and published.
    pub(super) async fn flush(&self, limit: Duration) {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        if self.flush.send(done_tx).await.is_ok()
            && tokio::time::timeout(limit, done_rx).await.is_err()
        {
            tracing::warn!("module Events not all published within {limit:?}");
        }
    }
}

/// Feeds the WebAssembly runtime's module loads and guest failures into the
/// metrics, and turns module load failures into Events on portwise's own Pod
/// (when POD_NAME/POD_NAMESPACE tell us which), so an operator sees why a
/// new module version is not serving.
pub(super) fn report_wasm(
    rt: Arc<WasmRuntime>,
    metrics: portwise_controller::metrics::Metrics,
    client: Client,
    managed_by: String,
) -> ModuleReports {
    use kube::runtime::events::{Event, Recorder, Reporter};
    use portwise_controller::Reason;
    use portwise_controller::metrics::ModuleLoad;
    use portwise_wasm::CompileSource;

    let pod_ref = match (std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE")) {
        (Ok(name), Ok(ns)) => Some(k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name),
            namespace: Some(ns),
            ..Default::default()
        }),
        _ => None,
    };
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: managed_by,
            instance: None,
        },
    );
    let mut events = rt.subscribe();
    // Loads that happened while the runtime started, before we listened.
    for info in rt.modules() {
        let result = match info.compiled {
            CompileSource::Cached => ModuleLoad::Cached,
            CompileSource::Compiled => ModuleLoad::Compiled,
        };
        metrics.guests.count_load(&info.module, result);
    }
    let m = metrics.clone();
    let (flush_tx, mut flush_rx) =
        tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>(1);
    tokio::spawn(async move {
        use tokio::sync::broadcast::error::{RecvError, TryRecvError};
        // A flush request is answered once every event already sent is
        // handled: those are in the channel by then, so draining it is
        // enough.
        let mut flushing: Option<tokio::sync::oneshot::Sender<()>> = None;
        loop {
            let ev = if flushing.is_some() {
                match events.try_recv() {
                    Ok(ev) => Ok(ev),
                    Err(TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                    Err(TryRecvError::Empty | TryRecvError::Closed) => {
                        if let Some(done) = flushing.take() {
                            let _ = done.send(());
                        }
                        continue;
                    }
                }
            } else {
                tokio::select! {
                    ev = events.recv() => ev,
                    Some(done) = flush_rx.recv() => {
                        flushing = Some(done);
                        continue;
                    }
                }
            };
            let ev = match ev {
                Ok(ev) => ev,
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        "module events came faster than they were reported"
                    );
                    continue;
                }
                Err(RecvError::Closed) => break,
            };
            let result = match (ev.ok, ev.compiled) {
                (false, _) => ModuleLoad::Failed,
                (true, Some(CompileSource::Cached)) => ModuleLoad::Cached,
                (true, _) => ModuleLoad::Compiled,
            };
            m.guests.count_load(&ev.module, result);
            if ev.ok {
                info!(module = %ev.module, "{}", ev.message);
                continue;
            }
            tracing::warn!(module = %ev.module, "{}", ev.message);
            if let Some(r) = &pod_ref {
                let note = Event {
                    type_: Reason::ModuleLoadFailed.event_type(),
                    reason: Reason::ModuleLoadFailed.as_str().into(),
                    note: Some(ev.message.chars().take(1000).collect()),
                    action: "LoadModule".into(),
                    secondary: None,
                };
                if let Err(e) = recorder.publish(&note, r).await {
                    tracing::debug!(error = %e, "could not publish module Event");
                }
            }
        }
    });
    // Guest failures and dropped log lines are atomics in the runtime,
    // read at every scrape.
    let drops = rt.clone();
    metrics
        .guests
        .read_log_drops(move || drops.log_lines_dropped());
    read_guest_failures(&metrics, rt);
    ModuleReports { flush: flush_tx }
}

/// Makes `portwise_guest_failures_total` read `rt`'s failure counters at
/// scrape time, with the runtime's kinds mapped to the metric's labels.
fn read_guest_failures(metrics: &portwise_controller::metrics::Metrics, rt: Arc<WasmRuntime>) {
    use portwise_controller::metrics::GuestFailure;
    use portwise_wasm::FailureKind;
    metrics.guests.read_failures(move || {
        rt.failures()
            .into_iter()
            .map(|f| {
                let kind = match f.kind {
                    FailureKind::Load | FailureKind::Config => GuestFailure::Load,
                    FailureKind::Trap => GuestFailure::Trap,
                    FailureKind::Deadline => GuestFailure::Deadline,
                    FailureKind::Memory => GuestFailure::Memory,
                    FailureKind::InvalidAnswer => GuestFailure::Invalid,
                    FailureKind::DeniedProbe => GuestFailure::Denied,
                };
                (f.module, kind, f.count)
            })
            .collect()
    });
}

#[cfg(test)]
mod tests {
    use portwise_wasm::{Limits, WasmConfig};

    use super::*;

    #[tokio::test]
    async fn guest_failures_metric_reads_the_runtimes_counters_at_scrape_time() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.wasm");
        std::fs::write(&bad, b"not a component").unwrap();
        let rt = Arc::new(
            WasmRuntime::new(WasmConfig {
                supply: Arc::new(portwise_supply::Supplier),
                oci: Default::default(),
                probes: Default::default(),
                modules_dir: None,
                expressions: None,
                cache_dir: None,
                watch: false,
                limits: Limits::default(),
            })
            .await
            .unwrap(),
        );
        let metrics = portwise_controller::metrics::Metrics::new();
        read_guest_failures(&metrics, rt.clone());
        let series = |text: &str, kind: &str| {
            let prefix =
                format!(r#"portwise_guest_failures_total{{module="bad.wasm",kind="{kind}"}} "#);
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_string))
        };
        assert_eq!(series(&metrics.encode(), "load"), None);
        // A load failure is counted by the runtime (kind `load`) ...
        rt.load_file(&bad).await.unwrap_err();
        rt.load_file(&bad).await.unwrap_err();
        // ... and the next scrape sees it, with the zeros of the other kinds.
        let text = metrics.encode();
        assert_eq!(series(&text, "load").as_deref(), Some("2"), "{text}");
        assert_eq!(series(&text, "trap").as_deref(), Some("0"), "{text}");
        assert!(
            text.contains("# TYPE portwise_guest_failures counter\n"),
            "{text}"
        );
    }
}
