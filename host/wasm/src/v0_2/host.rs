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

    async fn http_get_with(
        &mut self,
        request: probes::HttpRequest,
        options: probes::HttpOptions,
    ) -> Result<probes::HttpResponse, probes::ProbeError> {
        let mut request: crate::probes::HttpGet = request.into();
        request.tls = options.tls;
        request.headers = options
            .headers
            .into_iter()
            .map(|h| (h.name, h.value))
            .collect();
        Ok(self.probe_http(request).await?.into())
    }

    async fn grpc_health(
        &mut self,
        host: String,
        port: u16,
        service: String,
        timeout_ms: u32,
    ) -> Result<probes::GrpcHealthAnswer, probes::ProbeError> {
        use probe::{GrpcHealth, ServingStatus};
        use probes::{GrpcFailure, GrpcHealthAnswer, ServingStatus as Status};
        Ok(
            match self.probe_grpc(&host, port, &service, timeout_ms).await? {
                GrpcHealth::Status(s) => GrpcHealthAnswer::Status(match s {
                    ServingStatus::Serving => Status::Serving,
                    ServingStatus::NotServing => Status::NotServing,
                    ServingStatus::ServiceUnknown => Status::ServiceUnknown,
                    // A value newer than the WIT: as unknown as UNKNOWN.
                    ServingStatus::Unknown | ServingStatus::Other(_) => Status::Unknown,
                }),
                GrpcHealth::Failed { code, message } => {
                    GrpcHealthAnswer::Failed(GrpcFailure { code, message })
                }
            },
        )
    }

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
