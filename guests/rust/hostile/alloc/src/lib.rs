//! Allocates 1 GiB in `check` (size overridable with `{"bytes": N}`): the
//! host's memory limit must refuse the growth and contain the abort.

use portwise_guest::{Checker, Input, Verdict, parse_config};
use serde::Deserialize;

#[derive(Deserialize, Default)]
struct Config {
    bytes: Option<usize>,
}

struct Hog;

impl Checker for Hog {
    fn check(input: Input) -> Verdict {
        let config: Option<Config> = parse_config(input.config).unwrap_or_default();
        let bytes = config.unwrap_or_default().bytes.unwrap_or(1 << 30);
        let block = vec![1u8; bytes];
        let sum: u64 = std::hint::black_box(&block)
            .iter()
            .step_by(4096)
            .map(|&b| u64::from(b))
            .sum();
        Verdict::include().because(format!("allocated {bytes} bytes ({sum} pages touched)"))
    }
}

portwise_guest::export!(Hog);
