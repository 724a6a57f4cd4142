//! A starter membership checker: copy this crate and put your own logic
//! where the comments say so.
//!
//! What it does as it stands: a pod backs the port when it carries the
//! configured label (any value but `false`) and the target port answers a
//! probe: an HTTP GET of `path` answering 2xx when `path` is set, a TCP dial
//! otherwise. A refused connection or another status excludes; a timeout
//! abstains (not the pod's fault: portwise keeps what it published last).
//!
//! ```yaml
//! wasm:
//!   module: my-checker.wasm
//!   config: {label: app.example.com/serve, path: /healthz, timeoutMs: 1000}
//! ```

use std::time::Duration;

use portwise_guest::{Checker, Input, ProbeError, Verdict, parse_config};
use serde::Deserialize;

/// The configuration, from the `config:` value in the portwise config file.
/// `deny_unknown_fields` turns a typo into a load-time error instead of a
/// silent default. Add your own keys here.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    /// The pod label to read (required).
    label: String,
    /// HTTP GET this path on the target port; without it, dial the port.
    path: Option<String>,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u32,
}

fn default_timeout_ms() -> u32 {
    1000
}

/// Parses and checks the configuration. Put every rule here, so that
/// `validate_config` rejects what `check` could not use.
fn config(raw: &str) -> Result<Config, String> {
    let config: Config = parse_config(raw)?;
    if config.label.is_empty() {
        return Err("label: must not be empty".into());
    }
    if let Some(path) = &config.path
        && !path.starts_with('/')
    {
        return Err(format!("path: must start with /, got {path:?}"));
    }
    if !(1..=60_000).contains(&config.timeout_ms) {
        return Err(format!(
            "timeoutMs: must be within 1..60000, got {}",
            config.timeout_ms
        ));
    }
    Ok(config)
}

struct MyChecker;

impl Checker for MyChecker {
    fn validate_config(raw: &str) -> Result<(), String> {
        config(raw).map(drop)
    }

    fn check(input: Input) -> Verdict {
        // Never guess with a config validate_config would reject.
        let config = match config(input.config) {
            Ok(config) => config,
            Err(e) => return Verdict::abstain().because(format!("bad config: {e}")),
        };

        // 1. Facts about the pod: one host call per by-key query. Replace or
        //    extend this with your own rules (pod.annotation, pod.condition,
        //    input.service.annotation, ...).
        let value = match input.pod.label(&config.label) {
            None => {
                return Verdict::exclude().because(format!("pod has no label {}", config.label));
            }
            Some(v) if v == "false" => {
                return Verdict::exclude().because(format!("label {}=false", config.label));
            }
            Some(v) => v,
        };

        // 2. One probe of the address under judgement (the host reaches no
        //    other), and 3. the verdict, with a reason (`portwise check` and
        //    the debug log show it). Change the path, the port or what
        //    counts as healthy here. The kubelet's other probes are host
        //    calls too (WIT 0.2.1; guests/rust/broker-health uses both):
        //      HTTPS with headers, on a port the pod names:
        //        let admin = input.pod.container_port("admin").map(|p| p.port);
        //        input.target.https_get_port(port, "/ready", &[("Authorization", "Bearer t")], timeout)
        //      grpc.health.v1 (`SERVING` is the one healthy answer):
        //        input.target.grpc_health_port(port, "my.Service", timeout)?.is_serving()
        let port = input.target.target_port;
        let timeout = Duration::from_millis(config.timeout_ms.into());
        let label = &config.label;
        match &config.path {
            Some(path) => {
                let what = format!("GET {path} on port {port}");
                match input.target.http_get(path, timeout) {
                    Ok(r) if r.is_success() => Verdict::include()
                        .because(format!("label {label}={value}, {what}: {}", r.status)),
                    Ok(r) => Verdict::exclude().because(format!("{what}: {}", r.status)),
                    Err(e) => probe_failed(&what, e),
                }
            }
            None => {
                let what = format!("TCP dial of port {port}");
                match input.target.tcp_dial(timeout) {
                    Ok(()) => Verdict::include()
                        .because(format!("label {label}={value}, {what}: connected")),
                    Err(e) => probe_failed(&what, e),
                }
            }
        }
    }
}

/// Abstain when the failure is not the pod's fault (a timeout, a probe the
/// host denied, the prober's own `unreachable:` failures); exclude otherwise.
fn probe_failed(what: &str, e: ProbeError) -> Verdict {
    match e {
        ProbeError::Timeout => Verdict::abstain().because(format!("{what}: timeout")),
        ProbeError::Refused => Verdict::exclude().because(format!("{what}: connection refused")),
        ProbeError::Denied(why) => Verdict::abstain().because(format!("{what}: denied: {why}")),
        ProbeError::Io(why) if why.starts_with("unreachable:") => {
            Verdict::abstain().because(format!("{what}: {why}"))
        }
        ProbeError::Io(why) => Verdict::exclude().because(format!("{what}: {why}")),
    }
}

portwise_guest::export!(MyChecker);
