//! Write a portwise membership checker in a few lines of Rust.
//!
//! A checker is a WebAssembly component built against `wit/membership.wit`
//! (`portwise:membership@0.2.1`). The raw bindings work, but every checker
//! would repeat the same chores: look up a label, test the Ready condition,
//! probe the address under judgement, parse its JSON configuration. This
//! crate does those once.
//!
//! ```ignore
//! use portwise_guest::{Checker, Input, Verdict};
//!
//! struct Labelled;
//!
//! impl Checker for Labelled {
//!     fn check(input: Input) -> Verdict {
//!         match input.pod.label("tier").as_deref() {
//!             Some("backend") => Verdict::include(),
//!             _ => Verdict::exclude().because("not a backend"),
//!         }
//!     }
//! }
//!
//! portwise_guest::export!(Labelled);
//! ```
//!
//! # What things cost
//!
//! In 0.2 the host no longer copies the pod and Service into every call.
//! [`Input::pod`] and [`Input::service`] are views of host resources: each
//! query is one call into the host (well under a microsecond) plus a copy of
//! what it returns, and nothing is cached on the guest side. So:
//!
//! - read by key ([`Pod::label`], [`Pod::annotation`], [`Pod::condition`],
//!   [`Pod::container_port`], [`Service::port`]) rather than listing
//!   everything and searching;
//! - keep an answer you need twice in a local;
//! - [`Input::config`] and [`Input::target`] are already in the guest: free;
//! - a probe ([`Target::http_get`], [`Target::tcp_dial`]) costs what the
//!   network costs, two orders of magnitude more than any query.
//!
//! Build with `cargo build --release --target wasm32-wasip2` (crate type
//! `cdylib`); the `.wasm` file in `target/wasm32-wasip2/release/` is the
//! component to mount in portwise's `modulesDir`.

use std::time::Duration;

/// The raw bindings generated from `wit/membership.wit`. Checkers rarely need
/// them directly; they are public so that anything the helpers miss is still
/// reachable.
pub mod bindings {
    wit_bindgen::generate!({
        // The crate's own copy of wit/membership.wit (guests/build checks
        // they are the same), so the crate builds wherever it is copied.
        path: "wit",
        world: "membership-checker",
        pub_export_macro: true,
        export_macro_name: "__export_membership_checker",
        default_bindings_module: "::portwise_guest::bindings",
    });
}

pub use bindings::portwise::membership::probes::{
    GrpcFailure, GrpcHealthAnswer, HttpHeader, HttpResponse, ProbeError, ServingStatus,
};
pub use bindings::portwise::membership::types::{
    AddressFamily, ContainerPort, Decision, KeyValue, PodCondition, ServicePort, Target, Verdict,
};

use bindings::exports::portwise::membership::checker::Guest;
use bindings::portwise::membership::{log as wit_log, probes, types};

/// Everything one check receives.
///
/// `pod` and `service` are views of host resources that are valid for this
/// call only (the borrow checker enforces it): every query on them is one
/// call into the host that copies only its answer. `config` and `target` are
/// plain values, already in the guest.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The guest's configuration as JSON (`null` when none was given).
    pub config: &'a str,
    pub service: Service<'a>,
    pub pod: Pod<'a>,
    pub target: &'a Target,
}

impl Input<'_> {
    /// Parses the configuration into `T`. Free of host calls; it runs serde
    /// over `config` every time, so a checker that cares keeps the result.
    #[cfg(feature = "json")]
    pub fn config<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        parse_config(self.config)
    }

    /// Whether the pod counts as ready for this Service the way the built-in
    /// `podReady` checker sees it: its `Ready` condition is `True`, or the
    /// Service publishes not-ready addresses. One host call. Compare
    /// [`Pod::is_ready`], which reads the condition only.
    pub fn pod_ready(&self) -> bool {
        pod_ready()
    }
}

/// Parses a JSON configuration into `T`, with a message naming the problem.
#[cfg(feature = "json")]
pub fn parse_config<T: serde::de::DeserializeOwned>(config: &str) -> Result<T, String> {
    serde_json::from_str(config).map_err(|e| format!("invalid config: {e}"))
}

