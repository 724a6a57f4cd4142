//! Include a pod on a port when its HTTPS admin API says it is ready and its
//! gRPC health service says it is serving: the broker-style pod whose
//! traffic port (`kafka`) is decided by other ports, over TLS and gRPC, as
//! its kubelet probes would ask. Needs a host serving
//! `portwise:membership@0.2.1` (`http-get-with`, `grpc-health`).
//!
//! Both ports are container port names of the judged pod; a pod that
//! declares neither is excluded with the name in the reason. The admin API
//! must answer 2xx to `GET https://<pod>:<admin port><path>` with the
//! configured headers (the certificate is not verified, as the kubelet's
//! `scheme: HTTPS`); grpc.health.v1 must answer `SERVING` for `service`.
//! A probe that fails on the host's side (`unreachable:`) abstains; any
//! other failure excludes. Unknown configuration keys are rejected.
//!
//! ```yaml
//! wasm:
//!   module: broker-health.wasm
//!   config:
//!     adminPort: admin
//!     path: /v1/broker/ready
//!     headers: {Authorization: Bearer s3cret}
//!     grpcPort: grpc-health
//!     service: broker
//! ```

use std::{collections::BTreeMap, time::Duration};

use portwise_guest::{Checker, Input, ProbeError, Verdict, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    admin_port: String,
    #[serde(default = "default_path")]
    path: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    grpc_port: String,
    #[serde(default)]
    service: String,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u32,
}

fn default_path() -> String {
    "/ready".to_string()
}

fn default_timeout_ms() -> u32 {
    1000
}

fn config(raw: &str) -> Result<Config, String> {
    let config: Option<Config> = parse_config(raw)?;
    let config = config.ok_or("config: adminPort and grpcPort are required")?;
    if !config.path.starts_with('/') {
        return Err(format!("path {:?} must start with '/'", config.path));
    }
    Ok(config)
}

/// A failed probe's verdict: the host's own trouble says nothing of the pod.
fn failed(what: &str, e: &ProbeError) -> Verdict {
    let message = e.message();
    match e {
        ProbeError::Io(why) if why.starts_with("unreachable:") => {
            Verdict::abstain().because(format!("{what}: {message}"))
        }
        _ => Verdict::exclude().because(format!("{what}: {message}")),
    }
}

struct BrokerHealth;

impl Checker for BrokerHealth {
    fn validate_config(raw: &str) -> Result<(), String> {
        config(raw).map(drop)
    }

    fn check(input: Input) -> Verdict {
        let config = match config(input.config) {
            Ok(config) => config,
            Err(e) => return Verdict::abstain().because(e),
        };
        let port = |name: &str| input.pod.container_port(name).map(|p| p.port);
        let Some(admin) = port(&config.admin_port) else {
            return Verdict::exclude()
                .because(format!("no container port named {:?}", config.admin_port));
        };
        let Some(grpc) = port(&config.grpc_port) else {
            return Verdict::exclude()
                .because(format!("no container port named {:?}", config.grpc_port));
        };
        let timeout = Duration::from_millis(config.timeout_ms.into());
        let headers: Vec<(&str, &str)> = config
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let what = format!("https :{admin}{}", config.path);
        match input
            .target
            .https_get_port(admin, &config.path, &headers, timeout)
        {
            Ok(r) if r.is_success() => {}
            Ok(r) => return Verdict::exclude().because(format!("{what}: status {}", r.status)),
            Err(e) => return failed(&what, &e),
        }
        let what = format!("grpc health :{grpc} {:?}", config.service);
        match input
            .target
            .grpc_health_port(grpc, &config.service, timeout)
        {
            Ok(answer) if answer.is_serving() => {
                Verdict::include().because(format!("admin ready, {what}: SERVING"))
            }
            Ok(answer) => Verdict::exclude().because(format!("{what}: {}", answer.message())),
            Err(e) => failed(&what, &e),
        }
    }
}

portwise_guest::export!(BrokerHealth);
