//! What a guest can reach: the state behind one `Store`, and the host side
//! of the WIT imports (`probes`, `log`) and of WASI.
//!
//! The rule that matters: a guest's probes reach **only the address under
//! judgement**. Hosts are compared as parsed IP addresses (names are never
//! resolved), paths are checked before anything is sent, timeouts are capped
//! and so is the number of probes per call. WASI is linked only because
//! language runtimes import it: no preopened directories, no environment, no
//! arguments, no sockets, no name lookups; stdout and stderr go to a bounded
//! buffer that the caller drains into the log after each call.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use k8s_openapi::{
    api::core::v1::{Pod, Service},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder, component::ResourceTable};
use wasmtime_wasi::{
    WasiCtx, WasiCtxView, WasiView,
    cli::{IsTerminal, StdoutStream},
    p2::{OutputStream, Pollable, StreamResult},
};

use crate::bindings::{
    HttpRequest, WitHttpResponse, WitLevel, WitProbeError,
    v01::portwise::membership::{log, probes, types},
};
use crate::{
    CallLimits, Limits, failures::FailureKind, failures::ModuleCounters,
    probe_failure::ProbeFailure, replay::ProbeMode,
};
use portwise_core::text::truncate;
use portwise_probe as probe;

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
    limits: Arc<Limits>,
    counters: Arc<ModuleCounters>,
    /// Live, recorded or replayed probes (`portwise check --record/--replay`).
    probes: ProbeMode,
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
        let mut wasi = WasiCtx::builder();
        // The builder starts empty (no args, env, preopens, stdin); say the
        // network part out loud since it is the part that matters.
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .stdout(stdout.stream())
            .stderr(stderr.stream());
        HostState {
            wasi: wasi.build(),
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
                tracing::info!(
                    target: "portwise_wasm::guest",
                    module = %l.module, service = %l.service(), pod = %l.pod(), port = %l.port, stream,
                    "{line}"
                );
                if stream == "stderr" {
                    if tail.len() == 3 {
                        tail.remove(0);
                    }
                    tail.push(line.trim().to_string());
                }
            }
            if dropped > 0 {
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

    /// Decides where a probe may go, or why not.
    fn authorize(&mut self, host: &str, port: u16) -> Result<SocketAddr, String> {
        let Some(address) = self.call.address else {
            return Err("probes are not available during validate-config".into());
        };
        if port == 0 {
            return Err("port 0".into());
        }
        self.call.probes += 1;
        if self.call.probes > self.call.max_probes {
            return Err(format!(
                "more than {} probes in one call",
                self.call.max_probes
            ));
        }
        if let Some(ports) = &self.call.ports
            && !ports.contains(&port)
        {
            let allowed: Vec<String> = ports.iter().map(u16::to_string).collect();
            return Err(format!(
                "{address} is a hostNetwork pod's, its Node's: probes may reach only the ports \
                 its Service resolves there ({}), not {port}",
                allowed.join(", ")
            ));
        }
        if host.is_empty() {
            return Ok(SocketAddr::new(address, port));
        }
        // Accept the bracketed IPv6 form too; never resolve names.
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        match literal.parse::<IpAddr>() {
            Ok(ip) if ip.to_canonical() == address => Ok(SocketAddr::new(address, port)),
            Ok(ip) => Err(format!(
                "probes may reach only the address under judgement ({address}), not {ip}"
            )),
            Err(_) => Err(format!(
                "host {host:?} is not an IP address (names are never resolved)"
            )),
        }
    }

    fn deny(&mut self, why: String) -> ProbeFailure {
        self.call.denied_probes += 1;
        self.counters.fail(FailureKind::DeniedProbe);
        let l = &self.call.labels;
        tracing::warn!(
            target: "portwise_wasm::guest",
            module = %l.module, service = %l.service(), pod = %l.pod(), port = %l.port,
            "probe denied: {why}"
        );
        ProbeFailure::Denied(why)
    }

    fn timeout(&self, timeout_ms: u32) -> Duration {
        let cap = self.limits.probe_timeout_cap;
        // 0 means "the host's cap".
        if timeout_ms == 0 {
            cap
        } else {
            Duration::from_millis(timeout_ms.into()).min(cap)
        }
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

    /// The guest waited for the host: that time is not the guest's compute.
    fn credit(&mut self, waited: Duration) {
        self.call.compute_deadline += waited;
    }
}

impl From<ProbeFailure> for WitProbeError {
    fn from(e: ProbeFailure) -> Self {
        match e {
            ProbeFailure::Timeout => WitProbeError::Timeout,
            ProbeFailure::Refused => WitProbeError::Refused,
            ProbeFailure::Denied(why) => WitProbeError::Denied(why),
            ProbeFailure::Io(why) => WitProbeError::Io(why),
        }
    }
}

impl HostState {
    /// `GET http://<address>:<port><path>` for the guest, after the checks;
    /// the one implementation behind every WIT version's `http-get`.
    pub(crate) async fn probe_http(
        &mut self,
        host: &str,
        port: u16,
        path: &str,
        timeout_ms: u32,
    ) -> Result<probe::HttpResponse, ProbeFailure> {
        let addr = match self.authorize(host, port) {
            Ok(addr) => addr,
            Err(why) => return Err(self.deny(why)),
        };
        if path.contains(['\r', '\n']) {
            return Err(self.deny(format!("path {path:?} contains CR or LF")));
        }
        if let Err(why) = portwise_core::config::validate_path(path) {
            return Err(self.deny(why));
        }
        let timeout = self.timeout(timeout_ms);
        if let ProbeMode::Replay(replay) = &self.probes {
            return replay.http(addr, path);
        }
        let started = Instant::now();
        let result = probe::http_get(addr, path, timeout, probe::MAX_BODY_BYTES).await;
        self.credit(started.elapsed());
        let result = result.map_err(ProbeFailure::from);
        if let ProbeMode::Record(recorder) = &self.probes {
            recorder.http(addr, path, timeout, &result);
        }
        result
    }

    /// Opens and closes a TCP connection for the guest, after the checks.
    pub(crate) async fn probe_tcp(
        &mut self,
        host: &str,
        port: u16,
        timeout_ms: u32,
    ) -> Result<(), ProbeFailure> {
        let addr = match self.authorize(host, port) {
            Ok(addr) => addr,
            Err(why) => return Err(self.deny(why)),
        };
        let timeout = self.timeout(timeout_ms);
        if let ProbeMode::Replay(replay) = &self.probes {
            return replay.tcp(addr);
        }
        let started = Instant::now();
        let result = probe::tcp_dial(addr, timeout).await;
        self.credit(started.elapsed());
        let result = result.map_err(ProbeFailure::from);
        if let ProbeMode::Record(recorder) = &self.probes {
            recorder.tcp(addr, timeout, &result);
        }
        result
    }

    /// The guest's log line, capped in length and per call.
    pub(crate) fn guest_log(&mut self, level: tracing::Level, message: String) {
        self.call.log_lines += 1;
        if self.call.log_lines > MAX_LOG_LINES_PER_CALL {
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

impl types::Host for HostState {}

impl probes::Host for HostState {
    async fn max_body_bytes(&mut self) -> u32 {
        probe::MAX_BODY_BYTES as u32
    }

    async fn http_get(&mut self, request: HttpRequest) -> Result<WitHttpResponse, WitProbeError> {
        match self
            .probe_http(
                &request.host,
                request.port,
                &request.path,
                request.timeout_ms,
            )
            .await
        {
            Ok(r) => Ok(WitHttpResponse {
                status: r.status,
                body: r.body,
                truncated: r.truncated,
            }),
            Err(e) => Err(e.into()),
        }
    }

    async fn tcp_dial(
        &mut self,
        host: String,
        port: u16,
        timeout_ms: u32,
    ) -> Result<(), WitProbeError> {
        self.probe_tcp(&host, port, timeout_ms)
            .await
            .map_err(Into::into)
    }
}

impl log::Host for HostState {
    async fn log(&mut self, level: WitLevel, message: String) {
        let level = match level {
            WitLevel::Trace => tracing::Level::TRACE,
            WitLevel::Debug => tracing::Level::DEBUG,
            WitLevel::Info => tracing::Level::INFO,
            WitLevel::Warn => tracing::Level::WARN,
            WitLevel::Error => tracing::Level::ERROR,
        };
        self.guest_log(level, message);
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

/// Memory limit per linear memory, enforced by wasmtime's [`StoreLimits`].
/// Refusing growth (rather than trapping in the host) lets the guest's
/// allocator fail its own way, usually with an `unreachable` trap.
///
/// `StoreLimits` cannot say afterwards that it refused anything, and that is
/// what turns such a trap into a `memory` failure rather than a `trap`: this
/// wrapper delegates every decision to it and only records a refusal of our
/// limit in `denied`.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    limits: StoreLimits,
    max_bytes: usize,
    /// The last refused growth: (current, desired) bytes.
    pub denied: Option<(usize, usize)>,
}

/// Tables hold function references; a checker needs few.
const MAX_TABLE_ELEMENTS: usize = 1_000_000;

impl MemoryLimiter {
    pub(crate) fn new(max_bytes: usize) -> Self {
        MemoryLimiter {
            limits: StoreLimitsBuilder::new()
                .memory_size(max_bytes)
                .table_elements(MAX_TABLE_ELEMENTS)
                .build(),
            max_bytes,
            denied: None,
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.limits.memory_growing(current, desired, maximum)?;
        // Only our limit is a memory failure; growth past the module's own
        // declared maximum fails in wasmtime anyway and stays a trap.
        if !allowed && desired > self.max_bytes {
            self.denied = Some((current, desired));
        }
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.limits.memory_grow_failed(error)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.limits.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// A bounded buffer behind a guest's stdout or stderr. Writes past the bound
/// are counted and dropped, never refused: a chatty guest must not trap.
#[derive(Clone, Debug)]
pub(crate) struct Capture {
    inner: Arc<Mutex<CaptureBuf>>,
}

#[derive(Debug)]
struct CaptureBuf {
    bytes: Vec<u8>,
    cap: usize,
    dropped: usize,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Capture {
            inner: Arc::new(Mutex::new(CaptureBuf {
                bytes: Vec::new(),
                cap,
                dropped: 0,
            })),
        }
    }

    fn stream(&self) -> CaptureStream {
        CaptureStream(self.clone())
    }

    fn write(&self, data: &[u8]) {
        let mut buf = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let room = buf.cap.saturating_sub(buf.bytes.len());
        let keep = room.min(data.len());
        buf.bytes.extend_from_slice(&data[..keep]);
        buf.dropped += data.len() - keep;
    }

    /// Takes what was written since the last call, and how much was dropped.
    pub(crate) fn take(&self) -> (Vec<u8>, usize) {
        let mut buf = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let dropped = std::mem::take(&mut buf.dropped);
        (std::mem::take(&mut buf.bytes), dropped)
    }
}

struct CaptureStream(Capture);

impl IsTerminal for CaptureStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CaptureStream {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(CaptureWriter(self.0.clone()))
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(CaptureWriter(self.0.clone()))
    }
}

struct CaptureWriter(Capture);

#[wasmtime_wasi::async_trait]
impl Pollable for CaptureWriter {
    async fn ready(&mut self) {}
}

impl OutputStream for CaptureWriter {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.0.write(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for CaptureWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0.write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests;
