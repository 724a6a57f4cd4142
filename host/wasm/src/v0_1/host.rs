//! The host side of 0.1's imports: each one the shared implementation on
//! [`HostState`], in 0.1's types.

use super::portwise::membership::{
    log::{self, Level},
    probes, types,
};
use crate::state::HostState;
use portwise_probe as probe;

impl types::Host for HostState {}

impl probes::Host for HostState {
    async fn max_body_bytes(&mut self) -> u32 {
        probe::MAX_BODY_BYTES as u32
    }

    crate::wit::probe_imports!();
}

impl log::Host for HostState {
    async fn log(&mut self, level: Level, message: String) {
        self.guest_log(level.into(), message);
    }
}