/// A membership checker. Implement `check` (and, when the checker takes a
/// configuration, `validate_config`), then call [`export!`] with the type.
pub trait Checker {
    /// Runs once per (module version, configuration) before any check.
    /// Returning an error rejects the configuration: portwise refuses to
    /// start, or keeps the previous module version on a hot reload.
    fn validate_config(config: &str) -> Result<(), String> {
        let _ = config;
        Ok(())
    }

    /// Judges one (Service port, address family, pod).
    fn check(input: Input<'_>) -> Verdict;
}

impl<T: Checker> Guest for T {
    fn validate_config(config: String) -> Result<(), String> {
        <T as Checker>::validate_config(&config)
    }

    fn check(
        config: String,
        service: &types::Service,
        pod: &types::Pod,
        target: Target,
    ) -> Verdict {
        <T as Checker>::check(Input {
            config: &config,
            service: Service(service),
            pod: Pod(pod),
            target: &target,
        })
    }
}

/// Exports a [`Checker`] implementation as the component's `checker`
/// interface. Call it once, at the crate root, with the type's name.
#[macro_export]
macro_rules! export {
    ($ty:ident) => {
        $crate::bindings::__export_membership_checker!($ty with_types_in $crate::bindings);
    };
}

impl Verdict {
    pub fn include() -> Self {
        Verdict {
            decision: Decision::Include,
            reason: None,
        }
    }
    pub fn exclude() -> Self {
        Verdict {
            decision: Decision::Exclude,
            reason: None,
        }
    }
    pub fn abstain() -> Self {
        Verdict {
            decision: Decision::Abstain,
            reason: None,
        }
    }
    /// Attaches a human-readable reason (logged by the host, shown by
    /// `portwise check`).
    pub fn because(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }
}

/// The pod under judgement, borrowed from the host for one call.
///
/// What it costs: every method is one call into the host (well under a
/// microsecond) plus a copy of its answer into the guest, and nothing is
/// cached, so a value read twice crosses twice: keep it in a local. The
/// by-key queries ([`label`](Pod::label), [`annotation`](Pod::annotation),
/// [`condition`](Pod::condition), [`container_port`](Pod::container_port))
/// copy one entry; the whole-list ones copy every entry, and annotations
/// can be large.
#[derive(Clone, Copy, Debug)]
pub struct Pod<'a>(&'a types::Pod);

