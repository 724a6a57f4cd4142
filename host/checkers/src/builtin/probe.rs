//! What every port probe (`tcpDial`, `httpGet`) shares: the socket it
//! targets, the prelude that decides without probing, and how a failed
//! probe maps to a verdict (see the module docs of `builtin`).

use std::{future::Future, net::SocketAddr};

use portwise_core::membership::{Subject, Verdict, facts};
use portwise_probe::ProbeError;

/// The socket a probe targets: the address under judgement, the resolved
/// target port.
pub fn probe_addr(subject: &Subject) -> SocketAddr {
    SocketAddr::new(subject.address, subject.port.target)
}

/// Maps a failed probe to a verdict (see the module docs).
pub fn verdict_for_probe_error(what: &str, err: &ProbeError) -> Verdict {
    let v = if err.is_inconclusive() {
        Verdict::abstain()
    } else {
        Verdict::exclude()
    };
    v.because(format!("{what}: {err}"))
}

/// Runs the port probe `what` (`tcpDial`, `httpGet`) against `subject`'s
/// [`probe_addr`], after the prelude every port probe shares:
/// - under `publishNotReadyAddresses` a readiness signal yields: `include`
///   without probing (issue 12);
/// - a port-less Service has nothing to reach, which is a fact about the
///   Service, not a doubt: `exclude` (so not abstain).
pub(crate) async fn port_probe<F, Fut>(what: &str, subject: &Subject, probe: F) -> Verdict
where
    F: FnOnce(SocketAddr) -> Fut,
    Fut: Future<Output = Verdict>,
{
    if facts::readiness_yields(subject) {
        return Verdict::include()
            .because(format!("{what}: the Service publishes not-ready addresses"));
    }
    if subject.port.is_portless() {
        return Verdict::exclude().because(format!("{what}: the Service has no ports to probe"));
    }
    probe(probe_addr(subject)).await
}
