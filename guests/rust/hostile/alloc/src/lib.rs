//! Allocates 1 GiB in `check` (size overridable with `{"bytes": N}`): the
//! host's memory limit must refuse the growth and contain the abort. With
//! `{"holdMs": T}` it keeps what it allocated for T ms of wall clock
//! (spinning) before answering, so that many calls hold memory at once.

use std::time::{Duration, Instant};

use portwise_guest::{Checker, Input, Verdict, parse_config};
use serde::Deserialize;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Config {
    bytes: Option<usize>,
    hold_ms: Option<u64>,
}

struct Hog;

impl Checker for Hog {
    fn check(input: Input) -> Verdict {
        let config: Config = parse_config::<Option<Config>>(input.config)
            .unwrap_or_default()
            .unwrap_or_default();
        let bytes = config.bytes.unwrap_or(1 << 30);
        let block = vec![1u8; bytes];
        let sum: u64 = std::hint::black_box(&block)
            .iter()
            .step_by(4096)
            .map(|&b| u64::from(b))
            .sum();
        if let Some(ms) = config.hold_ms {
            let until = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < until {
                std::hint::black_box(&block);
            }
        }
        Verdict::include().because(format!("allocated {bytes} bytes ({sum} pages touched)"))
    }
}

portwise_guest::export!(Hog);
