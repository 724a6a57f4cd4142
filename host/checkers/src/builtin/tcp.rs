//! `tcpDial`: the TCP port probe.

use std::time::Duration;

use portwise_core::{
    config::ProbePort,
    membership::{Subject, Verdict},
};
use portwise_probe as probe;

use super::probe::{port_probe, verdict_for_probe_error};
use crate::{BoxFuture, Checker};

/// `tcpDial(port, timeout)`: a TCP connection to the address on `port`
/// (the target port by default). Probes always dial TCP, whatever the
/// Service port's protocol.
#[derive(Debug)]
pub struct TcpDial {
    pub port: Option<ProbePort>,
    pub timeout: Duration,
}

impl Checker for TcpDial {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(port_probe(
            "tcpDial",
            subject,
            self.port.as_ref(),
            move |addr| async move {
                match probe::tcp_dial(addr, self.timeout).await {
                    Ok(()) => Verdict::include(),
                    Err(e) => verdict_for_probe_error(&format!("tcpDial {addr}"), &e),
                }
            },
        ))
    }
}