impl<'a> Pod<'a> {
    /// The raw resource, for anything these helpers do not cover.
    pub fn raw(&self) -> &'a types::Pod {
        self.0
    }
    /// One host call; copies the name.
    pub fn name(&self) -> String {
        self.0.name()
    }
    /// One host call; copies the namespace.
    pub fn namespace(&self) -> String {
        self.0.namespace()
    }
    /// One host call; copies the UID.
    pub fn uid(&self) -> String {
        self.0.uid()
    }
    /// One label by key. One host call; copies that value only.
    pub fn label(&self, key: &str) -> Option<String> {
        self.0.label(key)
    }
    /// All labels, sorted by key. One host call; copies every key and value.
    pub fn labels(&self) -> Vec<KeyValue> {
        self.0.labels()
    }
    /// One annotation by key. One host call; copies that value only.
    pub fn annotation(&self, key: &str) -> Option<String> {
        self.0.annotation(key)
    }
    /// All annotations, sorted by key. One host call; copies every key and
    /// value, which can be large (`kubectl.kubernetes.io/last-applied-configuration`):
    /// prefer [`annotation`](Pod::annotation).
    pub fn annotations(&self) -> Vec<KeyValue> {
        self.0.annotations()
    }
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`. One host call.
    pub fn phase(&self) -> String {
        self.0.phase()
    }
    /// The condition of the given type (`Ready`, `ContainersReady`, ...).
    /// One host call; copies that condition only.
    pub fn condition(&self, kind: &str) -> Option<PodCondition> {
        self.0.condition(kind)
    }
    /// All conditions, in the kubelet's order. One host call; copies all.
    pub fn conditions(&self) -> Vec<PodCondition> {
        self.0.conditions()
    }
    /// True when the `Ready` condition is `True`. One host call (the
    /// condition by type). Under a Service's `publishNotReadyAddresses` the
    /// built-in `podReady` ignores readiness: use [`Input::pod_ready`] to
    /// match it.
    pub fn is_ready(&self) -> bool {
        self.condition("Ready").is_some_and(|c| c.status == "True")
    }
    /// True once the pod has a deletionTimestamp. One host call, no copy.
    pub fn is_terminating(&self) -> bool {
        self.0.terminating()
    }
    /// The node the pod was scheduled to. One host call.
    pub fn node_name(&self) -> Option<String> {
        self.0.node_name()
    }
    /// `status.podIPs`, normalised. One host call; copies every address.
    pub fn ips(&self) -> Vec<String> {
        self.0.ips()
    }
    /// The first declared container port with this name (containers, then
    /// restartable init containers). One host call; copies that port only.
    pub fn container_port(&self, name: &str) -> Option<ContainerPort> {
        self.0.container_port(name)
    }
    /// Every declared container port. One host call; copies them all.
    pub fn container_ports(&self) -> Vec<ContainerPort> {
        self.0.container_ports()
    }
}

/// The Service the slices are published for, borrowed like [`Pod`] and
/// costing the same: one host call per method, plus a copy of the answer.
#[derive(Clone, Copy, Debug)]
pub struct Service<'a>(&'a types::Service);

impl<'a> Service<'a> {
    /// The raw resource, for anything these helpers do not cover.
    pub fn raw(&self) -> &'a types::Service {
        self.0
    }
    /// One host call; copies the name.
    pub fn name(&self) -> String {
        self.0.name()
    }
    /// One host call; copies the namespace.
    pub fn namespace(&self) -> String {
        self.0.namespace()
    }
    /// One host call; copies the UID.
    pub fn uid(&self) -> String {
        self.0.uid()
    }
    /// One label by key. One host call; copies that value only.
    pub fn label(&self, key: &str) -> Option<String> {
        self.0.label(key)
    }
    /// All labels, sorted by key. One host call; copies them all.
    pub fn labels(&self) -> Vec<KeyValue> {
        self.0.labels()
    }
    /// One annotation by key. One host call; copies that value only.
    pub fn annotation(&self, key: &str) -> Option<String> {
        self.0.annotation(key)
    }
    /// All annotations, sorted by key. One host call; copies them all.
    pub fn annotations(&self) -> Vec<KeyValue> {
        self.0.annotations()
    }
    /// A Service port by name (empty for a single unnamed port). One host
    /// call; copies that port only.
    pub fn port(&self, name: &str) -> Option<ServicePort> {
        self.0.port(name)
    }
    /// Every Service port. One host call; copies them all.
    pub fn ports(&self) -> Vec<ServicePort> {
        self.0.ports()
    }
}

fn millis(timeout: Duration) -> u32 {
    u32::try_from(timeout.as_millis())
        .unwrap_or(u32::MAX)
        .max(1)
}

impl Target {
    pub fn is_ipv6(&self) -> bool {
        matches!(self.family, AddressFamily::Ipv6)
    }

    /// `GET http://<address>:<target port><path>`.
    pub fn http_get(&self, path: &str, timeout: Duration) -> Result<HttpResponse, ProbeError> {
        self.http_get_port(self.target_port, path, timeout)
    }

    /// `GET http://<address>:<port><path>`: another port of the same pod.
    pub fn http_get_port(
        &self,
        port: u16,
        path: &str,
        timeout: Duration,
    ) -> Result<HttpResponse, ProbeError> {
        probes::http_get(&probes::HttpRequest {
            host: String::new(),
            port,
            path: path.to_string(),
            timeout_ms: millis(timeout),
        })
    }

    /// `GET https://<address>:<port><path>` with `headers`, as a kubelet
    /// probe with `scheme: HTTPS` and `httpHeaders` (the certificate is not
    /// verified). Needs a host serving 0.2.1.
    pub fn https_get_port(
        &self,
        port: u16,
        path: &str,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<HttpResponse, ProbeError> {
        self.http_get_with(port, path, true, headers, timeout)
    }

    /// `GET http(s)://<address>:<port><path>` with `headers` (0.2.1).
    pub fn http_get_with(
        &self,
        port: u16,
        path: &str,
        tls: bool,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<HttpResponse, ProbeError> {
        probes::http_get_with(
            &probes::HttpRequest {
                host: String::new(),
                port,
                path: path.to_string(),
                timeout_ms: millis(timeout),
            },
            &probes::HttpOptions {
                tls,
                headers: headers
                    .iter()
                    .map(|(name, value)| HttpHeader {
                        name: name.to_string(),
                        value: value.to_string(),
                    })
                    .collect(),
            },
        )
    }

    /// grpc.health.v1 `Check` of `service` (`""`: the server) on another
    /// port of the same pod, as the kubelet's gRPC probe (0.2.1).
    pub fn grpc_health_port(
        &self,
        port: u16,
        service: &str,
        timeout: Duration,
    ) -> Result<GrpcHealthAnswer, ProbeError> {
        probes::grpc_health("", port, service, millis(timeout))
    }

    /// Opens and closes a TCP connection to `<address>:<target port>`.
    pub fn tcp_dial(&self, timeout: Duration) -> Result<(), ProbeError> {
        self.tcp_dial_port(self.target_port, timeout)
    }

    /// Opens and closes a TCP connection to another port of the same pod.
    pub fn tcp_dial_port(&self, port: u16, timeout: Duration) -> Result<(), ProbeError> {
        probes::tcp_dial("", port, millis(timeout))
    }
}

impl HttpResponse {
    /// True for a 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<&str, String> {
        std::str::from_utf8(&self.body).map_err(|e| format!("body is not UTF-8: {e}"))
    }
    /// The body parsed as JSON.
    #[cfg(feature = "json")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_slice(&self.body)
            .map_err(|e| format!("body is not the expected JSON: {e}"))
    }
}

