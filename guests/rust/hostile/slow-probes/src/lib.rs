//! A checker that takes its time, legitimately: `probes` HTTP GETs of the
//! target in sequence (`{"probes": 8, "path": "/slow"}`), each allowed the
//! host's longest probe timeout. It includes when every one answers 2xx. Run
//! against a listener that answers each GET after 1.5 s, one call takes 12 s:
//! longer than the runtime's default call timeout (5 s), within an
//! expression's own `limits.callTimeout`. portwise's per-check deadline must
//! follow that limit (tests/tests/it/probes.rs).

use std::time::Duration;

use portwise_guest::{Checker, Input, Verdict, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    probes: u32,
    path: String,
}

struct SlowProbes;

impl Checker for SlowProbes {
    fn validate_config(raw: &str) -> Result<(), String> {
        parse_config::<Config>(raw).map(drop)
    }

    fn check(input: Input) -> Verdict {
        let config: Config = match parse_config(input.config) {
            Ok(c) => c,
            Err(e) => return Verdict::abstain().because(e),
        };
        for i in 0..config.probes {
            match input.target.http_get(&config.path, Duration::from_secs(2)) {
                Ok(r) if r.is_success() => {}
                Ok(r) => return Verdict::exclude().because(format!("probe {i}: {}", r.status)),
                Err(e) => return Verdict::exclude().because(format!("probe {i}: {}", e.message())),
            }
        }
        Verdict::include().because(format!("{} probes answered", config.probes))
    }
}

portwise_guest::export!(SlowProbes);
