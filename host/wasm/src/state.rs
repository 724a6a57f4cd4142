//! The state behind one `Store`: what every WIT version's host side reads
//! and writes, whichever version the guest was built against.
//!
//! The pieces it holds have files of their own: the probe policy
//! ([`crate::authorize`]) and the probes themselves ([`crate::probes`]),
//! WASI ([`crate::wasi`]), the memory limit ([`crate::limiter`]) and the
//! guest's stdout and stderr ([`crate::capture`]). What a version adds (its
//! bindings and trait impls) is in `v0_1/` and `v0_2/`.

use std::{collections::BTreeSet, net::IpAddr, sync::Arc, time::Instant};

use k8s_openapi::{
    api::core::v1::{Pod, Service},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::{
    CallLimits, Limits,
    capture::Capture,
    failures::ModuleCounters,
    limiter::MemoryLimiter,
    log_rate::{Admit, BURST, RATE},
    replay::ProbeMode,
};
use portwise_core::text::truncate;

/// Longest log line a guest can emit through `log` (bytes).
const MAX_LOG_LINE: usize = 1024;
/// Log lines a guest can emit per call; the rest are counted and dropped.
const MAX_LOG_LINES_PER_CALL: u32 = 32;

/// Who is calling and about what: attached to the guest's log lines. Holds
/// references rather than formatted names, since most calls log nothing.
#[derive(Clone, Debug, Default)]
pub(crate) struct CallLabels {
    pub module: Arc<str>,
    /// Absent during validate-config.
    pub service: Option<Arc<Service>>,
    pub pod: Option<Arc<Pod>>,
    /// Service port name, or number when unnamed.
    pub port: String,
}

impl CallLabels {
    pub(crate) fn service(&self) -> Named<'_> {
        Named(self.service.as_deref().map(|s| &s.metadata))
    }

    pub(crate) fn pod(&self) -> Named<'_> {
        Named(self.pod.as_deref().map(|p| &p.metadata))
    }
}

/// `namespace/name` of an object, formatted only when logged.
pub(crate) struct Named<'a>(Option<&'a ObjectMeta>);

impl std::fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(m) => write!(
                f,
                "{}/{}",
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default()
            ),
            None => Ok(()),
        }
    }
}

/// Per-call state, reset before every call on a (possibly reused) instance.
#[derive(Debug)]
pub(crate) struct CallState {
    /// The address probes may reach; `None` during validate-config.
    pub address: Option<IpAddr>,
    /// The ports they may reach there; `None`: any. A `hostNetwork` pod's
    /// address is its Node's ([`portwise_core::align::probe_ports`]).
    pub ports: Option<BTreeSet<u16>>,
    pub labels: CallLabels,
    /// The guest's compute deadline. Probe time is added to it: the epoch
    /// deadline bounds the guest's own work, the call timeout bounds the
    /// whole call.
    pub compute_deadline: Instant,
    /// This call's expression's cap on probes.
    pub max_probes: u32,
    pub probes: u32,
    pub log_lines: u32,
    pub denied_probes: u32,
}

impl Default for CallState {
    fn default() -> Self {
        CallState {
            address: None,
            ports: None,
            labels: CallLabels::default(),
            compute_deadline: Instant::now(),
            max_probes: 0,
            probes: 0,
            log_lines: 0,
            denied_probes: 0,
        }
    }
}

/// The `T` of every `Store<T>`.
pub(crate) struct HostState {
    wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub limiter: MemoryLimiter,
    pub call: CallState,
    pub stdout: Capture,
    pub stderr: Capture,
    pub(crate) limits: Arc<Limits>,
    pub(crate) counters: Arc<ModuleCounters>,
    /// Live, recorded or replayed probes (`portwise check --record/--replay`).
    pub(crate) probes: ProbeMode,
}

impl HostState {
    /// A store's state; `memory_bytes` is its instance's memory limit (the
    /// expression's, or the runtime's default).
    pub(crate) fn new(
        limits: Arc<Limits>,
        counters: Arc<ModuleCounters>,
        memory_bytes: usize,
    ) -> Self {
        let stdout = Capture::new(limits.max_output_bytes);
        let stderr = Capture::new(limits.max_output_bytes);
        HostState {
            wasi: crate::wasi::context(&stdout, &stderr, memory_bytes),
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(memory_bytes),
            call: CallState::default(),
            stdout,
            stderr,
            limits,
            counters,
            probes: ProbeMode::Live,
        }
    }

