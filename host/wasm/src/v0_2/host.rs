//! The host side of 0.2's imports: each one the shared implementation on
//! [`HostState`], in 0.2's types.

use super::portwise::membership::{
    log::{self, Level},
    probes, types,
};
use crate::state::HostState;
use portwise_probe as probe;

impl types::Host for HostState {}

impl probes::Host for HostState {
    fn max_body_bytes(&mut self) -> wasmtime::Result<u32> {
        Ok(probe::MAX_BODY_BYTES as u32)
    }

    crate::wit::probe_imports!();

    fn pod_ready(&mut self) -> wasmtime::Result<bool> {
        Ok(self.call_pod_ready())
    }
}

impl log::Host for HostState {
    fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.guest_log(level.into(), message);
        Ok(())
    }
}
