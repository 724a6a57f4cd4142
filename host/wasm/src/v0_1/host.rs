//! The host side of 0.1's imports: each one the shared implementation on
//! [`HostState`], in 0.1's types.

use super::portwise::membership::{
    log::{self, Level},
    probes::{self, HttpRequest, HttpResponse, ProbeError},
    types,
};
use crate::state::HostState;
use portwise_probe as probe;

impl types::Host for HostState {}

impl probes::Host for HostState {
    async fn max_body_bytes(&mut self) -> u32 {
        probe::MAX_BODY_BYTES as u32
    }

    async fn http_get(&mut self, request: HttpRequest) -> Result<HttpResponse, ProbeError> {
        let response = self.probe_http(request.into()).await?;
        Ok(response.into())
    }

    async fn tcp_dial(
        &mut self,
        host: String,
        port: u16,
        timeout_ms: u32,
    ) -> Result<(), ProbeError> {
        self.probe_tcp(&host, port, timeout_ms)
            .await
            .map_err(Into::into)
    }
}

impl log::Host for HostState {
    async fn log(&mut self, level: Level, message: String) {
        self.guest_log(level.into(), message);
    }
}
