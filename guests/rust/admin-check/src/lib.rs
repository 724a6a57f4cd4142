//! Include a pod on the admin port when it is marked as an admin pod, or when
//! something accepts connections on the target port.
//!
//! The mark is a label or annotation (`key`, default
//! `port-mapper.example.com/admin`) with any value but `false`. Without the
//! mark the checker dials the target port: a connection includes, a refusal
//! excludes, a timeout abstains. Unknown configuration keys are rejected, so
//! a typo fails at load time.
//!
//! ```yaml
//! wasm:
//!   module: admin-check.wasm
//!   config: {key: port-mapper.example.com/admin, timeoutMs: 500}
//! ```

use std::time::Duration;

use portwise_guest::{Checker, Input, ProbeError, Verdict, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default = "default_key")]
    key: String,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            key: default_key(),
            timeout_ms: default_timeout_ms(),
        }
    }
}

fn default_key() -> String {
    "port-mapper.example.com/admin".to_string()
}

fn default_timeout_ms() -> u32 {
    1000
}

fn config(raw: &str) -> Result<Config, String> {
    // `null` (no config) means all defaults.
    let config: Option<Config> = parse_config(raw)?;
    let config = config.unwrap_or_default();
    if config.key.is_empty() {
        return Err("key: must not be empty".into());
    }
    Ok(config)
}

struct AdminCheck;

impl Checker for AdminCheck {
    fn validate_config(raw: &str) -> Result<(), String> {
        config(raw).map(drop)
    }

    fn check(input: Input) -> Verdict {
        let config = match config(input.config) {
            Ok(config) => config,
            Err(e) => return Verdict::abstain().because(e),
        };
        // Two by-key queries at most: the annotation is only asked for when
        // there is no such label.
        let pod = input.pod;
        let mark = pod
            .label(&config.key)
            .or_else(|| pod.annotation(&config.key));
        if let Some(value) = mark
            && value != "false"
        {
            return Verdict::include().because(format!("marked {}={value}", config.key));
        }
        let port = input.target.target_port;
        match input
            .target
            .tcp_dial(Duration::from_millis(config.timeout_ms.into()))
        {
            Ok(()) => Verdict::include().because(format!("port {port} accepts connections")),
            Err(ProbeError::Timeout) => {
                Verdict::abstain().because(format!("dial {port} timed out"))
            }
            Err(e) => Verdict::exclude().because(format!("dial {port}: {}", e.message())),
        }
    }
}

portwise_guest::export!(AdminCheck);
