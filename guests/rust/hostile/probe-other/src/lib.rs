//! Tries to probe somewhere other than the address under judgement
//! (`{"host": "169.254.169.254", "kind": "http"|"tcp", "port": 80}`). The host
//! must answer `denied`; the checker reports what it got as an exclude reason,
//! or includes if the probe was (wrongly) allowed.

use std::time::Duration;

use portwise_guest::bindings::portwise::membership::probes;
use portwise_guest::{Checker, Input, Verdict, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
struct Config {
    host: String,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    path: Option<String>,
}

struct Snoop;

impl Checker for Snoop {
    fn validate_config(raw: &str) -> Result<(), String> {
        parse_config::<Config>(raw).map(drop)
    }

    fn check(input: Input) -> Verdict {
        let config: Config = match parse_config(input.config) {
            Ok(c) => c,
            Err(e) => return Verdict::abstain().because(e),
        };
        let port = config.port.unwrap_or(input.target.target_port);
        let timeout_ms = Duration::from_millis(500).as_millis() as u32;
        let result = match config.kind.as_deref() {
            Some("tcp") => probes::tcp_dial(&config.host, port, timeout_ms),
            _ => probes::http_get(&probes::HttpRequest {
                host: config.host.clone(),
                port,
                path: config.path.clone().unwrap_or_else(|| "/".into()),
                timeout_ms,
            })
            .map(drop),
        };
        match result {
            Ok(()) => Verdict::include().because(format!("reached {}:{port}", config.host)),
            Err(e) => Verdict::exclude().because(e.message()),
        }
    }
}

portwise_guest::export!(Snoop);
