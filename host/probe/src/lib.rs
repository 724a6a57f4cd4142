//! portwise-probe: a TCP dial, an HTTP(S) GET and a gRPC health check,
//! shared by the built-in checkers (`tcpDial`, `httpGet`, `grpc`) and by
//! WebAssembly guests (the `probes` imports of `wit/membership.wit`).
//!
//! A crate of its own because it is the one place portwise opens sockets to
//! pods: the core stays pure, and the checkers and the wasm host both call
//! these functions rather than owning network code. It may not depend on a
//! Kubernetes client or wasmtime.
//!
//! Probes point at pods, and pods misbehave: they accept and never answer,
//! send headers forever, stream a gigabyte, reset half-way. A probe is only
//! useful to the controller if it ends on time whatever the peer does, so:
//!
//! - the **whole** probe (connect, request, headers, body) runs under one
//!   deadline;
//! - memory is bounded: hyper's read buffer and header size are capped and the
//!   body is read frame by frame only until `max_body` bytes are held;
//! - nothing outlives the call: the HTTP connection is driven inside the
//!   probe's own future (no spawned task), so when the probe returns or its
//!   deadline fires, the socket is dropped;
//! - redirects are never followed (a `3xx` is just a status).
//!
//! One module a protocol: [`http`](http_get) (plain or over [`Tls`]) and
//! [`grpc`](grpc_health); the TCP dial and the error classes are here.
//!
//! Errors are classified so callers can tell "the pod does not serve"
//! ([`ProbeError::Timeout`], [`ProbeError::Refused`], [`ProbeError::Io`]) from
//! "this probe says nothing about the pod" ([`ProbeError::Unreachable`]: the
//! prober has no route or no sockets).

use std::{future::Future, io, net::SocketAddr, time::Duration};

use tokio::net::TcpStream;

mod grpc;
mod http;
mod tls;

pub use grpc::{GrpcHealth, ServingStatus, grpc_health};
pub use http::{HttpRequest, HttpResponse, http_get};
pub use tls::{Tls, TlsError};

/// The `User-Agent` every probe sends.
pub const USER_AGENT_VALUE: &str = "portwise-probe";

/// The body size built-in checkers and guests get at most (matches
/// `max-body-bytes` in the WIT contract).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Upper bound on the status line plus response headers. Generous for any
/// health endpoint, small enough that a peer sending headers forever fails
/// fast with a bounded buffer.
pub(crate) const MAX_HEADER_BYTES: usize = 16 * 1024;

/// hyper's connection read buffer cap (its minimum is 8 KiB). Also bounds the
/// size of one body frame, hence the memory held beyond `max_body`.
pub(crate) const MAX_READ_BUFFER: usize = 16 * 1024;

/// Header count cap (hyper's default is 100; health endpoints need few).
pub(crate) const MAX_HEADERS: usize = 64;

/// Why a probe failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The deadline elapsed before the probe finished (connect, headers or
    /// body). The pod did not answer in time.
    #[error("timed out")]
    Timeout,
    /// The connection was refused: nothing listens on the port.
    #[error("connection refused")]
    Refused,
    /// The prober could not even try: no route to the address, network or
    /// host unreachable, no local ports or file descriptors left. Such a
    /// failure is about the controller's side of the network, so it tells
    /// nothing about the pod (membership turns it into `abstain`).
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// Any other I/O or protocol failure: reset, malformed or oversized
    /// response, invalid request path.
    #[error("{0}")]
    Io(String),
}

impl ProbeError {
    /// Classifies an I/O error from connecting or talking to the peer.
    ///
    /// Connection refused is [`ProbeError::Refused`]; errors that arise on the
    /// prober's side or on its path to the pod (no route, network/host
    /// unreachable, address not available, out of file descriptors or buffer
    /// space) are [`ProbeError::Unreachable`]; a timed-out socket is
    /// [`ProbeError::Timeout`]; the rest is [`ProbeError::Io`].
    pub fn from_io(err: &io::Error) -> Self {
        match err.kind() {
            io::ErrorKind::ConnectionRefused => return ProbeError::Refused,
            io::ErrorKind::TimedOut => return ProbeError::Timeout,
            io::ErrorKind::NetworkUnreachable
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::AddrNotAvailable
            | io::ErrorKind::NetworkDown => return ProbeError::Unreachable(err.to_string()),
            _ => {}
        }
        match err.raw_os_error() {
            Some(code) if is_local_resource_errno(code) => ProbeError::Unreachable(err.to_string()),
            _ => ProbeError::Io(err.to_string()),
        }
    }

    /// True when the failure says nothing about the pod, only about the
    /// prober (see [`ProbeError::Unreachable`]).
    pub fn is_inconclusive(&self) -> bool {
        matches!(self, ProbeError::Unreachable(_))
    }

    /// Classifies a hyper error: looks for an underlying I/O error first so a
    /// reset is reported as such, not as a generic protocol failure.
    pub(crate) fn from_hyper(err: &hyper::Error) -> Self {
        if err.is_timeout() {
            return ProbeError::Timeout;
        }
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = source {
            if let Some(io_err) = e.downcast_ref::<io::Error>() {
                return match Self::from_io(io_err) {
                    ProbeError::Io(_) => ProbeError::Io(format!("{err}: {io_err}")),
                    other => other,
                };
            }
            source = e.source();
        }
        ProbeError::Io(err.to_string())
    }
}

/// Local resource exhaustion: EMFILE, ENFILE, ENOBUFS, ENOMEM (Linux numbers;
/// the names have no `io::ErrorKind`).
fn is_local_resource_errno(code: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        matches!(code, 24 | 23 | 105 | 12)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = code;
        false
    }
}

/// Opens a TCP connection to `addr` and closes it again. Succeeds when the
/// three-way handshake completes within `timeout`.
pub async fn tcp_dial(addr: SocketAddr, timeout: Duration) -> Result<(), ProbeError> {
    // tokio polls the future once before looking at the deadline, and a
    // loopback connect can complete on that first poll.
    if timeout.is_zero() {
        return Err(ProbeError::Timeout);
    }
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Err(_) => Err(ProbeError::Timeout),
        Ok(Err(e)) => Err(ProbeError::from_io(&e)),
        Ok(Ok(stream)) => {
            drop(stream);
            Ok(())
        }
    }
}

/// Runs `exchange` while driving its connection `conn` in the same future
/// rather than a spawned task, so dropping the probe (deadline, truncation)
/// closes the socket at once.
pub(crate) async fn drive<T, C>(exchange: impl Future<Output = T>, conn: C) -> T
where
    C: Future,
{
    tokio::pin!(exchange);
    tokio::pin!(conn);
    let mut conn_done = false;
    loop {
        tokio::select! {
            result = &mut exchange => return result,
            // Once the connection future has finished, any data it read is
            // already queued for the body, and any error reaches `exchange`
            // through hyper's dispatch channel; keep polling `exchange`.
            _ = &mut conn, if !conn_done => conn_done = true,
        }
    }
}

#[cfg(test)]
mod tests;
