//! What every port probe (`tcpDial`, `httpGet`, `grpc`) shares: the socket
//! it targets, the prelude that decides without probing, and how a failed
//! probe maps to a verdict (see the module docs of `builtin`).

use std::{future::Future, net::SocketAddr};

use portwise_core::{
    align,
    config::ProbePort,
    membership::{Subject, Verdict, facts},
};
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

/// Runs the port probe `what` (`tcpDial`, `httpGet`, `grpc`) against
/// `subject`'s address on `port` (the resolved target port when `None`),
/// after the prelude every port probe shares:
/// - under `publishNotReadyAddresses` a readiness signal yields: `include`
///   without probing (issue 12);
/// - a port-less Service has nothing to reach unless the probe names a
///   port, which is a fact about the Service, not a doubt: `exclude` (so
///   not abstain);
/// - a container port name the pod does not declare (as TCP) is `exclude`:
///   the kubelet fails such a probe too, and the pod cannot be reached
///   where the operator said to look.
pub(crate) async fn port_probe<F, Fut>(
    what: &str,
    subject: &Subject,
    port: Option<&ProbePort>,
    probe: F,
) -> Verdict
where
    F: FnOnce(SocketAddr) -> Fut,
    Fut: Future<Output = Verdict>,
{
    if facts::readiness_yields(subject) {
        return Verdict::include()
            .because(format!("{what}: the Service publishes not-ready addresses"));
    }
    let target = match port {
        None if subject.port.is_portless() => {
            return Verdict::exclude()
                .because(format!("{what}: the Service has no ports to probe"));
        }
        None => subject.port.target,
        Some(ProbePort::Number(n)) => *n,
        Some(ProbePort::Name(name)) => match align::named_probe_port(&subject.pod, name) {
            Some(n) => n,
            None => {
                return Verdict::exclude().because(format!(
                    "{what}: the pod has no TCP container port named {name:?}"
                ));
            }
        },
    };
    probe(SocketAddr::new(subject.address, target)).await
}
