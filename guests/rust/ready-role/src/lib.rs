//! Include a pod when its readiness endpoint says it plays one of the
//! configured roles.
//!
//! `GET <path>` (default `/ready`) on the target port; a 2xx answer whose JSON
//! body has a `role` listed in `roles` includes the pod. A timeout abstains
//! (the pod may just be slow: keep what was published); anything else
//! excludes.
//!
//! ```yaml
//! wasm:
//!   module: ready-role.wasm
//!   config: {roles: [primary], path: /ready, timeoutMs: 1000}
//! ```

use std::time::Duration;

use portwise_guest::{Checker, Input, ProbeError, Verdict, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    roles: Vec<String>,
    #[serde(default = "default_path")]
    path: String,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u32,
    /// Probe this port instead of the resolved target port.
    #[serde(default)]
    port: Option<u16>,
}

fn default_path() -> String {
    "/ready".to_string()
}

fn default_timeout_ms() -> u32 {
    1000
}

#[derive(Deserialize)]
struct ReadyBody {
    role: Option<String>,
}

fn config(raw: &str) -> Result<Config, String> {
    let config: Config = parse_config(raw)?;
    if config.roles.is_empty() {
        return Err("roles: must list at least one role".into());
    }
    if !config.path.starts_with('/') {
        return Err(format!("path: {:?} must start with '/'", config.path));
    }
    Ok(config)
}

struct ReadyRole;

impl Checker for ReadyRole {
    fn validate_config(raw: &str) -> Result<(), String> {
        config(raw).map(drop)
    }

    fn check(input: Input) -> Verdict {
        let config = match config(input.config) {
            Ok(config) => config,
            Err(e) => return Verdict::abstain().because(e),
        };
        let port = config.port.unwrap_or(input.target.target_port);
        let timeout = Duration::from_millis(config.timeout_ms.into());
        let response = match input.target.http_get_port(port, &config.path, timeout) {
            Ok(response) => response,
            Err(ProbeError::Timeout) => {
                return Verdict::abstain().because(format!("GET {} timed out", config.path));
            }
            Err(e) => {
                return Verdict::exclude().because(format!("GET {}: {}", config.path, e.message()));
            }
        };
        if !response.is_success() {
            return Verdict::exclude()
                .because(format!("GET {} answered {}", config.path, response.status));
        }
        match response.json::<ReadyBody>() {
            Ok(ReadyBody { role: Some(role) }) if config.roles.contains(&role) => {
                Verdict::include().because(format!("role {role}"))
            }
            Ok(ReadyBody { role: Some(role) }) => {
                Verdict::exclude().because(format!("role {role} is not one of {:?}", config.roles))
            }
            Ok(ReadyBody { role: None }) => Verdict::exclude().because("answer has no role"),
            Err(e) => Verdict::exclude().because(e),
        }
    }
}

portwise_guest::export!(ReadyRole);
