//! Includes with an 8 MiB reason (size overridable with `{"bytes": N}`): the
//! host must keep the decision and truncate the reason.

use portwise_guest::{Checker, Input, Verdict, parse_config};
use serde::Deserialize;

#[derive(Deserialize, Default)]
struct Config {
    bytes: Option<usize>,
}

struct Chatty;

impl Checker for Chatty {
    fn check(input: Input) -> Verdict {
        let config: Option<Config> = parse_config(input.config).unwrap_or_default();
        let bytes = config.unwrap_or_default().bytes.unwrap_or(8 << 20);
        Verdict::include().because("x".repeat(bytes))
    }
}

portwise_guest::export!(Chatty);