    /// Where this store's probes go (live unless said otherwise).
    pub(crate) fn with_probes(mut self, probes: ProbeMode) -> Self {
        self.probes = probes;
        self
    }

    /// Resets the per-call state before a call.
    pub(crate) fn begin_call(
        &mut self,
        address: Option<IpAddr>,
        labels: CallLabels,
        limits: &CallLimits,
    ) {
        self.call = CallState {
            address: address.map(|ip| ip.to_canonical()),
            ports: None,
            labels,
            compute_deadline: Instant::now() + limits.deadline,
            max_probes: limits.max_probes_per_call,
            probes: 0,
            log_lines: 0,
            denied_probes: 0,
        };
        self.limiter.denied = None;
    }

    /// Writes what the guest printed during the call to the log, and
    /// returns the last lines of stderr (a panic message or the end of a
    /// traceback, typically) to quote in a failure reason.
    pub(crate) fn flush_output(&self) -> Option<String> {
        let mut tail: Vec<String> = Vec::new();
        let mut last_stderr: Option<String> = None;
        for (capture, stream) in [(&self.stdout, "stdout"), (&self.stderr, "stderr")] {
            let (bytes, dropped) = capture.take();
            if bytes.is_empty() && dropped == 0 {
                continue;
            }
            let text = String::from_utf8_lossy(&bytes);
            let l = &self.call.labels;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                if self.admit_log_line() {
                    tracing::info!(
                        target: "portwise_wasm::guest",
                        module = %l.module, service = %l.service(), pod = %l.pod(), port = %l.port, stream,
                        "{line}"
                    );
                }
                if stream == "stderr" {
                    if tail.len() == 3 {
                        tail.remove(0);
                    }
                    tail.push(line.trim().to_string());
                }
            }
            if dropped > 0 && self.admit_log_line() {
                tracing::info!(
                    target: "portwise_wasm::guest",
                    module = %l.module, stream, dropped,
                    "guest output truncated"
                );
            }
            if !tail.is_empty() {
                last_stderr = Some(truncate(tail.join(" | "), 300));
            }
        }
        last_stderr
    }

    /// The `pod-ready` import: the pod's Ready condition, or true when
    /// readiness yields to the Service's `publishNotReadyAddresses`, exactly
    /// as the built-in `podReady` decides. False during validate-config.
    pub(crate) fn call_pod_ready(&self) -> bool {
        let (Some(service), Some(pod)) = (&self.call.labels.service, &self.call.labels.pod) else {
            return false;
        };
        portwise_core::membership::facts::pod_ready_in(service, pod).decision
            == portwise_core::membership::Decision::Include
    }

    /// Whether the module may write one more line to the log now, by its
    /// rate ([`crate::log_rate`]); warns when it starts dropping.
    fn admit_log_line(&self) -> bool {
        match self.counters.log_rate.admit(Instant::now()) {
            Admit::Write => true,
            Admit::Drop => false,
            Admit::DropAndWarn(dropped) => {
                tracing::warn!(
                    target: "portwise_wasm::guest",
                    module = %self.call.labels.module, dropped,
                    "the module logs more than {RATE} lines a second (bursts of {BURST}): \
                     lines dropped since the last such warning; \
                     portwise_guest_log_lines_dropped_total counts them"
                );
                false
            }
        }
    }

    /// The guest's log line, capped in length and per call; the one
    /// implementation behind every WIT version's `log`.
    pub(crate) fn guest_log(&mut self, level: tracing::Level, message: String) {
        self.call.log_lines += 1;
        if self.call.log_lines > MAX_LOG_LINES_PER_CALL || !self.admit_log_line() {
            return;
        }
        let message = truncate(message, MAX_LOG_LINE);
        let l = &self.call.labels;
        macro_rules! emit {
            ($lvl:ident) => {
                tracing::$lvl!(
                    target: "portwise_wasm::guest",
                    module = %l.module, service = %l.service(), pod = %l.pod(), port = %l.port,
                    "{message}"
                )
            };
        }
        match level {
            tracing::Level::TRACE => emit!(trace),
            tracing::Level::DEBUG => emit!(debug),
            tracing::Level::INFO => emit!(info),
            tracing::Level::WARN => emit!(warn),
            _ => emit!(error),
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
