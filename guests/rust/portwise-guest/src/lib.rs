//! Write a portwise membership checker in a few lines of Rust.
//!
//! A checker is a WebAssembly component built against `wit/membership.wit`.
//! The raw bindings work, but every checker would repeat the same chores:
//! look up a label, test the Ready condition, probe the address under
//! judgement, parse its JSON configuration. This crate does those once.
//!
//! ```ignore
//! use portwise_guest::{Checker, Input, Verdict};
//!
//! struct Labelled;
//!
//! impl Checker for Labelled {
//!     fn check(input: Input) -> Verdict {
//!         match input.pod.label("tier") {
//!             Some("backend") => Verdict::include(),
//!             _ => Verdict::exclude().because("not a backend"),
//!         }
//!     }
//! }
//!
//! portwise_guest::export!(Labelled);
//! ```
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
        path: "../../../wit/v0.1",
        world: "membership-checker",
        pub_export_macro: true,
        export_macro_name: "__export_membership_checker",
        default_bindings_module: "::portwise_guest::bindings",
    });
}

pub use bindings::portwise::membership::probes::{HttpResponse, ProbeError};
pub use bindings::portwise::membership::types::{
    AddressFamily, ContainerPort, Decision, KeyValue, Pod, PodCondition, Service, ServicePort,
    Target, Verdict,
};

use bindings::exports::portwise::membership::checker::Guest;
use bindings::portwise::membership::{log as wit_log, probes};

/// Everything one check receives.
#[derive(Clone, Debug)]
pub struct Input {
    /// The guest's configuration as JSON (`null` when none was given).
    pub config: String,
    pub service: Service,
    pub pod: Pod,
    pub target: Target,
}

impl Input {
    /// Parses the configuration into `T`.
    #[cfg(feature = "json")]
    pub fn config<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        parse_config(&self.config)
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
    fn check(input: Input) -> Verdict;
}

impl<T: Checker> Guest for T {
    fn validate_config(config: String) -> Result<(), String> {
        <T as Checker>::validate_config(&config)
    }

    fn check(config: String, service: Service, pod: Pod, target: Target) -> Verdict {
        <T as Checker>::check(Input {
            config,
            service,
            pod,
            target,
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

fn lookup<'a>(list: &'a [KeyValue], key: &str) -> Option<&'a str> {
    list.iter()
        .find(|kv| kv.key == key)
        .map(|kv| kv.value.as_str())
}

impl Pod {
    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }
    pub fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.annotations, key)
    }
    /// The condition of the given type (`Ready`, `ContainersReady`, ...).
    pub fn condition(&self, kind: &str) -> Option<&PodCondition> {
        self.conditions.iter().find(|c| c.type_ == kind)
    }
    /// True when the `Ready` condition is `True`.
    pub fn is_ready(&self) -> bool {
        self.condition("Ready").is_some_and(|c| c.status == "True")
    }
    pub fn is_terminating(&self) -> bool {
        self.terminating
    }
    /// A declared container port by name.
    pub fn container_port(&self, name: &str) -> Option<&ContainerPort> {
        self.container_ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
    }
}

impl Service {
    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }
    pub fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.annotations, key)
    }
    /// A Service port by name.
    pub fn port(&self, name: &str) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.name == name)
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

/// The largest HTTP body the host returns.
pub fn max_body_bytes() -> u32 {
    probes::max_body_bytes()
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