impl GrpcHealthAnswer {
    /// True for `SERVING`, the one answer a kubelet gRPC probe passes on.
    pub fn is_serving(&self) -> bool {
        matches!(self, GrpcHealthAnswer::Status(ServingStatus::Serving))
    }

    /// A one-line description (`SERVING`, `gRPC status 5: unknown service`).
    pub fn message(&self) -> String {
        match self {
            GrpcHealthAnswer::Status(ServingStatus::Serving) => "SERVING".into(),
            GrpcHealthAnswer::Status(ServingStatus::NotServing) => "NOT_SERVING".into(),
            GrpcHealthAnswer::Status(ServingStatus::Unknown) => "UNKNOWN".into(),
            GrpcHealthAnswer::Status(ServingStatus::ServiceUnknown) => "SERVICE_UNKNOWN".into(),
            GrpcHealthAnswer::Failed(f) if f.message.is_empty() => {
                format!("gRPC status {}", f.code)
            }
            GrpcHealthAnswer::Failed(f) => format!("gRPC status {}: {}", f.code, f.message),
        }
    }
}

impl ProbeError {
    /// A one-line description (`timeout`, `connection refused`, `denied: ...`).
    /// (wit-bindgen's own `Display` prints the debug form.)
    pub fn message(&self) -> String {
        match self {
            ProbeError::Timeout => "timeout".into(),
            ProbeError::Refused => "connection refused".into(),
            ProbeError::Denied(why) => format!("denied: {why}"),
            ProbeError::Io(why) => format!("i/o error: {why}"),
        }
    }
}

/// The largest HTTP body the host returns. One host call.
pub fn max_body_bytes() -> u32 {
    probes::max_body_bytes()
}

/// Whether the pod under judgement is ready as the built-in `podReady` sees
/// it (always true under the Service's `publishNotReadyAddresses`). One host
/// call; also reachable as [`Input::pod_ready`].
pub fn pod_ready() -> bool {
    probes::pod_ready()
}

/// Logging into the host's log stream (tagged by the host with the module,
/// Service, pod and port under judgement).
pub mod log {
    use super::wit_log::{Level, log};

    pub fn trace(message: &str) {
        log(Level::Trace, message)
    }
    pub fn debug(message: &str) {
        log(Level::Debug, message)
    }
    pub fn info(message: &str) {
        log(Level::Info, message)
    }
    pub fn warn(message: &str) {
        log(Level::Warn, message)
    }
    pub fn error(message: &str) {
        log(Level::Error, message)
    }
}
