//! `grpc`: the grpc.health.v1 probe, and how its answer maps to a verdict.

use std::time::Duration;

use portwise_core::{
    config::ProbePort,
    membership::{Subject, Verdict},
};
use portwise_probe::{self as probe, GrpcHealth, ProbeError, ServingStatus};

use super::probe::{port_probe, verdict_for_probe_error};
use crate::{BoxFuture, Checker};

/// `grpc(port, service, timeout)`: `Check` on grpc.health.v1. As the
/// kubelet: `SERVING` includes, anything else excludes (`NOT_SERVING`,
/// `UNKNOWN`, a service the server does not know, a server without the
/// health service), each with the answer in the reason.
#[derive(Debug)]
pub struct Grpc {
    pub port: Option<ProbePort>,
    pub service: String,
    pub timeout: Duration,
}

impl Grpc {
    /// The verdict for a probe result.
    pub fn verdict(what: &str, result: Result<GrpcHealth, ProbeError>) -> Verdict {
        match result {
            Ok(GrpcHealth::Status(ServingStatus::Serving)) => Verdict::include(),
            Ok(answer) => Verdict::exclude().because(format!("{what}: {answer}")),
            Err(e) => verdict_for_probe_error(what, &e),
        }
    }
}

impl Checker for Grpc {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(port_probe(
            "grpc",
            subject,
            self.port.as_ref(),
            move |addr| async move {
                let result = probe::grpc_health(addr, &self.service, self.timeout).await;
                let what = if self.service.is_empty() {
                    format!("grpc {addr}")
                } else {
                    format!("grpc {addr} service {:?}", self.service)
                };
                Self::verdict(&what, result)
            },
        ))
    }
}
